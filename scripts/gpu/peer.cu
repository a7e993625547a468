// Two GPUs, one thread: pooled blocks stay on their device, peer access
// (runtime or driver API) reaches them, peer copies and kernels on device 1
// read device 0's pooled memory, and a free made while another device is
// current still waits for the work queued on the block's own device.
// Run by scripts/gpu-multi.sh plainly and under cupool; the result lines
// must be equal.
//   peer runtime|driver   the checks, peer access enabled through that API
//   peer probe            how long cudaFree of device 0's block takes while a
//                         kernel on device 1 still reads it (what CUDA promises)
#include <cuda.h>
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#define CK(x)                                                                               \
    do {                                                                                    \
        cudaError_t e_ = (x);                                                               \
        if (e_ != cudaSuccess) {                                                            \
            printf("result: error %s at line %d: %s\n", #x, __LINE__, cudaGetErrorString(e_)); \
            return 1;                                                                       \
        }                                                                                   \
    } while (0)

__device__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
}

__global__ void add(const int *a, const int *c, int *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + c[i];
}

// Waits, then writes: a block freed while this runs must not be handed out
// before it is done.
__global__ void late_fill(int *p, int n, int value, long long cycles) {
    spin(cycles);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = value;
}

// Waits, then copies: reads a peer's block late.
__global__ void late_copy(const int *src, int *dst, int n, long long cycles) {
    spin(cycles);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = src[i];
}

static int device_of(const void *p) {
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) return -1;
    int ordinal = -2;
    cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (CUdeviceptr)p);
    return a.device == ordinal ? a.device : -3;
}

static bool all_equal(const std::vector<int> &v, int value) {
    for (int x : v)
        if (x != value) return false;
    return true;
}

static long long cycles_for_ms(int ms) {
    int khz = 0;
    cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
    return (long long)khz * ms;
}

static int probe() {
    const int n = 1 << 20;
    int *a, *out;
    CK(cudaSetDevice(0));
    CK(cudaMalloc(&a, n * sizeof(int)));
    CK(cudaMemset(a, 1, n * sizeof(int)));
    CK(cudaDeviceSynchronize());
    CK(cudaSetDevice(1));
    CK(cudaDeviceEnablePeerAccess(0, 0));
    CK(cudaMalloc(&out, n * sizeof(int)));
    late_copy<<<64, 256>>>(a, out, n, cycles_for_ms(300));
    auto t0 = std::chrono::steady_clock::now();
    CK(cudaFree(a));
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    cudaError_t late = cudaDeviceSynchronize();
    printf("probe: cudaFree of device 0's block while device 1 reads it took %.1f ms; device 1 then: %s\n", ms,
           cudaGetErrorString(late));
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "runtime";
    int count = 0;
    CK(cudaGetDeviceCount(&count));
    if (count < 2) {
        printf("result: skipped, %d device(s)\n", count);
        return 0;
    }
    if (!strcmp(mode, "probe")) return probe();

    // 1. One thread switching devices between allocations: each block is on
    // the device that was current, also after frees and reuse.
    std::vector<void *> blocks(96);
    std::vector<int> want(96);
    int misplaced = 0;
    for (int round = 0; round < 3; round++) {
        for (size_t i = 0; i < blocks.size(); i++) {
            if (round > 0 && (i + round) % 3 != 0) continue;  // keep two thirds, renew the rest
            if (blocks[i]) CK(cudaFree(blocks[i]));
            want[i] = (int)((i + round) % 2);
            CK(cudaSetDevice(want[i]));
            CK(cudaMalloc(&blocks[i], 512 + (i * 7919) % (3 << 20)));
        }
        for (size_t i = 0; i < blocks.size(); i++) misplaced += device_of(blocks[i]) != want[i];
    }
    // Distinct blocks never overlap, whichever device they are on.
    int overlaps = 0;
    for (size_t i = 0; i < blocks.size(); i++)
        for (size_t j = 0; j < blocks.size(); j++) overlaps += i != j && blocks[i] == blocks[j];

    // 2. Peer access, enabled after A was allocated (C after it).
    const int n = 1 << 20;
    const size_t bytes = n * sizeof(int);
    int *a, *b, *c;
    CK(cudaSetDevice(0));
    CK(cudaMalloc(&a, bytes));
    std::vector<int> host(n);
    for (int i = 0; i < n; i++) host[i] = i;
    CK(cudaMemcpy(a, host.data(), bytes, cudaMemcpyHostToDevice));
    if (!strcmp(mode, "driver")) {
        CUcontext ctx0, ctx1;
        cuCtxGetCurrent(&ctx0);
        CK(cudaSetDevice(1));
        cuCtxGetCurrent(&ctx1);
        if (cuCtxEnablePeerAccess(ctx0, 0) != CUDA_SUCCESS) {
            printf("result: error cuCtxEnablePeerAccess\n");
            return 1;
        }
        CK(cudaSetDevice(0));
        if (cuCtxEnablePeerAccess(ctx1, 0) != CUDA_SUCCESS) {
            printf("result: error cuCtxEnablePeerAccess\n");
            return 1;
        }
    } else {
        CK(cudaSetDevice(1));
        CK(cudaDeviceEnablePeerAccess(0, 0));
        CK(cudaSetDevice(0));
        CK(cudaDeviceEnablePeerAccess(1, 0));
    }
    CK(cudaMalloc(&c, bytes));
    CK(cudaMemset(c, 0, bytes));
    CK(cudaSetDevice(1));
    CK(cudaMalloc(&b, bytes));
    add<<<(n + 255) / 256, 256>>>(a, c, b, n);  // device 1 reads device 0's pooled blocks
    CK(cudaGetLastError());
    std::vector<int> got(n);
    CK(cudaMemcpy(got.data(), b, bytes, cudaMemcpyDeviceToHost));
    bool kernel_ok = got == host;

    // 3. Peer copies, synchronous and on a stream of device 1.
    CK(cudaMemset(b, 0, bytes));
    CK(cudaMemcpyPeer(b, 1, a, 0, bytes));
    CK(cudaMemcpy(got.data(), b, bytes, cudaMemcpyDeviceToHost));
    bool copy_ok = got == host;
    cudaStream_t s1;
    CK(cudaStreamCreate(&s1));
    CK(cudaMemsetAsync(b, 0, bytes, s1));
    CK(cudaMemcpyPeerAsync(b, 1, a, 0, bytes, s1));
    CK(cudaMemcpyAsync(got.data(), b, bytes, cudaMemcpyDeviceToHost, s1));
    CK(cudaStreamSynchronize(s1));
    bool async_copy_ok = got == host;

    // 4. A free made while device 1 is current, of device 0's block that a
    // slow kernel on a device 0 stream is still writing: the next block of
    // that size on device 0 must not be handed out under the kernel.
    CK(cudaSetDevice(0));
    cudaStream_t s0;
    CK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
    int late_wrong = 0;
    for (int round = 0; round < 4; round++) {
        int *x, *y;
        CK(cudaSetDevice(0));
        CK(cudaMalloc(&x, bytes));
        late_fill<<<64, 256, 0, s0>>>(x, n, 7, cycles_for_ms(50));
        CK(cudaSetDevice(1));
        CK(cudaFree(x));
        CK(cudaSetDevice(0));
        CK(cudaMalloc(&y, bytes));
        CK(cudaMemset(y, 0, bytes));  // the legacy stream: not ordered after s0 (non-blocking)
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(got.data(), y, bytes, cudaMemcpyDeviceToHost));
        late_wrong += !all_equal(got, 0);
        CK(cudaFree(y));
    }

    // 5. Peer reads of blocks freed and reused on device 0 while device 1's
    // stream is still working with an earlier block.
    CK(cudaSetDevice(1));
    int *sink;
    CK(cudaMalloc(&sink, bytes));
    int peer_wrong = 0;
    for (int round = 0; round < 4; round++) {
        int *x;
        CK(cudaSetDevice(0));
        CK(cudaMalloc(&x, bytes));
        CK(cudaMemcpy(x, host.data(), bytes, cudaMemcpyHostToDevice));
        CK(cudaSetDevice(1));
        late_copy<<<64, 256, 0, s1>>>(x, sink, n, cycles_for_ms(20));
        CK(cudaStreamSynchronize(s1));  // the program's own ordering before the free
        CK(cudaMemcpy(got.data(), sink, bytes, cudaMemcpyDeviceToHost));
        peer_wrong += got != host;
        CK(cudaSetDevice(0));
        CK(cudaFree(x));
    }

    for (void *p : blocks) CK(cudaFree(p));
    CK(cudaSetDevice(1));
    CK(cudaFree(b));
    CK(cudaFree(sink));
    CK(cudaStreamDestroy(s1));
    CK(cudaSetDevice(0));
    CK(cudaFree(a));
    CK(cudaFree(c));
    CK(cudaStreamDestroy(s0));
    bool ok = !misplaced && !overlaps && kernel_ok && copy_ok && async_copy_ok && !late_wrong && !peer_wrong;
    printf("result: %s misplaced=%d overlaps=%d peer_kernel=%d peer_copy=%d peer_copy_async=%d late_fill_wrong=%d "
           "peer_read_wrong=%d\n",
           ok ? "PASS" : "FAIL", misplaced, overlaps, kernel_ok, copy_ok, async_copy_ok, late_wrong, peer_wrong);
    return ok ? 0 : 1;
}
