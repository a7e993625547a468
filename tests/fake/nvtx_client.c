/* Test-local program of tests/pool.rs (`nvtx_client`): an NVTX client that
 * loads its tool the way NVTX v3 does — dlopen($NVTX_INJECTION64_PATH), then
 * InitializeInjectionNvtx2(getExportTable), which fills the function slots —
 * and then calls the slots as nvtxRangePushA & co. would. After a first
 * 1 MiB allocation (recording on): ranges "outer" (push A) holding "inner"
 * (push Ex, ascii) with 2 MiB allocated in it, "async" (start A / end),
 * "registered" (domain push Ex with a registered string), an operation's
 * range as XLA names it (domain push Ex, not written) holding "callback"
 * (the same), "wide ✓" (push W),
 * "thread" pushed and popped on a second thread, and "forked", open across a
 * fork: the child allocates, pops it, frees and exits. Prints attached=, the
 * depths NVTX returns (d_outer=, d_inner=, pop_inner=, pop_outer=,
 * pop_extra=, d_op=, d_callback=, pop_callback=, pop_op=), child_pid= and result: ok. Without the variable: injected=0. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include <wchar.h>

#include "fake_cuda_api.h"
#include "fake_cudart_api.h"
#include "check.h"

typedef void (*slot_fn)(void);
#define SLOTS 16
static slot_fn core[SLOTS], core2[SLOTS];
static slot_fn *core_table[SLOTS], *core2_table[SLOTS];

static int get_module(int module, slot_fn ***out, unsigned *size)
{
    slot_fn *slots = module == 1 ? core : module == 5 ? core2 : NULL;
    slot_fn **table = module == 1 ? core_table : core2_table;
    if (!slots)
        return 0;
    for (int i = 0; i < SLOTS; i++)
        table[i] = &slots[i];
    *out = table;
    *size = SLOTS;
    return 1;
}

static struct {
    size_t struct_size;
    int (*get)(int, slot_fn ***, unsigned *);
} callbacks = {sizeof(callbacks), get_module};

static const void *get_export_table(uint32_t id) { return id == 1 ? (const void *)&callbacks : NULL; }

struct attributes {
    uint16_t version, size;
    uint32_t category;
    int32_t color_type;
    uint32_t color;
    int32_t payload_type, reserved0;
    uint64_t payload;
    int32_t message_type;
    const void *message;
};

typedef int (*push_a_fn)(const char *);
typedef int (*push_w_fn)(const wchar_t *);
typedef int (*push_ex_fn)(const struct attributes *);
typedef int (*pop_fn)(void);
typedef uint64_t (*start_a_fn)(const char *);
typedef void (*end_fn)(uint64_t);
typedef const void *(*domain_create_fn)(const char *);
typedef const void *(*register_fn)(const void *, const char *);
typedef int (*domain_push_fn)(const void *, const struct attributes *);
typedef int (*domain_pop_fn)(const void *);

static void *on_thread(void *arg)
{
    (void)arg;
    ((push_a_fn)core[9])("thread");
    ((pop_fn)core[11])();
    return NULL;
}

int main(void)
{
    const char *path = getenv("NVTX_INJECTION64_PATH");
    if (!path || !*path) {
        printf("injected=0\nresult: ok\n");
        return 0;
    }
    void *tool = dlopen(path, RTLD_LAZY);
    int (*init)(const void *(*)(uint32_t)) = tool ? (int (*)(const void *(*)(uint32_t)))dlsym(tool, "InitializeInjectionNvtx2") : NULL;
    if (!init)
        FAIL("no InitializeInjectionNvtx2 in %s", path);
    int attached = init(get_export_table);
    printf("attached=%d\n", attached);
    void *a = NULL, *b = NULL;
    CHECK(cudaMalloc(&a, 1u << 20));
    if (attached && core[9] && core[8] && core[11] && core[5] && core[7] && core[10] && core2[4] && core2[5] &&
        core2[10] && core2[12]) {
        printf("d_outer=%d\n", ((push_a_fn)core[9])("outer"));
        struct attributes inner = {3, sizeof(struct attributes), 0, 0, 0, 0, 0, 0, 1, "inner"};
        printf("d_inner=%d\n", ((push_ex_fn)core[8])(&inner));
        CHECK(cudaMalloc(&b, 2u << 20));
        printf("pop_inner=%d\n", ((pop_fn)core[11])());
        printf("pop_outer=%d\n", ((pop_fn)core[11])());
        printf("pop_extra=%d\n", ((pop_fn)core[11])());
        uint64_t id = ((start_a_fn)core[5])("async");
        CHECK(cudaFree(b));
        ((end_fn)core[7])(id);
        const void *domain = ((domain_create_fn)core2[12])("dom");
        const void *name = ((register_fn)core2[10])(domain, "registered");
        struct attributes reg = {3, sizeof(struct attributes), 0, 0, 0, 0, 0, 0, 3, name};
        ((domain_push_fn)core2[4])(domain, &reg);
        ((domain_pop_fn)core2[5])(domain);
        struct attributes op = {3, sizeof(struct attributes), 0, 0, 0, 0, 0, 0, 1, "Thunk:#hlo_op=fusion.3#"};
        printf("d_op=%d\n", ((domain_push_fn)core2[4])(domain, &op));
        struct attributes callback = {3, sizeof(struct attributes), 0, 0, 0, 0, 0, 0, 1, "callback"};
        printf("d_callback=%d\n", ((domain_push_fn)core2[4])(domain, &callback));
        printf("pop_callback=%d\n", ((domain_pop_fn)core2[5])(domain));
        printf("pop_op=%d\n", ((domain_pop_fn)core2[5])(domain));
        ((push_w_fn)core[10])(L"wide \u2713");
        ((pop_fn)core[11])();
        pthread_t t;
        pthread_create(&t, NULL, on_thread, NULL);
        pthread_join(t, NULL);
        ((push_a_fn)core[9])("forked");
        fflush(stdout);
        pid_t child = fork();
        if (child == 0) {
            void *c = NULL;
            CHECK(cudaMalloc(&c, 1u << 20));
            ((pop_fn)core[11])();
            CHECK(cudaFree(c));
            exit(0);
        }
        int status = 0;
        waitpid(child, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            FAIL("child status %d", status);
        printf("child_pid=%d\n", (int)child);
        ((pop_fn)core[11])();
    } else {
        CHECK(cudaMalloc(&b, 2u << 20));
        CHECK(cudaFree(b));
    }
    CHECK(cudaFree(a));
    printf("result: ok\n");
    return 0;
}
