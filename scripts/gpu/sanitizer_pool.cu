// What compute-sanitizer must still find when cupool's pool serves cudaMalloc
// (run by scripts/gpu-sanitizer.sh, plainly and under the pool). Usage:
//   sanitizer_pool oob    a = 1000 floats, then b right after it in the same
//                         segment; a kernel writes a[1000], one element past a
//                         (inside a's 512-byte rounding, not at the segment's
//                         end); both freed
//   sanitizer_pool leak   12345 bytes never freed; every other block (a 3 MiB
//                         one in a segment of its own too) freed
//   sanitizer_pool clean  everything freed, every access in bounds
// Prints what it did (and NVTX_INJECTION64_PATH, to show which tool is attached).
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("FAIL %s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

// Threads 0..n-1 stay in bounds; a launch of n+1 threads writes one past.
__global__ void fill(float* p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) p[i] = (float)i;
}

int main(int argc, char** argv) {
    const char* mode = argc > 1 ? argv[1] : "clean";
    const char* tool = getenv("NVTX_INJECTION64_PATH");
    printf("mode=%s nvtx_injection=%s\n", mode, tool ? tool : "(unset)");
    const int n = 1000;
    float *a, *b;
    CHECK(cudaMalloc(&a, n * sizeof(float)));
    CHECK(cudaMalloc(&b, n * sizeof(float)));
    printf("b_minus_a=%lld\n", (long long)((char*)b - (char*)a));
    if (strcmp(mode, "oob") == 0) {
        fill<<<1, n + 1>>>(a, n);
        printf("oob kernel -> %s\n", cudaGetErrorString(cudaDeviceSynchronize()));
        cudaGetLastError();
        CHECK(cudaFree(a));
        CHECK(cudaFree(b));
    } else if (strcmp(mode, "leak") == 0) {
        void *leaked, *large;
        CHECK(cudaMalloc(&leaked, 12345));
        CHECK(cudaMalloc(&large, 3 << 20));
        fill<<<1, n>>>(a, n - 1);
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaFree(large));
        CHECK(cudaFree(a));
        CHECK(cudaFree(b));
        printf("leaked=12345\n");
    } else {
        void* large;
        CHECK(cudaMalloc(&large, 3 << 20));
        fill<<<1, n>>>(a, n - 1);
        fill<<<1, n>>>(b, n - 1);
        fill<<<1024, 768>>>((float*)large, (3 << 20) / sizeof(float) - 1);
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaFree(a));
        CHECK(cudaFree(b));
        CHECK(cudaFree(large));
        // A block reused after its free is a new region, and freed again.
        CHECK(cudaMalloc(&a, 100));
        CHECK(cudaFree(a));
    }
    printf("done\n");
    return 0;
}
