/* Test-local program of tests/pool_safety.rs (`first_stream`): a block
 * allocated and freed while no stream exists, then the program's first
 * stream created and used, then a second one. Prints a result line. */
#include "fake_cuda_api.h"
#include "fake_cudart_api.h"
#include "check.h"

int main(void)
{
    void *a = NULL, *b = NULL;
    CHECK(cudaMalloc(&a, 4096));
    CHECK(cudaFree(a));
    cudaStream_t first, second;
    CHECK(cudaStreamCreate(&first));
    CHECK(cudaMalloc(&b, 4096));
    CHECK(cudaFree(b));
    CHECK(cudaStreamCreate(&second));
    CHECK(cudaStreamDestroy(second));
    CHECK(cudaStreamDestroy(first));
    printf("result: ok allocs=2 frees=2 leaked_bytes=0\n");
    return 0;
}
