// A request larger than the device, and then memory from another allocator
// (CUDA's own stream-ordered pool): under cupool as without it, the failed
// request must leave the device's memory free at once, even with GPU work
// queued, and fail about as fast. Prints the error codes (compared with a
// plain run by scripts/gpu-check.sh) and the times taken.
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>

__global__ void spin(char *p, long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
    if (threadIdx.x == 0) p[0] = 1;
}

static double ms_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

int main() {
    cudaStream_t s;
    cudaStreamCreate(&s);
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    // Freed blocks behind queued work: the pool's pages cool.
    char *a = nullptr;
    cudaMalloc(&a, 64 << 20);
    spin<<<1, 32, 0, s>>>(a, 200000000LL);
    cudaFree(a);
    auto t = std::chrono::steady_clock::now();
    void *big = nullptr;
    int e_big = cudaMalloc(&big, total_b + 1);
    double big_ms = ms_since(t);
    cudaGetLastError();
    t = std::chrono::steady_clock::now();
    void *huge = nullptr;
    int e_huge = cudaMalloc(&huge, 2 * total_b);
    double huge_ms = ms_since(t);
    cudaGetLastError();
    void *other = nullptr;
    int e_other = cudaMallocAsync(&other, free_b / 2, s);
    if (e_other == cudaSuccess) cudaFreeAsync(other, s);
    cudaStreamSynchronize(s);
    printf("result: big=%d huge=%d other=%d\n", e_big, e_huge, e_other);
    printf("times: big_ms=%.1f huge_ms=%.1f\n", big_ms, huge_ms);
    return 0;
}
