/* Memory a program frees in bulk goes back to the device; memory it frees
 * and allocates again in cycles may stay cached; cuMemGetInfo shows free
 * memory as it would be without a cache. The fake's own count of the
 * device memory it holds (fake_device_used) is the ground truth. Prints
 * used_after_bulk_free, used_after_churn, used_after_other_bulk_free,
 * used_after_meminfo (bytes);
 * ends with `result: ok`. */
#include "fake_cuda_api.h"
#include "check.h"

#define MIB (1024ull * 1024)

int main(void)
{
    CUcontext c;
    CUdeviceptr p[8];
    CHECK(cuInit(0));
    CHECK(cuDevicePrimaryCtxRetain(&c, 0));
    CHECK(cuCtxSetCurrent(c));
    for (int i = 0; i < 8; i++)
        CHECK(cuMemAlloc_v2(&p[i], 64 * MIB));
    for (int i = 0; i < 8; i++)
        CHECK(cuMemFree_v2(p[i]));
    printf("used_after_bulk_free=%zu\n", fake_device_used(0));
    for (int round = 0; round < 3; round++) {
        CHECK(cuMemAlloc_v2(&p[0], 64 * MIB));
        if (!holds_data(p[0], 64 * MIB, (unsigned char)round))
            FAIL("round %d: the block holds no data", round);
        CHECK(cuMemFree_v2(p[0]));
    }
    printf("used_after_churn=%zu\n", fake_device_used(0));
    /* A bulk free of another size after the churn still goes back. */
    for (int i = 0; i < 4; i++)
        CHECK(cuMemAlloc_v2(&p[i], 96 * MIB));
    for (int i = 0; i < 4; i++)
        CHECK(cuMemFree_v2(p[i]));
    printf("used_after_other_bulk_free=%zu\n", fake_device_used(0));
    size_t free_bytes, total;
    CHECK(cuMemGetInfo_v2(&free_bytes, &total));
    printf("used_after_meminfo=%zu\n", fake_device_used(0));
    printf("result: ok\n");
    return 0;
}
