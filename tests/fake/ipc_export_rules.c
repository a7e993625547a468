/* Test-local program of tests/pool.rs (`ipc_export_rules`): which pooled
 * blocks stay out of reuse after an IPC export, in one process. Two 1 MiB
 * blocks a and b (one pool segment under cupool); b is freed, then exported:
 * freed_export= is the result (CUDA refuses freed memory), and a new 1 MiB
 * block c takes b's place (b_reused=1: a failed export keeps nothing back).
 * Then a is exported (a_export=0) and freed, and a new block d must not take
 * a's place (a_kept=1: a receiver may still read it). Kept, a still answers
 * as freed memory to the program: an export and a range query of it fail
 * (a_freed_export, a_freed_range: CUDA's error codes, not 0), and the
 * refusal is the thread's last error (a_freed_export_last), as CUDA's. */
#include <stdint.h>

#include "fake_cuda_api.h"
#include "fake_cudart_api.h"
#include "check.h"

int main(void)
{
    void *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    cudaIpcMemHandle_t h;
    CHECK(cudaMalloc(&a, 1u << 20));
    CHECK(cudaMalloc(&b, 1u << 20));
    CHECK(cudaFree(b));
    printf("freed_export=%d\n", cudaIpcGetMemHandle(&h, b));
    CHECK(cudaMalloc(&c, 1u << 20));
    printf("b_reused=%d\n", c == b);
    printf("a_export=%d\n", cudaIpcGetMemHandle(&h, a));
    CHECK(cudaFree(a));
    CHECK(cudaMalloc(&d, 1u << 20));
    printf("a_kept=%d\n", d != a);
    CUdeviceptr base;
    size_t size;
    cudaGetLastError();
    printf("a_freed_export=%d\n", cudaIpcGetMemHandle(&h, a));
    printf("a_freed_export_last=%d\n", cudaGetLastError());
    printf("a_freed_range=%d\n", cuMemGetAddressRange_v2(&base, &size, (CUdeviceptr)(uintptr_t)a));
    CHECK(cudaFree(c));
    CHECK(cudaFree(d));
    printf("result: ok\n");
    return 0;
}
