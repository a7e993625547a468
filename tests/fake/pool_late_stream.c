/* Test-local program of tests/pool_safety.rs (`late_stream`). Work on the
 * legacy stream still uses block x (fake_stream_busy: 300 ms) when x is
 * freed, before any stream exists: the pool may reuse x at once, as all
 * work so far is ordered on that one stream. Then two streams are created
 * and x is handed out again. Whichever stream gets it must be ordered
 * behind that work: a record on the second stream completes only after it.
 * Prints ordered (1: x not reused, or the second stream waits). */
#include <stdio.h>

#include "fake_cuda_api.h"
#include "fake_cudart_api.h"
#include "check.h"

int main(void)
{
    void *kept = NULL, *x = NULL, *y = NULL;
    cudaStream_t first, second;
    CHECK(cudaMalloc(&kept, 4096));
    CHECK(cudaMalloc(&x, 4096));
    fake_stream_busy((CUstream)0, 300);
    CHECK(cudaFree(x));
    CHECK(cudaStreamCreate(&first));
    CHECK(cudaStreamCreate(&second));
    CHECK(cudaMalloc(&y, 4096));
    CUevent on_second;
    CHECK(cuEventCreate(&on_second, 0));
    CHECK(cuEventRecord(on_second, (CUstream)second));
    int ordered = y != x || cuEventQuery(on_second) == CUDA_ERROR_NOT_READY;
    printf("result: ok ordered=%d reused=%d\n", ordered, y == x);
    CHECK(cudaFree(y));
    CHECK(cudaFree(kept));
    CHECK(cudaStreamDestroy(second));
    CHECK(cudaStreamDestroy(first));
    return 0;
}
