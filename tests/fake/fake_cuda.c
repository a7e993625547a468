/*
 * Fake CUDA driver (soname libcuda.so.1) for tests on machines without a GPU.
 *
 * "Device" memory is host memory.  The library keeps its own table of live
 * allocations so that it can enforce the same rules as the real driver
 * (unknown pointer -> CUDA_ERROR_INVALID_VALUE, no context ->
 * CUDA_ERROR_INVALID_CONTEXT, memory limit -> CUDA_ERROR_OUT_OF_MEMORY, ...)
 * and so that it can report ground-truth counters at exit (FAKE_CUDA_STATS).
 *
 * Environment:
 *   FAKE_CUDA_DEVICES    number of devices (default 2, at most FAKE_MAX_DEVICES)
 *   FAKE_CUDA_TOTAL_MEM  bytes of memory per device (default 1 GiB)
 *   FAKE_CUDA_STATS      file to which the destructor appends one line:
 *                        pid allocs frees host_allocs host_frees vmm_creates
 *                        vmm_releases live live_bytes ipc_opens ipc_closes
 *                        cross_context_records (events recorded on a stream
 *                        of another context: refused, as CUDA does)
 *                        vmm_maps vmm_unmaps vmm_grants (cuMemSetAccess calls)
 *                        vmm_imports (cuMemImportFromShareableHandle calls)
 *                        stream_waits (cuStreamWaitEvent calls)
 *   FAKE_CUDA_EVENT_LATENCY_US  a recorded event completes this many us after
 *                        its record (cuEventQuery says CUDA_ERROR_NOT_READY
 *                        until then), as a GPU's lags the host; default 0
 *   FAKE_CUDA_SYNC_US    cuCtxSynchronize takes this many us (outside the
 *                        fake's own lock), as waiting for a busy GPU does;
 *                        default 0
 *
 * VMM memory (cuMemCreate + cuMemMap) is inaccessible until cuMemSetAccess
 * grants it, as on a GPU: a mapping without a grant faults when touched.
 *
 * Device allocations of cuMemAlloc_v2 / cuMemAllocPitch_v2 of at least
 * FAKE_MMAP_THRESHOLD bytes live in a memfd file mapped MAP_SHARED, so that
 * legacy CUDA IPC (cuIpcGetMemHandle / cuIpcOpenMemHandle) can share them
 * with another process: the receiver opens /proc/<exporter pid>/fd/<fd> and
 * maps the same pages.  See "Legacy CUDA IPC" below for the handle layout.
 *
 * Build: cc -shared -fPIC -fvisibility=hidden -Wl,-soname,libcuda.so.1
 *        -o libcuda.so.1 fake_cuda.c -pthread
 * Only the functions marked EXPORT are in the dynamic symbol table.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fake_cuda_api.h"

#define EXPORT __attribute__((visibility("default")))

/*
 * cuGetProcAddress must hand out exactly the addresses of our exported
 * functions.  Writing `&cuMemAlloc_v2` inside a -fPIC library goes through the
 * GOT, which the dynamic linker may bind to *another* object's cuMemAlloc_v2
 * (for instance an LD_PRELOADed shim).  A hidden alias always resolves to the
 * definition in this library, and it has the same address as the export.
 */
#define LOCAL_ALIAS(f) extern __typeof__(f) local_##f __attribute__((visibility("hidden"), alias(#f)))

#define FAKE_MAX_DEVICES 16
#define FAKE_DRIVER_VERSION 13000
#define FAKE_ALIGN 256
#define FAKE_MMAP_THRESHOLD (1u << 20)
#define FAKE_CTX_STACK 32

/* ------------------------------------------------------------------------ */
/* Global state.  Everything below is protected by g_lock unless noted.     */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static volatile int g_inited; /* cuInit succeeded; set once, under g_lock */
static volatile int g_deinit; /* destructor ran: the driver is shutting down */
static int g_ndev = 2;
static size_t g_total_mem = (size_t)1 << 30;
static size_t g_used[FAKE_MAX_DEVICES]; /* device + vmm-physical bytes per device */

enum alloc_kind {
    K_DEVICE,   /* cuMemAlloc_v2 */
    K_PITCHED,  /* cuMemAllocPitch_v2 */
    K_MANAGED,  /* cuMemAllocManaged */
    K_ASYNC,    /* cuMemAllocAsync */
    K_POOL,     /* cuMemAllocFromPoolAsync */
    K_HOST,     /* cuMemAllocHost_v2 / cuMemHostAlloc */
    K_VMM_MAP,  /* a cuMemMap'ed range; memory owned by the mapping */
    K_IPC,      /* another process's allocation, mapped by cuIpcOpenMemHandle */
};

static int kind_is_device(int k) { return k <= K_POOL; }

enum backing {
    B_MALLOC, /* posix_memalign */
    B_MMAP,   /* private anonymous mapping (or an IPC mapping, whose fd is closed) */
    B_MEMFD,  /* MAP_SHARED mapping of the memfd `fd`, closed on release */
    B_NONE,
};

struct alloc {
    uintptr_t base;
    size_t size;     /* size as seen by the program */
    size_t map_len;  /* length of the mmap when backing == B_MMAP */
    int kind;
    int backing;
    int device;
    struct CUctx_st *ctx;      /* owning context (NULL for VMM mappings) */
    unsigned long long id;     /* CU_POINTER_ATTRIBUTE_BUFFER_ID: fresh for every entry */
    int fd;                    /* B_MEMFD: the memfd; otherwise -1 */
    unsigned long long ino;    /* B_MEMFD and K_IPC: inode of the memfd */
    /* K_IPC only: who exported it (for repeated opens of one handle) and how
     * many opens are not closed yet. */
    int ipc_pid, ipc_fd;
    unsigned long long ipc_id;
    int ipc_refs;
};

/* Source of buffer ids (under g_lock). */
static unsigned long long g_next_id = 1;

/* Sorted by base address: exact lookups and range lookups are binary searches. */
static struct alloc *g_tab;
static size_t g_ntab, g_captab;

/* Counters for FAKE_CUDA_STATS (successful calls only). */
static struct {
    unsigned long long allocs, frees, host_allocs, host_frees, vmm_creates, vmm_releases, ipc_opens, ipc_closes,
        cross_context_records, vmm_maps, vmm_unmaps, vmm_grants, vmm_imports, stream_waits;
} g_stats;

#define CTX_MAGIC 0xC0C0C7A1u
#define CTX_DEAD 0xDEADC7A1u

struct CUctx_st {
    unsigned magic;
    int device;
    int primary;
    int refcount; /* primary contexts only */
    int active;   /* 0 once destroyed / reset / released to zero */
    unsigned long long id; /* cuCtxGetId: new for every context made, a primary one each time it starts */
};
static unsigned long long g_ctx_ids;

static struct CUctx_st g_primary[FAKE_MAX_DEVICES];

/* Per-thread context stack, like the real driver's. */
static __thread struct CUctx_st *t_stack[FAKE_CTX_STACK];
static __thread int t_depth;

struct CUstream_st {
    struct CUctx_st *ctx; /* the context current when it was created */
    unsigned flags;
    int priority;
    int capture; /* CU_STREAM_CAPTURE_STATUS_* */
    int capture_mode;
    pthread_t capture_thread;
    /* CLOCK_MONOTONIC ns until which work queued on it runs (fake_stream_busy). */
    long long busy_until_ns;
};
struct CUevent_st {
    struct CUctx_st *ctx;
    unsigned flags;
    /* CLOCK_MONOTONIC ns from which a record completes: its record plus the
     * latency, or later when its stream was busy. */
    long long ready_ns;
    /* CLOCK_MONOTONIC ns of its last record (FAKE_CUDA_EVENT_LATENCY_US),
     * the stream it was recorded on, and whether a synchronization since
     * completed it. */
    long long recorded_ns;
    CUstream stream;
    int synced;
};
/* VMM handles and reservations belong to the context current when they were
 * made and die with it (cuCtxDestroy), as cuMemAlloc memory does: on an H100
 * (driver 580) unmapping, releasing or freeing them after their context was
 * destroyed crashed the process, so cupool forgets them instead and the fake
 * takes them away. */
struct vmm_handle {
    int fd;
    size_t size;
    int device;
    struct CUctx_st *ctx;
    int shareable; /* made with requestedHandleTypes = POSIX file descriptor, or imported */
};
struct reservation {
    uintptr_t base;
    size_t size;
    void *map_base; /* what mmap returned (may precede base because of alignment) */
    size_t map_len;
    struct CUctx_st *ctx;
};

/* A tiny set of live handles, so stale or bogus handles are rejected instead
 * of dereferenced.  Linear search is fine: tests create few handles. */
struct handle_set {
    void **items;
    size_t n, cap;
};
static struct handle_set g_ctxs, g_streams, g_events, g_vmm, g_resv;
static void complete_events_locked(CUstream stream, int all);
/* Until when the legacy stream is busy (cuStreamWaitEvent on fake_stream_busy's work). */
static long long g_legacy_busy_until_ns;

static int set_add(struct handle_set *s, void *p)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        void **items = realloc(s->items, cap * sizeof(void *));
        if (!items)
            return -1;
        s->items = items;
        s->cap = cap;
    }
    s->items[s->n++] = p;
    return 0;
}

static int set_has(const struct handle_set *s, const void *p)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->items[i] == p)
            return 1;
    return 0;
}

static int set_del(struct handle_set *s, const void *p)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->items[i] == p) {
            s->items[i] = s->items[--s->n];
            return 1;
        }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Allocation table                                                         */

/* Index of the first entry whose base is > p. */
static size_t tab_upper(uintptr_t p)
{
    size_t lo = 0, hi = g_ntab;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (g_tab[mid].base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static struct alloc *tab_find_exact(uintptr_t p)
{
    size_t i = tab_upper(p);
    if (i > 0 && g_tab[i - 1].base == p)
        return &g_tab[i - 1];
    return NULL;
}

/* Entry containing the byte range [p, p+len) (len 0 is treated as 1). */
static struct alloc *tab_find_range(uintptr_t p, size_t len)
{
    size_t i = tab_upper(p);
    if (i == 0)
        return NULL;
    struct alloc *a = &g_tab[i - 1];
    if (len == 0)
        len = 1;
    if (p - a->base >= a->size || len > a->size - (p - a->base))
        return NULL;
    return a;
}

/* Inserts a copy of *a, giving it a fresh buffer id. */
static int tab_insert(const struct alloc *a)
{
    if (g_ntab == g_captab) {
        size_t cap = g_captab ? g_captab * 2 : 64;
        struct alloc *t = realloc(g_tab, cap * sizeof(*t));
        if (!t)
            return -1;
        g_tab = t;
        g_captab = cap;
    }
    size_t i = tab_upper(a->base);
    memmove(&g_tab[i + 1], &g_tab[i], (g_ntab - i) * sizeof(*g_tab));
    g_tab[i] = *a;
    g_tab[i].id = g_next_id++;
    g_ntab++;
    return 0;
}

static void tab_remove(struct alloc *a)
{
    size_t i = (size_t)(a - g_tab);
    memmove(&g_tab[i], &g_tab[i + 1], (g_ntab - i - 1) * sizeof(*g_tab));
    g_ntab--;
}

static void release_backing(const struct alloc *a)
{
    if (a->backing == B_MALLOC)
        free((void *)a->base);
    else if (a->backing == B_MMAP)
        munmap((void *)a->base, a->map_len);
    else if (a->backing == B_MEMFD) {
        /* A receiver that still maps the file keeps its pages alive. */
        munmap((void *)a->base, a->map_len);
        close(a->fd);
    }
}

/* Removes every entry for which drop(entry, arg) is true, releasing memory. */
static void tab_drop_if(int (*drop)(const struct alloc *, const void *), const void *arg)
{
    size_t w = 0;
    for (size_t r = 0; r < g_ntab; r++) {
        struct alloc *a = &g_tab[r];
        if (drop(a, arg)) {
            if (kind_is_device(a->kind))
                g_used[a->device] -= a->size;
            release_backing(a);
        } else {
            g_tab[w++] = *a;
        }
    }
    g_ntab = w;
}

static int owned_by_ctx(const struct alloc *a, const void *ctx)
{
    return a->kind != K_VMM_MAP && a->ctx == ctx;
}

/* ------------------------------------------------------------------------ */
/* Context helpers                                                          */

static struct CUctx_st *cur_ctx_raw(void) { return t_depth ? t_stack[t_depth - 1] : NULL; }

static int ctx_valid(const struct CUctx_st *c)
{
    if (!c)
        return 0;
    if (c >= g_primary && c < g_primary + FAKE_MAX_DEVICES)
        return (int)(c - g_primary) < g_ndev;
    return set_has(&g_ctxs, c) && c->magic == CTX_MAGIC;
}

/* Checks that the driver is initialised (call with g_lock held or not; the
 * flags are only ever set once). */
static CUresult check_init(void)
{
    if (g_deinit)
        return CUDA_ERROR_DEINITIALIZED;
    if (!g_inited)
        return CUDA_ERROR_NOT_INITIALIZED;
    return CUDA_SUCCESS;
}

/* Current usable context.  Call with g_lock held. */
static CUresult need_ctx(struct CUctx_st **out)
{
    struct CUctx_st *c = cur_ctx_raw();
    if (!c || !ctx_valid(c) || !c->active)
        return CUDA_ERROR_INVALID_CONTEXT;
    *out = c;
    return CUDA_SUCCESS;
}

static int capture_forbids_locked(void);
static int capture_forbids(void);
static int sync_blocked_by_capture_locked(struct CUctx_st *c);

static int stream_valid(CUstream s)
{
    /* NULL, CU_STREAM_LEGACY (0x1) and CU_STREAM_PER_THREAD (0x2) are implicit. */
    return (uintptr_t)s <= 2 || set_has(&g_streams, s);
}

/* ------------------------------------------------------------------------ */
/* Memory helpers                                                           */

/* Large cuMemAlloc_v2 / cuMemAllocPitch_v2 memory can be exported by
 * cuIpcGetMemHandle: it lives in a memfd mapped MAP_SHARED.  Should the
 * process be out of file descriptors, it falls back to private memory, which
 * cannot be exported (CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE 0). */
static void *memfd_backing(size_t len, struct alloc *a)
{
    int fd = memfd_create("fake-cuda-device", MFD_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct stat st;
    void *p = MAP_FAILED;
    if (ftruncate(fd, (off_t)len) == 0 && fstat(fd, &st) == 0)
        p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return NULL;
    }
    a->backing = B_MEMFD;
    a->fd = fd;
    a->ino = (unsigned long long)st.st_ino;
    return p;
}

/* Memory for a new allocation; fills in a's backing, map_len, fd and ino. */
static void *backing_alloc(size_t size, struct alloc *a)
{
    a->fd = -1;
    if (size >= FAKE_MMAP_THRESHOLD) {
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        size_t len = (size + page - 1) & ~(page - 1);
        a->map_len = len;
        if (a->kind == K_DEVICE || a->kind == K_PITCHED) {
            void *p = memfd_backing(len, a);
            if (p)
                return p;
        }
        void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED)
            return NULL;
        a->backing = B_MMAP;
        return p;
    }
    void *p = NULL;
    if (posix_memalign(&p, FAKE_ALIGN, size) != 0)
        return NULL;
    a->backing = B_MALLOC;
    a->map_len = 0;
    return p;
}

/* Common path of every allocation entry point.  `out` receives the address. */
static CUresult do_alloc(uintptr_t *out, size_t size, int kind)
{
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_init();
    if (r)
        return r;
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;

    pthread_mutex_lock(&g_lock);
    struct CUctx_st *ctx;
    r = need_ctx(&ctx);
    if (r)
        goto out;
    if (kind != K_ASYNC && kind != K_POOL && capture_forbids_locked()) {
        r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        goto out;
    }
    int dev = ctx->device;
    if (kind != K_HOST && (size > g_total_mem || g_used[dev] > g_total_mem - size)) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    struct alloc a = {.size = size, .kind = kind, .device = dev, .ctx = ctx};
    void *p = backing_alloc(size, &a);
    if (!p) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    a.base = (uintptr_t)p;
    if (tab_insert(&a) != 0) {
        release_backing(&a);
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    if (kind == K_HOST) {
        g_stats.host_allocs++;
    } else {
        g_used[dev] += size;
        g_stats.allocs++;
    }
    *out = a.base;
out:
    pthread_mutex_unlock(&g_lock);
    return r;
}

/* Common path of cuMemFree_v2 / cuMemFreeAsync / cuMemFreeHost. */
static CUresult do_free(uintptr_t p, int host)
{
    CUresult r = check_init();
    if (r)
        return r;
    pthread_mutex_lock(&g_lock);
    /* A device free needs no current context (an H200 frees from a thread
     * without one). */
    struct CUctx_st *ctx;
    if (host && (r = need_ctx(&ctx)))
        goto out;
    if (p == 0)
        goto out; /* freeing NULL is a no-op */
    struct alloc *a = tab_find_exact(p);
    /* IPC mappings are released by cuIpcCloseMemHandle only. */
    if (!a || a->kind == K_VMM_MAP || a->kind == K_IPC || (a->kind == K_HOST) != host) {
        r = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    struct alloc copy = *a;
    tab_remove(a);
    release_backing(&copy);
    if (host) {
        g_stats.host_frees++;
    } else {
        g_used[copy.device] -= copy.size;
        g_stats.frees++;
    }
out:
    pthread_mutex_unlock(&g_lock);
    return r;
}

/* ------------------------------------------------------------------------ */
/* Initialisation and devices                                               */

static size_t env_size(const char *name, size_t dflt)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return dflt;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *end)
        return dflt;
    return (size_t)v;
}

EXPORT CUresult cuInit(unsigned int flags)
{
    if (g_deinit)
        return CUDA_ERROR_DEINITIALIZED;
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    if (!g_inited) {
        size_t n = env_size("FAKE_CUDA_DEVICES", 2);
        g_ndev = n > FAKE_MAX_DEVICES ? FAKE_MAX_DEVICES : (int)n;
        g_total_mem = env_size("FAKE_CUDA_TOTAL_MEM", (size_t)1 << 30);
        for (int i = 0; i < FAKE_MAX_DEVICES; i++)
            g_primary[i] = (struct CUctx_st){.magic = CTX_MAGIC, .device = i, .primary = 1};
        g_inited = 1;
    }
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *driverVersion)
{
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = FAKE_DRIVER_VERSION;
    return CUDA_SUCCESS;
}

static CUresult check_dev(CUdevice dev)
{
    CUresult r = check_init();
    if (r)
        return r;
    return (dev < 0 || dev >= g_ndev) ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_dev(ordinal);
    if (r)
        return r;
    *device = ordinal;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *count)
{
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_init();
    if (r)
        return r;
    *count = g_ndev;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_dev(dev);
    if (r)
        return r;
    snprintf(name, (size_t)len, "Fake CUDA Device %d", dev);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_dev(dev);
    if (r)
        return r;
    *bytes = g_total_mem;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Contexts                                                                 */

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_dev(dev);
    if (r)
        return r;
    pthread_mutex_lock(&g_lock);
    g_primary[dev].refcount++;
    if (!g_primary[dev].active)
        g_primary[dev].id = ++g_ctx_ids;
    g_primary[dev].active = 1;
    *pctx = &g_primary[dev];
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

/* Destroys the primary context's state: like the real driver, all memory
 * allocated in it is gone.  Call with g_lock held. */
static void primary_reset_locked(CUdevice dev)
{
    tab_drop_if(owned_by_ctx, &g_primary[dev]);
    g_primary[dev].refcount = 0;
    g_primary[dev].active = 0;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    CUresult r = check_dev(dev);
    if (r)
        return r;
    pthread_mutex_lock(&g_lock);
    if (g_primary[dev].refcount <= 0) {
        r = CUDA_ERROR_INVALID_CONTEXT;
    } else if (--g_primary[dev].refcount == 0) {
        /* "The context is automatically reset once the last reference to it
         * is released." */
        primary_reset_locked(dev);
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    CUresult r = check_dev(dev);
    if (r)
        return r;
    pthread_mutex_lock(&g_lock);
    primary_reset_locked(dev);
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

EXPORT size_t fake_device_used(int dev)
{
    if (dev < 0 || dev >= FAKE_MAX_DEVICES)
        return 0;
    pthread_mutex_lock(&g_lock);
    size_t used = g_used[dev];
    pthread_mutex_unlock(&g_lock);
    return used;
}

EXPORT void fake_reset_primary_unseen(int dev)
{
    if (dev < 0 || dev >= FAKE_MAX_DEVICES)
        return;
    pthread_mutex_lock(&g_lock);
    primary_reset_locked(dev);
    pthread_mutex_unlock(&g_lock);
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    (void)flags;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_dev(dev);
    if (r)
        return r;
    if (t_depth == FAKE_CTX_STACK)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c = calloc(1, sizeof(*c));
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *c = (struct CUctx_st){.magic = CTX_MAGIC, .device = dev, .active = 1};
    pthread_mutex_lock(&g_lock);
    c->id = ++g_ctx_ids;
    if (set_add(&g_ctxs, c) != 0) {
        pthread_mutex_unlock(&g_lock);
        free(c);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_unlock(&g_lock);
    t_stack[t_depth++] = c; /* a new context becomes current */
    *pctx = c;
    return CUDA_SUCCESS;
}

static int inside_range(const struct alloc *a, const void *arg);

/* Forgets a live reservation and the mappings still inside it (g_lock held). */
static void free_reservation(struct reservation *v)
{
    uintptr_t range[2] = {v->base, v->size};
    tab_drop_if(inside_range, range);
    set_del(&g_resv, v);
    munmap(v->map_base, v->map_len);
    free(v);
}

/* Forgets a live VMM handle; mappings keep its pages until unmapped (g_lock held). */
static void free_vmm_handle(struct vmm_handle *h)
{
    set_del(&g_vmm, h);
    close(h->fd);
    g_used[h->device] -= h->size;
    free(h);
}

/* The VMM handles and reservations made in `ctx` die with it (g_lock held). */
static void drop_vmm_of(struct CUctx_st *ctx)
{
    for (size_t i = g_resv.n; i-- > 0;) {
        struct reservation *v = g_resv.items[i];
        if (v->ctx == ctx)
            free_reservation(v);
    }
    for (size_t i = g_vmm.n; i-- > 0;) {
        struct vmm_handle *h = g_vmm.items[i];
        if (h->ctx == ctx)
            free_vmm_handle(h);
    }
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    CUresult r = check_init();
    if (r)
        return r;
    pthread_mutex_lock(&g_lock);
    /* Primary contexts are managed through cuDevicePrimaryCtx*. */
    if (!ctx_valid(ctx) || ctx->primary) {
        pthread_mutex_unlock(&g_lock);
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    tab_drop_if(owned_by_ctx, ctx);
    drop_vmm_of(ctx);
    set_del(&g_ctxs, ctx);
    /* The struct is deliberately not freed: other threads may still hold the
     * handle, and a dead magic lets us reject it. */
    ctx->magic = CTX_DEAD;
    ctx->active = 0;
    pthread_mutex_unlock(&g_lock);
    if (cur_ctx_raw() == ctx)
        t_depth--;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_init();
    if (r)
        return r;
    *pctx = cur_ctx_raw();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    CUresult r = check_init();
    if (r)
        return r;
    if (!ctx) {
        /* NULL unbinds: equivalent to popping the top of the stack. */
        if (t_depth)
            t_depth--;
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&g_lock);
    int ok = ctx_valid(ctx);
    pthread_mutex_unlock(&g_lock);
    if (!ok)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (t_depth)
        t_stack[t_depth - 1] = ctx;
    else
        t_stack[t_depth++] = ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    CUresult r = check_init();
    if (r)
        return r;
    pthread_mutex_lock(&g_lock);
    int ok = ctx_valid(ctx);
    pthread_mutex_unlock(&g_lock);
    if (!ok)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (t_depth == FAKE_CTX_STACK)
        return CUDA_ERROR_INVALID_VALUE;
    t_stack[t_depth++] = ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    CUresult r = check_init();
    if (r)
        return r;
    if (!t_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct CUctx_st *c = t_stack[--t_depth];
    if (pctx)
        *pctx = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *device)
{
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_init();
    if (r)
        return r;
    pthread_mutex_lock(&g_lock);
    struct CUctx_st *c;
    r = need_ctx(&c);
    if (!r)
        *device = c->device;
    pthread_mutex_unlock(&g_lock);
    return r;
}

EXPORT CUresult cuCtxSynchronize(void)
{
    CUresult r = check_init();
    if (r)
        return r;
    pthread_mutex_lock(&g_lock);
    struct CUctx_st *c;
    r = need_ctx(&c);
    if (!r && (capture_forbids_locked() | sync_blocked_by_capture_locked(c)))
        r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (!r)
        complete_events_locked(NULL, 1);
    pthread_mutex_unlock(&g_lock);
    if (!r) {
        static long long sync_ns = -1;
        long long ns = __atomic_load_n(&sync_ns, __ATOMIC_RELAXED);
        if (ns < 0) {
            ns = (long long)env_size("FAKE_CUDA_SYNC_US", 0) * 1000;
            __atomic_store_n(&sync_ns, ns, __ATOMIC_RELAXED);
        }
        if (ns) {
            struct timespec t = {ns / 1000000000, ns % 1000000000};
            nanosleep(&t, NULL);
        }
    }
    return r;
}

/* ------------------------------------------------------------------------ */
/* Device memory                                                            */

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    return do_alloc((uintptr_t *)dptr, bytesize, K_DEVICE);
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    if (capture_forbids())
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return do_free((uintptr_t)dptr, 0);
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                   unsigned int ElementSizeBytes)
{
    if (!dptr || !pPitch || WidthInBytes == 0 || Height == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16)
        return CUDA_ERROR_INVALID_VALUE;
    if (WidthInBytes > SIZE_MAX - 511)
        return CUDA_ERROR_INVALID_VALUE;
    size_t pitch = (WidthInBytes + 511) & ~(size_t)511;
    if (Height > SIZE_MAX / pitch)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = do_alloc((uintptr_t *)dptr, pitch * Height, K_PITCHED);
    if (!r)
        *pPitch = pitch;
    return r;
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)
        return CUDA_ERROR_INVALID_VALUE;
    return do_alloc((uintptr_t *)dptr, bytesize, K_MANAGED);
}

/* Stream-ordered allocation happens at once: there is no real stream. */
static CUresult alloc_on_stream(CUdeviceptr *dptr, size_t bytesize, CUstream s, int kind)
{
    CUresult r = check_init();
    if (r)
        return r;
    pthread_mutex_lock(&g_lock);
    int ok = stream_valid(s);
    pthread_mutex_unlock(&g_lock);
    if (!ok)
        return CUDA_ERROR_INVALID_HANDLE;
    return do_alloc((uintptr_t *)dptr, bytesize, kind);
}

static CUresult free_on_stream(CUdeviceptr dptr, CUstream s)
{
    CUresult r = check_init();
    if (r)
        return r;
    pthread_mutex_lock(&g_lock);
    int ok = stream_valid(s);
    pthread_mutex_unlock(&g_lock);
    if (!ok)
        return CUDA_ERROR_INVALID_HANDLE;
    return do_free((uintptr_t)dptr, 0);
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return alloc_on_stream(dptr, bytesize, hStream, K_ASYNC);
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return alloc_on_stream(dptr, bytesize, hStream, K_ASYNC);
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) { return free_on_stream(dptr, hStream); }

EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    return free_on_stream(dptr, hStream);
}

/* There is no pool API in the fake, so any non-NULL pool handle is accepted. */
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                        CUstream hStream)
{
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_on_stream(dptr, bytesize, hStream, K_POOL);
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                             CUstream hStream)
{
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_on_stream(dptr, bytesize, hStream, K_POOL);
}

/* ------------------------------------------------------------------------ */
/* Pinned host memory                                                       */

EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    return do_alloc((uintptr_t *)pp, bytesize, K_HOST);
}

EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    if (Flags & ~0xfu) /* PORTABLE | DEVICEMAP | WRITECOMBINED | 0x8 */
        return CUDA_ERROR_INVALID_VALUE;
    return do_alloc((uintptr_t *)pp, bytesize, K_HOST);
}

EXPORT CUresult cuMemFreeHost(void *p)
{
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    return do_free((uintptr_t)p, 1);
}

/* ------------------------------------------------------------------------ */
/* Virtual memory management.  Physical allocations are memfd files, address */
/* reservations are PROT_NONE mappings, cuMemMap maps the file over them, so  */
/* aliasing behaves as on a GPU.                                             */

/* FAKE_CUDA_CREATE_US: each cuMemCreate takes this many microseconds, as a
 * driver call that waits for the device: a pool holding its lock across one
 * keeps other threads waiting at the lock, on any number of CPUs. */
static void slow_create(void)
{
    static long us = -1;
    long v = __atomic_load_n(&us, __ATOMIC_RELAXED);
    if (v < 0) {
        const char *s = getenv("FAKE_CUDA_CREATE_US");
        v = s ? atol(s) : 0;
        __atomic_store_n(&us, v, __ATOMIC_RELAXED);
    }
    if (v > 0) {
        struct timespec t = {v / 1000000, (v % 1000000) * 1000};
        nanosleep(&t, NULL);
    }
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                            unsigned long long flags)
{
    if (!handle || !prop || size == 0 || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_init();
    if (r)
        return r;
    if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (prop->requestedHandleTypes & ~CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    int dev = prop->location.id;
    if (dev < 0 || dev >= g_ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    slow_create();

    pthread_mutex_lock(&g_lock);
    if (size > g_total_mem || g_used[dev] > g_total_mem - size) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    struct vmm_handle *h = calloc(1, sizeof(*h));
    int fd = memfd_create("fake-cuda-vmm", MFD_CLOEXEC);
    if (!h || fd < 0 || ftruncate(fd, (off_t)size) != 0 || set_add(&g_vmm, h) != 0) {
        free(h);
        if (fd >= 0)
            close(fd);
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    *h = (struct vmm_handle){.fd = fd,
                             .size = size,
                             .device = dev,
                             .ctx = cur_ctx_raw(),
                             .shareable = prop->requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR};
    g_used[dev] += size;
    g_stats.vmm_creates++;
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
out:
    pthread_mutex_unlock(&g_lock);
    return r;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    CUresult r = check_init();
    if (r)
        return r;
    struct vmm_handle *h = (struct vmm_handle *)(uintptr_t)handle;
    pthread_mutex_lock(&g_lock);
    if (!set_has(&g_vmm, h)) {
        r = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    /* Existing mappings keep the pages alive until unmapped, as on a GPU. */
    free_vmm_handle(h);
    g_stats.vmm_releases++;
out:
    pthread_mutex_unlock(&g_lock);
    return r;
}

/* Shareable handles: a POSIX file descriptor is a new descriptor of the
 * page's memfd, so another process that imports it maps the same memory. */
EXPORT CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                             int handleType, unsigned long long flags)
{
    if (!shareableHandle || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_init();
    if (r)
        return r;
    struct vmm_handle *h = (struct vmm_handle *)(uintptr_t)handle;
    pthread_mutex_lock(&g_lock);
    if (!set_has(&g_vmm, h) || handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !h->shareable) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        int fd = fcntl(h->fd, F_DUPFD_CLOEXEC, 0);
        if (fd < 0)
            r = CUDA_ERROR_OUT_OF_MEMORY;
        else
            *(int *)shareableHandle = fd;
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                               int shHandleType)
{
    if (!handle || shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_init();
    if (r)
        return r;
    struct CUctx_st *ctx = cur_ctx_raw();
    if (!ctx)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct stat st;
    int fd = (int)(intptr_t)osHandle;
    if (fstat(fd, &st) != 0 || st.st_size <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct vmm_handle *h = calloc(1, sizeof(*h));
    int mine = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    pthread_mutex_lock(&g_lock);
    if (!h || mine < 0 || set_add(&g_vmm, h) != 0) {
        free(h);
        if (mine >= 0)
            close(mine);
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        int dev = ctx->device;
        *h = (struct vmm_handle){.fd = mine, .size = (size_t)st.st_size, .device = dev, .ctx = ctx, .shareable = 1};
        g_used[dev] += h->size;
        g_stats.vmm_imports++;
        *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

static struct reservation *resv_containing(uintptr_t p, size_t len)
{
    for (size_t i = 0; i < g_resv.n; i++) {
        struct reservation *v = g_resv.items[i];
        if (p >= v->base && p - v->base < v->size && len <= v->size - (p - v->base))
            return v;
    }
    return NULL;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                    unsigned long long flags)
{
    (void)addr; /* only a hint for the real driver too */
    if (!ptr || size == 0 || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (alignment & (alignment - 1))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_init();
    if (r)
        return r;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (size % page)
        return CUDA_ERROR_INVALID_VALUE;
    if (alignment < page)
        alignment = page;
    size_t len = size + alignment - page;
    void *m = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct reservation *v = malloc(sizeof(*v));
    if (!v) {
        munmap(m, len);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    uintptr_t base = ((uintptr_t)m + alignment - 1) & ~(uintptr_t)(alignment - 1);
    *v = (struct reservation){.base = base, .size = size, .map_base = m, .map_len = len, .ctx = cur_ctx_raw()};
    pthread_mutex_lock(&g_lock);
    int err = set_add(&g_resv, v);
    pthread_mutex_unlock(&g_lock);
    if (err) {
        munmap(m, len);
        free(v);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *ptr = base;
    return CUDA_SUCCESS;
}

static int inside_range(const struct alloc *a, const void *arg)
{
    const uintptr_t *r = arg; /* {base, size} */
    return a->kind == K_VMM_MAP && a->base >= r[0] && a->base - r[0] < r[1];
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    CUresult r = check_init();
    if (r)
        return r;
    pthread_mutex_lock(&g_lock);
    struct reservation *v = NULL;
    for (size_t i = 0; i < g_resv.n; i++) {
        struct reservation *c = g_resv.items[i];
        if (c->base == ptr && c->size == size)
            v = c;
    }
    if (!v)
        r = CUDA_ERROR_INVALID_VALUE;
    else
        free_reservation(v);
    pthread_mutex_unlock(&g_lock);
    return r;
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                         unsigned long long flags)
{
    if (size == 0 || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_init();
    if (r)
        return r;
    struct vmm_handle *h = (struct vmm_handle *)(uintptr_t)handle;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    pthread_mutex_lock(&g_lock);
    if (!set_has(&g_vmm, h) || offset > h->size || size > h->size - offset || offset % page || size % page ||
        !resv_containing(ptr, size)) {
        r = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    /* Refuse overlaps with an existing mapping. */
    size_t i = tab_upper(ptr + size - 1);
    if (i > 0 && g_tab[i - 1].base + g_tab[i - 1].size > ptr) {
        r = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    /* Inaccessible until cuMemSetAccess grants it. */
    void *m = mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->fd, (off_t)offset);
    if (m == MAP_FAILED) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    struct alloc a = {.base = ptr, .size = size, .kind = K_VMM_MAP, .backing = B_NONE, .device = h->device, .fd = -1};
    if (tab_insert(&a) != 0) {
        mmap(m, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        g_stats.vmm_maps++;
    }
out:
    pthread_mutex_unlock(&g_lock);
    return r;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_init();
    if (r)
        return r;
    pthread_mutex_lock(&g_lock);
    if (!resv_containing(ptr, size)) {
        r = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    /* The range must consist of whole mappings. */
    size_t found = 0;
    for (size_t i = 0; i < g_ntab; i++) {
        const struct alloc *a = &g_tab[i];
        if (a->kind != K_VMM_MAP)
            continue;
        int starts_inside = a->base >= ptr && a->base < ptr + size;
        int ends_inside = a->base + a->size > ptr && a->base + a->size <= ptr + size;
        if (starts_inside != ends_inside) {
            r = CUDA_ERROR_INVALID_VALUE;
            goto out;
        }
        found += starts_inside;
    }
    if (!found) {
        r = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    uintptr_t range[2] = {ptr, size};
    tab_drop_if(inside_range, range);
    g_stats.vmm_unmaps += found;
    /* Put the reservation back to inaccessible. */
    mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
out:
    pthread_mutex_unlock(&g_lock);
    return r;
}

/* Every byte of [ptr, ptr + size) mapped?  (g_lock held) */
static int all_mapped(uintptr_t ptr, size_t size)
{
    uintptr_t at = ptr;
    while (at < ptr + size) {
        size_t i = tab_upper(at);
        if (i == 0)
            return 0;
        const struct alloc *a = &g_tab[i - 1];
        if (a->kind != K_VMM_MAP || a->base + a->size <= at)
            return 0;
        at = a->base + a->size;
    }
    return 1;
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    if (size == 0 || !desc || count == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_init();
    if (r)
        return r;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            return CUDA_ERROR_INVALID_VALUE;
        if (desc[i].location.id < 0 || desc[i].location.id >= g_ndev)
            return CUDA_ERROR_INVALID_DEVICE;
    }
    pthread_mutex_lock(&g_lock);
    if (!resv_containing(ptr, size) || !all_mapped(ptr, size) ||
        mprotect((void *)(uintptr_t)ptr, size, PROT_READ | PROT_WRITE) != 0)
        r = CUDA_ERROR_INVALID_VALUE;
    else
        g_stats.vmm_grants++;
    pthread_mutex_unlock(&g_lock);
    return r;
}

EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop, int option)
{
    if (!granularity || !prop || (option != 0 && option != 1))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_init();
    if (r)
        return r;
    if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop->location.id < 0 || prop->location.id >= g_ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    /* FAKE_CUDA_NO_VMM=1: a device without virtual memory management. */
    if (env_size("FAKE_CUDA_NO_VMM", 0))
        return CUDA_ERROR_NOT_SUPPORTED;
    *granularity = 2u << 20;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev)
{
    if (!canAccessPeer)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_init();
    if (r)
        return r;
    if (dev < 0 || dev >= g_ndev || peerDev < 0 || peerDev >= g_ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    *canAccessPeer = dev != peerDev;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Queries                                                                  */

EXPORT CUresult cuMemGetInfo_v2(size_t *pfree, size_t *ptotal)
{
    if (!pfree || !ptotal)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_init();
    if (r)
        return r;
    pthread_mutex_lock(&g_lock);
    struct CUctx_st *c;
    r = need_ctx(&c);
    if (!r) {
        *ptotal = g_total_mem;
        *pfree = g_total_mem - g_used[c->device];
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    CUresult r = check_init();
    if (r)
        return r;
    pthread_mutex_lock(&g_lock);
    struct CUctx_st *c;
    r = need_ctx(&c);
    if (!r) {
        struct alloc *a = tab_find_range(dptr, 1);
        if (!a) {
            r = CUDA_ERROR_NOT_FOUND;
        } else {
            if (pbase)
                *pbase = a->base;
            if (psize)
                *psize = a->size;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

/* Memory that is not a VMM mapping has no allocation handle (as on a GPU);
 * the fake does not retain the handles of its own mappings. */
EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    CUresult r = check_init();
    if (r)
        return r;
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    struct alloc *a = tab_find_range((uintptr_t)addr, 1);
    r = a && a->kind == K_VMM_MAP ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&g_lock);
    return r;
}

EXPORT CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr)
{
    if (!data)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_init();
    if (r)
        return r;
    pthread_mutex_lock(&g_lock);
    struct alloc *a = tab_find_range(ptr, 1);
    if (!a) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else if (attribute == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR) {
        *(CUdeviceptr *)data = a->base;
    } else if (attribute == CU_POINTER_ATTRIBUTE_RANGE_SIZE) {
        *(size_t *)data = a->size;
    } else if (attribute == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) {
        *(int *)data = a->device;
    } else if (attribute == CU_POINTER_ATTRIBUTE_BUFFER_ID) {
        *(unsigned long long *)data = a->id;
    } else if (attribute == CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE) {
        *(int *)data = a->backing == B_MEMFD;
    } else {
        r = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

/* ------------------------------------------------------------------------ */
/* Legacy CUDA IPC.                                                         */
/*                                                                          */
/* An exportable allocation is a memfd (see memfd_backing).  Its handle     */
/* (64 bytes, integers in native byte order):                               */
/*                                                                          */
/*   byte  0       ignored (written 0); the real driver ignores it too      */
/*   bytes 1..4    magic "FkIp"                                             */
/*   byte  5       layout version, 1                                        */
/*   bytes 6..7    0                                                        */
/*   bytes 8..11   exporter pid (int32)                                     */
/*   bytes 12..15  the memfd's descriptor in the exporter (int32)           */
/*   bytes 16..23  allocation size (uint64)                                 */
/*   bytes 24..31  allocation's buffer id in the exporter (uint64)          */
/*   bytes 32..39  inode of the memfd (uint64): a reused descriptor number  */
/*                 no longer matches                                        */
/*   bytes 40..63  0; 56..63 are zero in the real driver's handles too.     */
/*                 Byte 60 is ignored (like the real driver), every other   */
/*                 byte must be 0                                           */
/*                                                                          */
/* Every pointer inside an allocation gets the handle of the allocation.   */
/* cuIpcOpenMemHandle opens /proc/<pid>/fd/<fd>, checks the inode and the   */
/* size, maps the whole file MAP_SHARED and returns its base; the mapping   */
/* keeps the pages alive after the exporter frees the allocation.  Opening  */
/* one allocation again while it is open returns the same base and counts   */
/* one more reference; each open needs its own cuIpcCloseMemHandle.         */
/*                                                                          */
/* Errors: cuIpcGetMemHandle on memory that is not memfd-backed (small,     */
/* managed, stream-ordered, host, VMM or IPC-opened memory) ->              */
/* CUDA_ERROR_INVALID_VALUE.  cuIpcOpenMemHandle of a handle with a wrong   */
/* magic or non-zero reserved bytes, of a process or descriptor that is     */
/* gone, or of an allocation the exporter freed -> CUDA_ERROR_INVALID_VALUE; */
/* of a handle made by the calling process itself ->                        */
/* CUDA_ERROR_INVALID_CONTEXT (as the real driver refuses that).            */
/* cuIpcCloseMemHandle of a pointer that is not the base of an open IPC     */
/* mapping -> CUDA_ERROR_INVALID_VALUE.  cuMemFree* refuse IPC mappings.     */

#define IPC_MAGIC "FkIp"
#define IPC_VERSION 1
#define IPC_OFF_PID 8
#define IPC_OFF_FD 12
#define IPC_OFF_SIZE 16
#define IPC_OFF_ID 24
#define IPC_OFF_INO 32
#define IPC_OFF_RESERVED 40

struct ipc_fields {
    int pid, fd;
    unsigned long long size, id, ino;
};

static void ipc_encode(CUipcMemHandle *h, const struct ipc_fields *f)
{
    memset(h, 0, sizeof(*h));
    memcpy(h->reserved + 1, IPC_MAGIC, 4);
    h->reserved[5] = IPC_VERSION;
    memcpy(h->reserved + IPC_OFF_PID, &f->pid, 4);
    memcpy(h->reserved + IPC_OFF_FD, &f->fd, 4);
    memcpy(h->reserved + IPC_OFF_SIZE, &f->size, 8);
    memcpy(h->reserved + IPC_OFF_ID, &f->id, 8);
    memcpy(h->reserved + IPC_OFF_INO, &f->ino, 8);
}

/* 0 when the handle is one the fake could have made (bytes 0 and 60 aside). */
static int ipc_decode(const CUipcMemHandle *h, struct ipc_fields *f)
{
    if (memcmp(h->reserved + 1, IPC_MAGIC, 4) != 0 || h->reserved[5] != IPC_VERSION || h->reserved[6] ||
        h->reserved[7])
        return -1;
    for (int i = IPC_OFF_RESERVED; i < (int)sizeof(h->reserved); i++)
        if (i != 60 && h->reserved[i])
            return -1;
    memcpy(&f->pid, h->reserved + IPC_OFF_PID, 4);
    memcpy(&f->fd, h->reserved + IPC_OFF_FD, 4);
    memcpy(&f->size, h->reserved + IPC_OFF_SIZE, 8);
    memcpy(&f->id, h->reserved + IPC_OFF_ID, 8);
    memcpy(&f->ino, h->reserved + IPC_OFF_INO, 8);
    if (f->pid <= 0 || f->fd < 0 || f->size == 0 || f->id == 0 || f->size > (unsigned long long)SIZE_MAX / 2)
        return -1;
    return 0;
}

EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    if (!pHandle)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_init();
    if (r)
        return r;
    pthread_mutex_lock(&g_lock);
    struct CUctx_st *c;
    r = need_ctx(&c);
    if (!r) {
        const struct alloc *a = tab_find_range(dptr, 1);
        if (!a || a->backing != B_MEMFD || (a->kind != K_DEVICE && a->kind != K_PITCHED)) {
            r = CUDA_ERROR_INVALID_VALUE;
        } else {
            struct ipc_fields f = {.pid = (int)getpid(), .fd = a->fd, .size = a->size, .id = a->id, .ino = a->ino};
            ipc_encode(pHandle, &f);
        }
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

/* The open IPC mapping of the handle's allocation (every meaningful field
 * equal), if any.  Call with g_lock held. */
static struct alloc *ipc_find(const struct ipc_fields *f)
{
    for (size_t i = 0; i < g_ntab; i++) {
        struct alloc *a = &g_tab[i];
        if (a->kind == K_IPC && a->ipc_pid == f->pid && a->ipc_fd == f->fd && a->ipc_id == f->id &&
            a->ino == f->ino && a->size == f->size)
            return a;
    }
    return NULL;
}

static CUresult ipc_open(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags)
{
    if (!pdptr || (flags & ~(unsigned)CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_init();
    if (r)
        return r;
    struct ipc_fields f;
    if (ipc_decode(&handle, &f) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (f.pid == (int)getpid())
        return CUDA_ERROR_INVALID_CONTEXT;

    pthread_mutex_lock(&g_lock);
    struct CUctx_st *ctx;
    int fd = -1;
    r = need_ctx(&ctx);
    if (r)
        goto out;
    struct alloc *prev = ipc_find(&f);
    if (prev) {
        prev->ipc_refs++;
        g_stats.ipc_opens++;
        *pdptr = prev->base;
        goto out;
    }
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", f.pid, f.fd);
    fd = open(path, O_RDWR | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (unsigned long long)st.st_ino != f.ino ||
        (unsigned long long)st.st_size < f.size) {
        r = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t len = ((size_t)f.size + page - 1) & ~(page - 1);
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    struct alloc a = {.base = (uintptr_t)m,
                      .size = (size_t)f.size,
                      .map_len = len,
                      .kind = K_IPC,
                      .backing = B_MMAP, /* the mapping keeps the file; the fd is closed below */
                      .device = ctx->device,
                      .ctx = ctx,
                      .fd = -1,
                      .ino = f.ino,
                      .ipc_pid = f.pid,
                      .ipc_fd = f.fd,
                      .ipc_id = f.id,
                      .ipc_refs = 1};
    if (tab_insert(&a) != 0) {
        munmap(m, len);
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    g_stats.ipc_opens++;
    *pdptr = a.base;
out:
    pthread_mutex_unlock(&g_lock);
    if (fd >= 0)
        close(fd);
    return r;
}

EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    return ipc_open(pdptr, handle, Flags);
}

/* The CUDA 4.1 name, same ABI. */
EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    return ipc_open(pdptr, handle, Flags);
}

EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    CUresult r = check_init();
    if (r)
        return r;
    pthread_mutex_lock(&g_lock);
    struct CUctx_st *c;
    r = need_ctx(&c);
    if (!r) {
        struct alloc *a = tab_find_exact(dptr);
        if (!a || a->kind != K_IPC) {
            r = CUDA_ERROR_INVALID_VALUE;
        } else {
            g_stats.ipc_closes++;
            if (--a->ipc_refs == 0) {
                struct alloc copy = *a;
                tab_remove(a);
                release_backing(&copy);
            }
        }
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

/* ------------------------------------------------------------------------ */
/* Streams and events (no asynchrony: everything is complete at once)      */

static CUresult stream_create(CUstream *ph, unsigned int flags, int priority)
{
    if (!ph || (flags & ~1u)) /* only CU_STREAM_NON_BLOCKING */
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_init();
    if (r)
        return r;
    pthread_mutex_lock(&g_lock);
    struct CUctx_st *c;
    r = need_ctx(&c);
    if (!r) {
        struct CUstream_st *s = malloc(sizeof(*s));
        if (!s || set_add(&g_streams, s) != 0) {
            free(s);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            *s = (struct CUstream_st){.ctx = c, .flags = flags, .priority = priority};
            *ph = s;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

EXPORT CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags) { return stream_create(phStream, Flags, 0); }

EXPORT CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)
{
    return stream_create(phStream, flags, priority);
}

EXPORT CUresult cuStreamDestroy_v2(CUstream hStream)
{
    CUresult r = check_init();
    if (r)
        return r;
    pthread_mutex_lock(&g_lock);
    int found = set_del(&g_streams, hStream);
    pthread_mutex_unlock(&g_lock);
    if (!found)
        return CUDA_ERROR_INVALID_HANDLE;
    free(hStream);
    return CUDA_SUCCESS;
}

static CUresult check_stream(CUstream s)
{
    CUresult r = check_init();
    if (r)
        return r;
    pthread_mutex_lock(&g_lock);
    int ok = stream_valid(s);
    pthread_mutex_unlock(&g_lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

EXPORT CUresult cuStreamSynchronize(CUstream hStream)
{
    CUresult r = check_stream(hStream);
    if (!r) {
        /* The legacy stream waits for every blocking stream: all of them, here. */
        pthread_mutex_lock(&g_lock);
        complete_events_locked(hStream, (uintptr_t)hStream <= 1);
        pthread_mutex_unlock(&g_lock);
    }
    return r;
}

EXPORT CUresult cuStreamIsCapturing(CUstream hStream, int *captureStatus)
{
    if (!captureStatus)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_stream(hStream);
    if (!r) {
        pthread_mutex_lock(&g_lock);
        *captureStatus = (uintptr_t)hStream <= 2 ? CU_STREAM_CAPTURE_STATUS_NONE : hStream->capture;
        pthread_mutex_unlock(&g_lock);
    }
    return r;
}

/* Captures record nothing: a graph is a token.  What matters to cupool is
 * which calls a capture forbids, as the real driver does: in global mode no
 * thread may make an unsafe call (allocate, free, synchronise), in
 * thread-local mode the capturing thread may not; such a call fails with
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the capture. */
static struct CUgraph_st {
    int unused;
} g_graph_token;

static struct CUstream_st *g_capturing[64];
static int g_ncapturing;

EXPORT CUresult cuStreamBeginCapture_v2(CUstream hStream, int mode)
{
    if ((uintptr_t)hStream <= 2)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* the fake captures created streams only */
    CUresult r = check_stream(hStream);
    if (r)
        return r;
    if (mode < 0 || mode > 2)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    if (hStream->capture != CU_STREAM_CAPTURE_STATUS_NONE || g_ncapturing == 64) {
        r = CUDA_ERROR_ILLEGAL_STATE;
    } else {
        hStream->capture = CU_STREAM_CAPTURE_STATUS_ACTIVE;
        hStream->capture_mode = mode;
        hStream->capture_thread = pthread_self();
        g_capturing[g_ncapturing++] = hStream;
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    if (!phGraph)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_stream(hStream);
    if (r)
        return r;
    if ((uintptr_t)hStream <= 2)
        return CUDA_ERROR_ILLEGAL_STATE;
    pthread_mutex_lock(&g_lock);
    int status = hStream->capture;
    hStream->capture = CU_STREAM_CAPTURE_STATUS_NONE;
    for (int i = 0; i < g_ncapturing; i++)
        if (g_capturing[i] == hStream)
            g_capturing[i--] = g_capturing[--g_ncapturing];
    pthread_mutex_unlock(&g_lock);
    *phGraph = status == CU_STREAM_CAPTURE_STATUS_ACTIVE ? &g_graph_token : NULL;
    if (status == CU_STREAM_CAPTURE_STATUS_NONE)
        return CUDA_ERROR_ILLEGAL_STATE;
    return status == CU_STREAM_CAPTURE_STATUS_ACTIVE ? CUDA_SUCCESS : CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
}

/* Would an unsafe call from this thread break a capture?  If so the
 * captures it breaks are invalidated.  A capture already invalidated but
 * not yet ended still forbids (measured on an H200).  Call with g_lock held. */
static int capture_forbids_locked(void)
{
    int forbidden = 0;
    for (int i = 0; i < g_ncapturing; i++) {
        struct CUstream_st *s = g_capturing[i];
        int applies = s->capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL ||
                      (s->capture_mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
                       pthread_equal(s->capture_thread, pthread_self()));
        if (applies) {
            s->capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
            forbidden = 1;
        }
    }
    return forbidden;
}

/* A synchronisation of context c cannot wait for a stream being captured,
 * in any mode and from any thread: it fails and invalidates the captures
 * there (measured on an H200: a relaxed capture, and a thread-local one of
 * another thread, which a free does not break).  Call with g_lock held. */
static int sync_blocked_by_capture_locked(struct CUctx_st *c)
{
    int blocked = 0;
    for (int i = 0; i < g_ncapturing; i++) {
        struct CUstream_st *s = g_capturing[i];
        if (s->ctx == c) {
            s->capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
            blocked = 1;
        }
    }
    return blocked;
}

static int capture_forbids(void)
{
    pthread_mutex_lock(&g_lock);
    int f = capture_forbids_locked();
    pthread_mutex_unlock(&g_lock);
    return f;
}

EXPORT CUresult cuCtxGetId(CUcontext ctx, unsigned long long *ctxId)
{
    if (!ctxId)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_init();
    if (r)
        return r;
    if (!ctx) {
        /* The current context's id without a lock, as the real driver reads
         * it (a shim asks on every pooled allocation). */
        struct CUctx_st *c = cur_ctx_raw();
        if (!c || !__atomic_load_n(&c->active, __ATOMIC_ACQUIRE))
            return CUDA_ERROR_INVALID_CONTEXT;
        *ctxId = __atomic_load_n(&c->id, __ATOMIC_ACQUIRE);
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&g_lock);
    if (!ctx_valid(ctx))
        r = CUDA_ERROR_INVALID_CONTEXT;
    else
        *ctxId = ctx->id;
    pthread_mutex_unlock(&g_lock);
    return r;
}

EXPORT CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    if (!phEvent)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_init();
    if (r)
        return r;
    pthread_mutex_lock(&g_lock);
    struct CUctx_st *c;
    r = need_ctx(&c);
    if (!r) {
        struct CUevent_st *e = malloc(sizeof(*e));
        if (!e || set_add(&g_events, e) != 0) {
            free(e);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            *e = (struct CUevent_st){.ctx = c, .flags = Flags};
            *phEvent = e;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

/* An event used with stream `s` (NULL: none). A record (`record`) must be
 * on a stream of the event's own context, as in CUDA (an implicit stream is
 * the current context's); one that is not is refused and counted. */
static CUresult check_event(CUevent e, CUstream s, int record)
{
    CUresult r = check_init();
    if (r)
        return r;
    pthread_mutex_lock(&g_lock);
    int valid = set_has(&g_events, e) && stream_valid(s);
    int same = !record || (valid && ((uintptr_t)s <= 2 ? cur_ctx_raw() : s->ctx) == e->ctx);
    pthread_mutex_unlock(&g_lock);
    if (!valid)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!same)
        __atomic_fetch_add(&g_stats.cross_context_records, 1, __ATOMIC_RELAXED);
    return same ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

static long long monotonic_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* FAKE_CUDA_EVENT_LATENCY_US=N: a recorded event completes N us after its
 * record, as a GPU's does some microseconds after the host queued it (work
 * itself still runs at once); 0, the default, completes it at once. */
static long long event_latency_ns(void)
{
    static long long latency = -1;
    long long l = __atomic_load_n(&latency, __ATOMIC_RELAXED);
    if (l < 0) {
        l = (long long)env_size("FAKE_CUDA_EVENT_LATENCY_US", 0) * 1000;
        __atomic_store_n(&latency, l, __ATOMIC_RELAXED);
    }
    return l;
}

/* FAKE_CUDA_REFUSE_STREAM_RECORDS=1: a record on a created stream fails while
 * the stream lives (a driver may refuse one for reasons of its own). */
EXPORT CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
    CUresult r = check_event(hEvent, hStream, 1);
    if (!r && (uintptr_t)hStream > 2 && env_size("FAKE_CUDA_REFUSE_STREAM_RECORDS", 0))
        return CUDA_ERROR_NOT_SUPPORTED;
    if (!r) {
        long long now = monotonic_ns();
        pthread_mutex_lock(&g_lock);
        hEvent->recorded_ns = now;
        hEvent->ready_ns = now + event_latency_ns();
        long long busy = (uintptr_t)hStream > 2 ? hStream->busy_until_ns
                         : (uintptr_t)hStream < 2 ? g_legacy_busy_until_ns
                                                  : 0;
        if (busy > hEvent->ready_ns)
            hEvent->ready_ns = busy;
        hEvent->stream = hStream;
        hEvent->synced = 0;
        pthread_mutex_unlock(&g_lock);
    }
    return r;
}

static int event_pending(CUevent e)
{
    pthread_mutex_lock(&g_lock);
    int pending = !e->synced && monotonic_ns() < e->ready_ns;
    pthread_mutex_unlock(&g_lock);
    return pending;
}

/* Test hook: work queued on `s` now runs for `ms` milliseconds (a kernel the
 * fake does not run): events recorded on it complete only after that, even
 * once the stream is destroyed, as on a GPU. */
EXPORT void fake_stream_busy(CUstream s, unsigned ms)
{
    long long until = monotonic_ns() + (long long)ms * 1000000;
    pthread_mutex_lock(&g_lock);
    if ((uintptr_t)s < 2)
        g_legacy_busy_until_ns = until; /* the legacy stream */
    else if ((uintptr_t)s > 2 && stream_valid(s))
        s->busy_until_ns = until;
    pthread_mutex_unlock(&g_lock);
}

/* A synchronization completes the events recorded before it: on `stream`,
 * or on every stream (NULL with `all`). Under g_lock. */
static void complete_events_locked(CUstream stream, int all)
{
    for (size_t i = 0; i < g_events.n; i++) {
        struct CUevent_st *e = g_events.items[i];
        if (all || e->stream == stream)
            e->synced = 1;
    }
    /* The fake does not wait out fake_stream_busy's work: a synchronization
     * finishes it at once. */
    if (all) {
        g_legacy_busy_until_ns = 0;
        for (size_t i = 0; i < g_streams.n; i++)
            ((struct CUstream_st *)g_streams.items[i])->busy_until_ns = 0;
    } else if ((uintptr_t)stream > 2) {
        stream->busy_until_ns = 0;
    }
}

/* Work runs at once here, so a wait orders nothing, but for the work of
 * fake_stream_busy: a stream that waits on an event of it is busy as long
 * (what a record on it then shows). Both handles must be valid; each wait
 * is counted (stream_waits). */
EXPORT CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    (void)Flags;
    CUresult r = check_event(hEvent, hStream, 0);
    if (!r) {
        __atomic_fetch_add(&g_stats.stream_waits, 1, __ATOMIC_RELAXED);
        pthread_mutex_lock(&g_lock);
        long long until = hEvent->synced ? 0 : hEvent->ready_ns;
        if ((uintptr_t)hStream > 2) {
            if (until > hStream->busy_until_ns)
                hStream->busy_until_ns = until;
        } else if ((uintptr_t)hStream < 2 && until > g_legacy_busy_until_ns) {
            g_legacy_busy_until_ns = until;
        }
        pthread_mutex_unlock(&g_lock);
    }
    return r;
}
EXPORT CUresult cuEventQuery(CUevent hEvent)
{
    CUresult r = check_event(hEvent, NULL, 0);
    return !r && event_pending(hEvent) ? CUDA_ERROR_NOT_READY : r;
}

/* The host waits: the event is complete when this returns (at once here,
 * however far behind the fake GPU is), and so is the fake_stream_busy work
 * it waited for (work queued on its stream later stays). */
EXPORT CUresult cuEventSynchronize(CUevent hEvent)
{
    CUresult r = check_event(hEvent, NULL, 0);
    if (!r) {
        pthread_mutex_lock(&g_lock);
        hEvent->synced = 1;
        CUstream s = hEvent->stream;
        if ((uintptr_t)s > 2 && stream_valid(s) && s->busy_until_ns <= hEvent->ready_ns)
            s->busy_until_ns = 0;
        else if ((uintptr_t)s < 2 && g_legacy_busy_until_ns <= hEvent->ready_ns)
            g_legacy_busy_until_ns = 0;
        pthread_mutex_unlock(&g_lock);
    }
    return r;
}

EXPORT CUresult cuEventDestroy_v2(CUevent hEvent)
{
    CUresult r = check_init();
    if (r)
        return r;
    pthread_mutex_lock(&g_lock);
    int found = set_del(&g_events, hEvent);
    pthread_mutex_unlock(&g_lock);
    if (!found)
        return CUDA_ERROR_INVALID_HANDLE;
    free(hEvent);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Copies: the device side must lie inside one known allocation (or mapped */
/* pages laid end to end), which catches out-of-bounds pointers handed out  */
/* by a sub-allocating shim.                                                */

/* Is [p, p + n) covered by one allocation, or by cuMemMap'ed ranges laid
 * end to end (a range of VA backed by several physical allocations, as a
 * VMM pool's block spanning pages is: fine on a GPU)? Under g_lock. */
static int range_is_device_memory(uintptr_t p, size_t n)
{
    if (tab_find_range(p, n))
        return 1;
    while (n) {
        struct alloc *a = tab_find_range(p, 1);
        if (!a || a->kind != K_VMM_MAP)
            return 0;
        size_t in_this = a->base + a->size - p;
        if (in_this >= n)
            return 1;
        p += in_this;
        n -= in_this;
    }
    return 1;
}

static CUresult check_device_range(uintptr_t p, size_t n)
{
    CUresult r = check_init();
    if (r)
        return r;
    pthread_mutex_lock(&g_lock);
    struct CUctx_st *c;
    r = need_ctx(&c);
    if (!r && n && !range_is_device_memory(p, n))
        r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&g_lock);
    return r;
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    if (ByteCount && !srcHost)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_device_range(dstDevice, ByteCount);
    if (!r && ByteCount)
        memcpy((void *)(uintptr_t)dstDevice, srcHost, ByteCount);
    return r;
}

EXPORT CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    if (ByteCount && !dstHost)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_device_range(srcDevice, ByteCount);
    if (!r && ByteCount)
        memcpy(dstHost, (const void *)(uintptr_t)srcDevice, ByteCount);
    return r;
}

EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    CUresult r = check_device_range(dstDevice, N);
    if (!r && N)
        memset((void *)(uintptr_t)dstDevice, uc, N);
    return r;
}

/* ------------------------------------------------------------------------ */
/* Errors                                                                   */

EXPORT CUresult cuGetErrorString(CUresult error, const char **pStr)
{
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    const char *s;
    switch (error) {
    case CUDA_SUCCESS: s = "no error"; break;
    case CUDA_ERROR_INVALID_VALUE: s = "invalid argument"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: s = "out of memory"; break;
    case CUDA_ERROR_NOT_INITIALIZED: s = "initialization error"; break;
    case CUDA_ERROR_DEINITIALIZED: s = "driver shutting down"; break;
    case CUDA_ERROR_INVALID_DEVICE: s = "invalid device ordinal"; break;
    case CUDA_ERROR_INVALID_CONTEXT: s = "invalid device context"; break;
    case CUDA_ERROR_INVALID_HANDLE: s = "invalid resource handle"; break;
    case CUDA_ERROR_NOT_FOUND: s = "named symbol not found"; break;
    case CUDA_ERROR_UNKNOWN: s = "unknown error"; break;
    default: *pStr = NULL; return CUDA_ERROR_INVALID_VALUE;
    }
    *pStr = s;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* cuGetProcAddress                                                         */

LOCAL_ALIAS(cuInit);
LOCAL_ALIAS(cuDriverGetVersion);
LOCAL_ALIAS(cuDeviceGet);
LOCAL_ALIAS(cuDeviceGetCount);
LOCAL_ALIAS(cuDeviceGetName);
LOCAL_ALIAS(cuDeviceTotalMem_v2);
LOCAL_ALIAS(cuDevicePrimaryCtxRetain);
LOCAL_ALIAS(cuDevicePrimaryCtxRelease_v2);
LOCAL_ALIAS(cuDevicePrimaryCtxReset_v2);
LOCAL_ALIAS(cuCtxCreate_v2);
LOCAL_ALIAS(cuCtxDestroy_v2);
LOCAL_ALIAS(cuCtxGetCurrent);
LOCAL_ALIAS(cuCtxSetCurrent);
LOCAL_ALIAS(cuCtxPushCurrent_v2);
LOCAL_ALIAS(cuCtxPopCurrent_v2);
LOCAL_ALIAS(cuCtxGetDevice);
LOCAL_ALIAS(cuCtxSynchronize);
LOCAL_ALIAS(cuMemAlloc_v2);
LOCAL_ALIAS(cuMemFree_v2);
LOCAL_ALIAS(cuMemAllocPitch_v2);
LOCAL_ALIAS(cuMemAllocManaged);
LOCAL_ALIAS(cuMemAllocAsync);
LOCAL_ALIAS(cuMemAllocAsync_ptsz);
LOCAL_ALIAS(cuMemFreeAsync);
LOCAL_ALIAS(cuMemFreeAsync_ptsz);
LOCAL_ALIAS(cuMemAllocFromPoolAsync);
LOCAL_ALIAS(cuMemAllocFromPoolAsync_ptsz);
LOCAL_ALIAS(cuMemAllocHost_v2);
LOCAL_ALIAS(cuMemHostAlloc);
LOCAL_ALIAS(cuMemFreeHost);
LOCAL_ALIAS(cuMemCreate);
LOCAL_ALIAS(cuMemRelease);
LOCAL_ALIAS(cuMemRetainAllocationHandle);
LOCAL_ALIAS(cuMemExportToShareableHandle);
LOCAL_ALIAS(cuMemImportFromShareableHandle);
LOCAL_ALIAS(cuMemAddressReserve);
LOCAL_ALIAS(cuMemAddressFree);
LOCAL_ALIAS(cuMemMap);
LOCAL_ALIAS(cuMemUnmap);
LOCAL_ALIAS(cuMemSetAccess);
LOCAL_ALIAS(cuMemGetAllocationGranularity);
LOCAL_ALIAS(cuDeviceCanAccessPeer);
LOCAL_ALIAS(cuMemGetInfo_v2);
LOCAL_ALIAS(cuMemGetAddressRange_v2);
LOCAL_ALIAS(cuPointerGetAttribute);
LOCAL_ALIAS(cuIpcGetMemHandle);
LOCAL_ALIAS(cuIpcOpenMemHandle_v2);
LOCAL_ALIAS(cuIpcOpenMemHandle);
LOCAL_ALIAS(cuIpcCloseMemHandle);
LOCAL_ALIAS(cuStreamCreate);
LOCAL_ALIAS(cuStreamCreateWithPriority);
LOCAL_ALIAS(cuStreamDestroy_v2);
LOCAL_ALIAS(cuStreamSynchronize);
LOCAL_ALIAS(cuStreamIsCapturing);
LOCAL_ALIAS(cuStreamBeginCapture_v2);
LOCAL_ALIAS(cuStreamEndCapture);
LOCAL_ALIAS(cuCtxGetId);
LOCAL_ALIAS(cuEventCreate);
LOCAL_ALIAS(cuEventRecord);
LOCAL_ALIAS(cuEventQuery);
LOCAL_ALIAS(cuStreamWaitEvent);
LOCAL_ALIAS(cuEventSynchronize);
LOCAL_ALIAS(cuEventDestroy_v2);
LOCAL_ALIAS(cuMemcpyHtoD_v2);
LOCAL_ALIAS(cuMemcpyDtoH_v2);
LOCAL_ALIAS(cuMemsetD8_v2);
LOCAL_ALIAS(cuGetErrorString);
LOCAL_ALIAS(cuGetProcAddress);
LOCAL_ALIAS(cuGetProcAddress_v2);

struct proc_entry {
    const char *name; /* base name, as callers ask for it */
    int min_version;  /* first CUDA version that has the symbol */
    void *fn;         /* newest variant */
    void *ptsz;       /* per-thread-default-stream variant, if any */
    void *old;        /* the variant handed out for versions before new_version */
    int new_version;  /* first CUDA version that gets fn (0: all do) */
};

#define P(base, ver, f) {base, ver, (void *)local_##f, NULL, NULL, 0}
#define PS(base, ver, f) {base, ver, (void *)local_##f, (void *)local_##f##_ptsz, NULL, 0}
/* fn from CUDA version newver on, oldf before. */
#define PV(base, ver, f, newver, oldf) {base, ver, (void *)local_##f, NULL, (void *)local_##oldf, newver}

static const struct proc_entry g_procs[] = {
    P("cuInit", 2000, cuInit),
    P("cuDriverGetVersion", 2020, cuDriverGetVersion),
    P("cuDeviceGet", 2000, cuDeviceGet),
    P("cuDeviceGetCount", 2000, cuDeviceGetCount),
    P("cuDeviceGetName", 2000, cuDeviceGetName),
    P("cuDeviceTotalMem", 2000, cuDeviceTotalMem_v2),
    P("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    P("cuDevicePrimaryCtxRelease", 7000, cuDevicePrimaryCtxRelease_v2),
    P("cuDevicePrimaryCtxReset", 7000, cuDevicePrimaryCtxReset_v2),
    P("cuCtxCreate", 2000, cuCtxCreate_v2),
    P("cuCtxDestroy", 2000, cuCtxDestroy_v2),
    P("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
    P("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
    P("cuCtxPushCurrent", 2000, cuCtxPushCurrent_v2),
    P("cuCtxPopCurrent", 2000, cuCtxPopCurrent_v2),
    P("cuCtxGetDevice", 2000, cuCtxGetDevice),
    P("cuCtxSynchronize", 2000, cuCtxSynchronize),
    P("cuMemAlloc", 2000, cuMemAlloc_v2),
    P("cuMemFree", 2000, cuMemFree_v2),
    P("cuMemAllocPitch", 2000, cuMemAllocPitch_v2),
    P("cuMemAllocManaged", 6000, cuMemAllocManaged),
    PS("cuMemAllocAsync", 11020, cuMemAllocAsync),
    PS("cuMemFreeAsync", 11020, cuMemFreeAsync),
    PS("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync),
    P("cuMemAllocHost", 2000, cuMemAllocHost_v2),
    P("cuMemHostAlloc", 2020, cuMemHostAlloc),
    P("cuMemFreeHost", 2000, cuMemFreeHost),
    P("cuMemCreate", 10020, cuMemCreate),
    P("cuMemRelease", 10020, cuMemRelease),
    P("cuMemRetainAllocationHandle", 11000, cuMemRetainAllocationHandle),
    P("cuMemExportToShareableHandle", 10020, cuMemExportToShareableHandle),
    P("cuMemImportFromShareableHandle", 10020, cuMemImportFromShareableHandle),
    P("cuMemAddressReserve", 10020, cuMemAddressReserve),
    P("cuMemAddressFree", 10020, cuMemAddressFree),
    P("cuMemMap", 10020, cuMemMap),
    P("cuMemUnmap", 10020, cuMemUnmap),
    P("cuMemSetAccess", 10020, cuMemSetAccess),
    P("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
    P("cuDeviceCanAccessPeer", 4000, cuDeviceCanAccessPeer),
    P("cuMemGetInfo", 2000, cuMemGetInfo_v2),
    P("cuMemGetAddressRange", 2000, cuMemGetAddressRange_v2),
    P("cuPointerGetAttribute", 4000, cuPointerGetAttribute),
    P("cuIpcGetMemHandle", 4010, cuIpcGetMemHandle),
    PV("cuIpcOpenMemHandle", 4010, cuIpcOpenMemHandle_v2, 11000, cuIpcOpenMemHandle),
    P("cuIpcCloseMemHandle", 4010, cuIpcCloseMemHandle),
    P("cuStreamCreate", 2000, cuStreamCreate),
    P("cuStreamCreateWithPriority", 5050, cuStreamCreateWithPriority),
    P("cuStreamDestroy", 2000, cuStreamDestroy_v2),
    P("cuStreamSynchronize", 2000, cuStreamSynchronize),
    P("cuStreamIsCapturing", 10000, cuStreamIsCapturing),
    P("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2),
    P("cuStreamEndCapture", 10000, cuStreamEndCapture),
    P("cuCtxGetId", 12000, cuCtxGetId),
    P("cuEventCreate", 2000, cuEventCreate),
    P("cuEventRecord", 2000, cuEventRecord),
    P("cuEventQuery", 2000, cuEventQuery),
    P("cuStreamWaitEvent", 2000, cuStreamWaitEvent),
    P("cuEventSynchronize", 2000, cuEventSynchronize),
    P("cuEventDestroy", 2000, cuEventDestroy_v2),
    P("cuMemcpyHtoD", 2000, cuMemcpyHtoD_v2),
    P("cuMemcpyDtoH", 2000, cuMemcpyDtoH_v2),
    P("cuMemsetD8", 2000, cuMemsetD8_v2),
    P("cuGetErrorString", 6000, cuGetErrorString),
    PV("cuGetProcAddress", 11030, cuGetProcAddress_v2, 12000, cuGetProcAddress),
};

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, unsigned long long flags,
                                    int *symbolStatus)
{
    if (!symbol || !pfn || (flags & ~3ULL))
        return CUDA_ERROR_INVALID_VALUE;
    if (g_deinit)
        return CUDA_ERROR_DEINITIALIZED;
    for (size_t i = 0; i < sizeof(g_procs) / sizeof(g_procs[0]); i++) {
        const struct proc_entry *e = &g_procs[i];
        if (strcmp(e->name, symbol) != 0)
            continue;
        if (cudaVersion < e->min_version) {
            *pfn = NULL;
            if (symbolStatus)
                *symbolStatus = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
            return CUDA_ERROR_NOT_FOUND;
        }
        void *fn = e->fn;
        if ((flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && e->ptsz)
            fn = e->ptsz;
        if (cudaVersion < e->new_version)
            fn = e->old;
        *pfn = fn;
        if (symbolStatus)
            *symbolStatus = CU_GET_PROC_ADDRESS_SUCCESS;
        return CUDA_SUCCESS;
    }
    *pfn = NULL;
    if (symbolStatus)
        *symbolStatus = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, unsigned long long flags)
{
    return local_cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}

/* ------------------------------------------------------------------------ */
/* fork and exit                                                            */

static void atfork_prepare(void) { pthread_mutex_lock(&g_lock); }
static void atfork_parent(void) { pthread_mutex_unlock(&g_lock); }

/* The child starts with its own view of the "GPU": no allocations and zeroed
 * counters, so its FAKE_CUDA_STATS line covers only what it did itself.  The
 * inherited copies of the parent's buffers are simply forgotten. */
static void atfork_child(void)
{
    pthread_mutex_unlock(&g_lock); /* locked by this same thread in prepare */
    g_ntab = 0;
    memset(g_used, 0, sizeof(g_used));
    memset(&g_stats, 0, sizeof(g_stats));
}

__attribute__((constructor)) static void fake_cuda_ctor(void)
{
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

__attribute__((destructor)) static void fake_cuda_dtor(void)
{
    const char *path = getenv("FAKE_CUDA_STATS");
    if (path && *path) {
        pthread_mutex_lock(&g_lock);
        unsigned long long live = 0, live_bytes = 0;
        for (size_t i = 0; i < g_ntab; i++)
            if (kind_is_device(g_tab[i].kind)) {
                live++;
                live_bytes += g_tab[i].size;
            }
        char line[768];
        int n = snprintf(line, sizeof(line),
                         "pid=%d allocs=%llu frees=%llu host_allocs=%llu host_frees=%llu vmm_creates=%llu "
                         "vmm_releases=%llu live=%llu live_bytes=%llu ipc_opens=%llu ipc_closes=%llu cross_context_records=%llu "
                         "vmm_maps=%llu vmm_unmaps=%llu vmm_grants=%llu vmm_imports=%llu stream_waits=%llu\n",
                         (int)getpid(), g_stats.allocs, g_stats.frees, g_stats.host_allocs, g_stats.host_frees,
                         g_stats.vmm_creates, g_stats.vmm_releases, live, live_bytes, g_stats.ipc_opens,
                         g_stats.ipc_closes, g_stats.cross_context_records, g_stats.vmm_maps, g_stats.vmm_unmaps,
                         g_stats.vmm_grants, g_stats.vmm_imports, g_stats.stream_waits);
        pthread_mutex_unlock(&g_lock);
        int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (fd >= 0) {
            /* One write per line so concurrent processes do not interleave. */
            ssize_t w = write(fd, line, (size_t)n);
            (void)w;
            close(fd);
        }
    }
    /* Like the real driver during teardown: later calls fail. */
    g_deinit = 1;
}
