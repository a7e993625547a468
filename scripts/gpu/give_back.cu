// Memory given back stays given back, for a C program: A allocates most of
// the free GPU memory in 1 GiB buffers, cudaFrees them, then runs B (itself
// with an argument), which allocates as much.
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

int main(int argc, char **argv) {
    const size_t gib = size_t(1) << 30;
    if (argc == 3) {  // B
        int n = atoi(argv[2]);
        std::vector<void *> got;
        for (int i = 0; i < n; i++) {
            void *p;
            if (cudaMalloc(&p, gib) != cudaSuccess) return 1;
            got.push_back(p);
        }
        return 0;
    }
    size_t free_bytes, total;
    cudaMemGetInfo(&free_bytes, &total);
    int n = int(free_bytes / gib * 85 / 100);
    std::vector<void *> held(n);
    for (auto &p : held) cudaMalloc(&p, gib);
    for (auto p : held) cudaFree(p);
    std::string b = std::string(argv[0]) + " B " + std::to_string(n);
    int under = system(b.c_str()) == 0;
    int plain = system(("env -u LD_PRELOAD -u CUPOOL_OPTIONS " + b).c_str()) == 0;
    printf("result: c A_allocated_gib=%d B_got_it=%d B_without_cupool_got_it=%d\n", n, under, plain);
    return 0;
}
