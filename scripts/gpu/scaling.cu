// Allocation throughput against threads: each thread makes its own
// non-blocking stream and repeats cudaMalloc(4 KiB), an empty kernel on its
// stream that takes the buffer, cudaFree. Prints pairs per second over all
// threads (scripts/gpu-bench.sh, section "scaling"). LAUNCH 0 leaves the
// kernel out (the streams still exist): allocation alone, which the driver's
// launch path does not serialise. ALLOCATOR "async" uses CUDA's own
// stream-ordered pool instead (cudaMallocAsync/cudaFreeAsync on the thread's
// stream), the baseline that a pool must scale against.
//
// Besides the wall-clock rate it prints the CPU time the threads spent per
// pair (CLOCK_THREAD_CPUTIME_ID over each thread's loop): a rate can fall
// because threads wait for each other or because the machine runs eight
// busy cores slower than one, and only the first is the allocator's doing.
// Per thread it also reads its own loop's wall time and context switches
// (getrusage RUSAGE_THREAD): wall time well above CPU time with voluntary
// switches means threads sleep on each other (a futex); without them, the
// threads were descheduled. The last thread's start and the longest loop,
// against the whole run, tell threads that started late from one that ran long.
//
// With SCALING_MAX_BYTES set, each request's size is drawn anew from
// 1..SCALING_MAX_BYTES (xorshift, a sequence per thread) instead of 4 KiB:
// sizes that seldom come back, which a thread's magazine does not serve.
//
// With SCALING_PER_THREAD set, a line per thread follows: its start, CPU
// time and loop time per pair, and its switches, so that a thread that ran
// long can be told from one that started late or slept.
//
// With SCALING_START_AT set (a time of the realtime clock, in seconds since
// the epoch), the threads' loops begin then, once CUDA is ready: processes
// started together begin their loops together (scripts/gpu-scaling.sh runs
// one process per thread so, sharing nothing); the result line then tells
// when the loops began and the last one ended (begin_unix, end_unix).
//
// ALLOCATOR "keep" is cudaMalloc as by default, with one 512-byte block left
// allocated to the end: with its trace off cupool writes a log only when
// something is left, and the log's end record says what the pool's fences
// and the threads' magazines did (scripts/gpu-scaling.sh reads it).
//   scaling THREADS PAIRS_PER_THREAD [LAUNCH] [ALLOCATOR]
#include <cuda_runtime.h>
#include <sys/resource.h>
#include <time.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "thread_cpu.h"

__global__ void touch(char *p) {
    if (threadIdx.x == 0 && p == nullptr) p[0] = 0;
}

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 1;
    const long pairs = argc > 2 ? atol(argv[2]) : 20000;
    const bool launch = argc > 3 ? atoi(argv[3]) != 0 : true;
    const bool async = argc > 4 && strcmp(argv[4], "async") == 0;
    const bool keep = argc > 4 && strcmp(argv[4], "keep") == 0;
    const char *max_env = getenv("SCALING_MAX_BYTES");
    const unsigned max_bytes = max_env ? (unsigned)atoi(max_env) : 0;
    cudaFree(nullptr);
    void *kept = nullptr;
    if (keep) cudaMalloc(&kept, 512);
    std::vector<cudaStream_t> streams(threads);
    for (auto &s : streams) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    std::atomic<int> failed{0};
    std::vector<double> cpu(threads), wall(threads), started(threads);
    std::vector<long> voluntary(threads), involuntary(threads);
    auto unix_s = [] {
        timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        return ts.tv_sec + ts.tv_nsec * 1e-9;
    };
    if (const char *at = getenv("SCALING_START_AT")) {
        const double wait = atof(at) - unix_s();
        if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    }
    const double begin_unix = unix_s();
    auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; t++)
        pool.emplace_back([&, t] {
            rusage u0, u1;
            getrusage(RUSAGE_THREAD, &u0);
            const auto w0 = std::chrono::steady_clock::now();
            started[t] = std::chrono::duration<double>(w0 - t0).count();
            const double c0 = thread_cpu_s();
            unsigned x = 0x9e3779b9u * (unsigned)(t + 1);
            for (long i = 0; i < pairs; i++) {
                void *p;
                size_t n = 4096;
                if (max_bytes) {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    n = 1 + x % max_bytes;
                }
                cudaError_t e = async ? cudaMallocAsync(&p, n, streams[t]) : cudaMalloc(&p, n);
                if (e != cudaSuccess) { failed = 1; break; }
                if (launch) touch<<<1, 32, 0, streams[t]>>>((char *)p);
                if (async) cudaFreeAsync(p, streams[t]); else cudaFree(p);
            }
            cpu[t] = thread_cpu_s() - c0;
            wall[t] = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
            getrusage(RUSAGE_THREAD, &u1);
            voluntary[t] = u1.ru_nvcsw - u0.ru_nvcsw;
            involuntary[t] = u1.ru_nivcsw - u0.ru_nivcsw;
        });
    for (auto &th : pool) th.join();
    const double end_unix = unix_s();
    cudaDeviceSynchronize();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double cpu_s = 0, wall_s = 0, last_start = 0, longest = 0;
    long vcsw = 0, ivcsw = 0;
    for (int t = 0; t < threads; t++) {
        cpu_s += cpu[t];
        wall_s += wall[t];
        last_start = std::max(last_start, started[t]);
        longest = std::max(longest, wall[t]);
        vcsw += voluntary[t];
        ivcsw += involuntary[t];
    }
    if (getenv("SCALING_PER_THREAD"))
        for (int t = 0; t < threads; t++)
            printf("thread %d start_ms=%.2f cpu_ns_per_pair=%.0f loop_ns_per_pair=%.0f vcsw=%ld ivcsw=%ld\n", t,
                   started[t] * 1e3, cpu[t] * 1e9 / pairs, wall[t] * 1e9 / pairs, voluntary[t], involuntary[t]);
    printf("result: threads=%d pairs_per_s=%.0f cpu_ns_per_pair=%.0f loop_ns_per_pair=%.0f vcsw=%ld ivcsw=%ld "
           "longest_loop_ns_per_pair=%.0f last_start_ms=%.2f failed=%d begin_unix=%.6f end_unix=%.6f\n",
           threads, threads * pairs / s, cpu_s * 1e9 / (threads * pairs), wall_s * 1e9 / (threads * pairs), vcsw, ivcsw,
           longest * 1e9 / pairs, last_start * 1e3, failed.load(), begin_unix, end_unix);
    return failed;
}
