// cuMemMap, cuMemSetAccess and cuMemUnmap over spans of N separately mapped
// pages of PAGE_MIB (2) MiB, one call over the span, with a kernel running
// (SPIN 1, the default) or not (BENCHMARKS.md, section 12).
//   nvcc -O2 -arch=native -o vmm_calls vmm_calls.cu -lcuda
//   vmm_calls [PAGE_MIB [SPIN]]
#include <cuda.h>
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
__global__ void spin(long long ns) {
    long long t0; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    long long t = t0; while (t - t0 < ns) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
}
#define CK(x) do { CUresult r = (x); if (r) { printf("fail %s = %d line %d\n", #x, r, __LINE__); exit(1); } } while (0)
static double us(std::chrono::steady_clock::time_point a) { return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count(); }
int main(int argc, char **argv) {
    cudaFree(0);
    CUdevice dev; cuCtxGetDevice(&dev);
    CUmemAllocationProp prop = {}; prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE; prop.location.id = dev;
    size_t page = (size_t)(argc > 1 ? atoi(argv[1]) : 2) << 20;
    CUmemAccessDesc acc = {}; acc.location = prop.location; acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CUdeviceptr va; CK(cuMemAddressReserve(&va, page * 1024, 0, 0, 0)); printf("page %zu MiB\n", page >> 20);
    std::vector<CUmemGenericAllocationHandle> h(64);
    for (int i = 0; i < 64; i++) CK(cuMemCreate(&h[i], page, &prop, 0));
    cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    for (int n : {1, 4, 16, 64}) {
        for (int mode = 0; mode < 2; mode++) {  // 0: per page, 1: one call over the span
            double map_us = 0, acc_us = 0, unmap_us = 0; int reps = 20;
            for (int r = 0; r < reps; r++) {
                if (argc < 3 || atoi(argv[2])) spin<<<1, 1, 0, s>>>(2000000);
                CUdeviceptr base = va + (size_t)((r % 4) * 128) * page;
                auto t = std::chrono::steady_clock::now();
                for (int i = 0; i < n; i++) CK(cuMemMap(base + i * page, page, 0, h[i], 0));
                map_us += us(t); t = std::chrono::steady_clock::now();
                if (mode) CK(cuMemSetAccess(base, n * page, &acc, 1));
                else for (int i = 0; i < n; i++) CK(cuMemSetAccess(base + i * page, page, &acc, 1));
                acc_us += us(t); t = std::chrono::steady_clock::now();
                if (mode) CK(cuMemUnmap(base, n * page));
                else for (int i = 0; i < n; i++) CK(cuMemUnmap(base + i * page, page));
                unmap_us += us(t);
                cudaStreamSynchronize(s);
            }
            printf("pages=%2d %-9s map %7.1f us  access %7.1f us  unmap %7.1f us  (per span of %d pages)\n", n, mode ? "one-call" : "per-page",
                   map_us / reps, acc_us / reps, unmap_us / reps, n);
        }
    }
    return 0;
}
