/* Test-local program of tests/sites.rs: allocations from known places, each
 * left allocated (so each is also a leak with its site), with sizes that tell
 * them apart:
 *   1234567  planted_alloc(), on the line marked PLANTED
 *   2222222  at the bottom of a 1500-deep recursion
 *   3333333  through nounwind_call() (sites_nounwind.c, built without unwind tables)
 *   4444444  on a second thread
 * Built with and without debug info. */
#include <pthread.h>
#include <stdint.h>

#include "fake_cudart_api.h"
#include "check.h"

void nounwind_call(void (*f)(void));

__attribute__((noinline)) static void planted_alloc(void)
{
    void *p = NULL;
    cudaMalloc(&p, 1234567); /* PLANTED */
}

__attribute__((noinline)) static int recurse(int depth)
{
    if (depth == 0) {
        void *p = NULL;
        return cudaMalloc(&p, 2222222);
    }
    int r = recurse(depth - 1);
    __asm__ volatile("" ::: "memory"); /* keeps the call from becoming a loop */
    return r;
}

__attribute__((noinline)) static void nounwind_target(void)
{
    void *p = NULL;
    cudaMalloc(&p, 3333333);
}

static void *thread_main(void *arg)
{
    (void)arg;
    void *p = NULL;
    cudaMalloc(&p, 4444444);
    return NULL;
}

int main(void)
{
    planted_alloc();
    CHECK(recurse(1500));
    nounwind_call(nounwind_target);
    pthread_t t;
    if (pthread_create(&t, NULL, thread_main, NULL) != 0)
        FAIL("pthread_create");
    pthread_join(t, NULL);
    printf("result: ok\n");
    return 0;
}
