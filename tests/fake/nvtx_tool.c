/* Test-local library of tests/tools.rs (`libnvtx_tool.so`): a fake NVTX
 * tool, loaded by a client through NVTX_INJECTION64_PATH, that takes the
 * NVTX memory extension as compute-sanitizer does and logs every call to the
 * file named by FAKE_NVTX_LOG, one line each (numbers in decimal):
 *
 *   core version=V core2_size=N   InitializeInjectionNvtx2 (export table read)
 *   ext module=M compat=C segment=I slots=N filled=0|1
 *                                 InitializeInjectionNvtxExtension
 *   domain name=S                 nvtxDomainCreateA (returns DOMAIN)
 *   heap handle=H domain=D addr=A size=S usage=U type=T desc=N struct=N
 *   heap_unregister handle=H domain=D
 *   region heap=H domain=D addr=A size=S struct=N
 *   unregion domain=D addr=A struct=N
 *
 * Heap handles are 1, 2, 3, ...: never the heap's address, so a client that
 * confuses the two is caught. Ids and layouts are NVTX's (nvtxTypes.h,
 * nvtxExtTypes.h, nvToolsExtMem.h). Like real tools, it fills only the slot
 * layouts it knows: slot i holds callback id i (NVTX 3.2), or with
 * FAKE_NVTX_SHIFTED=1 slot i holds id i+1 (NVTX's dev-mem-api headers); with
 * FAKE_NVTX_MIN_SLOTS=N it accepts a module of fewer slots but fills nothing. */
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define DOMAIN ((void *)0xd0d0)

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uintptr_t next_heap = 1;

static void logf_(const char *fmt, ...)
{
    const char *path = getenv("FAKE_NVTX_LOG");
    if (!path)
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0 || n >= (int)sizeof line - 1)
        return;
    line[n++] = '\n';
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
        if (write(fd, line, (size_t)n) != n) {
            /* a test reading the log finds the line missing */
        }
        close(fd);
    }
}

/* ---- core: the export table ---- */

typedef void (*fn_t)(void);
struct callbacks {
    size_t struct_size;
    int (*get_module_function_table)(int module, fn_t ***table, unsigned *size);
};
struct version_info {
    size_t struct_size;
    uint32_t version, reserved0;
    void (*set_injection_nvtx_version)(uint32_t);
};

static void *domain_create(const char *name)
{
    logf_("domain name=%s", name ? name : "(null)");
    return DOMAIN;
}

EXPORT int InitializeInjectionNvtx2(const void *(*get_export_table)(uint32_t))
{
    const struct callbacks *cb = get_export_table(1);
    const struct version_info *vi = get_export_table(3);
    if (!cb || cb->struct_size < sizeof *cb || !vi || vi->struct_size < sizeof *vi)
        return 0;
    fn_t **core2 = NULL;
    unsigned size = 0;
    if (!cb->get_module_function_table(5, &core2, &size) || !core2 || size <= 12 || !core2[12])
        return 0;
    *core2[12] = (fn_t)domain_create; /* NVTX_CBID_CORE2_DomainCreateA */
    vi->set_injection_nvtx_version(3);
    logf_("core version=%u core2_size=%u", vi->version, size);
    return 1;
}

/* ---- the memory extension ---- */

struct segment {
    size_t id, slot_count;
    intptr_t *slots;
};
struct module_info {
    uint16_t nvtx_ver, struct_size, module_id, compat_id;
    size_t segments_count;
    struct segment *segments;
    void *get_export_function;
    const void *ext_info;
};
struct range {
    size_t size;
    const void *ptr;
};
struct heap_desc {
    uint16_t compat, struct_size;
    uint32_t reserved0, usage, type;
    size_t desc_size;
    const struct range *desc;
    uint32_t category, message_type;
    const void *message;
};
struct regions_register {
    uint16_t compat, struct_size;
    uint32_t type;
    void *heap;
    size_t count, element_size;
    const struct range *elements;
    void **handles_out;
};
struct regions_unregister {
    uint16_t compat, struct_size;
    uint32_t ref_type;
    size_t count, element_size;
    const void *const *elements;
};

static void *heap_register(void *domain, const struct heap_desc *d)
{
    pthread_mutex_lock(&lock);
    uintptr_t h = next_heap++;
    pthread_mutex_unlock(&lock);
    logf_("heap handle=%lu domain=%lu addr=%lu size=%zu usage=%u type=%u desc=%zu struct=%u", (unsigned long)h,
          (unsigned long)(uintptr_t)domain, (unsigned long)(uintptr_t)d->desc->ptr, d->desc->size, d->usage, d->type,
          d->desc_size, d->struct_size);
    return (void *)h;
}

static void heap_unregister(void *domain, void *heap)
{
    logf_("heap_unregister handle=%lu domain=%lu", (unsigned long)(uintptr_t)heap, (unsigned long)(uintptr_t)domain);
}

static void regions_register(void *domain, const struct regions_register *b)
{
    for (size_t i = 0; i < b->count; i++)
        logf_("region heap=%lu domain=%lu addr=%lu size=%zu struct=%u", (unsigned long)(uintptr_t)b->heap,
              (unsigned long)(uintptr_t)domain, (unsigned long)(uintptr_t)b->elements[i].ptr, b->elements[i].size,
              b->struct_size);
}

static void regions_unregister(void *domain, const struct regions_unregister *b)
{
    for (size_t i = 0; i < b->count; i++)
        logf_("unregion domain=%lu addr=%lu struct=%u", (unsigned long)(uintptr_t)domain,
              (unsigned long)(uintptr_t)b->elements[i], b->struct_size);
}

EXPORT int InitializeInjectionNvtxExtension(struct module_info *m)
{
    if (!m || m->module_id != 1 || m->compat_id != 0x0102 || m->segments_count != 1 || m->segments[0].slot_count < 7)
        return 0;
    const char *min = getenv("FAKE_NVTX_MIN_SLOTS");
    int fill = !min || m->segments[0].slot_count >= (size_t)atoi(min);
    logf_("ext module=%u compat=%u segment=%zu slots=%zu filled=%d", m->module_id, m->compat_id, m->segments[0].id,
          m->segments[0].slot_count, fill);
    if (!fill)
        return 1;
    const char *shifted = getenv("FAKE_NVTX_SHIFTED");
    int shift = shifted && *shifted == '1';
    intptr_t *slot = m->segments[0].slots;
    slot[1 - shift] = (intptr_t)heap_register;
    slot[2 - shift] = (intptr_t)heap_unregister;
    slot[4 - shift] = (intptr_t)regions_register;
    slot[6 - shift] = (intptr_t)regions_unregister;
    return 1;
}
