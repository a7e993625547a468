/* Two threads launch "kernels" and allocate: with `ptsz` as argv[1] through
 * cudaLaunchKernel_ptsz on their per-thread default streams (what
 * --default-stream per-thread compiles to; `ex-ptsz` and `coop-ptsz` through
 * cudaLaunchKernelExC_ptsz and cudaLaunchCooperativeKernel_ptsz), else
 * through cudaLaunchKernel on the legacy stream. Ends with `result: ok`. */
#include "fake_cuda_api.h"
#include "fake_cudart_api.h"
#include "check.h"
#include <pthread.h>
#include <string.h>

static int per_thread;
static void kernel(void) {}

static void *worker(void *arg)
{
    (void)arg;
    dim3 one = {1, 1, 1};
    for (int i = 0; i < 100; i++) {
        void *p;
        if (cudaMalloc(&p, 4096))
            return (void *)1;
        cudaLaunchConfig_t config = {one, one, 0, 0, NULL, 0};
        cudaError_t e = per_thread == 1   ? cudaLaunchKernel_ptsz((const void *)kernel, one, one, NULL, 0, 0)
                        : per_thread == 2 ? cudaLaunchKernelExC_ptsz(&config, (const void *)kernel, NULL)
                        : per_thread == 3 ? cudaLaunchCooperativeKernel_ptsz((const void *)kernel, one, one, NULL, 0, 0)
                                          : cudaLaunchKernel((const void *)kernel, one, one, NULL, 0, 0);
        if (e || cudaFree(p))
            return (void *)1;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    const char *how = argc > 1 ? argv[1] : "";
    per_thread = strcmp(how, "ptsz") == 0 ? 1 : strcmp(how, "ex-ptsz") == 0 ? 2 : strcmp(how, "coop-ptsz") == 0 ? 3 : 0;
    pthread_t t[2];
    void *r[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, worker, NULL);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], &r[i]);
    if (r[0] || r[1])
        FAIL("a worker failed");
    printf("result: ok\n");
    return 0;
}
