/* Test-local program of tests/pool_magazines.rs (`books`): threads that
 * free their own blocks, blocks another thread made (handed along a ring),
 * and blocks of threads that have exited; a second wave of threads that
 * takes over the first wave's books; blocks each thread leaks on purpose.
 * Prints what it allocated, freed and leaked. */
#include <pthread.h>
#include <stdint.h>

#include "fake_cudart_api.h"
#include "check.h"

#define THREADS 8
#define ROUNDS 300
#define PER_ROUND 8
#define LEAKED_PER_THREAD 2
#define ORPHANS_PER_THREAD 3
#define RING 64

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static void *ring[THREADS][RING]; /* blocks handed to thread i, freed by it */
static int ring_len[THREADS];
static void *orphans[THREADS * ORPHANS_PER_THREAD];
static long allocs, frees, leaked_bytes, errors;

static size_t size_of(uint32_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 17;
    *x ^= *x << 5;
    /* mostly magazine sizes, now and then a large one */
    return (*x % 16 == 0) ? (1u << 20) + *x % 4096 : 256 + *x % (64u * 1024u - 256);
}

static void *alloc(uint32_t *x, size_t *size)
{
    void *p = NULL;
    *size = size_of(x);
    if (cudaMalloc(&p, *size) != cudaSuccess)
        __atomic_add_fetch(&errors, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&allocs, 1, __ATOMIC_RELAXED);
    return p;
}

static void release(void *p)
{
    if (cudaFree(p) != cudaSuccess)
        __atomic_add_fetch(&errors, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&frees, 1, __ATOMIC_RELAXED);
}

static void drain(int me)
{
    void *mine[RING];
    pthread_mutex_lock(&lock);
    int n = ring_len[me];
    for (int i = 0; i < n; i++)
        mine[i] = ring[me][i];
    ring_len[me] = 0;
    pthread_mutex_unlock(&lock);
    for (int i = 0; i < n; i++)
        release(mine[i]);
}

static void *first_wave(void *arg)
{
    int me = (int)(uintptr_t)arg, next = (me + 1) % THREADS;
    uint32_t x = 0x9e3779b9u * (uint32_t)(me + 1);
    size_t size;
    for (int r = 0; r < ROUNDS; r++) {
        void *p[PER_ROUND];
        for (int i = 0; i < PER_ROUND; i++)
            p[i] = alloc(&x, &size);
        for (int i = 0; i < PER_ROUND; i += 2)
            release(p[i]);
        for (int i = 1; i < PER_ROUND; i += 2) {
            pthread_mutex_lock(&lock);
            int full = ring_len[next] == RING;
            if (!full)
                ring[next][ring_len[next]++] = p[i];
            pthread_mutex_unlock(&lock);
            if (full)
                release(p[i]);
        }
        drain(me);
    }
    for (int i = 0; i < LEAKED_PER_THREAD; i++) {
        alloc(&x, &size);
        __atomic_add_fetch(&leaked_bytes, (long)size, __ATOMIC_RELAXED);
    }
    for (int i = 0; i < ORPHANS_PER_THREAD; i++)
        orphans[me * ORPHANS_PER_THREAD + i] = alloc(&x, &size);
    return NULL;
}

static void *second_wave(void *arg)
{
    uint32_t x = 0x51ed270bu * (uint32_t)((uintptr_t)arg + 1);
    size_t size;
    for (int r = 0; r < ROUNDS; r++)
        release(alloc(&x, &size));
    return NULL;
}

int main(void)
{
    pthread_t t[THREADS];
    CHECK(cudaFree(NULL)); /* initialises the runtime */
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, first_wave, (void *)(uintptr_t)i);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < THREADS; i++)
        drain(i);
    for (int i = 0; i < THREADS / 2; i++)
        pthread_create(&t[i], NULL, second_wave, (void *)(uintptr_t)i);
    for (int i = 0; i < THREADS / 2; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < THREADS * ORPHANS_PER_THREAD; i++)
        release(orphans[i]);
    if (errors)
        FAIL("%ld errors", errors);
    printf("result: ok allocs=%ld frees=%ld leaked_bytes=%ld leaked_count=%d\n", allocs, frees, leaked_bytes,
           THREADS * LEAKED_PER_THREAD);
    return 0;
}
