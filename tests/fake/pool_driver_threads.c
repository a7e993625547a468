/* Pooled allocations through the driver API from the main thread and, unless
 * argv[1] is "one", from a second thread too: what a program with the static
 * runtime looks like to the shim. Ends with `result: ok`. */
#include "fake_cuda_api.h"
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

static void *worker(void *arg)
{
    (void)arg;
    if (cuCtxSetCurrent(ctx) || churn())
        return (void *)1;
    return NULL;
}

int main(int argc, char **argv)
{
    CHECK(cuInit(0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CHECK(cuCtxSetCurrent(ctx));
    if (churn())
        return 1;
    if (!(argc > 1 && strcmp(argv[1], "one") == 0)) {
        pthread_t t;
        void *r;
        pthread_create(&t, NULL, worker, NULL);
        pthread_join(t, &r);
        if (r)
            FAIL("the second thread failed");
    }
    printf("result: ok\n");
    return 0;
}
