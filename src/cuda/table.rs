//! Every real function cupool calls or stands in front of, each declared
//! once: its exact exported name, its library and its C prototype. The table
//! gives a typed, lazily resolved `real::NAME` and the prototype as
//! `sig::NAME`, against which the hook of the same name is checked at
//! compile time (`hooks::entry!`), so a wrapper can never be handed out
//! under an ABI that differs from the function it replaces.

#![allow(non_upper_case_globals, non_camel_case_types)]

use super::*;
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

type Ptr = *mut c_void;
/// A program's `main`, as `__libc_start_main` receives it.
pub type MainFn = unsafe extern "C" fn(c_int, *mut *mut c_char, *mut *mut c_char) -> c_int;

macro_rules! table {
    ($( $lib:ident { $( $name:ident : fn($($arg:ty),* $(,)?) $(-> $ret:ty)? ; )* } )*) => {
        /// The real functions.
        pub mod real {
            use super::*;
            $($(
                pub static $name: Real<sig::$name> = Real::new(
                    match CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                        Ok(c) => c,
                        Err(_) => panic!("symbol names have no NUL"),
                    },
                    Lib::$lib,
                );
            )*)*
        }
        /// Their C prototypes.
        pub mod sig {
            use super::*;
            $($(
                pub type $name = unsafe extern "C" fn($($arg),*) $(-> $ret)?;
            )*)*
        }
    };
}

table! {
    Runtime {
        cudaMalloc: fn(*mut Ptr, usize) -> Status;
        cudaFree: fn(Ptr) -> Status;
        cudaMallocAsync: fn(*mut Ptr, usize, cudaStream_t) -> Status;
        cudaMallocAsync_ptsz: fn(*mut Ptr, usize, cudaStream_t) -> Status;
        cudaFreeAsync: fn(Ptr, cudaStream_t) -> Status;
        cudaFreeAsync_ptsz: fn(Ptr, cudaStream_t) -> Status;
        cudaMallocFromPoolAsync: fn(*mut Ptr, usize, cudaMemPool_t, cudaStream_t) -> Status;
        cudaMallocFromPoolAsync_ptsz: fn(*mut Ptr, usize, cudaMemPool_t, cudaStream_t) -> Status;
        cudaMallocManaged: fn(*mut Ptr, usize, c_uint) -> Status;
        cudaMallocPitch: fn(*mut Ptr, *mut usize, usize, usize) -> Status;
        cudaMalloc3D: fn(*mut cudaPitchedPtr, cudaExtent) -> Status;
        cudaMallocHost: fn(*mut Ptr, usize) -> Status;
        cudaHostAlloc: fn(*mut Ptr, usize, c_uint) -> Status;
        cudaFreeHost: fn(Ptr) -> Status;
        cudaMemGetInfo: fn(*mut usize, *mut usize) -> Status;
        cudaDeviceReset: fn() -> Status;
        cudaGetDevice: fn(*mut c_int) -> Status;
        // The runtime's per-thread last error, around a call made twice.
        cudaPeekAtLastError: fn() -> Status;
        cudaGetLastError: fn() -> Status;
        cudaIpcGetMemHandle: fn(*mut cudaIpcMemHandle_t, Ptr) -> Status;
        cudaIpcOpenMemHandle: fn(*mut Ptr, cudaIpcMemHandle_t, c_uint) -> Status;
        cudaIpcCloseMemHandle: fn(Ptr) -> Status;
        cudaGetDriverEntryPoint: fn(*const c_char, *mut Ptr, c_ulonglong, *mut c_int) -> Status;
        cudaGetDriverEntryPointByVersion: fn(*const c_char, *mut Ptr, c_uint, c_ulonglong, *mut c_int) -> Status;
        // Kernel launches: the one place a shared runtime shows the stream
        // (a per-thread default one, for `_ptsz`) that kernels run on.
        cudaLaunchKernel: fn(*const c_void, dim3, dim3, *mut Ptr, usize, cudaStream_t) -> Status;
        cudaLaunchKernel_ptsz: fn(*const c_void, dim3, dim3, *mut Ptr, usize, cudaStream_t) -> Status;
        cudaLaunchKernelExC: fn(*const cudaLaunchConfig_t, *const c_void, *mut Ptr) -> Status;
        cudaLaunchKernelExC_ptsz: fn(*const cudaLaunchConfig_t, *const c_void, *mut Ptr) -> Status;
        cudaLaunchCooperativeKernel: fn(*const c_void, dim3, dim3, *mut Ptr, usize, cudaStream_t) -> Status;
        cudaLaunchCooperativeKernel_ptsz: fn(*const c_void, dim3, dim3, *mut Ptr, usize, cudaStream_t) -> Status;
        // Stream capture (the graph, its nodes and edges stay opaque).
        cudaStreamBeginCapture: fn(cudaStream_t, c_int) -> Status;
        cudaStreamBeginCapture_ptsz: fn(cudaStream_t, c_int) -> Status;
        cudaStreamBeginCaptureToGraph: fn(cudaStream_t, Ptr, *const Ptr, *const c_void, usize, c_int) -> Status;
        cudaStreamBeginCaptureToGraph_ptsz: fn(cudaStream_t, Ptr, *const Ptr, *const c_void, usize, c_int) -> Status;
        cudaStreamEndCapture: fn(cudaStream_t, *mut Ptr) -> Status;
        cudaStreamEndCapture_ptsz: fn(cudaStream_t, *mut Ptr) -> Status;
    }
    Driver {
        // Memory.
        cuMemAlloc_v2: fn(*mut CUdeviceptr, usize) -> Status;
        cuMemFree_v2: fn(CUdeviceptr) -> Status;
        cuMemAllocPitch_v2: fn(*mut CUdeviceptr, *mut usize, usize, usize, c_uint) -> Status;
        cuMemAllocManaged: fn(*mut CUdeviceptr, usize, c_uint) -> Status;
        cuMemAllocAsync: fn(*mut CUdeviceptr, usize, CUstream) -> Status;
        cuMemAllocAsync_ptsz: fn(*mut CUdeviceptr, usize, CUstream) -> Status;
        cuMemFreeAsync: fn(CUdeviceptr, CUstream) -> Status;
        cuMemFreeAsync_ptsz: fn(CUdeviceptr, CUstream) -> Status;
        cuMemAllocFromPoolAsync: fn(*mut CUdeviceptr, usize, CUmemoryPool, CUstream) -> Status;
        cuMemAllocFromPoolAsync_ptsz: fn(*mut CUdeviceptr, usize, CUmemoryPool, CUstream) -> Status;
        cuMemAllocHost_v2: fn(*mut Ptr, usize) -> Status;
        cuMemHostAlloc: fn(*mut Ptr, usize, c_uint) -> Status;
        cuMemFreeHost: fn(Ptr) -> Status;
        cuMemCreate: fn(*mut CUmemGenericAllocationHandle, usize, *const CUmemAllocationProp, c_ulonglong) -> Status;
        cuMemRelease: fn(CUmemGenericAllocationHandle) -> Status;
        cuMemMap: fn(CUdeviceptr, usize, usize, CUmemGenericAllocationHandle, c_ulonglong) -> Status;
        cuMemUnmap: fn(CUdeviceptr, usize) -> Status;
        // The VMM-backed pool's own calls (not hooked).
        cuMemAddressReserve: fn(*mut CUdeviceptr, usize, usize, CUdeviceptr, c_ulonglong) -> Status;
        cuMemAddressFree: fn(CUdeviceptr, usize) -> Status;
        cuMemRetainAllocationHandle: fn(*mut CUmemGenericAllocationHandle, Ptr) -> Status;
        cuMemExportToShareableHandle: fn(Ptr, CUmemGenericAllocationHandle, c_int, c_ulonglong) -> Status;
        cuMemImportFromShareableHandle: fn(*mut CUmemGenericAllocationHandle, Ptr, c_int) -> Status;
        cuMemSetAccess: fn(CUdeviceptr, usize, *const CUmemAccessDesc, usize) -> Status;
        cuMemGetAllocationGranularity: fn(*mut usize, *const CUmemAllocationProp, c_int) -> Status;
        cuDeviceGetCount: fn(*mut c_int) -> Status;
        cuDeviceCanAccessPeer: fn(*mut c_int, CUdevice, CUdevice) -> Status;
        cuMemGetInfo_v2: fn(*mut usize, *mut usize) -> Status;
        // IPC. The handle is passed by value (64 bytes).
        cuIpcGetMemHandle: fn(*mut CUipcMemHandle, CUdeviceptr) -> Status;
        cuIpcOpenMemHandle: fn(*mut CUdeviceptr, CUipcMemHandle, c_uint) -> Status;
        cuIpcOpenMemHandle_v2: fn(*mut CUdeviceptr, CUipcMemHandle, c_uint) -> Status;
        cuIpcCloseMemHandle: fn(CUdeviceptr) -> Status;
        // Pointer queries. The attribute stays an int: callers may pass values cudarc does not know.
        cuPointerGetAttribute: fn(Ptr, c_int, CUdeviceptr) -> Status;
        cuPointerGetAttributes: fn(c_uint, *const c_int, *mut Ptr, CUdeviceptr) -> Status;
        cuMemGetAddressRange_v2: fn(*mut CUdeviceptr, *mut usize, CUdeviceptr) -> Status;
        // Contexts.
        cuCtxGetCurrent: fn(*mut CUcontext) -> Status;
        cuCtxSetCurrent: fn(CUcontext) -> Status;
        cuCtxPushCurrent_v2: fn(CUcontext) -> Status;
        cuCtxPopCurrent_v2: fn(*mut CUcontext) -> Status;
        cuCtxGetDevice: fn(*mut CUdevice) -> Status;
        cuCtxGetId: fn(CUcontext, *mut c_ulonglong) -> Status;
        cuCtxSynchronize: fn() -> Status;
        cuCtxDestroy_v2: fn(CUcontext) -> Status;
        cuDevicePrimaryCtxGetState: fn(CUdevice, *mut c_uint, *mut c_int) -> Status;
        cuDevicePrimaryCtxRetain: fn(*mut CUcontext, CUdevice) -> Status;
        cuDevicePrimaryCtxRelease_v2: fn(CUdevice) -> Status;
        cuDevicePrimaryCtxReset_v2: fn(CUdevice) -> Status;
        // Streams and events (the pool's reuse fences).
        cuStreamCreate: fn(*mut CUstream, c_uint) -> Status;
        cuStreamCreateWithPriority: fn(*mut CUstream, c_uint, c_int) -> Status;
        cuStreamDestroy_v2: fn(CUstream) -> Status;
        cuStreamWaitEvent: fn(CUstream, CUevent, c_uint) -> Status;
        cuStreamIsCapturing: fn(CUstream, *mut c_int) -> Status;
        cuStreamBeginCapture: fn(CUstream) -> Status;
        cuStreamBeginCapture_ptsz: fn(CUstream) -> Status;
        cuStreamBeginCapture_v2: fn(CUstream, c_int) -> Status;
        cuStreamBeginCapture_v2_ptsz: fn(CUstream, c_int) -> Status;
        cuStreamBeginCaptureToGraph: fn(CUstream, Ptr, *const Ptr, *const c_void, usize, c_int) -> Status;
        cuStreamBeginCaptureToGraph_ptsz: fn(CUstream, Ptr, *const Ptr, *const c_void, usize, c_int) -> Status;
        cuStreamEndCapture: fn(CUstream, *mut Ptr) -> Status;
        cuStreamEndCapture_ptsz: fn(CUstream, *mut Ptr) -> Status;
        cuEventCreate: fn(*mut CUevent, c_uint) -> Status;
        cuEventRecord: fn(CUevent, CUstream) -> Status;
        cuEventQuery: fn(CUevent) -> Status;
        cuEventSynchronize: fn(CUevent) -> Status;
        cuStreamSynchronize: fn(CUstream) -> Status;
        // Entry points.
        cuGetProcAddress: fn(*const c_char, *mut Ptr, c_int, u64) -> Status;
        cuGetProcAddress_v2: fn(*const c_char, *mut Ptr, c_int, u64, *mut c_int) -> Status;
        // Where GPU work is queued, each with its per-thread-default-stream twin.
        cuLaunchKernel: fn(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut Ptr, *mut Ptr) -> Status;
        cuLaunchKernel_ptsz: fn(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut Ptr, *mut Ptr) -> Status;
        cuLaunchKernelEx: fn(*const CUlaunchConfig, CUfunction, *mut Ptr, *mut Ptr) -> Status;
        cuLaunchKernelEx_ptsz: fn(*const CUlaunchConfig, CUfunction, *mut Ptr, *mut Ptr) -> Status;
        cuLaunchCooperativeKernel: fn(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut Ptr) -> Status;
        cuLaunchCooperativeKernel_ptsz: fn(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut Ptr) -> Status;
        cuLaunchHostFunc: fn(CUstream, CUhostFn, Ptr) -> Status;
        cuLaunchHostFunc_ptsz: fn(CUstream, CUhostFn, Ptr) -> Status;
        cuGraphLaunch: fn(CUgraphExec, CUstream) -> Status;
        cuGraphLaunch_ptsz: fn(CUgraphExec, CUstream) -> Status;
        cuMemcpyAsync: fn(CUdeviceptr, CUdeviceptr, usize, CUstream) -> Status;
        cuMemcpyAsync_ptsz: fn(CUdeviceptr, CUdeviceptr, usize, CUstream) -> Status;
        cuMemcpyPeerAsync: fn(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, usize, CUstream) -> Status;
        cuMemcpyPeerAsync_ptsz: fn(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, usize, CUstream) -> Status;
        cuMemcpyHtoDAsync_v2: fn(CUdeviceptr, *const c_void, usize, CUstream) -> Status;
        cuMemcpyHtoDAsync_v2_ptsz: fn(CUdeviceptr, *const c_void, usize, CUstream) -> Status;
        cuMemcpyDtoHAsync_v2: fn(Ptr, CUdeviceptr, usize, CUstream) -> Status;
        cuMemcpyDtoHAsync_v2_ptsz: fn(Ptr, CUdeviceptr, usize, CUstream) -> Status;
        cuMemcpyDtoDAsync_v2: fn(CUdeviceptr, CUdeviceptr, usize, CUstream) -> Status;
        cuMemcpyDtoDAsync_v2_ptsz: fn(CUdeviceptr, CUdeviceptr, usize, CUstream) -> Status;
        cuMemcpy2DAsync_v2: fn(*const CUDA_MEMCPY2D, CUstream) -> Status;
        cuMemcpy2DAsync_v2_ptsz: fn(*const CUDA_MEMCPY2D, CUstream) -> Status;
        cuMemcpy3DAsync_v2: fn(*const CUDA_MEMCPY3D, CUstream) -> Status;
        cuMemcpy3DAsync_v2_ptsz: fn(*const CUDA_MEMCPY3D, CUstream) -> Status;
        cuMemcpy3DPeerAsync: fn(*const CUDA_MEMCPY3D_PEER, CUstream) -> Status;
        cuMemcpy3DPeerAsync_ptsz: fn(*const CUDA_MEMCPY3D_PEER, CUstream) -> Status;
        cuMemsetD8Async: fn(CUdeviceptr, u8, usize, CUstream) -> Status;
        cuMemsetD8Async_ptsz: fn(CUdeviceptr, u8, usize, CUstream) -> Status;
        cuMemsetD16Async: fn(CUdeviceptr, u16, usize, CUstream) -> Status;
        cuMemsetD16Async_ptsz: fn(CUdeviceptr, u16, usize, CUstream) -> Status;
        cuMemsetD32Async: fn(CUdeviceptr, c_uint, usize, CUstream) -> Status;
        cuMemsetD32Async_ptsz: fn(CUdeviceptr, c_uint, usize, CUstream) -> Status;
        cuMemsetD2D8Async: fn(CUdeviceptr, usize, u8, usize, usize, CUstream) -> Status;
        cuMemsetD2D8Async_ptsz: fn(CUdeviceptr, usize, u8, usize, usize, CUstream) -> Status;
        cuMemsetD2D16Async: fn(CUdeviceptr, usize, u16, usize, usize, CUstream) -> Status;
        cuMemsetD2D16Async_ptsz: fn(CUdeviceptr, usize, u16, usize, usize, CUstream) -> Status;
        cuMemsetD2D32Async: fn(CUdeviceptr, usize, c_uint, usize, usize, CUstream) -> Status;
        cuMemsetD2D32Async_ptsz: fn(CUdeviceptr, usize, c_uint, usize, usize, CUstream) -> Status;
        cuStreamWriteValue32_v2: fn(CUstream, CUdeviceptr, u32, c_uint) -> Status;
        cuStreamWriteValue32_v2_ptsz: fn(CUstream, CUdeviceptr, u32, c_uint) -> Status;
        cuStreamWriteValue64_v2: fn(CUstream, CUdeviceptr, u64, c_uint) -> Status;
        cuStreamWriteValue64_v2_ptsz: fn(CUstream, CUdeviceptr, u64, c_uint) -> Status;
        cuStreamBatchMemOp_v2: fn(CUstream, c_uint, *mut CUstreamBatchMemOpParams, c_uint) -> Status;
        cuStreamBatchMemOp_v2_ptsz: fn(CUstream, c_uint, *mut CUstreamBatchMemOpParams, c_uint) -> Status;
    }
    Libc {
        __libc_start_main: fn(MainFn, c_int, *mut *mut c_char, Ptr, Ptr, Ptr, Ptr) -> c_int;
        exit: fn(c_int) -> !;
        _exit: fn(c_int) -> !;
        quick_exit: fn(c_int) -> !;
        execve: fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int;
    }
}
