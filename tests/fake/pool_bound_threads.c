/* A program with the runtime linked statically, as the shim sees it: pooled
 * allocations through the driver API from the main thread only, and a second
 * thread that only makes the context current (its kernels, launched through
 * the runtime's private entry points, would be invisible).
 *   argv[1] "one":    no second thread
 *   argv[1] "bind":   the second thread binds after the main thread allocated
 *   argv[1] "early":  the second thread binds before any allocation
 *   argv[1] "launch": as "bind", after a kernel launch the hooks see
 * Ends with `result: ok`. */
#include "fake_cuda_api.h"
#include "fake_cudart_api.h"
#include "check.h"
#include <pthread.h>
#include <string.h>

static CUcontext ctx;

static int churn(void)
{
    for (int i = 0; i < 100; i++) {
        CUdeviceptr p;
        CHECK(cuMemAlloc_v2(&p, 4096));
        CHECK(cuMemFree_v2(p));
    }
    return 0;
}

static void *binder(void *arg)
{
    (void)arg;
    return cuCtxSetCurrent(ctx) ? (void *)1 : NULL;
}

static int bind_on_another_thread(void)
{
    pthread_t t;
    void *r;
    pthread_create(&t, NULL, binder, NULL);
    pthread_join(t, &r);
    return r != NULL;
}

static void kernel(void) {}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "bind";
    CHECK(cuInit(0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CHECK(cuCtxSetCurrent(ctx));
    if (strcmp(mode, "early") == 0 && bind_on_another_thread())
        FAIL("the second thread could not bind");
    if (churn())
        return 1;
    if (strcmp(mode, "launch") == 0) {
        dim3 one = {1, 1, 1};
        CHECK(cudaLaunchKernel((const void *)kernel, one, one, NULL, 0, 0));
    }
    if ((strcmp(mode, "bind") == 0 || strcmp(mode, "launch") == 0) && bind_on_another_thread())
        FAIL("the second thread could not bind");
    if (churn())
        return 1;
    printf("result: ok\n");
    return 0;
}
