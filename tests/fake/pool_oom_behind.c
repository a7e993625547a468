/* Test-local program of tests/pool_safety.rs (`oom_behind`).
 * Usage: oom_behind [TIMES]
 * With a stream (so freed memory waits for fences) and the GPU behind
 * (FAKE_CUDA_EVENT_LATENCY_US), asks for TIMES (default 1) times the
 * device's memory plus one byte, or with TIMES 0 for 32 MiB more than is
 * free (a quarter of the device held by CUDA's own pool first); then
 * allocates through CUDA's own stream-ordered pool, which only succeeds if
 * the failed request left the device's memory free, as cudaMalloc does.
 * Prints how long the refused request took as oom_ms. */
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "fake_cudart_api.h"
#include "check.h"

int main(int argc, char **argv)
{
    size_t times = argc > 1 ? (size_t)atoi(argv[1]) : 1;
    cudaStream_t s;
    void *a = NULL, *big = NULL, *other = NULL;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaMalloc(&a, 3u << 20));
    CHECK(cudaFree(a));
    size_t free_b = 0, total_b = 0;
    CHECK(cudaMemGetInfo(&free_b, &total_b));
    void *held = NULL;
    if (times == 0) {
        CHECK(cudaMallocAsync(&held, total_b / 4, s));
        CHECK(cudaMemGetInfo(&free_b, &total_b));
    }
    size_t ask = times ? times * total_b + 1 : free_b + (32u << 20);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    cudaError_t e = cudaMalloc(&big, ask);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long long oom_ms = (t1.tv_sec - t0.tv_sec) * 1000LL + (t1.tv_nsec - t0.tv_nsec) / 1000000;
    if (e != cudaErrorMemoryAllocation)
        FAIL("cudaMalloc(%zu x total + 1) returned %d, expected %d", times, e, cudaErrorMemoryAllocation);
    (void)cudaGetLastError();
    CHECK(cudaMallocAsync(&other, times ? total_b / 2 : total_b / 4, s));
    CHECK(cudaFreeAsync(other, s));
    if (held)
        CHECK(cudaFreeAsync(held, s));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaStreamDestroy(s));
    printf("result: ok allocs=3 frees=2 leaked_bytes=0 oom_ms=%lld\n", oom_ms);
    return 0;
}
