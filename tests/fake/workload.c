/* The runtime-API workload; see workload.h. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cudart_api.h"
#include "workload.h"

#define CHECK_ERROR_NAME(code) cudaGetErrorString((cudaError_t)(code))
#include "check.h"

/* Writes a pattern into [dev, dev+n) through cudaMemcpy and reads it back. */
static int roundtrip(void *dev, size_t n, unsigned seed)
{
    size_t len = n < 65536 ? n : 65536; /* enough to prove the memory works */
    unsigned char *out = malloc(len), *in = malloc(len);
    if (!out || !in) {
        free(out);
        free(in);
        return -1;
    }
    for (size_t i = 0; i < len; i++)
        out[i] = (unsigned char)(i * 31u + seed);
    int ok = cudaMemcpy(dev, out, len, cudaMemcpyHostToDevice) == cudaSuccess &&
             cudaMemcpy(in, dev, len, cudaMemcpyDeviceToHost) == cudaSuccess && memcmp(in, out, len) == 0;
    /* Also touch the last byte. */
    unsigned char last = 0x5a, back = 0;
    ok = ok && cudaMemcpy((char *)dev + n - 1, &last, 1, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemcpy(&back, (char *)dev + n - 1, 1, cudaMemcpyDeviceToHost) == cudaSuccess && back == last;
    free(out);
    free(in);
    return ok ? 0 : -1;
}

int workload_run(void)
{
    static const size_t sizes[] = {1,      7,      64,     255,    256,       1000,      4096,   65536,
                                   100000, 262144, 999999, 1 << 20, 3 << 20, 5000000, 8 << 20};
    const size_t nsizes = sizeof(sizes) / sizeof(sizes[0]);
    unsigned allocs = 0, frees = 0;
    unsigned long long leaked = 0;

    CHECK(cudaFree(NULL)); /* initialise */

    for (unsigned i = 0; i < 100; i++) {
        size_t n = sizes[i % nsizes];
        void *p = NULL;
        CHECK(cudaMalloc(&p, n));
        allocs++;
        if (!p || ((uintptr_t)p & 255))
            FAIL("cudaMalloc(%zu) returned misaligned %p", n, p);
        if (roundtrip(p, n, i) != 0)
            FAIL("memory at %p (%zu bytes) does not hold data", p, n);
        CHECK(cudaFree(p));
        frees++;
    }

    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    void *pa = NULL;
    CHECK(cudaMallocAsync(&pa, 12345, s));
    allocs++;
    if (roundtrip(pa, 12345, 1) != 0)
        FAIL("async memory does not hold data");
    CHECK(cudaFreeAsync(pa, s));
    frees++;

    void *pm = NULL;
    CHECK(cudaMallocManaged(&pm, 40000, cudaMemAttachGlobal));
    allocs++;
    if (roundtrip(pm, 40000, 2) != 0)
        FAIL("managed memory does not hold data");
    CHECK(cudaFree(pm));
    frees++;

    void *pp = NULL;
    size_t pitch = 0;
    CHECK(cudaMallocPitch(&pp, &pitch, 100, 10));
    allocs++;
    if (pitch != 512)
        FAIL("cudaMallocPitch pitch %zu, expected 512", pitch);
    if (roundtrip(pp, pitch * 10, 3) != 0)
        FAIL("pitched memory does not hold data");
    CHECK(cudaFree(pp));
    frees++;

    struct cudaPitchedPtr p3 = {0};
    struct cudaExtent ext = {70, 5, 3};
    CHECK(cudaMalloc3D(&p3, ext));
    allocs++;
    if (!p3.ptr || p3.pitch != 512 || p3.xsize != 70 || p3.ysize != 5)
        FAIL("cudaMalloc3D returned ptr=%p pitch=%zu xsize=%zu ysize=%zu", p3.ptr, p3.pitch, p3.xsize, p3.ysize);
    if (roundtrip(p3.ptr, p3.pitch * 5 * 3, 4) != 0)
        FAIL("3D memory does not hold data");
    CHECK(cudaFree(p3.ptr));
    frees++;

    void *ph = NULL;
    CHECK(cudaMallocHost(&ph, 4096));
    memset(ph, 1, 4096);
    CHECK(cudaFreeHost(ph));
    CHECK(cudaHostAlloc(&ph, 8192, cudaHostAllocDefault));
    memset(ph, 2, 8192);
    CHECK(cudaFreeHost(ph));

    size_t free_b = 0, total_b = 0;
    CHECK(cudaMemGetInfo(&free_b, &total_b));
    if (total_b == 0 || free_b > total_b)
        FAIL("cudaMemGetInfo free=%zu total=%zu", free_b, total_b);
    printf("meminfo free=%zu total=%zu\n", free_b, total_b);

    /* Freeing a pointer that was never allocated. */
    cudaError_t e = cudaFree((void *)(uintptr_t)0x123400);
    printf("bogus_free=%d\n", e);
    if (e != cudaErrorInvalidValue)
        FAIL("cudaFree(bogus) returned %d, expected %d", e, cudaErrorInvalidValue);
    if (cudaGetLastError() != cudaErrorInvalidValue || cudaGetLastError() != cudaSuccess)
        FAIL("cudaGetLastError does not report and clear the bogus free");

    /* More than the device has. */
    void *big = NULL;
    e = cudaMalloc(&big, total_b + 1);
    printf("oversized_malloc=%d\n", e);
    if (e != cudaErrorMemoryAllocation)
        FAIL("cudaMalloc(total+1) returned %d, expected %d", e, cudaErrorMemoryAllocation);
    (void)cudaGetLastError();

    CHECK(cudaStreamDestroy(s));

    /* Driver entry points through the runtime, as PyTorch resolves cuMem*.
     * Only resolved, not called, so the counts above stay as they are. */
    void *fn = NULL;
    int status = -1;
    CHECK(cudaGetDriverEntryPointByVersion("cuMemAlloc", &fn, 12000, cudaEnableDefault, &status));
    if (!fn || status != 0)
        FAIL("cudaGetDriverEntryPointByVersion(cuMemAlloc): fn=%p status=%d", fn, status);
    CHECK(cudaGetDriverEntryPoint("cuNoSuchFunction", &fn, cudaEnableDefault, &status));
    if (fn || status != 1)
        FAIL("cudaGetDriverEntryPoint(unknown): fn=%p status=%d", fn, status);

    /* Deliberate leaks. */
    void *l1 = NULL, *l2 = NULL, *l3 = NULL, *l4 = NULL;
    CHECK(cudaMalloc(&l1, LEAK_MALLOC));
    allocs++;
    leaked += LEAK_MALLOC;
    CHECK(cudaMallocAsync(&l2, LEAK_ASYNC, NULL));
    allocs++;
    leaked += LEAK_ASYNC;
    CHECK(cudaMallocManaged(&l3, LEAK_MANAGED, cudaMemAttachGlobal));
    allocs++;
    leaked += LEAK_MANAGED;
    CHECK(cudaMallocPitch(&l4, &pitch, LEAK_PITCH_WIDTH, LEAK_PITCH_HEIGHT));
    allocs++;
    if (pitch * LEAK_PITCH_HEIGHT != LEAK_PITCH_BYTES)
        FAIL("leak pitch %zu", pitch);
    leaked += LEAK_PITCH_BYTES;
    printf("leaks %p %p %p %p\n", l1, l2, l3, l4);

    printf("result: ok allocs=%u frees=%u leaked_bytes=%llu\n", allocs, frees, leaked);
    fflush(stdout);
    return 0;
}
