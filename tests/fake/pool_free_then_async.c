/* Test-local program of tests/pool_safety.rs (`free_then_async`).
 * CuPy's TestMemoryAsyncPool, in C: with a stream created (so the pool's
 * frees wait for fences), a program frees 70 % of the device and then asks
 * CUDA's own stream-ordered pool for 70 %; then it frees and allocates one
 * 128 MiB size over and over (a size the pool keeps cached) and asks
 * cudaMallocAsync for all but 64 MiB of the device, and then cuMemCreate
 * for as much after the same churn. Without cupool every request succeeds:
 * every cudaFree gives its memory back. Prints the results (0: success) as
 * async_after_bulk_free, async_after_churn and vmm_after_churn, and the
 * device memory held right after the bulk free as used_after_bulk_free. */
#include <stdlib.h>
#include <string.h>

#include "fake_cuda_api.h"
#include "fake_cudart_api.h"
#include "check.h"

#define MIB (1024ull * 1024)

int main(void)
{
    cudaStream_t s;
    void *p = NULL, *q = NULL;
    CHECK(cudaStreamCreate(&s));
    size_t free_b = 0, total_b = 0;
    CHECK(cudaMemGetInfo(&free_b, &total_b));
    CHECK(cudaMalloc(&p, total_b / 10 * 7));
    CHECK(cudaFree(p));
    size_t used_after_bulk_free = fake_device_used(0);
    cudaError_t bulk = cudaMallocAsync(&q, total_b / 10 * 7, s);
    if (bulk == cudaSuccess)
        CHECK(cudaFreeAsync(q, s));
    (void)cudaGetLastError();
    CHECK(cudaDeviceSynchronize());
    for (int round = 0; round < 3; round++) {
        CHECK(cudaMalloc(&p, 128 * MIB));
        CHECK(cudaFree(p));
    }
    cudaError_t churn = cudaMallocAsync(&q, total_b - 64 * MIB, s);
    /* A call that succeeded leaves no error behind, however it was made. */
    cudaError_t last = cudaGetLastError();
    if (churn == cudaSuccess && last != cudaSuccess)
        FAIL("cudaMallocAsync succeeded but cudaGetLastError() says %d", (int)last);
    if (churn == cudaSuccess)
        CHECK(cudaFreeAsync(q, s));
    CHECK(cudaDeviceSynchronize());
    /* The same for VMM memory the program makes itself (PyTorch's expandable
     * segments): all but 64 MiB of the device in one physical allocation,
     * after the churn has made the pool keep its size again. */
    for (int round = 0; round < 3; round++) {
        CHECK(cudaMalloc(&p, 128 * MIB));
        CHECK(cudaFree(p));
    }
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CUmemGenericAllocationHandle handle;
    CUresult vmm = cuMemCreate(&handle, total_b - 64 * MIB, &prop, 0);
    if (vmm == CUDA_SUCCESS)
        CHECK(cuMemRelease(handle));
    CHECK(cudaStreamDestroy(s));
    printf("used_after_bulk_free=%zu\nasync_after_bulk_free=%d\nasync_after_churn=%d\nvmm_after_churn=%d\n",
           used_after_bulk_free, (int)bulk, (int)churn, (int)vmm);
    printf("result: ok allocs=6 frees=6 leaked_bytes=0\n");
    return 0;
}
