// Time of cudaMalloc, a memset and cudaFree of large blocks, twice each (the
// second cycle finds whatever the first left cached), at fractions of the
// device's free memory. Prints `result:` lines of milliseconds; run plainly
// and under cupool (scripts/gpu-huge.sh).
#include <chrono>
#include <cstdio>
#include <cuda_runtime.h>

static double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

int main() {
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    const size_t mib = 1 << 20;
    const size_t sizes[] = {256 * mib, 1024 * mib, 8192 * mib, free_b / 2 / mib * mib};
    for (size_t size : sizes) {
        for (int cycle = 0; cycle < 2; cycle++) {
            void *p = nullptr;
            auto t0 = std::chrono::steady_clock::now();
            cudaError_t r = cudaMalloc(&p, size);
            double alloc_ms = ms_since(t0);
            if (r != cudaSuccess) {
                printf("result: size_mib=%zu cycle=%d error=%d\n", size / mib, cycle, (int)r);
                return 1;
            }
            cudaMemset(p, 1, size);
            cudaDeviceSynchronize();
            t0 = std::chrono::steady_clock::now();
            cudaFree(p);
            double free_ms = ms_since(t0);
            printf("result: size_mib=%zu cycle=%d alloc_ms=%.2f free_ms=%.2f\n", size / mib, cycle, alloc_ms, free_ms);
        }
    }
    return 0;
}
