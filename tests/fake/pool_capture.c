/* Stream capture around device allocations and frees, through the runtime
 * (shared fake cudart). Prints what every call returned, one `key=code`
 * line each: the lines must be the same plainly and under cupool's pool.
 * A stream-ordered allocation captured into a graph is never freed by the
 * program (the graph owns it). Ends with `result: ok`. */
#include "fake_cuda_api.h"
#include "fake_cudart_api.h"
#include "check.h"
#include <pthread.h>
#include <sched.h>

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

static int capture_stage, capture_end;

/* Captures `arg` in thread-local mode until told to end. */
static void *capturing_thread(void *arg)
{
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture((cudaStream_t)arg, cudaStreamCaptureModeThreadLocal));
    __atomic_store_n(&capture_stage, 1, __ATOMIC_RELEASE);
    while (__atomic_load_n(&capture_stage, __ATOMIC_ACQUIRE) != 2)
        sched_yield();
    capture_end = cudaStreamEndCapture((cudaStream_t)arg, &g);
    return NULL;
}

static CUdeviceptr no_context_block;
static int no_context_free;

/* A thread with no current context frees a block through the driver API. */
static void *no_context_thread(void *arg)
{
    (void)arg;
    no_context_free = cuMemFree_v2(no_context_block);
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
    printf("global_end=%d\n", cudaStreamEndCapture(s, &g));
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    printf("global_free=%d\n", cudaFree(before));
    printf("global_free_end=%d\n", cudaStreamEndCapture(s, &g));
    printf("free_after_capture=%d\n", cudaFree(before));

    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    printf("global_other_malloc=%d\n", other_thread_malloc());
    printf("global_other_end=%d\n", cudaStreamEndCapture(s, &g));

    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    printf("local_other_malloc=%d\n", other_thread_malloc());
    printf("local_own_malloc=%d\n", cudaMalloc(&q, 4096));
    printf("local_end=%d\n", cudaStreamEndCapture(s, &g));

    /* A relaxed capture forbids no free: cudaFree succeeds (a pooled block
     * too) and the capture stays whole. */
    void *held;
    CHECK(cudaMalloc(&held, 2000));
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    printf("relaxed_held_free=%d\n", cudaFree(held));
    printf("relaxed_held_end=%d\n", cudaStreamEndCapture(s, &g));

    /* A global capture invalidated and left open, as by a program that lost
     * its graph builder to an exception, still forbids allocating and freeing. */
    cudaStream_t s2;
    void *kept1, *kept2, *z = NULL;
    CHECK(cudaStreamCreate(&s2));
    CHECK(cudaMalloc(&kept1, 3000));
    CHECK(cudaMalloc(&kept2, 3000));
    CHECK(cudaStreamBeginCapture(s2, cudaStreamCaptureModeGlobal));
    printf("open_malloc=%d\n", cudaMalloc(&z, 4096));
    printf("open_free=%d\n", cudaFree(kept1));
    printf("open_malloc_again=%d\n", cudaMalloc(&z, 4096));
    printf("open_free_again=%d\n", cudaFree(z));
    printf("open_end=%d\n", cudaStreamEndCapture(s2, &g));
    printf("open_free_after=%d\n", cudaFree(kept2));

    /* A thread-local capture on another thread forbids this thread nothing:
     * a free succeeds and leaves that capture whole. */
    void *mine;
    CHECK(cudaMalloc(&mine, 5000));
    pthread_t t;
    pthread_create(&t, NULL, capturing_thread, s2);
    while (__atomic_load_n(&capture_stage, __ATOMIC_ACQUIRE) != 1)
        sched_yield();
    printf("local_other_free=%d\n", cudaFree(mine));
    __atomic_store_n(&capture_stage, 2, __ATOMIC_RELEASE);
    pthread_join(t, NULL);
    printf("local_other_free_end=%d\n", capture_end);
    CHECK(cudaStreamDestroy(s2));

    /* cuMemFree needs no current context: from a thread without one it is
     * allowed, and refused under a global capture of the block's context
     * (as measured on an H200). */
    CUdeviceptr d1, d2;
    CHECK(cuMemAlloc_v2(&d1, 4096));
    CHECK(cuMemAlloc_v2(&d2, 4096));
    no_context_block = d1;
    pthread_create(&t, NULL, no_context_thread, NULL);
    pthread_join(t, NULL);
    printf("no_context_free=%d\n", no_context_free);
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    no_context_block = d2;
    pthread_create(&t, NULL, no_context_thread, NULL);
    pthread_join(t, NULL);
    printf("no_context_capture_free=%d\n", no_context_free);
    printf("no_context_capture_end=%d\n", cudaStreamEndCapture(s, &g));
    printf("no_context_free_after=%d\n", cuMemFree_v2(d2));

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
