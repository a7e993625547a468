/* Test-local program of tests/preload.rs (`start_race`): 16 threads make
 * their first allocation together, right after the runtime was initialised
 * by cudaFree(NULL) (which the shim does not record, so its lazy start
 * happens under the threads' feet). */
#include <pthread.h>

#include "fake_cudart_api.h"
#include "check.h"

#define N 16

static pthread_barrier_t bar;
static int errors;

static void *worker(void *arg)
{
    (void)arg;
    void *p = NULL;
    pthread_barrier_wait(&bar);
    if (cudaMalloc(&p, 4096) != cudaSuccess || cudaFree(p) != cudaSuccess)
        __atomic_add_fetch(&errors, 1, __ATOMIC_RELAXED);
    return NULL;
}

int main(void)
{
    pthread_t t[N];
    CHECK(cudaFree(NULL)); /* initialises the runtime */
    pthread_barrier_init(&bar, NULL, N);
    for (int i = 0; i < N; i++)
        pthread_create(&t[i], NULL, worker, NULL);
    for (int i = 0; i < N; i++)
        pthread_join(t[i], NULL);
    if (errors)
        FAIL("%d errors", errors);
    printf("result: ok allocs=%d frees=%d leaked_bytes=0\n", N, N);
    return 0;
}
