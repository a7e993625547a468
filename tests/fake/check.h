/* The checks every fake test program repeats. A failed check prints
 * "result: FAIL <what>" (the line the Rust tests look for, see
 * `result_line` in tests/support/mod.rs) and returns 1 from the enclosing
 * function: main, or a helper whose result main returns.
 *
 *   FAIL(fmt, ...)      fail with a message
 *   CHECK(call)         `call`, a driver or runtime call, must return 0 (success)
 *   EXPECT(call, want)  `call` must return `want`
 *
 * A program may name failed codes by defining CHECK_ERROR_NAME(code) (e.g. as
 * cudaGetErrorString) before it includes this header.
 *
 * Programs that include fake_cuda_api.h first also get holds_data(). */
#ifndef CHECK_H
#define CHECK_H

#include <stdio.h>
#include <string.h>

#define FAIL(...)                                                                                                      \
    do {                                                                                                               \
        printf("result: FAIL ");                                                                                       \
        printf(__VA_ARGS__);                                                                                           \
        printf("\n");                                                                                                  \
        fflush(stdout);                                                                                                \
        return 1;                                                                                                      \
    } while (0)

#ifdef CHECK_ERROR_NAME
#define CHECK_FAILED_(what, r) FAIL("%s -> %d (%s) at line %d", what, r, CHECK_ERROR_NAME(r), __LINE__)
#else
#define CHECK_FAILED_(what, r) FAIL("%s -> %d at line %d", what, r, __LINE__)
#endif

#define CHECK(call)                                                                                                    \
    do {                                                                                                               \
        int r_ = (int)(call);                                                                                          \
        if (r_ != 0)                                                                                                   \
            CHECK_FAILED_(#call, r_);                                                                                  \
    } while (0)

#define EXPECT(call, want)                                                                                             \
    do {                                                                                                               \
        int r_ = (int)(call);                                                                                          \
        if (r_ != (int)(want))                                                                                         \
            FAIL("%s -> %d, expected %d, at line %d", #call, r_, (int)(want), __LINE__);                               \
    } while (0)

#ifdef FAKE_CUDA_API_H
/* Whether the n bytes at p hold data: writes a pattern (varied by seed) into
 * the last 64 of them through the driver and reads it back. The fake driver
 * refuses copies outside live driver memory, so a block whose segment went
 * back to the driver answers 0 instead of crashing the program. */
static inline int holds_data(CUdeviceptr p, size_t n, unsigned char seed)
{
    unsigned char out[64], in[64];
    size_t len = n < sizeof(out) ? n : sizeof(out);
    for (size_t i = 0; i < len; i++)
        out[i] = (unsigned char)(i * 13 + seed);
    return cuMemcpyHtoD_v2(p + n - len, out, len) == 0 && cuMemcpyDtoH_v2(in, p + n - len, len) == 0 &&
           memcmp(in, out, len) == 0;
}
#endif

#endif
