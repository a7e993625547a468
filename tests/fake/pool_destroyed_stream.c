/* Test-local program of tests/pool_safety.rs (`destroyed_stream`). A
 * kernel on a stream of its own still uses block x (the fake's
 * fake_stream_busy: 300 ms of work) when the program destroys the stream,
 * which CUDA allows, and frees x, which waits for that work plainly. The
 * pool must not hand x out again ahead of that work: the next 4 KiB
 * allocation may get x's address while the work runs only if the pool
 * ordered the streams behind it on the GPU (a record on the legacy stream
 * then completes only after the work). Prints whether that held
 * (ordered_during_work) and whether x came back once the work was done. */
#include <stdio.h>
#include <time.h>

#include "fake_cuda_api.h"
#include "fake_cudart_api.h"
#include "check.h"

int main(void)
{
    cudaStream_t s;
    void *kept = NULL, *x = NULL, *during = NULL, *after = NULL;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaMalloc(&kept, 4096));
    CHECK(cudaMalloc(&x, 4096));
    fake_stream_busy((CUstream)s, 300);
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(x));
    struct timespec a_fence_later = {0, 2 * 1000 * 1000};
    nanosleep(&a_fence_later, NULL);
    CHECK(cudaMalloc(&during, 4096));
    CUevent after_alloc;
    CHECK(cuEventCreate(&after_alloc, 0));
    CHECK(cuEventRecord(after_alloc, 0));
    int ordered = during != x || cuEventQuery(after_alloc) == CUDA_ERROR_NOT_READY;
    struct timespec past_the_work = {0, 400 * 1000 * 1000};
    nanosleep(&past_the_work, NULL);
    CHECK(cudaFree(during));
    nanosleep(&a_fence_later, NULL);
    CHECK(cudaMalloc(&after, 4096));
    printf("result: ok ordered_during_work=%d reused_after_work=%d\n", ordered, after == x || after == during);
    CHECK(cudaFree(after));
    CHECK(cudaFree(kept));
    return 0;
}
