// What the driver's context queries cost from several threads at once: each
// thread makes the primary context current and calls one query in a loop.
// The pooled cudaMalloc asks cuCtxGetId once per call, so a query that slows
// when threads meet in the driver slows the pool's scaling with it.
//   ctx_calls THREADS CALLS_PER_THREAD
#include <cuda.h>
#include <cuda_runtime.h>
#include <time.h>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "thread_cpu.h"

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 1;
    const long calls = argc > 2 ? atol(argv[2]) : 1000000;
    cudaFree(nullptr);
    CUcontext ctx;
    cuCtxGetCurrent(&ctx);
    const char *names[] = {"cuCtxGetId", "cuCtxGetCurrent", "cuCtxGetDevice"};
    for (int q = 0; q < 3; q++) {
        std::vector<double> cpu(threads);
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; t++)
            pool.emplace_back([&, t] {
                cuCtxSetCurrent(ctx);
                const double c0 = thread_cpu_s();
                unsigned long long id;
                CUcontext c;
                CUdevice d;
                for (long i = 0; i < calls; i++) {
                    if (q == 0) cuCtxGetId(nullptr, &id);
                    else if (q == 1) cuCtxGetCurrent(&c);
                    else cuCtxGetDevice(&d);
                }
                cpu[t] = thread_cpu_s() - c0;
            });
        for (auto &th : pool) th.join();
        double sum = 0;
        for (double c : cpu) sum += c;
        printf("result: query=%s threads=%d cpu_ns_per_call=%.1f\n", names[q], threads, sum * 1e9 / (threads * calls));
    }
}
