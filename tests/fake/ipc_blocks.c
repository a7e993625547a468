/* CUDA IPC of two blocks that a pool puts in one segment, between two
 * processes driven over pipes by scripts/gpu/ipc_check.py (the GPU check, and
 * tests/pool.rs with the fakes). Plain C against the real CUDA headers
 * (`nvcc -cudart shared ipc_blocks.c -lcuda`) or the fakes (-DFAKE_CUDA).
 *   ipc_blocks export   allocates a (0xAA) and b (0xBB), 1 MiB each, prints
 *                       "H <name> <rc> <128 hex digits>" for a, b, b through
 *                       the driver API (b_driver) and b + 4096 (b_interior),
 *                       then "distance_b_a N"; on a line "free" frees both,
 *                       fills two new 1 MiB blocks with 0xCC, prints "freed";
 *                       on "exit" (or EOF) exits.
 *   ipc_blocks import   opens every handle line read (until "END"), prints
 *                       "open <name> rc=N byte=XX", then "opened"; on
 *                       "recheck" prints "recheck <name> byte=XX" for each,
 *                       closes them all and prints "closed K/N" (with
 *                       IPC_CLOSE_IN_CAPTURE set, during a relaxed capture,
 *                       then "capture_end N" and whether the first
 *                       block's range is "gone" or "still" mapped). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef FAKE_CUDA
#include "fake_cuda_api.h"
#include "fake_cudart_api.h"
#else
#include <cuda.h>
#include <cuda_runtime.h>
#endif

#define MIB (1u << 20)

static void hex(const void *p, char *out)
{
    for (int i = 0; i < 64; i++)
        sprintf(out + 2 * i, "%02x", ((const unsigned char *)p)[i]);
}

static int unhex(const char *s, void *out)
{
    for (int i = 0; i < 64; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1)
            return 0;
        ((unsigned char *)out)[i] = (unsigned char)v;
    }
    return 1;
}

static void wait_for(const char *word)
{
    char line[256];
    while (fgets(line, sizeof line, stdin))
        if (strncmp(line, word, strlen(word)) == 0)
            return;
}

static void print_handle(const char *name, int rc, const void *h)
{
    char text[129];
    hex(h, text);
    printf("H %s %d %s\n", name, rc, text);
}

static int do_export(void)
{
    void *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    cudaMalloc(&a, MIB);
    cudaMalloc(&b, MIB);
    cudaMemset(a, 0xAA, MIB);
    cudaMemset(b, 0xBB, MIB);
    cudaDeviceSynchronize();
    cudaIpcMemHandle_t h;
    CUipcMemHandle dh;
    int r = cudaIpcGetMemHandle(&h, a);
    print_handle("a", r, &h);
    r = cudaIpcGetMemHandle(&h, b);
    print_handle("b", r, &h);
    r = cuIpcGetMemHandle(&dh, (CUdeviceptr)(size_t)b);
    print_handle("b_driver", r, &dh);
    r = cudaIpcGetMemHandle(&h, (char *)b + 4096);
    print_handle("b_interior", r, &h);
    printf("distance_b_a %lld\n", (long long)((char *)b - (char *)a));
    fflush(stdout);
    wait_for("free");
    cudaFree(a);
    cudaFree(b);
    cudaMalloc(&c, MIB);
    cudaMalloc(&d, MIB);
    cudaMemset(c, 0xCC, MIB);
    cudaMemset(d, 0xCC, MIB);
    cudaDeviceSynchronize();
    printf("freed\n");
    fflush(stdout);
    wait_for("exit");
    cudaFree(c);
    cudaFree(d);
    return 0;
}

static int do_import(void)
{
    char names[8][64];
    void *ptrs[8];
    int n = 0;
    char line[512];
    while (n < 8 && fgets(line, sizeof line, stdin) && strncmp(line, "END", 3) != 0) {
        char name[64], text[200];
        int er;
        cudaIpcMemHandle_t handle;
        if (sscanf(line, "H %63s %d %199s", name, &er, text) != 3 || !unhex(text, &handle))
            continue;
        void *p = NULL;
        int r = cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess);
        unsigned char first = 0;
        if (r == 0) {
            cudaMemcpy(&first, p, 1, cudaMemcpyDeviceToHost);
            strcpy(names[n], name);
            ptrs[n++] = p;
        } else {
            cudaGetLastError();
        }
        printf("open %s rc=%d byte=%02x\n", name, r, first);
    }
    printf("opened\n");
    fflush(stdout);
    wait_for("recheck");
    for (int i = 0; i < n; i++) {
        unsigned char first = 0;
        cudaMemcpy(&first, ptrs[i], 1, cudaMemcpyDeviceToHost);
        printf("recheck %s byte=%02x\n", names[i], first);
    }
    /* IPC_CLOSE_IN_CAPTURE: the closes happen during a relaxed stream
     * capture of this thread's, which they must leave whole. */
    cudaStream_t s = NULL;
    if (getenv("IPC_CLOSE_IN_CAPTURE")) {
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
    }
    int closes = 0;
    for (int i = 0; i < n; i++)
        closes += cudaIpcCloseMemHandle(ptrs[i]) == 0;
    printf("closed %d/%d\n", closes, n);
    if (s) {
        cudaGraph_t g;
        printf("capture_end %d\n", (int)cudaStreamEndCapture(s, &g));
        cudaStreamDestroy(s);
        /* Closed is closed once the capture is over: the range is gone. */
        CUdeviceptr base;
        size_t size;
        if (n > 0)
            printf("range_after_close %s\n",
                   cuMemGetAddressRange_v2(&base, &size, (CUdeviceptr)(size_t)ptrs[0]) ? "gone" : "still");
    }
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "export") == 0)
        return do_export();
    if (argc > 1 && strcmp(argv[1], "import") == 0)
        return do_import();
    fprintf(stderr, "usage: ipc_blocks export|import\n");
    return 2;
}
