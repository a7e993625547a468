/* Test-local program of tests/check.rs (`check_cache`): a clean program
 * whose only memory live at exit is what its "libtorch_cuda.so"
 * (check_cache_lib.c) keeps. Prints result: ok leaked_bytes=0. */
#include <stddef.h>

#include "fake_cudart_api.h"
#include "check.h"

int cache_reserve(size_t bytes);

int main(void)
{
    CHECK(cache_reserve(2u << 20));
    void *p = NULL;
    CHECK(cudaMalloc(&p, 4096));
    CHECK(cudaFree(p));
    printf("result: ok leaked_bytes=0\n");
    return 0;
}
