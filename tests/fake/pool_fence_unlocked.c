/* Test-local program of tests/pool_safety.rs
 * (`fences_are_recorded_with_the_pools_lock_let_go`). Two threads, each with
 * a stream of its own (so the pool's frees wait for fences), allocate and
 * free 4 KiB for 300 ms, while every record on a created stream takes 5 ms
 * (a busy driver). Prints pairs (both threads) and
 * most_allocs_during_a_record: the most pooled allocations (each asks the
 * driver for its context's id once) the other thread made while one record
 * of a fence ran. Under the pool's lock, a fence's records would hold it
 * back to one. */
#include <pthread.h>
#include <stdio.h>
#include <time.h>

#include "fake_cuda_api.h"
#include "fake_cudart_api.h"
#include "check.h"

static long long now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000LL + t.tv_nsec / 1000000;
}

static long long until_ms;

static void *pairs_on_a_stream(void *arg)
{
    cudaStream_t s;
    long pairs = 0;
    if (cudaStreamCreate(&s))
        return (void *)-1L;
    while (now_ms() < until_ms) {
        void *p = NULL;
        if (cudaMalloc(&p, 4096) || cudaFree(p))
            return (void *)-1L;
        pairs++;
    }
    *(long *)arg = pairs;
    return cudaStreamDestroy(s) ? (void *)-1L : NULL;
}

int main(void)
{
    void *warm = NULL;
    CHECK(cudaMalloc(&warm, 4096)); /* the pool and its first page exist before the clock starts */
    fake_slow_records(5000);
    until_ms = now_ms() + 300;
    pthread_t threads[2];
    long pairs[2] = {0, 0};
    for (int i = 0; i < 2; i++)
        pthread_create(&threads[i], NULL, pairs_on_a_stream, &pairs[i]);
    for (int i = 0; i < 2; i++) {
        void *failed = NULL;
        pthread_join(threads[i], &failed);
        if (failed)
            FAIL("thread %d: a pooled pair or a stream failed", i);
    }
    unsigned long long most = fake_slow_records(0);
    CHECK(cudaFree(warm));
    printf("result: ok pairs=%ld most_allocs_during_a_record=%llu\n", pairs[0] + pairs[1], most);
    return 0;
}
