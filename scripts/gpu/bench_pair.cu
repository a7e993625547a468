// cudaMalloc+cudaFree pair latency per size: median over batches, in microseconds.
#include <cuda_runtime.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

int main() {
    const size_t sizes[] = {512, 4096, 1 << 20, 8 << 20, 64 << 20, 512 << 20};
    cudaFree(0);
    printf("size_bytes,pair_us_median\n");
    for (size_t size : sizes) {
        int iters = size >= (64 << 20) ? 20 : 200;
        std::vector<double> batches;
        for (int b = 0; b < 7; b++) {
            auto t0 = std::chrono::steady_clock::now();
            for (int i = 0; i < iters; i++) {
                void* p;
                if (cudaMalloc(&p, size) != cudaSuccess) { printf("FAIL\n"); return 1; }
                cudaFree(p);
            }
            auto t1 = std::chrono::steady_clock::now();
            batches.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / iters);
        }
        std::sort(batches.begin(), batches.end());
        printf("%zu,%.3f\n", size, batches[batches.size() / 2]);
    }
    return 0;
}
