/* Two allocations and two frees with sleeps between them (shared runtime).
 * Prints the gaps between the calls as this program measured them
 * (CLOCK_MONOTONIC), for a test to compare with the log's event times. */
#include <stdio.h>
#include <time.h>

#include "fake_cudart_api.h"
#include "check.h"

static long long now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000LL + t.tv_nsec / 1000;
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
    long long t[4];
    t[0] = now_us();
    if (cudaMalloc(&a, 4096) != cudaSuccess)
        FAIL("cudaMalloc a");
    sleep_ms(30);
    t[1] = now_us();
    if (cudaMalloc(&b, 8192) != cudaSuccess)
        FAIL("cudaMalloc b");
    sleep_ms(250);
    t[2] = now_us();
    if (cudaFree(a) != cudaSuccess)
        FAIL("cudaFree a");
    sleep_ms(5);
    t[3] = now_us();
    if (cudaFree(b) != cudaSuccess)
        FAIL("cudaFree b");
    printf("result: ok allocs=2 frees=2 leaked_bytes=0 gap1_us=%lld gap2_us=%lld gap3_us=%lld\n", t[1] - t[0],
           t[2] - t[1], t[3] - t[2]);
    return 0;
}
