// Runtime-API workload with planted leaks, built twice by gpu-check.sh:
// with -cudart shared and with nvcc's default static cudart.
// Prints its own count of device allocations, the ground truth cupool must match.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("FAIL %s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

__global__ void fill(unsigned char* p, size_t n, unsigned char v) {
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = v;
}

int main(int argc, char** argv) {
    int loops = argc > 1 ? atoi(argv[1]) : 200;
    size_t device_allocs = 0, host_allocs = 0;
    for (int i = 0; i < loops; i++) {
        void* p;
        size_t size = (size_t(1) << (i % 24)) + i;
        CHECK(cudaMalloc(&p, size));
        device_allocs++;
        fill<<<64, 256>>>((unsigned char*)p, size, (unsigned char)i);
        CHECK(cudaFree(p));
    }
    void *a, *m, *pitched, *h1, *h2;
    size_t pitch;
    CHECK(cudaMallocAsync(&a, 1 << 20, 0)); device_allocs++;
    CHECK(cudaFreeAsync(a, 0));
    cudaMemPool_t mempool;
    CHECK(cudaDeviceGetDefaultMemPool(&mempool, 0));
    void* fp;
    CHECK(cudaMallocFromPoolAsync(&fp, 1 << 16, mempool, 0)); device_allocs++;
    CHECK(cudaFreeAsync(fp, 0));
    CHECK(cudaMallocManaged(&m, 1 << 20)); device_allocs++;
    CHECK(cudaFree(m));
    CHECK(cudaMallocPitch(&pitched, &pitch, 1000, 10)); device_allocs++;
    CHECK(cudaFree(pitched));
    cudaPitchedPtr p3;
    CHECK(cudaMalloc3D(&p3, make_cudaExtent(100, 10, 10))); device_allocs++;
    CHECK(cudaFree(p3.ptr));
    CHECK(cudaMallocHost(&h1, 1 << 16)); host_allocs++;
    CHECK(cudaHostAlloc(&h2, 1 << 16, cudaHostAllocDefault)); host_allocs++;
    CHECK(cudaFreeHost(h1));
    CHECK(cudaFreeHost(h2));
    cudaError_t bad = cudaFree((void*)0x1234);
    printf("invalid free -> %d\n", (int)bad);
    cudaGetLastError();
    void* huge;
    cudaError_t oom = cudaMalloc(&huge, (size_t)1 << 50);
    printf("huge malloc -> %d\n", (int)oom);
    cudaGetLastError();

    // Planted leaks: the set compute-sanitizer --leak-check full must also report.
    void *l1, *l2, *l3, *l5;
    CUdeviceptr l4;
    size_t lpitch;
    CHECK(cudaMalloc(&l1, 1000003));
    CHECK(cudaMallocAsync(&l2, 2000003, 0));
    CHECK(cudaStreamSynchronize(0));
    CHECK(cudaMallocManaged(&l3, 3000017));
    if (cuMemAlloc(&l4, 4000037) != CUDA_SUCCESS) { printf("FAIL cuMemAlloc\n"); return 1; }
    CHECK(cudaMallocPitch(&l5, &lpitch, 500, 7));
    device_allocs += 5;
    CHECK(cudaDeviceSynchronize());
    printf("result: device_allocs=%zu host_allocs=%zu leaks=5 leaked_bytes=%zu\n", device_allocs, host_allocs,
           (size_t)1000003 + 2000003 + 3000017 + 4000037 + lpitch * 7);
    return 0;
}
