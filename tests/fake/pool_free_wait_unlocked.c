/* Test-local program of tests/pool_safety.rs (`free_wait_unlocked`).
 * With a stream created (so the pool's frees wait for fences), the main
 * thread frees a 512 MiB block: more than the pool keeps behind queued
 * work, so the free waits for the GPU, as cudaFree does (the fake's
 * cuCtxSynchronize takes FAKE_CUDA_SYNC_US). Meanwhile another thread
 * allocates 4 KiB, which the pool serves from a page already mapped. Prints
 * free_ms (the free), other_alloc_ms (the other thread's allocation, timed
 * from 50 ms into the free) and used_after_free_mib (device memory held
 * right after the free).
 *   pool_free_wait_unlocked capture: the other thread instead begins a
 * global-mode stream capture 50 ms into the free and ends it after the
 * free's wait; prints capture_end (its cudaStreamEndCapture result), which
 * a cudaFree made by cupool meanwhile would have invalidated. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "fake_cuda_api.h"
#include "fake_cudart_api.h"
#include "check.h"

#define MIB (1024ull * 1024)

static atomic_int freeing;
static long long other_alloc_ms = -1;
static cudaStream_t capture_stream;
static int capture_end = -1;

static long long now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000LL + t.tv_nsec / 1000000;
}

static void *other_thread(void *arg)
{
    (void)arg;
    while (!atomic_load(&freeing))
        ;
    struct timespec fifty = {0, 50 * 1000 * 1000};
    nanosleep(&fifty, NULL);
    void *p = NULL;
    long long t0 = now_ms();
    CHECK(cudaMalloc(&p, 4096));
    other_alloc_ms = now_ms() - t0;
    return p;
}

static void *capturing_thread(void *arg)
{
    (void)arg;
    while (!atomic_load(&freeing))
        ;
    struct timespec fifty = {0, 50 * 1000 * 1000}, past_the_wait = {0, 400 * 1000 * 1000};
    nanosleep(&fifty, NULL);
    CHECK(cudaStreamBeginCapture(capture_stream, cudaStreamCaptureModeGlobal));
    nanosleep(&past_the_wait, NULL);
    cudaGraph_t g;
    capture_end = cudaStreamEndCapture(capture_stream, &g);
    return NULL;
}

int main(int argc, char **argv)
{
    int capture = argc > 1 && strcmp(argv[1], "capture") == 0;
    cudaStream_t s;
    void *kept = NULL, *big = NULL;
    CHECK(cudaStreamCreate(&s));
    if (capture)
        CHECK(cudaStreamCreate(&capture_stream));
    CHECK(cudaMalloc(&kept, 4096)); /* maps the page the other thread's block fits in */
    CHECK(cudaMalloc(&big, 512 * MIB));
    pthread_t other;
    pthread_create(&other, NULL, capture ? capturing_thread : other_thread, NULL);
    atomic_store(&freeing, 1);
    long long t0 = now_ms();
    CHECK(cudaFree(big));
    long long free_ms = now_ms() - t0;
    size_t used_after_free = fake_device_used(0);
    void *theirs = NULL;
    pthread_join(other, &theirs);
    if (capture) {
        CHECK(cudaFree(kept));
        CHECK(cudaStreamDestroy(capture_stream));
        CHECK(cudaStreamDestroy(s));
        printf("result: ok free_ms=%lld capture_end=%d\n", free_ms, capture_end);
        return 0;
    }
    CHECK(cudaFree(theirs));
    CHECK(cudaFree(kept));
    CHECK(cudaStreamDestroy(s));
    printf("result: ok free_ms=%lld other_alloc_ms=%lld used_after_free_mib=%zu\n", free_ms, other_alloc_ms,
           used_after_free / MIB);
    return 0;
}
