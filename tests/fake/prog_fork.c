/* Fork test (shared runtime).  The parent allocates and frees 3 blocks, then
 * forks.  The child allocates 2 blocks of CHILD_BYTES, frees one, leaks one
 * and exits 0; it prints "child: allocs=2 frees=1 leaked_bytes=7777".  The
 * parent waits, leaks one block of PARENT_BYTES and prints child_pid=,
 * parent_pid= and its own result line (allocs=4 frees=3). */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fake_cudart_api.h"
#include "check.h"

#define CHILD_BYTES 7777u
#define PARENT_BYTES 6666u

static int child(void)
{
    void *a = NULL, *b = NULL;
    if (cudaMalloc(&a, CHILD_BYTES) || cudaMalloc(&b, CHILD_BYTES))
        FAIL("child cudaMalloc");
    if (cudaFree(a))
        FAIL("child cudaFree");
    printf("child: allocs=2 frees=1 leaked_bytes=%u\n", CHILD_BYTES);
    return 0;
}

int main(void)
{
    for (unsigned i = 0; i < 3; i++) {
        void *p = NULL;
        if (cudaMalloc(&p, 1000 * (i + 1)) || cudaFree(p))
            FAIL("parent cudaMalloc/cudaFree");
    }
    fflush(stdout); /* do not duplicate buffered output into the child */
    pid_t pid = fork();
    if (pid < 0)
        FAIL("fork");
    if (pid == 0)
        exit(child()); /* exit(), not _exit(): destructors and atexit run */

    int status = 0;
    if (waitpid(pid, &status, 0) != pid)
        FAIL("waitpid");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        FAIL("child status %#x", status);
    void *leak = NULL;
    if (cudaMalloc(&leak, PARENT_BYTES))
        FAIL("parent leak cudaMalloc");
    printf("child_pid=%d\n", (int)pid);
    printf("parent_pid=%d\n", (int)getpid());
    printf("result: ok allocs=4 frees=3 leaked_bytes=%u\n", PARENT_BYTES);
    return 0;
}
