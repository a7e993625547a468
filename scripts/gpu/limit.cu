// The `limit` option on a real GPU: one cap in every mode. Run under
// `cupool run --limit 64m [--mode pool]`: cudaMemGetInfo shows a 64 MiB
// device, 40 MiB fit, 40 MiB more fail with cudaErrorMemoryAllocation and
// leave nothing allocated, and after a free a 3 MiB request near the cap
// still fits. Prints one `result:` line; the same line plainly (no cap) shows
// what the program saw without cupool.
#include <cuda_runtime.h>
#include <cuda.h>
#include <cstdio>

int main() {
    size_t free0 = 0, total0 = 0;
    cudaMemGetInfo(&free0, &total0);
    void *a = nullptr, *b = nullptr, *c = nullptr;
    int ra = cudaMalloc(&a, 40 << 20);
    int rb = cudaMalloc(&b, 40 << 20);  // past a 64 MiB cap
    cudaGetLastError();
    CUdeviceptr d = 0;
    int rd = cuMemAlloc(&d, 40 << 20);  // the driver API keeps the same cap
    if (ra == 0) cudaFree(a);
    int rc = cudaMalloc(&c, 3 << 20);   // near the cap, after a free
    int wrote = -1;
    if (rc == 0) wrote = cudaMemset(c, 7, 3 << 20) == 0 && cudaDeviceSynchronize() == 0;
    if (rc == 0) cudaFree(c);
    if (rb == 0) cudaFree(b);
    if (rd == 0) cuMemFree(d);
    printf("result: total_mib=%zu a=%d b=%d driver=%d near_cap=%d wrote=%d\n", total0 >> 20, ra, rb, rd, rc, wrote);
    return 0;
}
