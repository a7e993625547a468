/* Test-local program of tests/pool.rs (`errors`), run with and without the
 * pool. Usage: errors [segment_start]
 * Prints the result codes of a bogus cudaFree, cudaMalloc(NULL, 16) and
 * cudaMalloc(&p, 0) (and p). Then allocates blocks a and b (b inside a's
 * segment in pool mode) and double-frees b, or with `segment_start` a (the
 * block at the start of the pool's segment). Afterwards the other block and
 * new blocks c and d must hold data; copies go through the driver, which
 * checks that the range lies in live driver memory, so a released segment
 * shows as `*_works=0`, not a crash. */
#include <stdint.h>

#include "fake_cuda_api.h"
#include "fake_cudart_api.h"
#include "check.h"

static int works(void *p, size_t n)
{
    return holds_data((CUdeviceptr)(uintptr_t)p, n, 5);
}

int main(int argc, char **argv)
{
    int segment_start = argc > 1 && strcmp(argv[1], "segment_start") == 0;
    unsigned allocs = 0, frees = 0;
    setvbuf(stdout, NULL, _IONBF, 0);
    CHECK(cudaFree(NULL)); /* initialises the runtime */
    printf("bogus_free=%d\n", cudaFree((void *)(uintptr_t)0x123400));
    printf("null_out=%d\n", cudaMalloc(NULL, 16));
    void *z = (void *)(uintptr_t)0x1;
    printf("zero=%d\n", cudaMalloc(&z, 0));
    printf("zero_ptr=%llu\n", (unsigned long long)(uintptr_t)z);

    void *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    CHECK(cudaMalloc(&a, 1000));
    CHECK(cudaMalloc(&b, 1000));
    allocs += 2;
    printf("a=%llu\nb=%llu\n", (unsigned long long)(uintptr_t)a, (unsigned long long)(uintptr_t)b);
    void *twice = segment_start ? a : b, *other = segment_start ? b : a;
    printf("free=%d\n", cudaFree(twice));
    frees++;
    printf("double_free=%d\n", cudaFree(twice));
    printf("other_works=%d\n", works(other, 1000));
    CHECK(cudaMalloc(&c, 1000));
    CHECK(cudaMalloc(&d, 1000));
    allocs += 2;
    printf("c_works=%d\n", works(c, 1000));
    printf("d_works=%d\n", works(d, 1000));
    printf("free_other=%d\n", cudaFree(other));
    printf("free_c=%d\n", cudaFree(c));
    printf("free_d=%d\n", cudaFree(d));
    frees += 3;
    printf("result: ok allocs=%u frees=%u leaked_bytes=0\n", allocs, frees);
    return 0;
}
