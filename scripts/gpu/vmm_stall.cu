// What VMM calls cost while kernels run: CPU time per call and the GPU time
// they add to a stream of spinning kernels (BENCHMARKS.md, section 12).
//   nvcc -O2 -arch=native -o vmm_stall vmm_stall.cu -lcuda
//   vmm_stall KERNELS SPIN_US OPS_PER_KERNEL WHAT
// WHAT: none | move (unmap a page, map it elsewhere, set access) | make
// (create, map, access; unmap+release later) | access (set access again on a
// mapped page)
#include <cuda.h>
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

__global__ void spin(long long ns) {
    long long t0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    long long t = t0;
    while (t - t0 < ns) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
}

#define CK(x) do { CUresult r = (x); if (r) { printf("fail %s = %d line %d\n", #x, r, __LINE__); exit(1); } } while (0)

int main(int argc, char **argv) {
    int kernels = atoi(argv[1]);
    long long spin_ns = atoll(argv[2]) * 1000;
    int ops = atoi(argv[3]);
    const char *what = argv[4];
    cudaFree(0);
    CUdevice dev; cuCtxGetDevice(&dev);
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    size_t page = 2 << 20;
    CUmemAccessDesc acc = {};
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    int slots = 4096;
    CUdeviceptr va;
    CK(cuMemAddressReserve(&va, page * slots, 0, 0, 0));
    std::vector<CUmemGenericAllocationHandle> h(64);
    for (int i = 0; i < 64; i++) { CK(cuMemCreate(&h[i], page, &prop, 0)); CK(cuMemMap(va + i * page, page, 0, h[i], 0)); }
    CK(cuMemSetAccess(va, page * 64, &acc, 1));
    std::vector<int> at(64); for (int i = 0; i < 64; i++) at[i] = i;
    int next = 64;
    cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    for (int i = 0; i < 20; i++) spin<<<1, 1, 0, s>>>(spin_ns);
    cudaStreamSynchronize(s);
    double op_ns = 0; long nops = 0; double worst = 0;
    std::vector<CUmemGenericAllocationHandle> made;
    cudaEventRecord(e0, s);
    auto c0 = std::chrono::steady_clock::now();
    for (int k = 0; k < kernels; k++) {
        spin<<<1, 1, 0, s>>>(spin_ns);
        for (int o = 0; o < ops; o++) {
            auto t = std::chrono::steady_clock::now();
            if (!strcmp(what, "move")) {
                int i = nops % 64;
                CK(cuMemUnmap(va + at[i] * page, page));
                at[i] = next; next = next + 1 >= slots ? 64 : next + 1;
                CK(cuMemMap(va + at[i] * page, page, 0, h[i], 0));
                CK(cuMemSetAccess(va + at[i] * page, page, &acc, 1));
            } else if (!strcmp(what, "make")) {
                CUmemGenericAllocationHandle m;
                CK(cuMemCreate(&m, page, &prop, 0));
                CK(cuMemMap(va + (64 + made.size()) * page, page, 0, m, 0));
                CK(cuMemSetAccess(va + (64 + made.size()) * page, page, &acc, 1));
                made.push_back(m);
            } else if (!strcmp(what, "access")) {
                CK(cuMemSetAccess(va + (nops % 64) * page, page, &acc, 1));
            } else if (!strcmp(what, "unmapmap")) {
                int i = nops % 64;
                CK(cuMemUnmap(va + at[i] * page, page));
                CK(cuMemMap(va + at[i] * page, page, 0, h[i], 0));
                CK(cuMemSetAccess(va + at[i] * page, page, &acc, 1));
            }
            double d = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t).count();
            op_ns += d; nops++; if (d > worst) worst = d;
        }
    }
    auto c1 = std::chrono::steady_clock::now();
    cudaEventRecord(e1, s);
    cudaEventSynchronize(e1);
    float gpu_ms; cudaEventElapsedTime(&gpu_ms, e0, e1);
    double cpu_ms = std::chrono::duration<double, std::milli>(c1 - c0).count();
    printf("what=%s kernels=%d spin_us=%lld ops=%ld gpu_ms=%.2f ideal_ms=%.2f cpu_enqueue_ms=%.2f op_us=%.1f worst_op_us=%.1f\n",
           what, kernels, spin_ns / 1000, nops, gpu_ms, kernels * spin_ns / 1e6, cpu_ms, nops ? op_ns / nops / 1e3 : 0.0,
           worst / 1e3);
    return 0;
}
