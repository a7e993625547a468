/* Test-local program of tests/pool.rs (`reset`).
 * Usage: reset [w][c]
 * x = cuMemAlloc_v2(1000) in the primary context of device 0, then
 * cuDevicePrimaryCtxReset_v2(0), which destroys x (and only x: other contexts
 * keep their memory), then the primary context is retained again and used
 * (y_works=). `w`: a 512 B allocation is made and freed before x, so x is not
 * the process's first allocation. `c`: a second context on device 0 holds
 * blocks a and b (one pool segment) across the reset; afterwards a is freed
 * (a_free=), b must still hold its data (b_works=) and be freeable (b_free=),
 * and a new block c must work (c_works=). */
#include "fake_cuda_api.h"
#include "check.h"

int main(int argc, char **argv)
{
    int warm = argc > 1 && strchr(argv[1], 'w'), other = argc > 1 && strchr(argv[1], 'c');
    unsigned allocs = 0, frees = 0;
    CUcontext prim, c1;
    CUdeviceptr w = 0, x = 0, a = 0, b = 0, c = 0, y = 0;
    setvbuf(stdout, NULL, _IONBF, 0);
    CHECK(cuInit(0));
    CHECK(cuDevicePrimaryCtxRetain(&prim, 0));
    CHECK(cuCtxSetCurrent(prim));
    if (warm) {
        CHECK(cuMemAlloc_v2(&w, 512));
        CHECK(cuMemFree_v2(w));
        allocs++, frees++;
    }
    CHECK(cuMemAlloc_v2(&x, 1000));
    allocs++;
    printf("x=%llu\n", x);
    if (other) {
        CHECK(cuCtxCreate_v2(&c1, 0, 0));
        CHECK(cuMemAlloc_v2(&a, 1000));
        CHECK(cuMemAlloc_v2(&b, 1000));
        allocs += 2;
        printf("a=%llu\nb=%llu\n", a, b);
        if (!holds_data(a, 1000, 1) || !holds_data(b, 1000, 2))
            FAIL("a, b");
        CHECK(cuCtxPushCurrent_v2(prim));
    }
    CHECK(cuDevicePrimaryCtxReset_v2(0));
    if (other) {
        CHECK(cuCtxPopCurrent_v2(NULL)); /* c1 is current again */
        printf("a_free=%d\n", cuMemFree_v2(a));
        printf("b_works=%d\n", holds_data(b, 1000, 3));
        printf("b_free=%d\n", cuMemFree_v2(b));
        frees += 2;
        CHECK(cuMemAlloc_v2(&c, 1000));
        allocs++;
        printf("c_works=%d\n", holds_data(c, 1000, 4));
        CHECK(cuMemFree_v2(c));
        frees++;
        CHECK(cuCtxDestroy_v2(c1));
    }
    CHECK(cuDevicePrimaryCtxRetain(&prim, 0));
    CHECK(cuCtxSetCurrent(prim));
    CHECK(cuMemAlloc_v2(&y, 2000));
    allocs++;
    printf("y_works=%d\n", holds_data(y, 2000, 5));
    CHECK(cuMemFree_v2(y));
    frees++;
    printf("result: ok allocs=%u frees=%u leaked_bytes=1000\n", allocs, frees);
    return 0;
}
