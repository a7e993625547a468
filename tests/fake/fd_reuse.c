/* A program that closes a descriptor number it does not own any more, then
 * writes a file of its own, which may get that number. Its file must hold
 * exactly what it wrote, whatever the log's writer does meanwhile.
 *
 * usage: fd_reuse double OUT   closes a number twice: the number of a file
 *                              it opened and closed before its first CUDA
 *                              call (a bug that is harmless on its own)
 *        fd_reuse log OUT      closes the log's descriptor (found through
 *                              /proc/self/fd) and puts its own file there
 *
 * Prints "result: ok" and the figures the test reads. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake_cudart_api.h"
#include "check.h"

#define LINE "the program's own line\n"

/* The descriptor open on a file named cupool.*.json, or -1. */
static int log_descriptor(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int found = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        char path[64], target[4096];
        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, target, sizeof(target) - 1);
        if (n <= 0)
            continue;
        target[n] = 0;
        const char *base = strrchr(target, '/');
        if (base && strncmp(base, "/cupool.", 8) == 0 && strstr(base, ".json"))
            found = atoi(e->d_name);
    }
    closedir(d);
    return found;
}

/* Allocations and frees, so that the log has events to write; 1 on failure. */
static int churn(unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        void *p = NULL;
        CHECK(cudaMalloc(&p, 4096 + i % 7 * 512));
        CHECK(cudaFree(p));
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 3 || (strcmp(argv[1], "double") && strcmp(argv[1], "log")))
        FAIL("usage: fd_reuse double|log OUT");
    int stale = open("/dev/null", O_RDONLY);
    if (stale < 0)
        FAIL("open /dev/null");
    close(stale);
    void *keep = NULL;
    CHECK(cudaMalloc(&keep, 4096)); /* the first CUDA call: the log opens */
    if (churn(100))
        return 1;
    int number = stale, closed;
    if (strcmp(argv[1], "double") == 0) {
        char path[64], target[4096] = "";
        snprintf(path, sizeof(path), "/proc/self/fd/%d", stale);
        ssize_t len = readlink(path, target, sizeof(target) - 1);
        if (len > 0) {
            target[len] = 0;
            fprintf(stderr, "fd_reuse: closing %d again, now %s\n", stale, target);
        }
        closed = close(stale) == 0;
    } else {
        number = log_descriptor();
        if (number < 0)
            FAIL("no log descriptor under /proc/self/fd");
        closed = close(number) == 0;
    }
    int fd = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        FAIL("open OUT");
    if (fd != number) {
        if (dup2(fd, number) != number)
            FAIL("dup2");
        close(fd);
        fd = number;
    }
    for (int round = 0; round < 3; round++) {
        if (write(fd, LINE, strlen(LINE)) != (ssize_t)strlen(LINE))
            FAIL("write OUT");
        if (churn(1000))
            return 1;
        usleep(250 * 1000); /* past the writer's flush period */
    }
    close(fd);
    CHECK(cudaFree(keep));

    char got[4096];
    int in = open(argv[2], O_RDONLY);
    ssize_t n = in < 0 ? -1 : read(in, got, sizeof(got) - 1);
    if (n < 0)
        FAIL("read OUT back");
    close(in);
    got[n] = 0;
    const char *want = LINE LINE LINE;
    if (strcmp(got, want) != 0) {
        fprintf(stderr, "OUT holds %zd bytes, not the program's 3 lines; it begins:\n%.300s\n", n, got);
        FAIL("OUT changed");
    }
    printf("result: ok closed_another=%d number=%d\n", closed, number);
    return 0;
}
