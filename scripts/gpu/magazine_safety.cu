// Would corrupt data if a thread took back a small block it freed before the
// GPU work queued before its free had finished (thread magazines reuse a
// thread's own frees without the pool). Each thread has two non-blocking
// streams: a kernel on the first waits a while, then writes its block; the
// block is freed at once and a block of the same size is allocated and
// written on the second stream, which waits longer and then checks it. If
// the new block is the freed one, the late write breaks the check.
//   magazine_safety [THREADS] [ROUNDS]
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

__global__ void late_write(unsigned* p, int n, unsigned v, long long spin) {
    long long start = clock64();
    while (clock64() - start < spin) {}
    for (int i = threadIdx.x; i < n; i += blockDim.x) p[i] = v;
}

__global__ void write_wait_check(unsigned* p, int n, unsigned v, long long spin, unsigned long long* bad) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) p[i] = v;
    long long start = clock64();
    while (clock64() - start < spin) {}
    __syncthreads();
    unsigned long long local = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) local += p[i] != v;
    if (local) atomicAdd(bad, local);
}

int main(int argc, char** argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 4;
    const int rounds = argc > 2 ? atoi(argv[2]) : 2000;
    const int words = 4096;  // 16 KiB: a magazine's size
    unsigned long long* bad;
    cudaMalloc(&bad, sizeof *bad);
    cudaMemset(bad, 0, sizeof *bad);
    cudaDeviceSynchronize();
    std::vector<long> same(threads, 0);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; t++)
        pool.emplace_back([=, &same] {
            cudaStream_t first, second;
            cudaStreamCreateWithFlags(&first, cudaStreamNonBlocking);
            cudaStreamCreateWithFlags(&second, cudaStreamNonBlocking);
            for (int r = 0; r < rounds; r++) {
                unsigned *a, *b;
                if (cudaMalloc(&a, words * 4) != cudaSuccess) { printf("FAIL alloc\n"); exit(2); }
                late_write<<<1, 256, 0, first>>>(a, words, 0xdead0000u | t, 20000);
                cudaFree(a);
                if (cudaMalloc(&b, words * 4) != cudaSuccess) { printf("FAIL alloc\n"); exit(2); }
                same[t] += a == b;
                write_wait_check<<<1, 256, 0, second>>>(b, words, 0x5afe0000u | r, 100000, bad);
                cudaFree(b);
            }
            cudaStreamSynchronize(first);
            cudaStreamSynchronize(second);
        });
    for (auto& th : pool) th.join();
    cudaDeviceSynchronize();
    unsigned long long h = 0;
    cudaMemcpy(&h, bad, sizeof h, cudaMemcpyDeviceToHost);
    long reused = 0;
    for (long s : same) reused += s;
    printf("result: threads=%d rounds=%d freed_block_again_at_once=%ld corrupted_words=%llu\n", threads, rounds, reused,
           h);
    return h != 0;
}
