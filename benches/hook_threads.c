/* Pooled pairs from several threads at once through the fake runtime
 * (scripts/hook-bench.sh): each thread creates a stream of its own (so the
 * pool fences its frees, as with several streams on a GPU), then repeats
 * cudaMalloc(4 KiB)+cudaFree. Prints pairs per second over all threads.
 * With MAX_BYTES, each request is of a size drawn anew from 1..MAX_BYTES
 * (xorshift, a sequence per thread): sizes that seldom come back.
 *   hook_threads THREADS PAIRS_PER_THREAD [MAX_BYTES] */
#include <pthread.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
typedef struct CUstream_st *cudaStream_t;
int cudaMalloc(void **p, size_t n);
int cudaFree(void *p);
int cudaStreamCreate(cudaStream_t *s);
static long pairs;
static long failed; /* calls that returned an error, over all threads */
static size_t max_bytes;
static void *run(void *arg) {
    cudaStream_t s;
    cudaStreamCreate(&s);
    void *p;
    uint32_t x = 0x9e3779b9u * (uint32_t)(uintptr_t)arg + 1;
    for (long i = 0; i < pairs; i++) {
        size_t n = 4096;
        if (max_bytes) {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            n = 1 + x % max_bytes;
        }
        long bad = cudaMalloc(&p, n) != 0;
        bad += cudaFree(p) != 0;
        if (bad) __atomic_add_fetch(&failed, bad, __ATOMIC_RELAXED);
    }
    return arg;
}
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    pairs = argc > 2 ? atol(argv[2]) : 300000;
    max_bytes = argc > 3 ? (size_t)atol(argv[3]) : 0;
    if (threads < 1 || threads > 64) return 2;
    pthread_t th[64];
    cudaFree(0);
    double t0 = now();
    for (long i = 0; i < threads; i++) pthread_create(&th[i], 0, run, (void *)(i + 1));
    for (int i = 0; i < threads; i++) pthread_join(th[i], 0);
    double s = now() - t0;
    if (failed) { fprintf(stderr, "hook_threads: %ld calls failed\n", failed); return 1; }
    printf("pairs_per_s=%.0f\n", threads * pairs / s);
    return 0;
}
