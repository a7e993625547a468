// Leak checkpoints: memory still allocated when cudaDeviceReset destroys the
// primary context is leaked at that point; a later allocation leaks at exit.
#include <cuda_runtime.h>
#include <cstdio>

int main() {
    void *a, *b, *c, *d;
    cudaMalloc(&a, 1111111);
    cudaMalloc(&b, 2222222);
    cudaMalloc(&c, 3333333);
    cudaFree(b);
    cudaDeviceReset();  // a and c die here
    cudaMalloc(&d, 4444444);
    cudaDeviceSynchronize();
    printf("result: device_allocs=4 leaks=3 leaked_bytes=%d\n", 1111111 + 3333333 + 4444444);
    return 0;
}
