/* Test-local program of tests/pool_magazines.rs: a thread's magazine holds
 * blocks of the primary context when the context is reset
 * (cuDevicePrimaryCtxReset_v2). The new context gets a pool of its own,
 * whose memory may lie at the old addresses; the old blocks, handed back
 * later by the magazine, must not free any of it. Prints whether three
 * blocks of the new context keep their data, and the result of a 1 MiB
 * allocation afterwards. */
#include <stdio.h>

#include "fake_cuda_api.h"
#include "check.h"

int main(void)
{
    CUcontext prim;
    CUdeviceptr z, p1, p2, q1, q2, q3, big;
    CHECK(cuInit(0));
    CHECK(cuDevicePrimaryCtxRetain(&prim, 0));
    CHECK(cuCtxSetCurrent(prim));
    CHECK(cuMemAlloc_v2(&z, 8192));
    CHECK(cuMemAlloc_v2(&p1, 4096)); /* the class is remembered */
    CHECK(cuMemFree_v2(p1));
    CHECK(cuMemAlloc_v2(&p2, 4096)); /* the class is taken on: blocks in stock */
    CHECK(cuMemFree_v2(p2));         /* kept by the magazine */
    CHECK(cuMemFree_v2(z));
    CHECK(cuDevicePrimaryCtxReset_v2(0));
    CHECK(cuDevicePrimaryCtxRetain(&prim, 0));
    CHECK(cuCtxSetCurrent(prim));
    CHECK(cuMemAlloc_v2(&q1, 4096)); /* a new pool, a new segment */
    CHECK(cuMemAlloc_v2(&q2, 4096)); /* the magazine refills for it: the old blocks go back */
    CHECK(cuMemAlloc_v2(&q3, 4096));
    int kept = holds_data(q1, 4096, 1) + holds_data(q2, 4096, 2) + holds_data(q3, 4096, 3);
    CHECK(cuMemFree_v2(q1));
    CHECK(cuMemFree_v2(q2));
    CHECK(cuMemFree_v2(q3));
    int big_rc = cuMemAlloc_v2(&big, 1 << 20);
    if (big_rc == CUDA_SUCCESS)
        CHECK(cuMemFree_v2(big));
    printf("result: ok blocks_with_data=%d big_rc=%d\n", kept, big_rc);
    CHECK(cuDevicePrimaryCtxRelease_v2(0));
    return 0;
}
