/* Test-local program of tests/pool.rs (`reuse`).
 * Usage: reuse [stream|streams|stream-vary]
 * 10000 x cudaMalloc(4096) / cudaFree, each block written through the driver
 * (which checks that the range lies inside a live driver allocation). With
 * `stream`, a stream is created first, so freed blocks are reused only
 * behind fences; with `streams`, twelve (more than the pool orders behind a
 * fence on the GPU, so reuse waits for fences to complete); `stream-vary` is
 * `stream` with sizes that keep changing (128 multiples of 512 bytes, each
 * taken once in any 128 pairs in a row). Prints
 * same_as_first= (blocks at the first block's address) and distinct=
 * (distinct addresses). */
#include <stdint.h>
#include <stdlib.h>

#include "fake_cuda_api.h"
#include "fake_cudart_api.h"
#include "check.h"

#define N 10000

static int cmp(const void *a, const void *b)
{
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    static uintptr_t ptrs[N];
    cudaStream_t s[12];
    const char *mode = argc < 2 ? "" : argv[1];
    int vary = strcmp(mode, "stream-vary") == 0;
    int streams = strcmp(mode, "stream") == 0 || vary ? 1 : strcmp(mode, "streams") == 0 ? 12 : 0;
    for (int i = 0; i < streams; i++)
        CHECK(cudaStreamCreate(&s[i]));
    unsigned same_as_first = 0;
    for (int i = 0; i < N; i++) {
        void *p = NULL;
        size_t size = vary ? (size_t)((i * 111) % 128 + 1) * 512 : 4096;
        CHECK(cudaMalloc(&p, size));
        ptrs[i] = (uintptr_t)p;
        same_as_first += ptrs[i] == ptrs[0];
        unsigned char b = (unsigned char)i, back = 0;
        if (cuMemsetD8_v2((CUdeviceptr)ptrs[i], b, size) || cuMemcpyDtoH_v2(&back, (CUdeviceptr)ptrs[i] + size - 1, 1) ||
            back != b)
            FAIL("block %p does not hold data", p);
        CHECK(cudaFree(p));
    }
    qsort(ptrs, N, sizeof(ptrs[0]), cmp);
    unsigned distinct = 0;
    for (int i = 0; i < N; i++)
        distinct += i == 0 || ptrs[i] != ptrs[i - 1];
    for (int i = 0; i < streams; i++)
        CHECK(cudaStreamDestroy(s[i]));
    printf("same_as_first=%u\n", same_as_first);
    printf("distinct=%u\n", distinct);
    printf("result: ok allocs=%d frees=%d leaked_bytes=0\n", N, N);
    return 0;
}
