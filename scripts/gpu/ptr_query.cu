// Pointer queries on pooled blocks, on a real driver: run plainly and under
// `cupool run --mode pool`; both must print the same `result:` line. Two
// 1000-byte blocks a and p (one pool segment under cupool): p's range and
// buffer id are its own, a freed p is unknown memory, a block reused at p's
// address gets a new buffer id, it is exportable through legacy IPC and has
// no VMM allocation handle (also with backing=vmm).
#include <cuda.h>
#include <cstdio>

int main() {
    cuInit(0);
    CUdevice dev;
    CUcontext ctx;
    cuDeviceGet(&dev, 0);
    cuDevicePrimaryCtxRetain(&ctx, dev);
    cuCtxSetCurrent(ctx);
    CUdeviceptr a = 0, p = 0, q = 0, base = 0;
    size_t size = 0;
    cuMemAlloc(&a, 1000);
    cuMemAlloc(&p, 1000);
    int range_ok = cuMemGetAddressRange(&base, &size, p + 100) == CUDA_SUCCESS && base == p && size == 1000;
    unsigned long long id_a = 0, id_p = 0, id_inside = 0, id_q = 0;
    cuPointerGetAttribute(&id_a, CU_POINTER_ATTRIBUTE_BUFFER_ID, a);
    cuPointerGetAttribute(&id_p, CU_POINTER_ATTRIBUTE_BUFFER_ID, p);
    cuPointerGetAttribute(&id_inside, CU_POINTER_ATTRIBUTE_BUFFER_ID, p + 999);
    int ipc_capable = 0;
    cuPointerGetAttribute(&ipc_capable, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p);
    CUmemGenericAllocationHandle handle = 0;
    int retain = cuMemRetainAllocationHandle(&handle, (void *)p);
    cuMemFree(p);
    int freed_range = cuMemGetAddressRange(&base, &size, p + 100);
    int ordinal = -1;
    int freed_attr = cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p);
    cuMemAlloc(&q, 1000);
    cuPointerGetAttribute(&id_q, CU_POINTER_ATTRIBUTE_BUFFER_ID, q);
    printf("result: range_ok=%d ids_differ=%d id_same_inside=%d id_new_for_new_allocation=%d ipc_capable=%d "
           "retain=%d freed_range=%d freed_attr_failed=%d\n",
           range_ok, id_a != id_p, id_p == id_inside, id_q != id_p, ipc_capable, retain, freed_range, freed_attr != 0);
    cuMemFree(q);
    cuMemFree(a);
    return 0;
}
