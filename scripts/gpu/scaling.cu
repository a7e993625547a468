// Allocation throughput against threads: each thread makes its own
// non-blocking stream and repeats cudaMalloc(4 KiB), an empty kernel on its
// stream that takes the buffer, cudaFree. Prints pairs per second over all
// threads (scripts/gpu-bench.sh, section "scaling"). LAUNCH 0 leaves the
// kernel out (the streams still exist): allocation alone, which the driver's
// launch path does not serialise.
//   scaling THREADS PAIRS_PER_THREAD [LAUNCH]
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

__global__ void touch(char *p) {
    if (threadIdx.x == 0 && p == nullptr) p[0] = 0;
}

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 1;
    const long pairs = argc > 2 ? atol(argv[2]) : 20000;
    const bool launch = argc > 3 ? atoi(argv[3]) != 0 : true;
    cudaFree(nullptr);
    std::vector<cudaStream_t> streams(threads);
    for (auto &s : streams) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    int failed = 0;
    auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; t++)
        pool.emplace_back([&, t] {
            for (long i = 0; i < pairs; i++) {
                void *p;
                if (cudaMalloc(&p, 4096) != cudaSuccess) { failed = 1; return; }
                if (launch) touch<<<1, 32, 0, streams[t]>>>((char *)p);
                cudaFree(p);
            }
        });
    for (auto &th : pool) th.join();
    cudaDeviceSynchronize();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    printf("result: threads=%d pairs_per_s=%.0f failed=%d\n", threads, threads * pairs / s, failed);
    return failed;
}
