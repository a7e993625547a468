/*
 * Fake CUDA runtime (soname libcudart.so.13), also usable as an object file
 * compiled straight into a program, like nvcc's default static cudart.
 *
 * It reaches the driver exactly the way the real runtime does since CUDA
 * 11.3: dlopen("libcuda.so.1"), dlsym(handle, "cuGetProcAddress_v2"), then one
 * cuGetProcAddress_v2 call per entry point, by base name, for CUDA 13.0.  It
 * has no DT_NEEDED on libcuda and calls no driver function by symbol, so an
 * LD_PRELOAD shim only sees these calls if it intercepts dlsym and
 * cuGetProcAddress.
 *
 * Shared: cc -shared -fPIC -fvisibility=hidden -Wl,-soname,libcudart.so.13
 *         -o libcudart.so.13 fake_cudart.c -ldl -pthread
 * Static: cc -o prog prog.c fake_cudart.c -ldl -pthread
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

/* Only for the driver's types and for __typeof__ below: no driver function
 * is referenced by symbol. */
#include "fake_cuda_api.h"
#include "fake_cudart_api.h"

#define EXPORT __attribute__((visibility("default")))
#define CUDART_VERSION 13000
#define RT_MAX_DEVICES 16

/* ------------------------------------------------------------------------ */
/* Driver entry points, filled in once by rt_init().                        */

#define DRIVER_FUNCS(X)                                                                                                \
    X(cuInit, "cuInit")                                                                                                \
    X(cuDeviceGetCount, "cuDeviceGetCount")                                                                            \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain")                                                            \
    X(cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset")                                                           \
    X(cuCtxGetCurrent, "cuCtxGetCurrent")                                                                              \
    X(cuCtxSetCurrent, "cuCtxSetCurrent")                                                                              \
    X(cuCtxSynchronize, "cuCtxSynchronize")                                                                            \
    X(cuMemAlloc_v2, "cuMemAlloc")                                                                                     \
    X(cuMemFree_v2, "cuMemFree")                                                                                       \
    X(cuMemAllocAsync, "cuMemAllocAsync")                                                                              \
    X(cuMemFreeAsync, "cuMemFreeAsync")                                                                                \
    X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync")                                                              \
    X(cuMemAllocManaged, "cuMemAllocManaged")                                                                          \
    X(cuMemAllocPitch_v2, "cuMemAllocPitch")                                                                           \
    X(cuMemAllocHost_v2, "cuMemAllocHost")                                                                             \
    X(cuMemHostAlloc, "cuMemHostAlloc")                                                                                \
    X(cuMemFreeHost, "cuMemFreeHost")                                                                                  \
    X(cuMemGetInfo_v2, "cuMemGetInfo")                                                                                 \
    X(cuStreamCreate, "cuStreamCreate")                                                                                \
    X(cuStreamDestroy_v2, "cuStreamDestroy")                                                                       \
    X(cuStreamBeginCapture_v2, "cuStreamBeginCapture")                                                                 \
    X(cuStreamEndCapture, "cuStreamEndCapture")                                                                        \
    X(cuStreamIsCapturing, "cuStreamIsCapturing")                                                                      \
    X(cuIpcGetMemHandle, "cuIpcGetMemHandle")                                                                          \
    X(cuIpcOpenMemHandle_v2, "cuIpcOpenMemHandle")                                                                     \
    X(cuIpcCloseMemHandle, "cuIpcCloseMemHandle")

static struct {
#define DECLARE(fn, name) __typeof__(fn) *fn;
    DRIVER_FUNCS(DECLARE)
#undef DECLARE
    __typeof__(cuGetProcAddress_v2) *getProcAddress;
} drv;

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static cudaError_t g_init_err; /* sticky initialisation failure */
static int g_ndev;

/* One primary context per device, retained on first use. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static CUcontext g_prim[RT_MAX_DEVICES];
static int g_retained[RT_MAX_DEVICES];

static __thread int t_dev;               /* current device of this thread */
static __thread cudaError_t t_last_error; /* for cudaGetLastError */

static cudaError_t map_result(CUresult r)
{
    switch (r) {
    case CUDA_SUCCESS: return cudaSuccess;
    case CUDA_ERROR_INVALID_VALUE: return cudaErrorInvalidValue;
    case CUDA_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
    case CUDA_ERROR_INVALID_CONTEXT: return cudaErrorDeviceUninitialized;
    case CUDA_ERROR_ILLEGAL_STATE: return cudaErrorIllegalState;
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: return cudaErrorStreamCaptureUnsupported;
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: return cudaErrorStreamCaptureInvalidated;
    default: return cudaErrorUnknown;
    }
}

/* Every exported function returns through here so cudaGetLastError works. */
static cudaError_t ret(cudaError_t e)
{
    if (e != cudaSuccess)
        t_last_error = e;
    return e;
}

static void rt_init(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        g_init_err = cudaErrorInsufficientDriver;
        return;
    }
    drv.getProcAddress = (__typeof__(drv.getProcAddress))dlsym(h, "cuGetProcAddress_v2");
    if (!drv.getProcAddress) {
        g_init_err = cudaErrorInsufficientDriver;
        return;
    }
    int status;
#define RESOLVE(fn, name)                                                                                              \
    if (drv.getProcAddress(name, (void **)&drv.fn, CUDART_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &status) !=            \
            CUDA_SUCCESS ||                                                                                            \
        !drv.fn) {                                                                                                     \
        g_init_err = cudaErrorInsufficientDriver;                                                                      \
        return;                                                                                                        \
    }
    DRIVER_FUNCS(RESOLVE)
#undef RESOLVE
    CUresult r = drv.cuInit(0);
    if (r == CUDA_SUCCESS)
        r = drv.cuDeviceGetCount(&g_ndev);
    if (r != CUDA_SUCCESS) {
        g_init_err = map_result(r);
        return;
    }
    if (g_ndev > RT_MAX_DEVICES)
        g_ndev = RT_MAX_DEVICES;
}

static cudaError_t rt_load(void)
{
    pthread_once(&g_once, rt_init);
    return g_init_err;
}

/* Retains the primary context of `dev` (once) and makes it current. */
static cudaError_t bind_device(int dev)
{
    pthread_mutex_lock(&g_lock);
    if (!g_retained[dev]) {
        CUresult r = drv.cuDevicePrimaryCtxRetain(&g_prim[dev], dev);
        if (r != CUDA_SUCCESS) {
            pthread_mutex_unlock(&g_lock);
            return map_result(r);
        }
        g_retained[dev] = 1;
    }
    CUcontext ctx = g_prim[dev];
    pthread_mutex_unlock(&g_lock);
    return map_result(drv.cuCtxSetCurrent(ctx));
}

/* Makes sure the calling thread has a usable context.  Like the real runtime
 * it adopts a context the program made current through the driver API, and
 * otherwise binds the primary context of the thread's current device. */
static cudaError_t rt_ctx(void)
{
    cudaError_t e = rt_load();
    if (e)
        return e;
    CUcontext cur = NULL;
    CUresult r = drv.cuCtxGetCurrent(&cur);
    if (r != CUDA_SUCCESS)
        return map_result(r);
    if (cur) {
        /* A primary context that cudaDeviceReset dropped must be re-retained. */
        int stale = 0;
        pthread_mutex_lock(&g_lock);
        for (int i = 0; i < g_ndev; i++)
            if (g_prim[i] == cur && !g_retained[i])
                stale = 1;
        pthread_mutex_unlock(&g_lock);
        if (!stale)
            return cudaSuccess;
    }
    return bind_device(t_dev);
}

/* ------------------------------------------------------------------------ */
/* Device memory                                                            */

EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    if (!devPtr)
        return ret(cudaErrorInvalidValue);
    cudaError_t e = rt_ctx();
    if (e)
        return ret(e);
    if (size == 0) {
        *devPtr = NULL; /* the real runtime succeeds without allocating */
        return cudaSuccess;
    }
    CUdeviceptr p = 0;
    e = map_result(drv.cuMemAlloc_v2(&p, size));
    if (!e)
        *devPtr = (void *)(uintptr_t)p;
    return ret(e);
}

EXPORT cudaError_t cudaFree(void *devPtr)
{
    /* cudaFree(NULL) is the customary way to initialise the runtime. */
    cudaError_t e = rt_ctx();
    if (e || !devPtr)
        return ret(e);
    return ret(map_result(drv.cuMemFree_v2((CUdeviceptr)(uintptr_t)devPtr)));
}

EXPORT cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream)
{
    if (!devPtr)
        return ret(cudaErrorInvalidValue);
    cudaError_t e = rt_ctx();
    if (e)
        return ret(e);
    CUdeviceptr p = 0;
    e = map_result(drv.cuMemAllocAsync(&p, size, stream));
    if (!e)
        *devPtr = (void *)(uintptr_t)p;
    return ret(e);
}

EXPORT cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t stream)
{
    cudaError_t e = rt_ctx();
    if (e)
        return ret(e);
    return ret(map_result(drv.cuMemFreeAsync((CUdeviceptr)(uintptr_t)devPtr, stream)));
}

EXPORT cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream)
{
    if (!ptr)
        return ret(cudaErrorInvalidValue);
    cudaError_t e = rt_ctx();
    if (e)
        return ret(e);
    CUdeviceptr p = 0;
    e = map_result(drv.cuMemAllocFromPoolAsync(&p, size, memPool, stream));
    if (!e)
        *ptr = (void *)(uintptr_t)p;
    return ret(e);
}

EXPORT cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
    if (!devPtr)
        return ret(cudaErrorInvalidValue);
    cudaError_t e = rt_ctx();
    if (e)
        return ret(e);
    CUdeviceptr p = 0;
    e = map_result(drv.cuMemAllocManaged(&p, size, flags));
    if (!e)
        *devPtr = (void *)(uintptr_t)p;
    return ret(e);
}

/* Element size handed to cuMemAllocPitch_v2 (the runtime picks one itself). */
#define RT_PITCH_ELEMENT 16

EXPORT cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height)
{
    if (!devPtr || !pitch)
        return ret(cudaErrorInvalidValue);
    cudaError_t e = rt_ctx();
    if (e)
        return ret(e);
    CUdeviceptr p = 0;
    e = map_result(drv.cuMemAllocPitch_v2(&p, pitch, width, height, RT_PITCH_ELEMENT));
    if (!e)
        *devPtr = (void *)(uintptr_t)p;
    return ret(e);
}

EXPORT cudaError_t cudaMalloc3D(struct cudaPitchedPtr *pitchedDevPtr, struct cudaExtent extent)
{
    if (!pitchedDevPtr)
        return ret(cudaErrorInvalidValue);
    cudaError_t e = rt_ctx();
    if (e)
        return ret(e);
    if (extent.height && extent.depth > SIZE_MAX / extent.height)
        return ret(cudaErrorMemoryAllocation);
    /* One pitched allocation with height*depth rows. */
    CUdeviceptr p = 0;
    size_t pitch = 0;
    e = map_result(
        drv.cuMemAllocPitch_v2(&p, &pitch, extent.width, extent.height * extent.depth, RT_PITCH_ELEMENT));
    if (!e)
        *pitchedDevPtr = (struct cudaPitchedPtr){(void *)(uintptr_t)p, pitch, extent.width, extent.height};
    return ret(e);
}

/* ------------------------------------------------------------------------ */
/* Pinned host memory                                                       */

EXPORT cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    if (!ptr)
        return ret(cudaErrorInvalidValue);
    cudaError_t e = rt_ctx();
    if (e)
        return ret(e);
    if (size == 0) {
        *ptr = NULL;
        return cudaSuccess;
    }
    return ret(map_result(drv.cuMemAllocHost_v2(ptr, size)));
}

EXPORT cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
    if (!pHost)
        return ret(cudaErrorInvalidValue);
    cudaError_t e = rt_ctx();
    if (e)
        return ret(e);
    if (size == 0) {
        *pHost = NULL;
        return cudaSuccess;
    }
    return ret(map_result(drv.cuMemHostAlloc(pHost, size, flags)));
}

EXPORT cudaError_t cudaFreeHost(void *ptr)
{
    cudaError_t e = rt_ctx();
    if (e || !ptr)
        return ret(e);
    return ret(map_result(drv.cuMemFreeHost(ptr)));
}

/* ------------------------------------------------------------------------ */
/* Devices                                                                  */

EXPORT cudaError_t cudaMemGetInfo(size_t *free, size_t *total)
{
    cudaError_t e = rt_ctx();
    if (e)
        return ret(e);
    return ret(map_result(drv.cuMemGetInfo_v2(free, total)));
}

EXPORT cudaError_t cudaDeviceReset(void)
{
    cudaError_t e = rt_load();
    if (e)
        return ret(e);
    int dev = t_dev;
    pthread_mutex_lock(&g_lock);
    CUresult r = drv.cuDevicePrimaryCtxReset_v2(dev);
    /* The next runtime call on this device retains the context again. */
    g_retained[dev] = 0;
    pthread_mutex_unlock(&g_lock);
    return ret(map_result(r));
}

EXPORT cudaError_t cudaGetDevice(int *device)
{
    if (!device)
        return ret(cudaErrorInvalidValue);
    cudaError_t e = rt_load();
    if (e)
        return ret(e);
    *device = t_dev;
    return cudaSuccess;
}

EXPORT cudaError_t cudaSetDevice(int device)
{
    cudaError_t e = rt_load();
    if (e)
        return ret(e);
    if (device < 0 || device >= g_ndev)
        return ret(cudaErrorInvalidDevice);
    t_dev = device;
    return ret(bind_device(device));
}

EXPORT cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count)
        return ret(cudaErrorInvalidValue);
    cudaError_t e = rt_load();
    if (e)
        return ret(e);
    *count = g_ndev;
    return cudaSuccess;
}

EXPORT cudaError_t cudaDeviceSynchronize(void)
{
    cudaError_t e = rt_ctx();
    if (e)
        return ret(e);
    return ret(map_result(drv.cuCtxSynchronize()));
}

/* ------------------------------------------------------------------------ */
/* Streams, copies                                                          */

EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
    if (!pStream)
        return ret(cudaErrorInvalidValue);
    cudaError_t e = rt_ctx();
    if (e)
        return ret(e);
    return ret(map_result(drv.cuStreamCreate(pStream, flags)));
}

EXPORT cudaError_t cudaStreamCreate(cudaStream_t *pStream)
{
    if (!pStream)
        return ret(cudaErrorInvalidValue);
    cudaError_t e = rt_ctx();
    if (e)
        return ret(e);
    return ret(map_result(drv.cuStreamCreate(pStream, 0)));
}

/* Like the real runtime, launches reach the driver through no entry point a
 * shim sees; the fake checks the stream and runs nothing. */
static cudaError_t launch(const void *func, cudaStream_t stream)
{
    cudaError_t e = rt_ctx();
    if (e)
        return ret(e);
    if (!func)
        return ret(cudaErrorInvalidValue);
    int capturing;
    return ret(map_result(drv.cuStreamIsCapturing(stream, &capturing)));
}

EXPORT cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shared,
                                    cudaStream_t stream)
{
    (void)grid, (void)block, (void)args, (void)shared;
    return launch(func, stream);
}

EXPORT cudaError_t cudaLaunchKernel_ptsz(const void *func, dim3 grid, dim3 block, void **args, size_t shared,
                                         cudaStream_t stream)
{
    (void)grid, (void)block, (void)args, (void)shared;
    return launch(func, stream);
}

EXPORT cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args)
{
    (void)args;
    return config ? launch(func, config->stream) : ret(cudaErrorInvalidValue);
}

EXPORT cudaError_t cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t *config, const void *func, void **args)
{
    (void)args;
    return config ? launch(func, config->stream) : ret(cudaErrorInvalidValue);
}

EXPORT cudaError_t cudaLaunchCooperativeKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shared,
                                               cudaStream_t stream)
{
    (void)grid, (void)block, (void)args, (void)shared;
    return launch(func, stream);
}

EXPORT cudaError_t cudaLaunchCooperativeKernel_ptsz(const void *func, dim3 grid, dim3 block, void **args,
                                                    size_t shared, cudaStream_t stream)
{
    (void)grid, (void)block, (void)args, (void)shared;
    return launch(func, stream);
}

/* The runtime's capture calls reach the driver through the entry points it
 * looked up, as the real runtime's do. */
EXPORT cudaError_t cudaStreamBeginCapture(cudaStream_t stream, int mode)
{
    cudaError_t e = rt_ctx();
    if (e)
        return ret(e);
    return ret(map_result(drv.cuStreamBeginCapture_v2(stream, mode)));
}

EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph)
{
    cudaError_t e = rt_ctx();
    if (e)
        return ret(e);
    return ret(map_result(drv.cuStreamEndCapture(stream, pGraph)));
}

EXPORT cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    cudaError_t e = rt_ctx();
    if (e)
        return ret(e);
    return ret(map_result(drv.cuStreamDestroy_v2(stream)));
}

/* "Device" memory is host memory, so every copy kind is a host memcpy. */
EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    (void)kind;
    cudaError_t e = rt_ctx();
    if (e)
        return ret(e);
    if (count && (!dst || !src))
        return ret(cudaErrorInvalidValue);
    if (count)
        memmove(dst, src, count);
    return cudaSuccess;
}

EXPORT cudaError_t cudaMemset(void *devPtr, int value, size_t count)
{
    cudaError_t e = rt_ctx();
    if (e)
        return ret(e);
    if (count && !devPtr)
        return ret(cudaErrorInvalidValue);
    if (count)
        memset(devPtr, value, count);
    return cudaSuccess;
}

/* ------------------------------------------------------------------------ */
/* Legacy IPC: the driver's calls (see "Legacy CUDA IPC" in fake_cuda.c).   */

_Static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(CUipcMemHandle), "IPC handles are 64 bytes");

EXPORT cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr)
{
    if (!handle)
        return ret(cudaErrorInvalidValue);
    cudaError_t e = rt_ctx();
    if (e)
        return ret(e);
    CUipcMemHandle h;
    e = map_result(drv.cuIpcGetMemHandle(&h, (CUdeviceptr)(uintptr_t)devPtr));
    if (!e)
        memcpy(handle, &h, sizeof(h));
    return ret(e);
}

EXPORT cudaError_t cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle, unsigned int flags)
{
    if (!devPtr)
        return ret(cudaErrorInvalidValue);
    cudaError_t e = rt_ctx();
    if (e)
        return ret(e);
    CUipcMemHandle h;
    memcpy(&h, &handle, sizeof(h));
    CUdeviceptr p = 0;
    e = map_result(drv.cuIpcOpenMemHandle_v2(&p, h, flags));
    if (!e)
        *devPtr = (void *)(uintptr_t)p;
    return ret(e);
}

EXPORT cudaError_t cudaIpcCloseMemHandle(void *devPtr)
{
    cudaError_t e = rt_ctx();
    if (e)
        return ret(e);
    return ret(map_result(drv.cuIpcCloseMemHandle((CUdeviceptr)(uintptr_t)devPtr)));
}

/* ------------------------------------------------------------------------ */
/* Driver entry points: straight to the cuGetProcAddress_v2 we were given.  */
/* A missing symbol is reported through driverStatus with cudaSuccess.      */

static cudaError_t entry_point(const char *symbol, void **funcPtr, int cudaVersion, unsigned long long flags,
                               int *driverStatus)
{
    if (!symbol || !funcPtr)
        return ret(cudaErrorInvalidValue);
    cudaError_t e = rt_load();
    if (e)
        return ret(e);
    int status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = drv.getProcAddress(symbol, funcPtr, cudaVersion, flags, &status);
    if (driverStatus)
        *driverStatus = status;
    if (r == CUDA_ERROR_NOT_FOUND)
        return cudaSuccess;
    return ret(map_result(r));
}

/* Exported functions never call each other (that would go through the PLT
 * and could be interposed); both use entry_point(). */
EXPORT cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr, unsigned int cudaVersion,
                                                    unsigned long long flags, int *driverStatus)
{
    return entry_point(symbol, funcPtr, (int)cudaVersion, flags, driverStatus);
}

EXPORT cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **funcPtr, unsigned long long flags,
                                           int *driverStatus)
{
    return entry_point(symbol, funcPtr, CUDART_VERSION, flags, driverStatus);
}

/* ------------------------------------------------------------------------ */
/* Errors                                                                   */

EXPORT const char *cudaGetErrorString(cudaError_t error)
{
    switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorDeviceUninitialized: return "invalid device context";
    case cudaErrorUnknown: return "unknown error";
    default: return "unrecognized error code";
    }
}

EXPORT cudaError_t cudaPeekAtLastError(void)
{
    return t_last_error;
}

EXPORT cudaError_t cudaGetLastError(void)
{
    cudaError_t e = t_last_error;
    t_last_error = cudaSuccess;
    return e;
}
