/* Driver-API program, linked directly against libcuda.so.1 (-lcuda) and
 * calling the driver by symbol, as JAX/XLA-style code does.
 *
 * Device 0 (primary context): assorted allocations, all freed, VMM, and one
 * leak of LEAK_EXIT bytes that is still live at exit.
 * Device 1 (a cuCtxCreate_v2 context): a few allocations and one leak of
 * LEAK_CTX bytes, then cuCtxDestroy_v2, which releases that memory (a
 * "checkpoint" leak: gone from the device, never freed by the program).
 *
 * Prints "checkpoint_leaked_bytes=<LEAK_CTX>" before the result line; the
 * result line's leaked_bytes counts both leaks. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "fake_cuda_api.h"
#include "check.h"

#define LEAK_EXIT 4000037u
#define LEAK_CTX 5000011u

static unsigned allocs, frees;

/* Writes and reads back a pattern through the driver copy functions. */
static int roundtrip(CUdeviceptr p, size_t n)
{
    unsigned char out[4096], in[4096];
    size_t len = n < sizeof(out) ? n : sizeof(out);
    for (size_t i = 0; i < len; i++)
        out[i] = (unsigned char)(i ^ 0xa5);
    if (cuMemcpyHtoD_v2(p, out, len) || cuMemcpyDtoH_v2(in, p, len) || memcmp(in, out, len))
        return -1;
    if (cuMemsetD8_v2(p, 0x3c, n) || cuMemcpyDtoH_v2(in, p + n - 1, 1) || in[0] != 0x3c)
        return -1;
    return 0;
}

int main(void)
{
    CUdeviceptr p = 0;
    unsigned long long leaked = 0;

    /* Before cuInit nothing works. */
    EXPECT(cuMemAlloc_v2(&p, 4096), CUDA_ERROR_NOT_INITIALIZED);

    CHECK(cuInit(0));
    int ndev = 0, version = 0;
    CHECK(cuDriverGetVersion(&version));
    CHECK(cuDeviceGetCount(&ndev));
    if (ndev < 2)
        FAIL("need 2 devices, have %d", ndev);
    char name[64];
    CHECK(cuDeviceGetName(name, sizeof(name), 0));
    size_t dev_total = 0;
    CHECK(cuDeviceTotalMem_v2(&dev_total, 0));
    printf("driver %d, %d devices, %s, %zu bytes\n", version, ndev, name, dev_total);

    /* Initialised but no current context. */
    EXPECT(cuMemAlloc_v2(&p, 4096), CUDA_ERROR_INVALID_CONTEXT);

    CUdevice d0, d1;
    CUcontext prim;
    CHECK(cuDeviceGet(&d0, 0));
    CHECK(cuDeviceGet(&d1, 1));
    CHECK(cuDevicePrimaryCtxRetain(&prim, d0));
    CHECK(cuCtxSetCurrent(prim));

    EXPECT(cuMemAlloc_v2(&p, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemAlloc_v2(NULL, 16), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemFree_v2((CUdeviceptr)0x123400), CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemFree_v2(0));

    for (unsigned i = 0; i < 50; i++) {
        size_t n = 1 + (size_t)i * 40503u % (2u << 20);
        CHECK(cuMemAlloc_v2(&p, n));
        allocs++;
        if (roundtrip(p, n))
            FAIL("memory of cuMemAlloc_v2(%zu) does not hold data", n);
        CHECK(cuMemFree_v2(p));
        frees++;
    }

    size_t pitch = 0;
    CHECK(cuMemAllocPitch_v2(&p, &pitch, 1000, 20, 4));
    allocs++;
    if (pitch != 1024)
        FAIL("pitch %zu, expected 1024", pitch);
    CUdeviceptr base = 0;
    size_t range = 0;
    CHECK(cuMemGetAddressRange_v2(&base, &range, p + 5000));
    if (base != p || range != pitch * 20)
        FAIL("cuMemGetAddressRange_v2 gave base %#llx size %zu", base, range);
    CHECK(cuMemFree_v2(p));
    frees++;

    CHECK(cuMemAllocManaged(&p, 70000, CU_MEM_ATTACH_GLOBAL));
    allocs++;
    int ordinal = -1;
    CHECK(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p + 1));
    if (ordinal != 0)
        FAIL("managed memory on device %d", ordinal);
    CHECK(cuMemFree_v2(p));
    frees++;

    CUstream s;
    CHECK(cuStreamCreate(&s, 0));
    int capturing = -1;
    CHECK(cuStreamIsCapturing(s, &capturing));
    CHECK(cuMemAllocAsync(&p, 300000, s));
    allocs++;
    if (roundtrip(p, 300000))
        FAIL("async memory does not hold data");
    CHECK(cuMemFreeAsync(p, s));
    frees++;
    CUevent ev;
    CHECK(cuEventCreate(&ev, 0));
    CHECK(cuEventRecord(ev, s));
    CUresult q = cuEventQuery(ev); /* not ready yet under FAKE_CUDA_EVENT_LATENCY_US */
    if (q != CUDA_SUCCESS && q != CUDA_ERROR_NOT_READY)
        FAIL("cuEventQuery -> %d", q);
    CHECK(cuEventSynchronize(ev));
    CHECK(cuEventQuery(ev));
    CHECK(cuEventDestroy_v2(ev));
    CHECK(cuStreamSynchronize(s));
    CHECK(cuStreamDestroy_v2(s));

    void *h1 = NULL, *h2 = NULL;
    CHECK(cuMemAllocHost_v2(&h1, 10000));
    CHECK(cuMemHostAlloc(&h2, 20000, 0));
    memset(h1, 1, 10000);
    memset(h2, 2, 20000);
    CHECK(cuMemFreeHost(h1));
    CHECK(cuMemFreeHost(h2));

    /* Virtual memory management: physical handle, reservation, mapping. */
    const size_t vsz = 2u << 20;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemGenericAllocationHandle handle;
    CUdeviceptr va = 0;
    size_t free0 = 0, free1 = 0, total = 0;
    CHECK(cuMemGetInfo_v2(&free0, &total));
    CHECK(cuMemCreate(&handle, vsz, &prop, 0));
    CHECK(cuMemGetInfo_v2(&free1, &total));
    if (free0 - free1 != vsz)
        FAIL("cuMemCreate(%zu) changed free memory by %zu", vsz, free0 - free1);
    CHECK(cuMemAddressReserve(&va, vsz, vsz, 0, 0));
    CHECK(cuMemMap(va, vsz, 0, handle, 0));
    CUmemAccessDesc access = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
                              .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CHECK(cuMemSetAccess(va, vsz, &access, 1));
    if (roundtrip(va, vsz))
        FAIL("mapped memory does not hold data");
    CHECK(cuMemUnmap(va, vsz));
    CHECK(cuMemAddressFree(va, vsz));
    CHECK(cuMemRelease(handle));

    CHECK(cuMemGetInfo_v2(&free0, &total));
    EXPECT(cuMemGetInfo_v2(NULL, &total), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemGetInfo_v2(&free0, NULL), CUDA_ERROR_INVALID_VALUE);
    printf("meminfo free=%zu total=%zu\n", free0, total);

    /* Leak on device 0, live at exit. */
    CUdeviceptr leak0 = 0;
    CHECK(cuMemAlloc_v2(&leak0, LEAK_EXIT));
    allocs++;
    leaked += LEAK_EXIT;

    /* Device 1 in its own context. */
    CUcontext c1;
    CHECK(cuCtxCreate_v2(&c1, 0, d1));
    CUdevice cur = -1;
    CHECK(cuCtxGetDevice(&cur));
    if (cur != d1)
        FAIL("current device %d after cuCtxCreate_v2, expected 1", cur);
    for (unsigned i = 0; i < 5; i++) {
        CHECK(cuMemAlloc_v2(&p, 100000 + i));
        allocs++;
        CHECK(cuMemFree_v2(p));
        frees++;
    }
    CUdeviceptr leak1 = 0;
    CHECK(cuMemAlloc_v2(&leak1, LEAK_CTX));
    allocs++;
    leaked += LEAK_CTX;
    CHECK(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, leak1));
    if (ordinal != 1)
        FAIL("allocation in device-1 context reports device %d", ordinal);
    CHECK(cuCtxSynchronize());
    CHECK(cuCtxDestroy_v2(c1));

    /* Back on the primary context; the device-1 memory is gone. */
    CUcontext now = NULL;
    CHECK(cuCtxGetCurrent(&now));
    if (now != prim)
        FAIL("current context after destroy is %p, expected primary %p", (void *)now, (void *)prim);
    CUdeviceptr start = 0;
    EXPECT(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, leak1), CUDA_ERROR_INVALID_VALUE);
    CHECK(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, leak0 + 17));
    if (start != leak0)
        FAIL("range start of leak0");

    printf("leaks %#llx %#llx\n", leak0, leak1);
    printf("checkpoint_leaked_bytes=%u\n", LEAK_CTX);
    printf("result: ok allocs=%u frees=%u leaked_bytes=%llu\n", allocs, frees, leaked);
    return 0;
}
