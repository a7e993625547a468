/* Test-local program of tests/pool.rs (`api_stats`): reads cupool's own C API
 * the way the Python module does, through dlsym on the running process.
 * Prints has_api= (the symbols are there), then after a 1 MiB block is kept
 * and a 3 MiB block came and went: allocated=, peak_allocated=, reserved=,
 * peak_reserved=, allocations=, peak_allocations=, num_allocs=, num_frees=;
 * and after cupool_reset_peak_memory_stats: peak_after_reset=. */
#include <dlfcn.h>
#include <stdint.h>

#include "fake_cuda_api.h"
#include "fake_cudart_api.h"
#include "check.h"

struct cupool_memory_stats {
    uint64_t allocated_bytes, peak_allocated_bytes, reserved_bytes, peak_reserved_bytes;
    uint64_t allocations, peak_allocations, num_allocs, num_frees, num_alloc_failures;
};

int main(void)
{
    int (*stats)(int, struct cupool_memory_stats *, size_t) =
        (int (*)(int, struct cupool_memory_stats *, size_t))dlsym(RTLD_DEFAULT, "cupool_memory_stats");
    void (*reset)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, "cupool_reset_peak_memory_stats");
    printf("has_api=%d\n", stats != NULL && reset != NULL);
    if (!stats || !reset) {
        printf("result: ok\n");
        return 0;
    }
    void *a = NULL, *b = NULL;
    CHECK(cudaMalloc(&a, 1u << 20));
    CHECK(cudaMalloc(&b, 3u << 20));
    CHECK(cudaFree(b));
    struct cupool_memory_stats s;
    EXPECT(stats(0, NULL, sizeof s), -1);
    EXPECT(stats(0, &s, sizeof s - 1), -1);
    EXPECT(stats(-1, &s, sizeof s), -1);
    CHECK(stats(0, &s, sizeof s));
    printf("allocated=%llu\npeak_allocated=%llu\n", (unsigned long long)s.allocated_bytes,
           (unsigned long long)s.peak_allocated_bytes);
    printf("reserved=%llu\npeak_reserved=%llu\n", (unsigned long long)s.reserved_bytes,
           (unsigned long long)s.peak_reserved_bytes);
    printf("allocations=%llu\npeak_allocations=%llu\n", (unsigned long long)s.allocations,
           (unsigned long long)s.peak_allocations);
    printf("num_allocs=%llu\nnum_frees=%llu\n", (unsigned long long)s.num_allocs, (unsigned long long)s.num_frees);
    reset(0);
    CHECK(stats(0, &s, sizeof s));
    printf("peak_after_reset=%llu\n", (unsigned long long)s.peak_allocated_bytes);
    CHECK(cudaFree(a));
    printf("result: ok\n");
    return 0;
}
