/* Test-local program of tests/tools.rs (`tools_blocks`), run in pool mode:
 * a = 1000 bytes, b = 3000 bytes (both in one small segment), c = 5 MiB (a
 * large segment of its own), d = 777 bytes, never freed; then a is freed and
 * e = 1000 bytes takes its place; b, c and e are freed. Prints the addresses
 * (a=, b=, c=, d=, e=, decimal) and ends with `result: ok`. */
#include <stdint.h>

#include "fake_cudart_api.h"
#include "check.h"

int main(void)
{
    void *a, *b, *c, *d, *e;
    CHECK(cudaMalloc(&a, 1000));
    CHECK(cudaMalloc(&b, 3000));
    CHECK(cudaMalloc(&c, 5u << 20));
    CHECK(cudaMalloc(&d, 777));
    CHECK(cudaFree(a));
    CHECK(cudaMalloc(&e, 1000));
    CHECK(cudaFree(b));
    CHECK(cudaFree(c));
    CHECK(cudaFree(e));
    printf("a=%lu\nb=%lu\nc=%lu\nd=%lu\ne=%lu\n", (unsigned long)(uintptr_t)a, (unsigned long)(uintptr_t)b,
           (unsigned long)(uintptr_t)c, (unsigned long)(uintptr_t)d, (unsigned long)(uintptr_t)e);
    printf("result: ok\n");
    return 0;
}
