// Multi-thread, multi-stream reuse stress: each thread allocates a buffer,
// fills it with its own pattern and verifies it on its own non-blocking
// stream, and frees it right after queueing the work (no sync). If a pool
// handed the memory to another thread before that work finished, the other
// thread's fill would break the verification. Counts corrupted words on the GPU.
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

__global__ void fill(unsigned* p, size_t n, unsigned v) {
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = v ^ (unsigned)i;
}
__global__ void verify(const unsigned* p, size_t n, unsigned v, unsigned long long* bad) {
    unsigned long long local = 0;
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) local += (p[i] != (v ^ (unsigned)i));
    if (local) atomicAdd(bad, local);
}

int main(int argc, char** argv) {
    const long ops = argc > 1 ? atol(argv[1]) : 1000000;  // allocations + frees, all threads
    const int threads = argc > 2 ? atoi(argv[2]) : 8;
    const long iters = ops / (2 * threads);
    unsigned long long* bad;
    cudaMalloc(&bad, sizeof(unsigned long long));
    cudaMemset(bad, 0, sizeof(unsigned long long));
    cudaDeviceSynchronize();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; t++) {
        pool.emplace_back([=] {
            cudaStream_t s;
            cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
            unsigned seed = 1234567u * (t + 1);
            for (long i = 0; i < iters; i++) {
                seed = seed * 1664525u + 1013904223u;
                size_t words = 1024 + (seed >> 8) % (256 * 1024);
                unsigned* p;
                if (cudaMalloc(&p, words * 4) != cudaSuccess) { printf("FAIL alloc\n"); exit(2); }
                unsigned v = (unsigned)(t << 24) ^ (unsigned)i;
                fill<<<32, 256, 0, s>>>(p, words, v);
                verify<<<32, 256, 0, s>>>(p, words, v, bad);
                cudaFree(p);
            }
            cudaStreamSynchronize(s);
            cudaStreamDestroy(s);
        });
    }
    for (auto& th : pool) th.join();
    cudaDeviceSynchronize();
    unsigned long long h = 0;
    cudaMemcpy(&h, bad, sizeof h, cudaMemcpyDeviceToHost);
    printf("result: threads=%d ops=%ld corrupted_words=%llu\n", threads, 2 * threads * iters, h);
    return h != 0;
}
