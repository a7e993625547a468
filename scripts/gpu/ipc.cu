// CUDA IPC between two processes, driven by ipc_check.py over pipes.
//   ipc export   two 1 MiB blocks a (0xAA) and b (0xBB) that a pool puts in one
//                segment; prints their handles (runtime API; b also through the
//                driver API and through an interior pointer), then on "free"
//                frees both and fills two new 1 MiB blocks with 0xCC, on "exit" exits.
//   ipc import   opens every handle read from stdin (until END), prints the first
//                byte it sees, and on "recheck" prints it again, then closes.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

static std::string hex(const void* p, size_t n) {
    std::string s;
    char b[3];
    for (size_t i = 0; i < n; i++) { snprintf(b, 3, "%02x", ((const unsigned char*)p)[i]); s += b; }
    return s;
}

static bool unhex(const char* s, void* out, size_t n) {
    if (strlen(s) < 2 * n) return false;
    for (size_t i = 0; i < n; i++) { unsigned v; if (sscanf(s + 2 * i, "%2x", &v) != 1) return false; ((unsigned char*)out)[i] = v; }
    return true;
}

static void wait_for(const char* word) {
    char line[256];
    while (fgets(line, sizeof line, stdin)) if (strncmp(line, word, strlen(word)) == 0) return;
}

static int do_export() {
    void *a, *b;
    cudaMalloc(&a, 1 << 20);
    cudaMalloc(&b, 1 << 20);
    cudaMemset(a, 0xAA, 1 << 20);
    cudaMemset(b, 0xBB, 1 << 20);
    cudaDeviceSynchronize();
    cudaIpcMemHandle_t h;
    int r = cudaIpcGetMemHandle(&h, a);
    printf("H a %d %s\n", r, hex(&h, 64).c_str());
    r = cudaIpcGetMemHandle(&h, b);
    printf("H b %d %s\n", r, hex(&h, 64).c_str());
    CUipcMemHandle dh;
    r = cuIpcGetMemHandle(&dh, (CUdeviceptr)b);
    printf("H b_driver %d %s\n", r, hex(&dh, 64).c_str());
    r = cudaIpcGetMemHandle(&h, (char*)b + 4096);
    printf("H b_interior %d %s\n", r, hex(&h, 64).c_str());
    printf("distance_b_a %lld\n", (long long)((char*)b - (char*)a));
    fflush(stdout);
    wait_for("free");
    cudaFree(a);
    cudaFree(b);
    void *c, *d;
    cudaMalloc(&c, 1 << 20);
    cudaMalloc(&d, 1 << 20);
    cudaMemset(c, 0xCC, 1 << 20);
    cudaMemset(d, 0xCC, 1 << 20);
    cudaDeviceSynchronize();
    printf("freed\n");
    fflush(stdout);
    wait_for("exit");
    return 0;
}

static int do_import() {
    std::vector<std::pair<std::string, void*>> opened;
    char line[512];
    while (fgets(line, sizeof line, stdin) && strncmp(line, "END", 3) != 0) {
        char name[64], h[200];
        int er;
        if (sscanf(line, "H %63s %d %199s", name, &er, h) != 3) continue;
        cudaIpcMemHandle_t handle;
        unhex(h, &handle, 64);
        void* p = nullptr;
        int r = cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess);
        unsigned char first = 0;
        if (r == 0) { cudaMemcpy(&first, p, 1, cudaMemcpyDeviceToHost); opened.push_back({name, p}); }
        else cudaGetLastError();
        printf("open %s rc=%d byte=%02x\n", name, r, first);
    }
    printf("opened\n");
    fflush(stdout);
    wait_for("recheck");
    for (auto& o : opened) {
        unsigned char first = 0;
        cudaMemcpy(&first, o.second, 1, cudaMemcpyDeviceToHost);
        printf("recheck %s byte=%02x\n", o.first.c_str(), first);
    }
    int closes = 0;
    for (auto& o : opened) closes += cudaIpcCloseMemHandle(o.second) == 0;
    printf("closed %d/%zu\n", closes, opened.size());
    fflush(stdout);
    return 0;
}

int main(int argc, char** argv) {
    if (argc > 1 && strcmp(argv[1], "export") == 0) return do_export();
    if (argc > 1 && strcmp(argv[1], "import") == 0) return do_import();
    fprintf(stderr, "usage: ipc export|import\n");
    return 2;
}
