/* Test-local program of tests/top.rs (`top_grow`): memory that grows while
 * the program runs, for `cupool top` to watch.
 * Usage: top_grow STEPS STEP_MS SLEEP_S
 *
 * Allocates 1 MiB from grow_buffers() every STEP_MS milliseconds, STEPS
 * times, keeping every buffer; then 4 KiB from keep_small() and prints
 * "ready" and sleeps SLEEP_S seconds (so a test can kill it), then frees
 * everything and prints result: ok steps=N. */
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "fake_cudart_api.h"
#include "check.h"

#define MAX_STEPS 4096

__attribute__((noinline)) static void *grow_buffers(void)
{
    void *p = NULL;
    return cudaMalloc(&p, 1u << 20) == cudaSuccess ? p : NULL;
}

__attribute__((noinline)) static void *keep_small(void)
{
    void *p = NULL;
    return cudaMalloc(&p, 4096) == cudaSuccess ? p : NULL;
}

int main(int argc, char **argv)
{
    if (argc < 4)
        FAIL("usage: top_grow STEPS STEP_MS SLEEP_S");
    int steps = atoi(argv[1]);
    long step_ms = atol(argv[2]);
    unsigned seconds = (unsigned)atoi(argv[3]);
    static void *kept[MAX_STEPS];
    if (steps > MAX_STEPS)
        FAIL("at most %d steps", MAX_STEPS);
    for (int i = 0; i < steps; i++) {
        if (!(kept[i] = grow_buffers()))
            FAIL("cudaMalloc step %d", i);
        struct timespec ts = {step_ms / 1000, (step_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    void *small = keep_small();
    if (!small)
        FAIL("cudaMalloc small");
    printf("ready\n");
    fflush(stdout);
    while (seconds)
        seconds = sleep(seconds);
    for (int i = 0; i < steps; i++)
        CHECK(cudaFree(kept[i]));
    CHECK(cudaFree(small));
    printf("result: ok steps=%d\n", steps);
    return 0;
}
