// GPU check of `cupool check`: a clean cuBLAS program (handle, SGEMM, frees).
#include <cstdio>
#include <cublas_v2.h>
#include <cuda_runtime.h>

int main()
{
    const int n = 1024;
    float *a, *b, *c;
    cudaMalloc(&a, n * n * sizeof(float));
    cudaMalloc(&b, n * n * sizeof(float));
    cudaMalloc(&c, n * n * sizeof(float));
    cudaMemset(a, 0, n * n * sizeof(float));
    cudaMemset(b, 0, n * n * sizeof(float));
    cublasHandle_t h;
    cublasCreate(&h);
    const float one = 1, zero = 0;
    for (int i = 0; i < 10; i++)
        cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, n, b, n, &zero, c, n);
    cudaDeviceSynchronize();
    cublasDestroy(h);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    printf("result: ok\n");
    return 0;
}
