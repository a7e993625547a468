/* Test-local library of tests/check.rs, built as `libtorch_cuda.so`: a
 * cache that reserves device memory once and keeps it until the process
 * ends, as PyTorch's caching allocator does. */
#include "fake_cudart_api.h"

static void *reserved;

__attribute__((visibility("default"))) int cache_reserve(size_t bytes)
{
    return reserved ? 0 : (int)cudaMalloc(&reserved, bytes);
}
