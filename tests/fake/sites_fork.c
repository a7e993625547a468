/* Test-local program of tests/sites.rs: one call site allocates in the
 * parent, then, after a fork, in the child, from the very same stack (the
 * same loop call in main). The parent frees its block; the child leaks its
 * 4321 bytes and exits 0. The child's log must define that site itself. */
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fake_cudart_api.h"
#include "check.h"

__attribute__((noinline)) static void *forked_site(size_t n)
{
    void *p = NULL;
    if (cudaMalloc(&p, n))
        FAIL("cudaMalloc");
    return p;
}

int main(void)
{
    for (int round = 0; round < 2; round++) {
        if (round == 1) {
            pid_t pid = fork();
            if (pid < 0)
                FAIL("fork");
            if (pid > 0) {
                int status = 0;
                waitpid(pid, &status, 0);
                return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
            }
        }
        void *p = forked_site(4321);
        if (round == 0 && cudaFree(p))
            FAIL("cudaFree");
    }
    return 0;
}
