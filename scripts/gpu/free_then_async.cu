// CuPy's TestMemoryAsyncPool in CUDA C (scripts/gpu-check.sh, row
// free-then-async): with a stream created, so that the pool's frees wait
// for fences, 70 % of the device is freed in one cudaFree and then asked of
// CUDA's own stream-ordered pool; then one 1 GiB size is allocated and freed
// over and over (a size the pool keeps) and cudaMallocAsync asks for all but
// 512 MiB of what was free. Without cupool both succeed. Prints the error
// codes and what cudaGetLastError says after the second one, for the check
// to compare with a plain run.
#include <cuda_runtime.h>
#include <cstdio>

int main() {
    cudaStream_t s;
    cudaStreamCreate(&s);
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    void *p = nullptr, *q = nullptr;
    cudaMalloc(&p, total_b / 10 * 7);
    cudaFree(p);
    int bulk = cudaMallocAsync(&q, total_b / 10 * 7, s);
    if (bulk == cudaSuccess) cudaFreeAsync(q, s);
    cudaGetLastError();
    cudaStreamSynchronize(s);
    for (int round = 0; round < 3; round++) {
        cudaMalloc(&p, 1ull << 30);
        cudaFree(p);
    }
    int churn = cudaMallocAsync(&q, free_b - (512ull << 20), s);
    int last = cudaGetLastError();
    if (churn == cudaSuccess) cudaFreeAsync(q, s);
    cudaStreamSynchronize(s);
    printf("result: bulk=%d churn=%d last_error=%d\n", bulk, churn, last);
    return 0;
}
