/* The thread's last error (cudaGetLastError) after runtime calls that
 * cupool's pool may answer itself: a double free, an allocation the device
 * cannot hold, a free that a global capture refuses. One `key=code` line
 * each, the same plainly and under the pool; ends with `result: ok`.
 * Against the fakes (-DFAKE_CUDA, tests/pool_safety.rs) or a real GPU
 * (`nvcc -cudart shared`, scripts/gpu-check.sh), where blocks of 512 MiB
 * (below `direct_min`, so pooled) fill the device. */
#ifdef FAKE_CUDA
#include "fake_cuda_api.h"
#include "fake_cudart_api.h"
#define BLOCK (64 << 20)
#else
#include <cuda_runtime.h>
#define BLOCK ((size_t)512 << 20)
#endif
#include "check.h"

/* `capture-limit`: under a global capture on one stream, a stream-ordered
 * allocation on another (allowed) that cupool's `limit` refuses: the refusal
 * must leave the capture whole. */
static int capture_limit(void)
{
    cudaStream_t s, other;
    cudaGraph_t g;
    void *p = NULL;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaStreamCreate(&other));
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    printf("limit_async=%d\n", cudaMallocAsync(&p, 512 << 20, other));
    printf("limit_capture_end=%d\n", cudaStreamEndCapture(s, &g));
    if (p)
        CHECK(cudaFreeAsync(p, other));
    CHECK(cudaStreamDestroy(other));
    CHECK(cudaStreamDestroy(s));
    printf("result: ok\n");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "capture-limit") == 0)
        return capture_limit();
    void *a, *b, *fill[400];
    CHECK(cudaMalloc(&a, 4096));
    CHECK(cudaFree(a));
    printf("double_free=%d\n", cudaFree(a));
    printf("double_free_last=%d\n", cudaGetLastError());
    printf("double_free_last_again=%d\n", cudaGetLastError());

    /* Blocks until the device is full (how many differs: the pool keeps
     * some memory of its own). */
    int n = 0, m = 0;
    while (n < 400 && (m = cudaMalloc(&fill[n], BLOCK)) == 0)
        n++;
    printf("oom=%d\n", m);
    printf("oom_last=%d\n", cudaGetLastError());
    printf("oom_last_again=%d\n", cudaGetLastError());
    for (int i = 0; i < n; i++)
        CHECK(cudaFree(fill[i]));

    cudaStream_t s;
    cudaGraph_t g;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaMalloc(&b, 4096));
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    printf("capture_free=%d\n", cudaFree(b));
    printf("capture_free_last=%d\n", cudaGetLastError());
    printf("capture_end=%d\n", cudaStreamEndCapture(s, &g));
    printf("capture_end_last=%d\n", cudaGetLastError());
    CHECK(cudaFree(b));
    CHECK(cudaStreamDestroy(s));
    printf("result: ok\n");
    return 0;
}
