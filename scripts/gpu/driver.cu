// Driver-API workload: own contexts, VMM, pinned host memory, and a leak that
// dies with a destroyed context (a checkpoint leak) plus one live at exit.
#include <cuda.h>
#include <cstdio>
#include <cstdlib>

#define CK(x) do { CUresult r = (x); if (r != CUDA_SUCCESS) { const char* s; cuGetErrorString(r, &s); printf("FAIL %s: %s\n", #x, s); return 1; } } while (0)

int main(int argc, char** argv) {
    int loops = argc > 1 ? atoi(argv[1]) : 100;
    size_t device_allocs = 0;
    CK(cuInit(0));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    CUcontext primary;
    CK(cuDevicePrimaryCtxRetain(&primary, dev));
    CK(cuCtxSetCurrent(primary));
    for (int i = 0; i < loops; i++) {
        CUdeviceptr p;
        size_t size = (size_t(1) << (i % 22)) + 7 * i;
        CK(cuMemAlloc(&p, size));
        device_allocs++;
        CK(cuMemsetD8(p, 1, size));
        CK(cuMemFree(p));
    }
    CUdeviceptr pitched; size_t pitch;
    CK(cuMemAllocPitch(&pitched, &pitch, 1000, 10, 4)); device_allocs++;
    CK(cuMemFree(pitched));
    CUdeviceptr managed;
    CK(cuMemAllocManaged(&managed, 1 << 20, CU_MEM_ATTACH_GLOBAL)); device_allocs++;
    CK(cuMemFree(managed));
    CUmemoryPool dpool;
    CK(cuDeviceGetDefaultMemPool(&dpool, dev));
    CUdeviceptr fp;
    CK(cuMemAllocFromPoolAsync(&fp, 1 << 16, dpool, 0)); device_allocs++;
    CK(cuMemAllocAsync(&pitched, 1 << 16, 0)); device_allocs++;
    CK(cuMemFreeAsync(fp, 0));
    CK(cuMemFreeAsync(pitched, 0));
    CK(cuStreamSynchronize(0));
    void* host;
    CK(cuMemAllocHost(&host, 1 << 16));
    CK(cuMemFreeHost(host));
    CK(cuMemHostAlloc(&host, 1 << 16, 0));
    CK(cuMemFreeHost(host));

    // VMM: observed (create/release counted, map/unmap in the timeline), never pooled.
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t gran;
    CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUmemGenericAllocationHandle h;
    CK(cuMemCreate(&h, gran, &prop, 0));
    CUdeviceptr va;
    CK(cuMemAddressReserve(&va, gran, 0, 0, 0));
    CK(cuMemMap(va, gran, 0, h, 0));
    CK(cuMemUnmap(va, gran));
    CK(cuMemAddressFree(va, gran));
    CK(cuMemRelease(h));

    size_t free_b = 0, total_b = 0;
    CK(cuMemGetInfo(&free_b, &total_b));
    CUresult null_out = cuMemGetInfo(NULL, &total_b);
    printf("cuMemGetInfo(NULL) -> %d\n", (int)null_out);

    // A context of our own that dies holding 5000011 bytes.
    CUcontext own;
#if CUDA_VERSION >= 13000
    CK(cuCtxCreate(&own, NULL, 0, dev));
#else
    CK(cuCtxCreate(&own, 0, dev));
#endif
    CUdeviceptr doomed;
    CK(cuMemAlloc(&doomed, 5000011)); device_allocs++;
    CK(cuCtxDestroy(own));
    CK(cuCtxSetCurrent(primary));
    CUdeviceptr leak;
    CK(cuMemAlloc(&leak, 4000037)); device_allocs++;
    printf("result: device_allocs=%zu leaks=2 leaked_bytes=%zu\n", device_allocs, (size_t)4000037 + 5000011);
    return 0;
}
