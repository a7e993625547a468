/* Legacy IPC in the fake driver, through the driver API (-lcuda), in one
 * program that forks its receiver (test-local: `ipcdriver`, used by
 * tests/fake_cuda.rs).
 *
 * Parent: pointer attributes (BUFFER_ID the same for base and interior
 * pointers and fresh for every allocation; IS_LEGACY_CUDA_IPC_CAPABLE 1 only
 * for large cuMemAlloc_v2 / cuMemAllocPitch_v2 memory), cuIpcGetMemHandle
 * (interior handle == base handle, bytes 56..63 zero, non-shareable memory ->
 * CUDA_ERROR_INVALID_VALUE), cuGetProcAddress of the IPC entry points, an
 * open of its own handle (CUDA_ERROR_INVALID_CONTEXT).
 * Child (fork; the fake forgets the parent's allocations there): opens the
 * parent's handle with the driver's cuIpcOpenMemHandle_v2, reads the base's
 * data with cuMemcpyDtoH_v2, writes with cuMemsetD8_v2 and cuMemcpyHtoD_v2,
 * checks that cuMemFree_v2 refuses the mapping and that copies past its end
 * fail, closes it and exits (its FAKE_CUDA_STATS line: ipc_opens=2
 * ipc_closes=2).  The parent then sees the child's writes.
 * Prints `child_pid=N` and `result: ok allocs=7 frees=7 leaked_bytes=0`. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fake_cuda_api.h"
#include "check.h"

#define MIB ((size_t)1 << 20)

static unsigned long long buffer_id(CUdeviceptr p)
{
    unsigned long long id = 0;
    if (cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, p) != 0)
        return 0;
    return id;
}

static int ipc_capable(CUdeviceptr p)
{
    int v = -1;
    if (cuPointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p) != 0)
        return -1;
    return v;
}

static int child(CUipcMemHandle h, CUdeviceptr parent_base)
{
    CUdeviceptr p = 0, q = 0;
    CHECK(cuIpcOpenMemHandle_v2(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    CHECK(cuIpcOpenMemHandle(&q, h, 0)); /* the unversioned name, same ABI */
    if (p != q)
        FAIL("second open returned %llx, first %llx", q, p);
    if (p == parent_base)
        FAIL("the receiver's mapping is the parent's own address");
    unsigned char buf[16];
    CHECK(cuMemcpyDtoH_v2(buf, p, sizeof(buf)));
    for (int i = 0; i < 16; i++)
        if (buf[i] != (unsigned char)(0x40 + i))
            FAIL("receiver read byte %d = %02x", i, buf[i]);
    CHECK(cuMemsetD8_v2(p + MIB, 0x7e, 16));
    CHECK(cuMemcpyHtoD_v2(p + 2 * MIB - 4, "abcd", 4));
    EXPECT(cuMemcpyDtoH_v2(buf, p + 2 * MIB - 8, 16), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr base = 0;
    size_t size = 0;
    CHECK(cuMemGetAddressRange_v2(&base, &size, p + 12345));
    if (base != p || size != 2 * MIB)
        FAIL("address range of the mapping: %llx %zu", base, size);
    EXPECT(ipc_capable(p), 0);
    CUipcMemHandle again;
    EXPECT(cuIpcGetMemHandle(&again, p), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuIpcCloseMemHandle(p + 1), CUDA_ERROR_INVALID_VALUE);
    CHECK(cuIpcCloseMemHandle(p));
    CHECK(cuIpcCloseMemHandle(q));
    EXPECT(cuIpcCloseMemHandle(p), CUDA_ERROR_INVALID_VALUE);
    printf("child: ok\n");
    return 0;
}

int main(void)
{
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));

    CUdeviceptr big = 0, big2 = 0, small = 0, managed = 0, pitched = 0;
    size_t pitch = 0;
    CHECK(cuMemAlloc_v2(&big, 2 * MIB));
    CHECK(cuMemAlloc_v2(&big2, 2 * MIB));
    CHECK(cuMemAlloc_v2(&small, 4096));
    CHECK(cuMemAllocManaged(&managed, 2 * MIB, CU_MEM_ATTACH_GLOBAL));
    CHECK(cuMemAllocPitch_v2(&pitched, &pitch, 4096, 512, 4));

    /* Buffer ids. */
    unsigned long long id = buffer_id(big);
    if (id == 0 || buffer_id(big + MIB + 3) != id || buffer_id(big + 2 * MIB - 1) != id)
        FAIL("buffer id of interior pointers differs from the base's %llu", id);
    if (buffer_id(big2) == id || buffer_id(small) == id || buffer_id(big2) == 0 || buffer_id(small) == 0)
        FAIL("buffer ids not distinct");
    CUdeviceptr tmp = 0;
    CHECK(cuMemAlloc_v2(&tmp, 4096));
    unsigned long long tmp_id = buffer_id(tmp);
    CHECK(cuMemFree_v2(tmp));
    CHECK(cuMemAlloc_v2(&tmp, 4096)); /* likely the same address: still a fresh id */
    if (buffer_id(tmp) == tmp_id || buffer_id(tmp) == 0)
        FAIL("buffer id not fresh for a new allocation");
    CHECK(cuMemFree_v2(tmp));

    /* IPC capability. */
    EXPECT(ipc_capable(big), 1);
    EXPECT(ipc_capable(big + 77), 1);
    EXPECT(ipc_capable(pitched), 1);
    EXPECT(ipc_capable(small), 0);
    EXPECT(ipc_capable(managed), 0);

    /* Handles. */
    CUipcMemHandle h, hi, hp;
    CHECK(cuIpcGetMemHandle(&h, big));
    CHECK(cuIpcGetMemHandle(&hi, big + MIB + 5));
    if (memcmp(&h, &hi, sizeof(h)) != 0)
        FAIL("interior handle differs from the base's");
    for (int i = 56; i < 64; i++)
        if (h.reserved[i])
            FAIL("handle byte %d is %d", i, h.reserved[i]);
    CHECK(cuIpcGetMemHandle(&hp, pitched));
    if (memcmp(&h, &hp, sizeof(h)) == 0)
        FAIL("two allocations, one handle");
    EXPECT(cuIpcGetMemHandle(&hp, small), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuIpcGetMemHandle(&hp, managed), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuIpcGetMemHandle(&hp, big + 2 * MIB + 4096 * 16), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuIpcGetMemHandle(NULL, big), CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr self = 0;
    EXPECT(cuIpcOpenMemHandle_v2(&self, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cuIpcCloseMemHandle(big), CUDA_ERROR_INVALID_VALUE);

    /* Entry points. */
    void *fn = NULL;
    CHECK(cuGetProcAddress_v2("cuIpcOpenMemHandle", &fn, 13000, 0, NULL));
    if (fn != (void *)cuIpcOpenMemHandle_v2)
        FAIL("cuGetProcAddress(cuIpcOpenMemHandle, 13000) is not cuIpcOpenMemHandle_v2");
    CHECK(cuGetProcAddress_v2("cuIpcOpenMemHandle", &fn, 10020, 0, NULL));
    if (fn != (void *)cuIpcOpenMemHandle)
        FAIL("cuGetProcAddress(cuIpcOpenMemHandle, 10020) is not cuIpcOpenMemHandle");
    CHECK(cuGetProcAddress_v2("cuIpcGetMemHandle", &fn, 13000, 0, NULL));
    if (fn != (void *)cuIpcGetMemHandle)
        FAIL("cuGetProcAddress(cuIpcGetMemHandle)");
    CHECK(cuGetProcAddress_v2("cuIpcCloseMemHandle", &fn, 13000, 0, NULL));
    if (fn != (void *)cuIpcCloseMemHandle)
        FAIL("cuGetProcAddress(cuIpcCloseMemHandle)");

    /* The receiver. */
    unsigned char pattern[16];
    for (int i = 0; i < 16; i++)
        pattern[i] = (unsigned char)(0x40 + i);
    CHECK(cuMemcpyHtoD_v2(big, pattern, sizeof(pattern)));
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        FAIL("fork");
    if (pid == 0)
        return child(h, big);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        FAIL("child failed: status %d", status);
    printf("child_pid=%d\n", (int)pid);
    unsigned char buf[16];
    CHECK(cuMemcpyDtoH_v2(buf, big + MIB, sizeof(buf)));
    for (int i = 0; i < 16; i++)
        if (buf[i] != 0x7e)
            FAIL("the child's memset is not visible: byte %d = %02x", i, buf[i]);
    CHECK(cuMemcpyDtoH_v2(buf, big + 2 * MIB - 4, 4));
    if (memcmp(buf, "abcd", 4) != 0)
        FAIL("the child's copy is not visible");

    CHECK(cuMemFree_v2(big));
    CHECK(cuMemFree_v2(big2));
    CHECK(cuMemFree_v2(small));
    CHECK(cuMemFree_v2(managed));
    CHECK(cuMemFree_v2(pitched));
    printf("result: ok allocs=7 frees=7 leaked_bytes=0\n");
    return 0;
}
