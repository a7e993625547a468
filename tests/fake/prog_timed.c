/* Two allocations and two frees with sleeps between them (shared runtime).
 * Reads its clock (CLOCK_MONOTONIC) just before and just after each call and
 * prints, for each gap between two calls, the least and the most it can be,
 * for a test to compare with the log's event times. The bracket matters: the
 * first call also starts the shim, which on a loaded machine takes
 * milliseconds before the event is stamped. */
#include <stdio.h>
#include <time.h>

#include "fake_cudart_api.h"
#include "check.h"

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void sleep_ms(long ms)
{
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0) {
    }
}

int main(void)
{
    void *a = NULL, *b = NULL;
    long long before[4], after[4];
    before[0] = now_ns();
    if (cudaMalloc(&a, 4096) != cudaSuccess)
        FAIL("cudaMalloc a");
    after[0] = now_ns();
    sleep_ms(30);
    before[1] = now_ns();
    if (cudaMalloc(&b, 8192) != cudaSuccess)
        FAIL("cudaMalloc b");
    after[1] = now_ns();
    sleep_ms(250);
    before[2] = now_ns();
    if (cudaFree(a) != cudaSuccess)
        FAIL("cudaFree a");
    after[2] = now_ns();
    sleep_ms(5);
    before[3] = now_ns();
    if (cudaFree(b) != cudaSuccess)
        FAIL("cudaFree b");
    after[3] = now_ns();
    printf("result: ok allocs=2 frees=2 leaked_bytes=0");
    for (int k = 0; k < 3; k++)
        printf(" gap%d_min_ns=%lld gap%d_max_ns=%lld", k + 1, before[k + 1] - after[k], k + 1,
               after[k + 1] - before[k]);
    printf("\n");
    return 0;
}
