/* Test-local program of tests/pool_safety.rs (`destroyed_stream`). A
 * kernel on a stream of its own still uses block x (the fake's
 * fake_stream_busy: 300 ms of work) when the program destroys the stream,
 * which CUDA allows, and frees x, which waits for that work plainly. The
 * pool must not hand x out again ahead of that work: the next 4 KiB
 * allocation may get x's address while the work runs only if the pool
 * ordered the streams behind it on the GPU (a record on the legacy stream
 * then completes only after the work). Prints whether that held
 * (ordered_during_work) and whether x came back once the work was done.
 *   pool_destroyed_stream older: two streams; x is freed while the second
 * one's work runs, that stream is destroyed, and two more frees come a
 * fence apart each, so that the block is handed out behind a barrier on a
 * fence recorded after the one that carried the destroyed stream's event. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "fake_cuda_api.h"
#include "fake_cudart_api.h"
#include "check.h"

int main(int argc, char **argv)
{
    int older = argc > 1 && strcmp(argv[1], "older") == 0;
    cudaStream_t s, other;
    void *kept = NULL, *x = NULL, *y = NULL, *z = NULL, *during = NULL, *after = NULL;
    struct timespec a_fence_later = {0, 2 * 1000 * 1000};
    CHECK(cudaStreamCreate(&s));
    if (older)
        CHECK(cudaStreamCreate(&other));
    CHECK(cudaMalloc(&kept, 4096));
    CHECK(cudaMalloc(&x, 4096));
    if (older) {
        CHECK(cudaMalloc(&y, 4096));
        CHECK(cudaMalloc(&z, 4096));
    }
    fake_stream_busy((CUstream)s, 300);
    if (older)
        CHECK(cudaFree(x)); /* a fence with an event on the busy stream */
    CHECK(cudaStreamDestroy(s));
    if (older) {
        nanosleep(&a_fence_later, NULL);
        CHECK(cudaFree(y)); /* the next fence carries the destroyed stream's event */
        nanosleep(&a_fence_later, NULL);
        CHECK(cudaFree(z)); /* and this one has none */
    } else {
        CHECK(cudaFree(x));
    }
    nanosleep(&a_fence_later, NULL);
    CHECK(cudaMalloc(&during, 4096));
    CUevent after_alloc;
    CHECK(cuEventCreate(&after_alloc, 0));
    CHECK(cuEventRecord(after_alloc, 0));
    int ordered = (during != x && during != y) || cuEventQuery(after_alloc) == CUDA_ERROR_NOT_READY;
    struct timespec past_the_work = {0, 400 * 1000 * 1000};
    nanosleep(&past_the_work, NULL);
    CHECK(cudaFree(during));
    nanosleep(&a_fence_later, NULL);
    CHECK(cudaMalloc(&after, 4096));
    printf("result: ok ordered_during_work=%d reused_after_work=%d\n", ordered, after == x || after == during);
    CHECK(cudaFree(after));
    CHECK(cudaFree(kept));
    if (older)
        CHECK(cudaStreamDestroy(other));
    return 0;
}
