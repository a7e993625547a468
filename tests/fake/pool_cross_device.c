/* Two devices, one thread: a stream on each (so freed blocks wait for
 * fences), blocks of device 0 freed while device 1 is current and blocks of
 * device 1 while device 0 is, then memory asked back on each. Every block is
 * on the device that was current at its cudaMalloc. With give_back=never
 * the pools keep their segments, so the fences are what decides reuse.
 * With argv[1] "thread": one 64 MiB block freed by a new thread that has no
 * current context (its segment goes back to the device then).
 * Ends with `result: ok`. */
#include "fake_cuda_api.h"
#include "fake_cudart_api.h"
#include "check.h"
#include <pthread.h>
#include <string.h>

static void *free_it(void *p) { return (void *)(long)cudaFree(p); }

static int free_on_a_new_thread(void)
{
    void *p;
    CHECK(cudaMalloc(&p, 64 << 20));
    pthread_t t;
    void *r;
    pthread_create(&t, NULL, free_it, p);
    pthread_join(t, &r);
    if (r)
        FAIL("cudaFree on a thread without a context -> %ld", (long)r);
    printf("result: ok\n");
    return 0;
}

static int device_of(void *p)
{
    int ordinal = -1;
    if (cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (CUdeviceptr)p))
        return -1;
    return ordinal;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "thread") == 0)
        return free_on_a_new_thread();
    cudaStream_t s[2];
    for (int d = 0; d < 2; d++) {
        CHECK(cudaSetDevice(d));
        CHECK(cudaStreamCreate(&s[d]));
    }
    for (int round = 0; round < 50; round++) {
        void *p[2];
        for (int d = 0; d < 2; d++) {
            CHECK(cudaSetDevice(d));
            CHECK(cudaMalloc(&p[d], 4096 + 512 * round));
            if (device_of(p[d]) != d)
                FAIL("round %d: a block asked for on device %d is on device %d", round, d, device_of(p[d]));
        }
        /* Each freed while the other device is current. */
        CHECK(cudaSetDevice(1));
        CHECK(cudaFree(p[0]));
        CHECK(cudaSetDevice(0));
        CHECK(cudaFree(p[1]));
    }
    for (int d = 0; d < 2; d++) {
        CHECK(cudaSetDevice(d));
        CHECK(cudaStreamDestroy(s[d]));
    }
    printf("result: ok\n");
    return 0;
}
