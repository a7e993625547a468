/* libmarker.so (built by tests/cli.rs with -shared -fPIC): a preload library
 * whose constructor prints "preload-marker pid=<pid> LD_PRELOAD=<value>" on
 * stderr, so a test can see which processes loaded it and what LD_PRELOAD
 * each of them saw. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void marker(void)
{
    const char *p = getenv("LD_PRELOAD");
    fprintf(stderr, "preload-marker pid=%d LD_PRELOAD=%s\n", (int)getpid(), p ? p : "");
}
