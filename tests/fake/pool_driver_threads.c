/* A program with the runtime linked statically, as the shim sees it: pooled
 * allocations through the driver API from the main thread, and a second
 * thread whose kernels, launched through the runtime's private entry points,
 * would be invisible.
 *   argv[1] "two" (default): the second thread allocates too
 *   argv[1] "one":    no second thread
 *   argv[1] "bind":   the second thread only makes the context current,
 *                     after the main thread allocated
 *   argv[1] "early":  the same, before any allocation
 *   argv[1] "launch": as "bind", after a kernel launch the hooks see
 *   argv[1] "launch-two": as "two", after a kernel launch the hooks see
 *   argv[1] "push":   as "bind", through cuCtxPushCurrent
 *   argv[1] "procaddr": as "bind", through a cuCtxSetCurrent the thread got
 *                     from cuGetProcAddress_v2, as the static runtime does
 *   argv[1] "foreign-free": the second thread, with no context of its own,
 *                     frees a block the main thread allocated
 * Ends with `result: ok`. */
#include "fake_cuda_api.h"
#include "fake_cudart_api.h"
#include "check.h"
#include <pthread.h>
#include <string.h>

static CUcontext ctx;
static const char *mode;
static CUdeviceptr foreign;
#define MODE(m) (strcmp(mode, m) == 0)

static int churn(void)
{
    for (int i = 0; i < 100; i++) {
        CUdeviceptr p;
        CHECK(cuMemAlloc_v2(&p, 4096));
        CHECK(cuMemFree_v2(p));
    }
    return 0;
}

static int bind(void)
{
    if (MODE("push"))
        return cuCtxPushCurrent_v2(ctx);
    if (MODE("procaddr")) {
        void *set_current = NULL;
        int status = -1;
        if (cuGetProcAddress_v2("cuCtxSetCurrent", &set_current, 13000, 0, &status) || status || !set_current)
            return 1;
        return ((__typeof__(cuCtxSetCurrent) *)set_current)(ctx);
    }
    return cuCtxSetCurrent(ctx);
}

static void *worker(void *arg)
{
    (void)arg;
    if (MODE("foreign-free"))
        return cuMemFree_v2(foreign) ? (void *)1 : NULL;
    if (bind() || ((MODE("two") || MODE("launch-two")) && churn()))
        return (void *)1;
    return NULL;
}

/* Returns whether the second thread failed. */
static int second_thread(void)
{
    pthread_t t;
    void *r;
    pthread_create(&t, NULL, worker, NULL);
    pthread_join(t, &r);
    return r != NULL;
}

static void kernel(void) {}

int main(int argc, char **argv)
{
    mode = argc > 1 ? argv[1] : "two";
    CHECK(cuInit(0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CHECK(cuCtxSetCurrent(ctx));
    if (MODE("early") && second_thread())
        FAIL("the second thread failed");
    if (churn())
        return 1;
    if (MODE("launch") || MODE("launch-two")) {
        dim3 one = {1, 1, 1};
        CHECK(cudaLaunchKernel((const void *)kernel, one, one, NULL, 0, 0));
    }
    if (MODE("foreign-free"))
        CHECK(cuMemAlloc_v2(&foreign, 4096));
    if (!MODE("one") && !MODE("early") && second_thread())
        FAIL("the second thread failed");
    if (churn())
        return 1;
    printf("result: ok\n");
    return 0;
}
