/* Test-local program of tests/pool.rs (`limit`), run under `limit=64m` and
 * without a limit. Prints what cudaMemGetInfo / cuMemGetInfo_v2 report
 * before (free0=, total0=) and while (free1=, total1=, drv_free1=,
 * drv_total1=) it holds 3,000,000 B of device memory and 1 MiB of managed
 * memory; the result codes of cudaMalloc(100 MiB) (big=, and whether the
 * out-parameter stayed untouched: big_untouched=) and of cudaMalloc(50 MiB)
 * before (mid=) and after (mid_after_free=) freeing the 3,000,000 B block;
 * whether blocks hold data (small_works=, mid_works=); and the result codes
 * of the memory queries with NULL out-parameters. */
#include <stdint.h>

#include "fake_cuda_api.h"
#include "fake_cudart_api.h"
#include "check.h"

static int works(void *p, size_t n)
{
    return holds_data((CUdeviceptr)(uintptr_t)p, n, 1);
}

int main(void)
{
    size_t f = 0, t = 0;
    CHECK(cudaMemGetInfo(&f, &t));
    printf("free0=%zu\ntotal0=%zu\n", f, t);
    void *a = NULL, *m = NULL;
    CHECK(cudaMalloc(&a, 3000000));
    CHECK(cudaMallocManaged(&m, 1 << 20, cudaMemAttachGlobal));
    CHECK(cudaMemGetInfo(&f, &t));
    printf("free1=%zu\ntotal1=%zu\n", f, t);
    CHECK(cuMemGetInfo_v2(&f, &t));
    printf("drv_free1=%zu\ndrv_total1=%zu\n", f, t);
    void *big = (void *)(uintptr_t)0x77;
    printf("big=%d\n", cudaMalloc(&big, 100u << 20));
    printf("big_untouched=%d\n", big == (void *)(uintptr_t)0x77);
    void *mid = NULL;
    printf("mid=%d\n", cudaMalloc(&mid, 50u << 20));
    void *s = NULL;
    CHECK(cudaMalloc(&s, 4096));
    printf("small_works=%d\n", works(s, 4096));
    CHECK(cudaFree(a));
    printf("mid_after_free=%d\n", cudaMalloc(&mid, 50u << 20));
    printf("mid_works=%d\n", mid && works(mid, 50u << 20));
    printf("drv_null_free=%d\n", cuMemGetInfo_v2(NULL, &t));
    printf("drv_null_total=%d\n", cuMemGetInfo_v2(&f, NULL));
    printf("rt_null_free=%d\n", cudaMemGetInfo(NULL, &t));
    CHECK(cudaFree(mid));
    CHECK(cudaFree(s));
    CHECK(cudaFree(m));
    printf("result: ok allocs=4 frees=4 leaked_bytes=0\n");
    return 0;
}
