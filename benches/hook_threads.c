/* Pooled pairs from several threads at once through the fake runtime
 * (scripts/hook-bench.sh): each thread creates a stream of its own (so the
 * pool fences its frees, as with several streams on a GPU), then repeats
 * cudaMalloc(4 KiB)+cudaFree. Prints pairs per second over all threads.
 *   hook_threads THREADS PAIRS_PER_THREAD */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
typedef struct CUstream_st *cudaStream_t;
int cudaMalloc(void **p, size_t n);
int cudaFree(void *p);
int cudaStreamCreate(cudaStream_t *s);
static long pairs;
static void *run(void *arg) {
    cudaStream_t s;
    cudaStreamCreate(&s);
    void *p;
    for (long i = 0; i < pairs; i++) { cudaMalloc(&p, 4096); cudaFree(p); }
    return arg;
}
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    pairs = argc > 2 ? atol(argv[2]) : 300000;
    if (threads < 1 || threads > 64) return 2;
    pthread_t th[64];
    cudaFree(0);
    double t0 = now();
    for (int i = 0; i < threads; i++) pthread_create(&th[i], 0, run, 0);
    for (int i = 0; i < threads; i++) pthread_join(th[i], 0);
    printf("pairs_per_s=%.0f\n", threads * pairs / (now() - t0));
    return 0;
}
