// Would corrupt data if a pool handed out, for a program's first created
// stream, a block freed while only the legacy default stream was in use and
// still written there. Before any stream exists, a pool may reuse a freed
// block at once (all work so far runs in one order); a non-blocking stream
// created afterwards is not ordered behind that work. A slow kernel on the
// legacy stream writes buffer A, A is freed, the first stream is created
// (non-blocking), B is allocated (a pool may give A's memory), written on
// the new stream and checked after the slow kernel's write would have
// landed. One process, one round: the first stream is the point.
#include <cuda_runtime.h>
#include <cstdio>

__global__ void late_write(int* p, int n, long long spin) {
    long long start = clock64();
    while (clock64() - start < spin) {}
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = 1;
}

__global__ void write_wait_check(int* p, int n, long long spin, unsigned long long* bad) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = 2;
    long long start = clock64();
    while (clock64() - start < spin) {}
    unsigned long long local = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) local += p[i] != 2;
    if (local) atomicAdd(bad, local);
}

int main() {
    const int n = 1 << 18;  // 1 MiB
    unsigned long long* bad;
    cudaMalloc(&bad, sizeof *bad);
    cudaMemset(bad, 0, sizeof *bad);
    // Both kernels once first: loading a kernel lazily at its first launch
    // waits for the work already running, which would order the test for it.
    late_write<<<1, 1>>>(nullptr, 0, 0);
    write_wait_check<<<1, 1>>>(nullptr, 0, 0, bad);
    cudaDeviceSynchronize();
    int *a, *b;
    cudaMalloc(&a, n * sizeof(int));
    late_write<<<64, 256>>>(a, n, 100000000LL);  // ~50 ms on the legacy stream
    cudaFree(a);
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaMalloc(&b, n * sizeof(int));
    write_wait_check<<<64, 256, 0, s>>>(b, n, 400000000LL, bad);  // checks ~200 ms later
    cudaDeviceSynchronize();
    unsigned long long h = 0;
    cudaMemcpy(&h, bad, sizeof h, cudaMemcpyDeviceToHost);
    printf("result: reused_address=%d corrupted_words=%llu\n", a == b, h);
    return h != 0;
}
