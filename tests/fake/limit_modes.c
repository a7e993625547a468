/* Test-local program of tests/pool.rs (`limit_modes`), run under `limit=64m`
 * in each mode: the cap is one rule whatever serves the memory. Prints the
 * total cudaMemGetInfo reports (total_mib=), the result codes of 40 MiB that
 * fit (a=), 40 MiB more past the cap through the runtime (b=) and the driver
 * (driver=), and of 3 MiB asked for near the cap after a free (near_cap=),
 * and whether that block holds data (near_cap_works=). */
#include <stdint.h>

#include "fake_cuda_api.h"
#include "fake_cudart_api.h"
#include "check.h"

int main(void)
{
    size_t f = 0, t = 0;
    CHECK(cudaMemGetInfo(&f, &t));
    printf("total_mib=%zu\n", t >> 20);
    void *a = NULL, *b = NULL, *c = NULL;
    int ra = cudaMalloc(&a, 40u << 20);
    printf("a=%d\n", ra);
    printf("b=%d\n", cudaMalloc(&b, 40u << 20));
    CUdeviceptr d = 0;
    printf("driver=%d\n", cuMemAlloc_v2(&d, 40u << 20));
    if (ra == 0)
        CHECK(cudaFree(a));
    int rc = cudaMalloc(&c, 3u << 20);
    printf("near_cap=%d\n", rc);
    printf("near_cap_works=%d\n", rc == 0 && holds_data((CUdeviceptr)(uintptr_t)c, 3u << 20, 7));
    if (rc == 0)
        CHECK(cudaFree(c));
    printf("result: ok\n");
    return 0;
}
