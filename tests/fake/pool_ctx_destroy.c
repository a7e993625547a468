/* Test-local program of tests/pool.rs (`ctxdestroy`): a second context on
 * device 0 next to the primary one, allocations in both, a leak of LEAK_CTX
 * bytes in the second, which is then destroyed; afterwards the primary
 * context's old block x and new blocks must work (x_intact=, new_blocks_ok=
 * out of 21, x_still_intact=, keep_ok=). Leaks LEAK_EXIT bytes at exit and
 * prints the context leak's address (leak=). */
#include "fake_cuda_api.h"
#include "check.h"

#define LEAK_CTX 3000017u
#define LEAK_EXIT 7777u

/* Writes a pattern (varied by seed) into the first 512 bytes of [p, p+n) and
 * the seed into its last byte; check() reads both back later. */
static int fill(CUdeviceptr p, size_t n, unsigned seed)
{
    unsigned char out[512];
    size_t len = n < sizeof(out) ? n : sizeof(out);
    for (size_t i = 0; i < len; i++)
        out[i] = (unsigned char)(i * 3 + seed);
    return cuMemcpyHtoD_v2(p, out, len) == 0 && cuMemsetD8_v2(p + n - 1, (unsigned char)seed, 1) == 0;
}

static int check(CUdeviceptr p, size_t n, unsigned seed)
{
    unsigned char in[512], last = 0;
    size_t len = n < sizeof(in) ? n : sizeof(in);
    if (cuMemcpyDtoH_v2(in, p, len) || cuMemcpyDtoH_v2(&last, p + n - 1, 1) || last != (unsigned char)seed)
        return 0;
    for (size_t i = 0; i + 1 < len; i++)
        if (in[i] != (unsigned char)(i * 3 + seed))
            return 0;
    return 1;
}

int main(void)
{
    unsigned allocs = 0, frees = 0;
    CUcontext prim, c1, now = NULL;
    CUdeviceptr x = 0, y = 0, leak = 0, q[20], big = 0, keep = 0;
    CHECK(cuInit(0));
    CHECK(cuDevicePrimaryCtxRetain(&prim, 0));
    CHECK(cuCtxSetCurrent(prim));
    CHECK(cuMemAlloc_v2(&x, 3000));
    allocs++;
    if (!fill(x, 3000, 11))
        FAIL("fill x");

    CHECK(cuCtxCreate_v2(&c1, 0, 0));
    CHECK(cuMemAlloc_v2(&y, 5000));
    allocs++;
    if (!fill(y, 5000, 22) || !check(y, 5000, 22))
        FAIL("y");
    CHECK(cuMemFree_v2(y));
    frees++;
    CHECK(cuMemAlloc_v2(&leak, LEAK_CTX));
    allocs++;
    if (!fill(leak, LEAK_CTX, 33))
        FAIL("leak");
    CHECK(cuCtxDestroy_v2(c1));
    CHECK(cuCtxGetCurrent(&now));
    if (now != prim)
        FAIL("current context after destroy");
    printf("leak=%llu\n", leak);

    printf("x_intact=%d\n", check(x, 3000, 11));
    unsigned ok = 0;
    for (unsigned i = 0; i < 20; i++) {
        size_t n = 1000 * (i + 1);
        CHECK(cuMemAlloc_v2(&q[i], n));
        allocs++;
        ok += fill(q[i], n, i) && check(q[i], n, i);
    }
    CHECK(cuMemAlloc_v2(&big, 4u << 20));
    allocs++;
    ok += fill(big, 4u << 20, 44) && check(big, 4u << 20, 44);
    printf("new_blocks_ok=%u\n", ok);
    printf("x_still_intact=%d\n", check(x, 3000, 11));
    for (unsigned i = 0; i < 20; i++) {
        CHECK(cuMemFree_v2(q[i]));
        frees++;
    }
    CHECK(cuMemFree_v2(big));
    CHECK(cuMemFree_v2(x));
    frees += 2;
    CHECK(cuMemAlloc_v2(&keep, LEAK_EXIT));
    allocs++;
    printf("keep_ok=%d\n", fill(keep, LEAK_EXIT, 55) && check(keep, LEAK_EXIT, 55));
    printf("result: ok allocs=%u frees=%u leaked_bytes=%u\n", allocs, frees, LEAK_CTX + LEAK_EXIT);
    return 0;
}
