/* Legacy CUDA IPC between two processes, through the runtime API (shared
 * cudart).
 *
 * prog_ipc export N    (1 <= N <= 8)
 *   cudaMalloc's one 8 MiB buffer and fills it with a pattern per MiB: byte i
 *   of MiB k is (k << 4 | (i & 15)), so the first 16 bytes of MiB k read
 *   k0 k1 ... kf.  Then, for k = 0 .. N-1, prints the handle of base + k MiB
 *   (cudaIpcGetMemHandle) as 128 hex digits on a line of its own, then
 *   `small_handle=<error of cudaIpcGetMemHandle on a 4 KiB buffer>` and
 *   `ready`.  It waits for a line (or EOF) on stdin, frees the buffer, prints
 *   `freed`, waits for another line (or EOF), prints
 *   `result: ok allocs=2 frees=2 leaked_bytes=0` and exits.
 *
 * prog_ipc import [hold]
 *   Reads handles, 128 hex digits a line, from stdin until EOF or a line
 *   `end` (other lines are ignored).  Opens them all
 *   (cudaIpcOpenMemHandle, cudaIpcMemLazyEnablePeerAccess) before closing
 *   any, so that repeated opens of one allocation are visible, and prints for
 *   handle i
 *     `open i=<i> rc=0 delta=<pointer - first opened pointer> data=<32 hex>`
 *   (the first 16 bytes at the pointer, copied with cudaMemcpy) or
 *     `open i=<i> rc=<error>`.
 *   With `hold` it then prints `holding`, waits for a line (or EOF) on stdin,
 *   and prints `after i=<i> data=<32 hex>` for each open handle.  Then it
 *   closes every successful open (each close must succeed), checks that one
 *   more close of the first pointer and a close of its own cudaMalloc
 *   pointer both fail with cudaErrorInvalidValue, and prints
 *   `result: ok opens=<successful opens> errors=<failed opens> closes=<closes>
 *    allocs=1 frees=1 leaked_bytes=0`.
 *
 * Exit status 0 unless a check fails (`result: FAIL ...`, status 1).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cudart_api.h"
#define CHECK_ERROR_NAME cudaGetErrorString
#include "check.h"

#define MIB ((size_t)1 << 20)
#define BUF_SIZE (8 * MIB)
#define MAX_HANDLES 64

static void wait_line(void)
{
    char line[256];
    if (!fgets(line, sizeof(line), stdin))
        return;
}

static void print_hex(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        printf("%02x", p[i]);
}

static int parse_hex(const char *s, unsigned char *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1)
            return -1;
        out[i] = (unsigned char)v;
    }
    return 0;
}

static int do_export(int n)
{
    if (n < 1 || n > 8)
        FAIL("export N: N must be 1..8, not %d", n);
    unsigned char *host = malloc(BUF_SIZE);
    if (!host)
        FAIL("malloc");
    for (size_t i = 0; i < BUF_SIZE; i++)
        host[i] = (unsigned char)(((i / MIB) << 4) | (i & 15));
    void *buf = NULL;
    CHECK(cudaMalloc(&buf, BUF_SIZE));
    CHECK(cudaMemcpy(buf, host, BUF_SIZE, cudaMemcpyHostToDevice));
    free(host);
    for (int k = 0; k < n; k++) {
        cudaIpcMemHandle_t h;
        CHECK(cudaIpcGetMemHandle(&h, (char *)buf + (size_t)k * MIB));
        print_hex((const unsigned char *)h.reserved, sizeof(h.reserved));
        printf("\n");
    }
    void *small = NULL;
    CHECK(cudaMalloc(&small, 4096));
    cudaIpcMemHandle_t hs;
    printf("small_handle=%d\n", (int)cudaIpcGetMemHandle(&hs, small));
    printf("ready\n");
    fflush(stdout);
    wait_line();
    CHECK(cudaFree(buf));
    CHECK(cudaFree(small));
    printf("freed\n");
    fflush(stdout);
    wait_line();
    printf("result: ok allocs=2 frees=2 leaked_bytes=0\n");
    return 0;
}

static int do_import(int hold)
{
    static cudaIpcMemHandle_t handles[MAX_HANDLES];
    static void *ptrs[MAX_HANDLES];
    int rcs[MAX_HANDLES];
    int n = 0;
    char line[512];
    while (n < MAX_HANDLES && fgets(line, sizeof(line), stdin)) {
        line[strcspn(line, "\r\n")] = 0;
        if (strcmp(line, "end") == 0)
            break;
        if (strlen(line) != 2 * CUDA_IPC_HANDLE_SIZE ||
            parse_hex(line, (unsigned char *)handles[n].reserved, CUDA_IPC_HANDLE_SIZE) != 0)
            continue;
        n++;
    }
    int opens = 0, errors = 0, closes = 0;
    void *first = NULL;
    for (int i = 0; i < n; i++) {
        ptrs[i] = NULL;
        rcs[i] = (int)cudaIpcOpenMemHandle(&ptrs[i], handles[i], cudaIpcMemLazyEnablePeerAccess);
        if (rcs[i] == 0) {
            opens++;
            if (!first)
                first = ptrs[i];
        } else {
            errors++;
        }
    }
    for (int i = 0; i < n; i++) {
        if (rcs[i] != 0) {
            printf("open i=%d rc=%d\n", i, rcs[i]);
            continue;
        }
        unsigned char data[16];
        CHECK(cudaMemcpy(data, ptrs[i], sizeof(data), cudaMemcpyDeviceToHost));
        printf("open i=%d rc=0 delta=%lld data=", i, (long long)((char *)ptrs[i] - (char *)first));
        print_hex(data, sizeof(data));
        printf("\n");
    }
    if (hold) {
        printf("holding\n");
        fflush(stdout);
        wait_line();
        for (int i = 0; i < n; i++) {
            if (rcs[i] != 0)
                continue;
            unsigned char data[16];
            CHECK(cudaMemcpy(data, ptrs[i], sizeof(data), cudaMemcpyDeviceToHost));
            printf("after i=%d data=", i);
            print_hex(data, sizeof(data));
            printf("\n");
        }
    }
    for (int i = 0; i < n; i++) {
        if (rcs[i] != 0)
            continue;
        CHECK(cudaIpcCloseMemHandle(ptrs[i]));
        closes++;
    }
    if (first)
        EXPECT(cudaIpcCloseMemHandle(first), cudaErrorInvalidValue);
    void *own = NULL;
    CHECK(cudaMalloc(&own, 4096));
    EXPECT(cudaIpcCloseMemHandle(own), cudaErrorInvalidValue);
    CHECK(cudaFree(own));
    printf("result: ok opens=%d errors=%d closes=%d allocs=1 frees=1 leaked_bytes=0\n", opens, errors, closes);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "export") == 0)
        return do_export(atoi(argv[2]));
    if (argc >= 2 && strcmp(argv[1], "import") == 0)
        return do_import(argc >= 3 && strcmp(argv[2], "hold") == 0);
    printf("result: FAIL usage: prog_ipc export N | prog_ipc import [hold]\n");
    return 2;
}
