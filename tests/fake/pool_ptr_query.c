/* Test-local program of tests/pool.rs (`ptrquery`): two 1000 B blocks a and p
 * and 5000 B of managed memory m, then what cuMemGetAddressRange_v2 and
 * cuPointerGetAttribute answer for addresses inside them (and NULL
 * out-parameters), and the result codes for an unknown address and a NULL
 * attribute, buffer ids (distinct per allocation, also when a block is
 * reused), and for p once freed (freed_range=, freed_attr=). Prints one
 * key=value line per answer. */
#include <stdint.h>

#include "fake_cuda_api.h"
#include "check.h"

int main(void)
{
    CUcontext ctx;
    CUdeviceptr a = 0, p = 0, m = 0, base = 0, start = 0;
    size_t size = 0, rsize = 0;
    int ordinal = -1;
    CHECK(cuInit(0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuMemAlloc_v2(&a, 1000));
    CHECK(cuMemAlloc_v2(&p, 1000));
    CHECK(cuMemAllocManaged(&m, 5000, CU_MEM_ATTACH_GLOBAL));
    printf("a=%llu\np=%llu\nm=%llu\n", a, p, m);

    CHECK(cuMemGetAddressRange_v2(&base, &size, p + 100));
    printf("range_base=%llu\nrange_size=%zu\n", base, size);
    base = 0;
    CHECK(cuMemGetAddressRange_v2(&base, NULL, p + 999));
    printf("range_last_base=%llu\n", base);
    size = 0;
    CHECK(cuMemGetAddressRange_v2(NULL, &size, p));
    printf("range_exact_size=%zu\n", size);
    CHECK(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p + 100));
    CHECK(cuPointerGetAttribute(&rsize, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p + 100));
    CHECK(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p + 100));
    printf("attr_start=%llu\nattr_size=%zu\nattr_ordinal=%d\n", start, rsize, ordinal);

    CHECK(cuMemGetAddressRange_v2(&base, &size, a + 5));
    printf("a_base=%llu\na_size=%zu\n", base, size);
    CHECK(cuPointerGetAttribute(&rsize, CU_POINTER_ATTRIBUTE_RANGE_SIZE, a));
    printf("a_attr_size=%zu\n", rsize);

    CHECK(cuMemGetAddressRange_v2(&base, &size, m + 10));
    printf("m_base=%llu\nm_size=%zu\n", base, size);
    CHECK(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, m + 10));
    CHECK(cuPointerGetAttribute(&rsize, CU_POINTER_ATTRIBUTE_RANGE_SIZE, m + 10));
    printf("m_attr_start=%llu\nm_attr_size=%zu\n", start, rsize);

    printf("range_unknown=%d\n", cuMemGetAddressRange_v2(&base, &size, (CUdeviceptr)0x10));
    printf("attr_unknown=%d\n", cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, (CUdeviceptr)0x10));
    printf("attr_null=%d\n", cuPointerGetAttribute(NULL, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p));

    unsigned long long id_a = 0, id_p = 0, id_p_inside = 0, id_q = 0;
    CHECK(cuPointerGetAttribute(&id_a, CU_POINTER_ATTRIBUTE_BUFFER_ID, a));
    CHECK(cuPointerGetAttribute(&id_p, CU_POINTER_ATTRIBUTE_BUFFER_ID, p));
    CHECK(cuPointerGetAttribute(&id_p_inside, CU_POINTER_ATTRIBUTE_BUFFER_ID, p + 999));
    CHECK(cuMemFree_v2(p));
    CUdeviceptr q = 0;
    CHECK(cuMemAlloc_v2(&q, 1000));
    CHECK(cuPointerGetAttribute(&id_q, CU_POINTER_ATTRIBUTE_BUFFER_ID, q));
    int legacy_ipc = -1;
    CHECK(cuPointerGetAttribute(&legacy_ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, q));
    CUmemGenericAllocationHandle retained = 0;
    printf("ipc_capable=%d\nretain=%d\n", legacy_ipc, cuMemRetainAllocationHandle(&retained, (void *)(uintptr_t)q));
    printf("q_is_p=%d\nids_differ=%d\nid_same_inside=%d\nid_new_after_reuse=%d\n", q == p, id_a != id_p,
           id_p == id_p_inside, id_q != id_p);
    CHECK(cuMemFree_v2(q));
    /* p (and q at the same place) is freed; a still lives in the same segment. */
    printf("freed_range=%d\n", cuMemGetAddressRange_v2(&base, &size, p + 100));
    printf("freed_attr=%d\n", cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p));
    CHECK(cuMemFree_v2(a));
    CHECK(cuMemFree_v2(m));
    printf("result: ok allocs=4 frees=4 leaked_bytes=0\n");
    return 0;
}
