/* A primary context destroyed behind the shim's back (as the static
 * runtime's cudaDeviceReset does) and created again under the same handle:
 * memory allocated afterwards must be the new context's. `b` leaks into the
 * reset. Prints same_handle, x_works; ends with `result: ok`. */
#include "fake_cuda_api.h"
#include "check.h"

int main(void)
{
    CUcontext c, c2;
    CUdeviceptr a, b, x;
    CHECK(cuInit(0));
    CHECK(cuDevicePrimaryCtxRetain(&c, 0));
    CHECK(cuCtxSetCurrent(c));
    CHECK(cuMemAlloc_v2(&a, 1000));
    CHECK(cuMemAlloc_v2(&b, 1000));
    CHECK(cuMemFree_v2(a)); /* a cached block in a live segment */
    fake_reset_primary_unseen(0);
    CHECK(cuDevicePrimaryCtxRetain(&c2, 0));
    CHECK(cuCtxSetCurrent(c2));
    printf("same_handle=%d\n", c == c2);
    CHECK(cuMemAlloc_v2(&x, 1000));
    printf("x_works=%d\n", holds_data(x, 1000, 3));
    CHECK(cuMemFree_v2(x));
    printf("result: ok\n");
    return 0;
}
