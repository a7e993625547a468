// GPU check of allocation sites (scripts/gpu-sites.sh): one large planted
// allocation on the line marked PLANTED, beside smaller ones elsewhere; the
// report's top site by peak bytes must name that line. Built with -g, with
// the static and the shared CUDA runtime.
#include <cstdio>
#include <cuda_runtime.h>

__attribute__((noinline)) static void *planted(size_t n)
{
    void *p = nullptr;
    cudaMalloc(&p, n); // PLANTED
    return p;
}

__attribute__((noinline)) static void small_ones(void **out, int k)
{
    for (int i = 0; i < k; i++)
        cudaMalloc(&out[i], 1 << 20);
}

int main()
{
    void *small[8];
    small_ones(small, 8);
    void *big = planted(512u << 20);
    cudaMemset(big, 0, 512u << 20);
    cudaDeviceSynchronize();
    for (int i = 0; i < 8; i++)
        cudaFree(small[i]);
    cudaFree(big);
    printf("result: ok\n");
    return 0;
}
