// NCCL on pooled memory, one process driving two GPUs: all-reduces between
// buffers that share pool segments, registered with ncclCommRegister (user
// buffer registration) and freed and allocated again between rounds so that
// registrations meet reused blocks. Run by scripts/gpu-multi.sh plainly and
// under cupool, with NCCL_CUMEM_ENABLE=0 and 1; the result lines must be equal.
#include <cuda_runtime.h>
#include <nccl.h>
#include <cstdio>
#include <vector>

#define CK(x)                                                                 \
    do {                                                                      \
        cudaError_t e_ = (x);                                                 \
        if (e_ != cudaSuccess) {                                              \
            printf("result: error %s: %s\n", #x, cudaGetErrorString(e_));     \
            return 1;                                                         \
        }                                                                     \
    } while (0)
#define NK(x)                                                                 \
    do {                                                                      \
        ncclResult_t r_ = (x);                                                \
        if (r_ != ncclSuccess) {                                              \
            printf("result: error %s: %s\n", #x, ncclGetErrorString(r_));     \
            return 1;                                                         \
        }                                                                     \
    } while (0)

__global__ void fill(float *p, size_t n, float v) {
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = v + (i % 7);
}

int main() {
    int count = 0;
    CK(cudaGetDeviceCount(&count));
    if (count < 2) {
        printf("result: skipped, %d device(s)\n", count);
        return 0;
    }
    const int ndev = 2;
    int devs[ndev] = {0, 1};
    ncclComm_t comms[ndev];
    NK(ncclCommInitAll(comms, ndev, devs));
    cudaStream_t streams[ndev];
    for (int d = 0; d < ndev; d++) {
        CK(cudaSetDevice(d));
        CK(cudaStreamCreate(&streams[d]));
    }
    // Sizes from 4 KiB to 24 MiB: small ones share a segment with others.
    const size_t sizes[] = {1024, 65536, 262144, 1 << 20, 6 << 20};
    int wrong = 0, rounds = 0, registered = 0;
    for (int round = 0; round < 10; round++) {
        for (size_t n : sizes) {
            float *send[ndev], *recv[ndev];
            void *handles[2 * ndev] = {};
            bool reg = round % 2 == 0;  // every other round registers its buffers
            for (int d = 0; d < ndev; d++) {
                CK(cudaSetDevice(d));
                CK(cudaMalloc(&send[d], n * sizeof(float)));
                CK(cudaMalloc(&recv[d], n * sizeof(float)));
                fill<<<64, 256, 0, streams[d]>>>(send[d], n, (float)(d + 1 + round));
                if (reg) {
                    NK(ncclCommRegister(comms[d], send[d], n * sizeof(float), &handles[2 * d]));
                    NK(ncclCommRegister(comms[d], recv[d], n * sizeof(float), &handles[2 * d + 1]));
                    registered += 2;
                }
            }
            NK(ncclGroupStart());
            for (int d = 0; d < ndev; d++)
                NK(ncclAllReduce(send[d], recv[d], n, ncclFloat, ncclSum, comms[d], streams[d]));
            NK(ncclGroupEnd());
            for (int d = 0; d < ndev; d++) {
                CK(cudaSetDevice(d));
                CK(cudaStreamSynchronize(streams[d]));
                std::vector<float> host(n);
                CK(cudaMemcpy(host.data(), recv[d], n * sizeof(float), cudaMemcpyDeviceToHost));
                for (size_t i = 0; i < n; i++) {
                    float want = 2.0f * (i % 7) + (1 + round) + (2 + round);
                    if (host[i] != want) {
                        wrong++;
                        break;
                    }
                }
                if (reg) {
                    NK(ncclCommDeregister(comms[d], handles[2 * d]));
                    NK(ncclCommDeregister(comms[d], handles[2 * d + 1]));
                }
                CK(cudaFree(send[d]));
                CK(cudaFree(recv[d]));
            }
            rounds++;
        }
    }
    for (int d = 0; d < ndev; d++) {
        CK(cudaSetDevice(d));
        CK(cudaStreamDestroy(streams[d]));
        ncclCommDestroy(comms[d]);
    }
    printf("result: %s allreduces=%d registered=%d wrong=%d\n", wrong ? "FAIL" : "PASS", rounds, registered, wrong);
    return wrong ? 1 : 0;
}
