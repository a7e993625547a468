/* Test-local library of tests/sites.rs, loaded by a Python script through
 * ctypes: allocates on a native thread that never ran Python. */
#include <pthread.h>
#include <stddef.h>

#include "fake_cudart_api.h"

static void *alloc_main(void *arg)
{
    void *p = NULL;
    cudaMalloc(&p, *(size_t *)arg);
    return NULL;
}

int alloc_on_native_thread(size_t bytes)
{
    pthread_t t;
    if (pthread_create(&t, NULL, alloc_main, &bytes) != 0)
        return -1;
    return pthread_join(t, NULL);
}
