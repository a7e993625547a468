/* Test-local program of tests/pool.rs (`api_phases`): names phases through
 * cupool's C API, found with dlsym as the Python module finds it. With an
 * argument "nocuda" it names phases and never touches CUDA memory. Otherwise:
 * "setup" begins before the first CUDA call (1 MiB allocated inside it),
 * then marks "epoch 1" (2 MiB more) and "epoch 2" (the 2 MiB freed), and
 * "setup" ends last. Prints has_api=. */
#include <dlfcn.h>
#include <string.h>

#include "fake_cuda_api.h"
#include "fake_cudart_api.h"
#include "check.h"

int main(int argc, char **argv)
{
    void (*begin)(const char *) = (void (*)(const char *))dlsym(RTLD_DEFAULT, "cupool_phase_begin");
    void (*end)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "cupool_phase_end");
    void (*mark)(const char *) = (void (*)(const char *))dlsym(RTLD_DEFAULT, "cupool_mark");
    printf("has_api=%d\n", begin && end && mark);
    if (!begin || !end || !mark)
        FAIL("cupool's phase API is missing");
    if (argc > 1 && strcmp(argv[1], "nocuda") == 0) {
        begin("idle");
        mark("nothing");
        end();
        end(); /* one too many: ignored */
        printf("result: ok\n");
        return 0;
    }
    begin("setup \"quoted\"");
    void *a = NULL, *b = NULL;
    CHECK(cudaMalloc(&a, 1u << 20));
    mark("epoch 1");
    CHECK(cudaMalloc(&b, 2u << 20));
    mark("epoch 2");
    CHECK(cudaFree(b));
    end();
    CHECK(cudaFree(a));
    printf("result: ok\n");
    return 0;
}
