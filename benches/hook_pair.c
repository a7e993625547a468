/* Hook overhead on the CPU: cudaMalloc+cudaFree pairs through the fake
 * runtime, with and without libcupool.so preloaded (scripts/hook-bench.sh).
 * `hook_pair N driver` makes the pairs with cuMemAlloc_v2+cuMemFree_v2
 * instead, the calls a static runtime's cudaMalloc reaches cupool by.
 * `hook_pair N busy` keeps six running values live across the calls, in
 * the callee-saved registers (rbp among them), as an optimised loop keeps
 * its counters and pointers: the hooks' prologues save them on the stack,
 * where an allocation site's walk reads them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
int cudaMalloc(void** p, size_t n);
int cudaFree(void* p);
#ifdef __cplusplus
extern "C" {
#endif
int cuMemAlloc_v2(unsigned long long* p, size_t n);
int cuMemFree_v2(unsigned long long p);
#ifdef __cplusplus
}
#endif
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
int main(int argc, char** argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    int driver = argc > 2 && strcmp(argv[2], "driver") == 0;
    int busy = argc > 2 && strcmp(argv[2], "busy") == 0;
    unsigned long a = 1, b = 2, c = 3, e = 5, f = 7, g = 11;
    void* p;
    unsigned long long d;
    long failed = 0;
    cudaFree(0);
    double best = 1e30;
    for (int round = 0; round < 5; round++) {
        double t0 = now();
        if (busy) {
            for (long i = 0; i < n; i++) {
                a += i; b ^= a << 1; c += b >> 3; e ^= c * 5; f += e | 1; g ^= f >> 2;
                failed += cudaMalloc(&p, 4096) != 0;
                failed += cudaFree(p) != 0;
            }
        } else if (driver) {
            for (long i = 0; i < n; i++) { failed += cuMemAlloc_v2(&d, 4096) != 0; failed += cuMemFree_v2(d) != 0; }
        } else {
            for (long i = 0; i < n; i++) { failed += cudaMalloc(&p, 4096) != 0; failed += cudaFree(p) != 0; }
        }
        double ns = (now() - t0) / n;
        if (ns < best) best = ns;
    }
    /* A bench that times refusals measures the wrong path: say so, print no figure. */
    if (failed) { fprintf(stderr, "hook_pair: %ld calls failed\n", failed); return 1; }
    if ((a ^ b ^ c ^ e ^ f ^ g) == 42) fprintf(stderr, "hook_pair: unlikely\n"); /* keeps them live */
    printf("pair_ns=%.1f\n", best);
    return 0;
}
