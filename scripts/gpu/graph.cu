// Stream capture and graphs around device allocations: the output must be
// the same plainly and under cupool's pool. Every case prints one line.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <atomic>
#include <thread>

__global__ void fill(int *p, int n, int v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = v + i;
}
__global__ void add(int *dst, const int *src, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] += src[i];
}

static int check(const int *dev, int n, int v) {
    int *h = new int[n];
    cudaMemcpy(h, dev, n * sizeof(int), cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int i = 0; i < n; i++) bad += h[i] != v + i;
    delete[] h;
    return bad;
}

int main() {
    const int n = 1 << 16, bytes = n * sizeof(int);
    cudaStream_t s;
    cudaStreamCreate(&s);
    cudaGraph_t g;
    cudaGraphExec_t ge;

    // 1. Relaxed capture: cudaMalloc inside is allowed; the graph writes it at every replay.
    int *out, *tmp = nullptr;
    cudaMalloc(&out, bytes);
    cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
    cudaError_t m = cudaMalloc(&tmp, bytes);
    fill<<<n / 256, 256, 0, s>>>(tmp, n, 7);
    cudaMemcpyAsync(out, tmp, bytes, cudaMemcpyDeviceToDevice, s);
    cudaError_t e = cudaStreamEndCapture(s, &g);
    cudaGraphInstantiate(&ge, g, 0);
    int bad = 0;
    for (int r = 0; r < 5; r++) {
        cudaMemsetAsync(out, 0, bytes, s);
        cudaGraphLaunch(ge, s);
        cudaStreamSynchronize(s);
        bad += check(out, n, 7);
    }
    printf("relaxed: malloc=%d end=%d bad=%d\n", (int)m, (int)e, bad);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaFree(tmp);

    // 2. Global capture: cudaMalloc and cudaFree are not permitted and invalidate the capture.
    int *x = nullptr, *held;
    cudaMalloc(&held, bytes);
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    m = cudaMalloc(&x, bytes);
    e = cudaStreamEndCapture(s, &g);
    printf("global: malloc=%d end=%d\n", (int)m, (int)e);
    if (e == cudaSuccess) cudaGraphDestroy(g);
    if (m == cudaSuccess) cudaFree(x);
    cudaGetLastError();
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    cudaError_t f = cudaFree(held);
    e = cudaStreamEndCapture(s, &g);
    cudaError_t f2 = cudaFree(held);
    printf("global-free: free=%d end=%d free_after=%d\n", (int)f, (int)e, (int)f2);
    if (e == cudaSuccess) cudaGraphDestroy(g);
    cudaGetLastError();

    // 3. Global capture on this thread, a cudaMalloc from another thread (also refused).
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    cudaError_t other = cudaSuccess;
    std::thread t([&] { int *y = nullptr; other = cudaMalloc(&y, bytes); if (other == cudaSuccess) cudaFree(y); });
    t.join();
    e = cudaStreamEndCapture(s, &g);
    printf("global-other-thread: malloc=%d end=%d\n", (int)other, (int)e);
    if (e == cudaSuccess) cudaGraphDestroy(g);
    cudaGetLastError();

    // 4. Thread-local capture: another thread may allocate.
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    std::thread t2([&] {
        cudaStream_t own;
        cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking);
        int *y = nullptr;
        other = cudaMalloc(&y, bytes);
        if (other == cudaSuccess) {
            fill<<<n / 256, 256, 0, own>>>(y, n, 3);
            cudaStreamSynchronize(own);
            int *h = new int[n];
            cudaMemcpyAsync(h, y, bytes, cudaMemcpyDeviceToHost, own);
            cudaStreamSynchronize(own);
            bad = 0;
            for (int i = 0; i < n; i++) bad += h[i] != 3 + i;
            delete[] h;
        }
        cudaStreamDestroy(own);
        if (other == cudaSuccess) cudaFree(y);
    });
    t2.join();
    fill<<<n / 256, 256, 0, s>>>(out, n, 9);
    e = cudaStreamEndCapture(s, &g);
    cudaGraphInstantiate(&ge, g, 0);
    cudaGraphLaunch(ge, s);
    cudaStreamSynchronize(s);
    printf("thread-local: other=%d end=%d bad=%d graph_bad=%d\n", (int)other, (int)e, bad, check(out, n, 9));
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);

    // 5. Graph memory nodes: cudaMallocAsync/cudaFreeAsync captured, replayed.
    int *acc;
    cudaMalloc(&acc, bytes);
    cudaMemset(acc, 0, bytes);
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    int *ga = nullptr;
    m = cudaMallocAsync(&ga, bytes, s);
    fill<<<n / 256, 256, 0, s>>>(ga, n, 0);
    add<<<n / 256, 256, 0, s>>>(acc, ga, n);
    cudaFreeAsync(ga, s);
    e = cudaStreamEndCapture(s, &g);
    cudaGraphInstantiate(&ge, g, 0);
    for (int r = 0; r < 4; r++) cudaGraphLaunch(ge, s);
    cudaStreamSynchronize(s);
    int *h = new int[n];
    cudaMemcpy(h, acc, bytes, cudaMemcpyDeviceToHost);
    bad = 0;
    for (int i = 0; i < n; i++) bad += h[i] != 4 * i;
    printf("mem-nodes: malloc=%d end=%d bad=%d\n", (int)m, (int)e, bad);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);

    // 6. Blocks freed and reallocated around replays: pooled reuse must not
    // hand a graph's buffer (still live) to someone else.
    int *keep;
    cudaMalloc(&keep, bytes);
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    fill<<<n / 256, 256, 0, s>>>(keep, n, 11);
    e = cudaStreamEndCapture(s, &g);
    cudaGraphInstantiate(&ge, g, 0);
    bad = 0;
    for (int r = 0; r < 50; r++) {
        int *churn;
        cudaMalloc(&churn, bytes);
        fill<<<n / 256, 256, 0, s>>>(churn, n, r);
        cudaGraphLaunch(ge, s);
        bad += check(churn, n, r);
        cudaFree(churn);
    }
    bad += check(keep, n, 11);
    printf("replay-churn: end=%d bad=%d\n", (int)e, bad);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);

    // 7. What a capture forbids besides allocations. A relaxed capture: a
    // free, then a synchronisation (which the capturing stream cannot join).
    int *rf;
    cudaMalloc(&rf, bytes);
    cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
    f = cudaFree(rf);
    fill<<<n / 256, 256, 0, s>>>(out, n, 5);
    e = cudaStreamEndCapture(s, &g);
    printf("relaxed-free: free=%d end=%d\n", (int)f, (int)e);
    if (e == cudaSuccess) cudaGraphDestroy(g);
    cudaGetLastError();
    cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
    cudaError_t sy = cudaDeviceSynchronize();
    e = cudaStreamEndCapture(s, &g);
    printf("relaxed-sync: sync=%d end=%d\n", (int)sy, (int)e);
    if (e == cudaSuccess) cudaGraphDestroy(g);
    cudaGetLastError();
    // A global capture invalidated by a refused call and left open, as by a
    // program that lost its graph builder to an exception (numba-cuda's suite).
    int *k1, *k2, *z = nullptr;
    cudaMalloc(&k1, bytes);
    cudaMalloc(&k2, bytes);
    cudaStream_t s2;
    cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
    cudaStreamBeginCapture(s2, cudaStreamCaptureModeGlobal);
    m = cudaMalloc(&z, bytes);
    f = cudaFree(k1);
    cudaError_t m2 = cudaMalloc(&z, bytes);
    if (m2 == cudaSuccess) cudaFree(z);
    sy = cudaDeviceSynchronize();
    e = cudaStreamEndCapture(s2, &g);
    f2 = cudaFree(k2);
    printf("invalidated-open: malloc=%d free=%d malloc_again=%d sync=%d end=%d free_after=%d\n", (int)m, (int)f,
           (int)m2, (int)sy, (int)e, (int)f2);
    cudaGetLastError();
    // A thread-local capture on another thread: this thread frees, then
    // synchronises the device.
    int *tf;
    cudaMalloc(&tf, bytes);
    std::atomic<int> stage{0};
    cudaError_t tl_end = cudaSuccess;
    std::thread t3([&] {
        cudaStreamBeginCapture(s2, cudaStreamCaptureModeThreadLocal);
        stage = 1;
        while (stage != 2) std::this_thread::yield();
        cudaGraph_t g3;
        tl_end = cudaStreamEndCapture(s2, &g3);
        if (tl_end == cudaSuccess) cudaGraphDestroy(g3);
    });
    while (stage != 1) std::this_thread::yield();
    f = cudaFree(tf);
    sy = cudaDeviceSynchronize();
    stage = 2;
    t3.join();
    printf("thread-local-other: free=%d sync=%d end=%d\n", (int)f, (int)sy, (int)tl_end);
    cudaGetLastError();
    // The driver API from a thread with no current context: a free of a
    // block made in this thread's context, alone and during this thread's
    // global capture.
    CUdeviceptr d1 = 0, d2 = 0;
    cuMemAlloc(&d1, 4096);
    cuMemAlloc(&d2, 4096);
    CUresult nf = CUDA_SUCCESS, nfc = CUDA_SUCCESS;
    std::thread([&] { nf = cuMemFree(d1); }).join();
    cudaStreamBeginCapture(s2, cudaStreamCaptureModeGlobal);
    std::thread([&] { nfc = cuMemFree(d2); }).join();
    cudaGraph_t g4;
    e = cudaStreamEndCapture(s2, &g4);
    if (e == cudaSuccess) cudaGraphDestroy(g4);
    cudaGetLastError();
    CUresult nf_after = nf == CUDA_SUCCESS ? CUDA_SUCCESS : cuMemFree(d1);
    CUresult nfc_after = nfc == CUDA_SUCCESS ? CUDA_SUCCESS : cuMemFree(d2);
    printf("no-context-free: free=%d in_global_capture=%d end=%d free_after=%d,%d\n", (int)nf, (int)nfc, (int)e,
           (int)nf_after, (int)nfc_after);
    cudaStreamDestroy(s2);
    cudaFree(keep);
    cudaFree(acc);
    cudaFree(out);
    cudaStreamDestroy(s);
    printf("last error: %d\n", (int)cudaGetLastError());
    return 0;
}
