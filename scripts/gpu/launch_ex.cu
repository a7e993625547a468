// Kernels launched through cudaLaunchKernelEx (cudaLaunchKernelExC) and
// cudaLaunchCooperativeKernel, on the legacy and a created stream, with
// pooled buffers: the output must be the same plainly and under cupool.
#include <cuda_runtime.h>
#include <cstdio>

__global__ void fill(int *p, int n, int v) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = v + i;
}

static long sum(const int *d, int n) {
    int *h = new int[n];
    cudaMemcpy(h, d, n * sizeof(int), cudaMemcpyDeviceToHost);
    long s = 0;
    for (int i = 0; i < n; i++) s += h[i];
    delete[] h;
    return s;
}

int main() {
    const int n = 1 << 16;
    int *a, *b;
    cudaMalloc(&a, n * sizeof(int));
    cudaMalloc(&b, n * sizeof(int));
    cudaStream_t s;
    cudaStreamCreate(&s);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(64);
    cfg.blockDim = dim3(256);
    cfg.stream = s;
    cudaError_t ex = cudaLaunchKernelEx(&cfg, fill, a, n, 3);
    int v = 5, nn = n;
    void *args[] = {&b, &nn, &v};
    cudaError_t coop = cudaLaunchCooperativeKernel((const void *)fill, dim3(8), dim3(256), args, 0, 0);
    cudaDeviceSynchronize();
    printf("launch-ex: ex=%d coop=%d sum_a=%ld sum_b=%ld last_error=%d\n", (int)ex, (int)coop, sum(a, n), sum(b, n),
           (int)cudaGetLastError());
    cudaFree(a);
    cudaFree(b);
    cudaStreamDestroy(s);
    return 0;
}
