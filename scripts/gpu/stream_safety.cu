// Would corrupt data if a pool handed out a freed block while GPU work queued
// before the free still writes it: a slow kernel on a non-blocking stream
// fills buffer A; A is freed; B is allocated (a pool may give A's memory) and
// zeroed on the legacy stream, which does not wait for the non-blocking one.
#include <cuda_runtime.h>
#include <cstdio>
#include <vector>

__global__ void slow_fill(int* p, size_t n, long long spin) {
    long long start = clock64();
    while (clock64() - start < spin) {}
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = 1;
}

int main() {
    const size_t n = 1 << 20;
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    size_t corrupted = 0, reused = 0;
    for (int round = 0; round < 5; round++) {
        int *a, *b;
        cudaMalloc(&a, n * sizeof(int));
        slow_fill<<<64, 256, 0, s>>>(a, n, 200000000LL);  // ~0.1 s of spinning first
        cudaFree(a);
        cudaMalloc(&b, n * sizeof(int));
        reused += (a == b);
        cudaMemset(b, 0, n * sizeof(int));
        cudaDeviceSynchronize();
        std::vector<int> h(n);
        cudaMemcpy(h.data(), b, n * sizeof(int), cudaMemcpyDeviceToHost);
        for (int v : h) corrupted += (v != 0);
        cudaFree(b);
    }
    printf("result: rounds=5 reused_address=%zu corrupted_words=%zu\n", reused, corrupted);
    return corrupted != 0;
}
