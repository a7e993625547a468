/* "Static-runtime-like" driver user: no link-time dependency on libcuda; it
 * finds the driver the way cudart does (dlopen + dlsym("cuGetProcAddress_v2")
 * + cuGetProcAddress_v2 per entry point).  Allocates 10 blocks, frees 9.
 *
 * Also prints "getproc_matches_dlsym=<0|1>": whether cuGetProcAddress_v2
 * handed out the same addresses as dlsym on the driver handle.  Without a
 * shim this must be 1; a shim may legitimately change it. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "fake_cuda_api.h"
#include "check.h"

#define LEAK_BYTES 10007u

static __typeof__(cuGetProcAddress_v2) *get_proc;

static void *get(const char *name, unsigned long long flags)
{
    void *fn = NULL;
    int status = -1;
    if (get_proc(name, &fn, 13000, flags, &status) != CUDA_SUCCESS || status != 0)
        return NULL;
    return fn;
}

int main(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h)
        FAIL("dlopen(libcuda.so.1): %s", dlerror());
    get_proc = (__typeof__(get_proc))dlsym(h, "cuGetProcAddress_v2");
    if (!get_proc)
        FAIL("dlsym(cuGetProcAddress_v2)");

    __typeof__(cuInit) *init = get("cuInit", 0);
    __typeof__(cuDevicePrimaryCtxRetain) *retain = get("cuDevicePrimaryCtxRetain", 0);
    __typeof__(cuCtxSetCurrent) *set_current = get("cuCtxSetCurrent", 0);
    __typeof__(cuMemAlloc_v2) *mem_alloc = get("cuMemAlloc", 0);
    __typeof__(cuMemFree_v2) *mem_free = get("cuMemFree", 0);
    __typeof__(cuMemGetInfo_v2) *mem_info = get("cuMemGetInfo", 0);
    __typeof__(cuMemAllocAsync) *alloc_async_ptsz =
        get("cuMemAllocAsync", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    void *self = get("cuGetProcAddress", 0);
    if (!init || !retain || !set_current || !mem_alloc || !mem_free || !mem_info || !alloc_async_ptsz || !self)
        FAIL("cuGetProcAddress_v2 did not resolve every entry point");

    /* Unknown names are not found. */
    void *fn = (void *)1;
    int status = -1;
    if (get_proc("cuNoSuchFunction", &fn, 13000, 0, &status) != CUDA_ERROR_NOT_FOUND || fn || status != 1)
        FAIL("unknown symbol: fn=%p status=%d", fn, status);

    /* Too old a CUDA version for the stream-ordered allocator. */
    fn = (void *)1;
    status = -1;
    if (get_proc("cuMemAllocAsync", &fn, 11000, 0, &status) != CUDA_ERROR_NOT_FOUND || fn || status != 2)
        FAIL("cuMemAllocAsync for CUDA 11.0: fn=%p status=%d", fn, status);
    /* Before 12.0, "cuGetProcAddress" is the 4-argument version. */
    void *self_v1 = NULL;
    if (get_proc("cuGetProcAddress", &self_v1, 11080, 0, &status) != CUDA_SUCCESS || !self_v1)
        FAIL("cuGetProcAddress for CUDA 11.8");

    int same = self_v1 == dlsym(h, "cuGetProcAddress") && self == dlsym(h, "cuGetProcAddress_v2") &&
               (void *)init == dlsym(h, "cuInit") && (void *)mem_alloc == dlsym(h, "cuMemAlloc_v2") &&
               (void *)mem_free == dlsym(h, "cuMemFree_v2") && (void *)mem_info == dlsym(h, "cuMemGetInfo_v2") &&
               (void *)alloc_async_ptsz == dlsym(h, "cuMemAllocAsync_ptsz");
    printf("getproc_matches_dlsym=%d\n", same);

    CUcontext ctx;
    if (init(0) || retain(&ctx, 0) || set_current(ctx))
        FAIL("driver initialisation");

    CUdeviceptr p[10];
    unsigned allocs = 0, frees = 0;
    for (unsigned i = 0; i < 10; i++) {
        size_t n = i == 9 ? LEAK_BYTES : 1000u * (i + 1);
        if (mem_alloc(&p[i], n) != CUDA_SUCCESS)
            FAIL("cuMemAlloc(%zu)", n);
        memset((void *)(uintptr_t)p[i], (int)i, n);
        allocs++;
    }
    for (unsigned i = 0; i < 9; i++) {
        if (mem_free(p[i]) != CUDA_SUCCESS)
            FAIL("cuMemFree");
        frees++;
    }
    size_t free_b = 0, total_b = 0;
    if (mem_info(&free_b, &total_b) != CUDA_SUCCESS || free_b > total_b)
        FAIL("cuMemGetInfo");
    printf("result: ok allocs=%u frees=%u leaked_bytes=%u\n", allocs, frees, LEAK_BYTES);
    return 0;
}
