/* Test-local program of tests/check.rs (`check_loop`): a training loop.
 * Usage: check_loop STEPS clean|leak|wave [mark] [exit-code]
 *
 * Setup allocates 1 MiB of weights; the second step allocates 512 KiB of
 * optimizer state (warm-up), kept to the end. Every step allocates and frees
 * a 64 KiB temporary. `leak` also keeps LEAK_BYTES per step, never freed
 * (from leak_one_buffer). `wave` keeps a queue of batches whose sizes and
 * number follow the step (up and down, never growing), freed at the end.
 * `mark` names each step with cupool_mark("step N"), found with dlsym.
 * With STEP_US set, a step takes that many microseconds, as real ones take
 * time: a loop over before the program's last event by more than its own
 * span (and a hundredth of its span, up to a second) is set-up to the check,
 * which a busy host preempting a bare loop of microseconds before its final
 * frees would make it.
 * Everything but the leak is freed before exit. Prints
 * result: ok steps=N leaked_bytes=N. With EXIT_BY=quick_exit it then
 * leaves through quick_exit, with EXIT_BY=term by raising SIGTERM, with
 * EXIT_BY=exec by replacing itself with /bin/true (execv). */
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake_cudart_api.h"
#include "check.h"

#define LEAK_BYTES 4096u
#define MAX_QUEUE 4

__attribute__((noinline)) static int leak_one_buffer(void)
{
    void *p = NULL;
    CHECK(cudaMalloc(&p, LEAK_BYTES));
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3)
        FAIL("usage: check_loop STEPS clean|leak|wave [mark] [exit-code]");
    int steps = atoi(argv[1]);
    const char *mode = argv[2];
    int marks = argc > 3 && strcmp(argv[3], "mark") == 0;
    int code = argc > 3 ? atoi(argv[argc - 1]) : 0;
    void (*mark)(const char *) = (void (*)(const char *))dlsym(RTLD_DEFAULT, "cupool_mark");

    void *weights = NULL, *state = NULL, *queue[MAX_QUEUE] = {0};
    int queued = 0;
    unsigned leaked = 0;
    CHECK(cudaMalloc(&weights, 1u << 20));
    const char *step_us = getenv("STEP_US");
    useconds_t pause = step_us ? (useconds_t)atoi(step_us) : 0;
    for (int step = 0; step < steps; step++) {
        if (pause)
            usleep(pause);
        if (marks && mark) {
            char name[32];
            snprintf(name, sizeof name, "step %d", step);
            mark(name);
        }
        void *tmp = NULL;
        CHECK(cudaMalloc(&tmp, 64u << 10));
        if (step == 1)
            CHECK(cudaMalloc(&state, 512u << 10));
        if (strcmp(mode, "leak") == 0) {
            if (leak_one_buffer())
                return 1;
            leaked += LEAK_BYTES;
        } else if (strcmp(mode, "wave") == 0) {
            int keep = 1 + (step * 5) % MAX_QUEUE;
            if (queued == MAX_QUEUE) {
                CHECK(cudaFree(queue[0]));
                memmove(queue, queue + 1, sizeof(void *) * (MAX_QUEUE - 1));
                queued--;
            }
            CHECK(cudaMalloc(&queue[queued++], (size_t)(1 + (step * 7) % 5) << 15));
            while (queued > keep) {
                CHECK(cudaFree(queue[0]));
                memmove(queue, queue + 1, sizeof(void *) * (MAX_QUEUE - 1));
                queued--;
            }
        }
        CHECK(cudaFree(tmp));
    }
    for (int i = 0; i < queued; i++)
        CHECK(cudaFree(queue[i]));
    if (state)
        CHECK(cudaFree(state));
    CHECK(cudaFree(weights));
    printf("result: ok steps=%d leaked_bytes=%u\n", steps, leaked);
    fflush(stdout);
    const char *exit_by = getenv("EXIT_BY");
    if (exit_by && strcmp(exit_by, "quick_exit") == 0)
        quick_exit(code);
    if (exit_by && strcmp(exit_by, "term") == 0)
        raise(SIGTERM);
    if (exit_by && strcmp(exit_by, "exec") == 0) {
        char *const argv_true[] = {"true", NULL};
        execv("/bin/true", argv_true);
        FAIL("execv /bin/true");
    }
    return code;
}
