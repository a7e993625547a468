/* Stream capture around device allocations and frees, through the runtime
 * (shared fake cudart). Prints what every call returned, one `key=code`
 * line each: the lines must be the same plainly and under cupool's pool.
 * A stream-ordered allocation captured into a graph is never freed by the
 * program (the graph owns it). Ends with `result: ok`. */
#include "fake_cuda_api.h"
#include "fake_cudart_api.h"
#include "check.h"
#include <pthread.h>

static int other_malloc;

static void *other_thread(void *arg)
{
    (void)arg;
    void *p = NULL;
    other_malloc = cudaMalloc(&p, 4096);
    if (other_malloc == 0)
        cudaFree(p);
    return NULL;
}

static int other_thread_malloc(void)
{
    pthread_t t;
    pthread_create(&t, NULL, other_thread, NULL);
    pthread_join(t, NULL);
    return other_malloc;
}

int main(void)
{
    cudaStream_t s;
    cudaGraph_t g;
    void *before, *p = NULL, *q = NULL;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaMalloc(&before, 1000));

    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    printf("relaxed_malloc=%d\n", cudaMalloc(&p, 4096));
    printf("relaxed_end=%d\n", cudaStreamEndCapture(s, &g));
    printf("relaxed_free=%d\n", cudaFree(p));

    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    printf("global_malloc=%d\n", cudaMalloc(&q, 4096));
    printf("global_free=%d\n", cudaFree(before));
    printf("global_end=%d\n", cudaStreamEndCapture(s, &g));
    printf("free_after_capture=%d\n", cudaFree(before));

    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    printf("global_other_malloc=%d\n", other_thread_malloc());
    printf("global_other_end=%d\n", cudaStreamEndCapture(s, &g));

    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    printf("local_other_malloc=%d\n", other_thread_malloc());
    printf("local_own_malloc=%d\n", cudaMalloc(&q, 4096));
    printf("local_end=%d\n", cudaStreamEndCapture(s, &g));

    void *graph_owned = NULL;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    printf("graph_malloc=%d\n", cudaMallocAsync(&graph_owned, 8192, s));
    size_t free_bytes, total;
    printf("graph_meminfo=%d\n", cudaMemGetInfo(&free_bytes, &total)); /* not an unsafe call */
    printf("graph_end=%d\n", cudaStreamEndCapture(s, &g));

    void *after;
    printf("malloc_after=%d\n", cudaMalloc(&after, 4096));
    printf("free_after=%d\n", cudaFree(after));
    CHECK(cudaStreamDestroy(s));
    printf("result: ok\n");
    return 0;
}
