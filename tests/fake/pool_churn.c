/* Test-local program of tests/pool.rs (`churn`): 16 threads x 4000
 * cudaMalloc / cudaFree pairs of xorshift sizes up to 256 KiB through the
 * shared runtime, so that blocks move between threads all the time. */
#include <pthread.h>
#include <stdint.h>

#include "fake_cudart_api.h"
#include "check.h"

#define THREADS 16
#define ITERS 4000

static int errors;

static void *worker(void *arg)
{
    uint32_t x = 0x9e3779b9u * (uint32_t)(uintptr_t)arg + 1;
    for (int i = 0; i < ITERS; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        void *p = NULL;
        if (cudaMalloc(&p, 1 + x % (256u * 1024u)) != cudaSuccess || cudaFree(p) != cudaSuccess)
            __atomic_add_fetch(&errors, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

int main(void)
{
    pthread_t t[THREADS];
    CHECK(cudaFree(NULL)); /* initialises the runtime */
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)i);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    if (errors)
        FAIL("%d errors", errors);
    printf("result: ok allocs=%d frees=%d leaked_bytes=0\n", THREADS * ITERS, THREADS * ITERS);
    return 0;
}
