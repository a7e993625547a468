// Pooled memory after cudaDeviceReset: with the static runtime the reset is
// invisible to hooks, and the context comes back under the same handle. A
// buffer allocated after the reset must be real memory of the new context.
#include <cuda_runtime.h>
#include <cstdio>

__global__ void fill(int *p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = 3 * i;
}

int main() {
    const int n = 1 << 16;
    int *a, *b, *c;
    cudaMalloc(&a, n * sizeof(int));
    cudaMalloc(&b, n * sizeof(int));
    cudaFree(a);  // a cached block in a live segment
    cudaDeviceReset();
    cudaError_t m = cudaMalloc(&c, n * sizeof(int));
    fill<<<n / 256, 256>>>(c, n);
    cudaError_t k = cudaDeviceSynchronize();
    static int h[1 << 16];
    cudaError_t cp = cudaMemcpy(h, c, sizeof(h), cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int i = 0; i < n; i++) bad += h[i] != 3 * i;
    printf("result: malloc=%d kernel=%d copy=%d bad=%d free=%d\n", (int)m, (int)k, (int)cp, bad, (int)cudaFree(c));
    return 0;
}
