/* Allocates 50 blocks of 4096 bytes (shared runtime), frees none, prints the
 * result line and "ready", then sleeps so a test can kill it.
 * Usage: prog_sleep [seconds]   (default 30) */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "fake_cudart_api.h"
#include "check.h"

int main(int argc, char **argv)
{
    unsigned seconds = argc > 1 ? (unsigned)atoi(argv[1]) : 30;
    for (unsigned i = 0; i < 50; i++) {
        void *p = NULL;
        if (cudaMalloc(&p, 4096) != cudaSuccess)
            FAIL("cudaMalloc %u", i);
    }
    printf("result: ok allocs=50 frees=0 leaked_bytes=%u\n", 50u * 4096u);
    printf("ready\n");
    fflush(stdout);
    while (seconds)
        seconds = sleep(seconds); /* restart after signals that do not kill us */
    return 0;
}
