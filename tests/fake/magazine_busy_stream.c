/* Test-local program of tests/pool_magazines.rs (`busy_stream`). Two
 * threads, each on a stream of its own, free a block while work queued on
 * that stream still uses it (fake_stream_busy: BUSY_MS), then allocate and
 * free 4 KiB blocks PAIRS times at once. A busy block may be handed out
 * again while its work runs only where later work is ordered behind it (a
 * GPU-side barrier: an event recorded on a third, idle stream then
 * completes only after the work), or once the pool waited for the work on
 * the host (which the fake finishes at once). Neither the thread's magazine
 * (whichever thread recorded the fence its free waits for) nor the pool may
 * do otherwise. `busy_stream [SPARE]` makes SPARE more idle streams first
 * (8: too many for barriers). Prints unordered (a busy block handed out
 * with later work not ordered behind it), early (handed out, ordered) and
 * pairs (made well inside the busy time: the check covered something). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "fake_cuda_api.h"
#include "fake_cudart_api.h"
#include "check.h"

#define BUSY_MS 400
#define PAIRS 3000
#define MAX_SPARE_STREAMS 16

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

struct outcome {
    long unordered, early, inside, failed;
};

static cudaStream_t idle;

static void *churn(void *arg)
{
    struct outcome *o = arg;
    cudaStream_t s;
    void *busy = NULL, *p = NULL;
    if (cudaStreamCreateWithFlags(&s, 1)) {
        o->failed++;
        return NULL;
    }
    /* A few pairs first: a magazine holds the size, and the busy block is one of its own. */
    for (int i = 0; i < 8; i++)
        if (cudaMalloc(&p, 4096) || cudaFree(p)) {
            o->failed++;
            return NULL;
        }
    if (cudaMalloc(&busy, 4096)) {
        o->failed++;
        return NULL;
    }
    long long started = now_ns();
    fake_stream_busy((CUstream)s, BUSY_MS);
    if (cudaFree(busy)) {
        o->failed++;
        return NULL;
    }
    /* Half the busy time: well before the work ends, however slow the host. */
    long long deadline = started + BUSY_MS * 1000000LL / 2;
    for (int i = 0; i < PAIRS; i++) {
        if (cudaMalloc(&p, 4096)) {
            o->failed++;
            return NULL;
        }
        if (now_ns() < deadline) {
            o->inside++;
            if (p == busy) {
                /* Still running (the pool did not wait for it on the host)
                 * with work on the idle stream not ordered behind it? */
                CUevent on_busy, on_idle;
                if (cuEventCreate(&on_busy, 0) || cuEventCreate(&on_idle, 0) ||
                    cuEventRecord(on_busy, (CUstream)s) || cuEventRecord(on_idle, (CUstream)idle)) {
                    o->failed++;
                    return NULL;
                }
                if (cuEventQuery(on_busy) == CUDA_ERROR_NOT_READY && cuEventQuery(on_idle) == CUDA_SUCCESS)
                    o->unordered++;
                else
                    o->early++;
                cuEventDestroy_v2(on_busy);
                cuEventDestroy_v2(on_idle);
            }
        }
        if (cudaFree(p)) {
            o->failed++;
            return NULL;
        }
    }
    cudaStreamDestroy(s);
    return NULL;
}

int main(int argc, char **argv)
{
    int spare_streams = argc > 1 ? atoi(argv[1]) : 0;
    if (spare_streams > MAX_SPARE_STREAMS)
        FAIL("at most %d spare streams", MAX_SPARE_STREAMS);
    void *kept = NULL;
    CHECK(cudaMalloc(&kept, 512)); /* a log is written with the trace off */
    CHECK(cudaStreamCreateWithFlags(&idle, 1));
    /* Past 8 streams the pool places no GPU-side barrier (which would order
     * the idle stream behind the busy work): reuse waits for the work. */
    cudaStream_t spare[MAX_SPARE_STREAMS];
    for (int i = 0; i < spare_streams; i++)
        CHECK(cudaStreamCreateWithFlags(&spare[i], 1));
    struct outcome o[2] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, churn, &o[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    if (o[0].failed || o[1].failed)
        FAIL("a call failed");
    printf("result: ok unordered=%ld early=%ld pairs=%ld\n", o[0].unordered + o[1].unordered, o[0].early + o[1].early,
           o[0].inside + o[1].inside);
    return 0;
}
