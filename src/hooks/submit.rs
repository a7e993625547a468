//! Where GPU work is queued. Pool mode reuses a freed block at once only
//! while every piece of work so far went to one stream; these hooks watch the
//! driver entry points that queue work (kernel launches, graph launches, async
//! copies and memsets, stream memory operations) and do nothing else: note
//! the stream, call the real function.

#![allow(non_snake_case)]

use super::{entry, twins};
use crate::cuda::*;
use crate::intercept;
use crate::real;
use std::ffi::{c_uint, c_void};

type Ptr = *mut c_void;

/// One hook per entry point and its per-thread-default-stream twin; `@ expr`
/// is the stream the work goes to.
macro_rules! stream_hooks {
    ($( $work:ident $name:ident / $ptsz:ident @ $stream:expr, ( $($arg:ident : $ty:ty),* ); )*) => {
        $(
            twins!($name / $ptsz ($($arg: $ty),*) |real, per_thread| {
                intercept::work_queued($stream as u64, per_thread, intercept::Work::$work);
                real!([real]($($arg),*))
            });
        )*
        /// The submission hooks, for `dlsym` and `cuGetProcAddress` substitution.
        pub static TABLE: &[super::Entry] = &[
            $( entry!($name), entry!($ptsz), )*
        ];
    };
}

stream_hooks! {
    Launch cuLaunchKernelEx / cuLaunchKernelEx_ptsz @ stream_of(config), (config: *const CUlaunchConfig, f: CUfunction,
        params: *mut Ptr, extra: *mut Ptr);
    Launch cuLaunchKernel / cuLaunchKernel_ptsz @ stream, (f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint,
        by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut Ptr, extra: *mut Ptr);
    Launch cuLaunchCooperativeKernel / cuLaunchCooperativeKernel_ptsz @ stream, (f: CUfunction, gx: c_uint, gy: c_uint,
        gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut Ptr);
    Other cuLaunchHostFunc / cuLaunchHostFunc_ptsz @ stream, (stream: CUstream, f: CUhostFn, data: Ptr);
    Other cuGraphLaunch / cuGraphLaunch_ptsz @ stream, (exec: CUgraphExec, stream: CUstream);
    Other cuMemcpyAsync / cuMemcpyAsync_ptsz @ stream, (dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream);
    Other cuMemcpyPeerAsync / cuMemcpyPeerAsync_ptsz @ stream, (dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr,
        src_ctx: CUcontext, n: usize, stream: CUstream);
    Other cuMemcpyHtoDAsync_v2 / cuMemcpyHtoDAsync_v2_ptsz @ stream, (dst: CUdeviceptr, src: *const c_void, n: usize,
        stream: CUstream);
    Other cuMemcpyDtoHAsync_v2 / cuMemcpyDtoHAsync_v2_ptsz @ stream, (dst: Ptr, src: CUdeviceptr, n: usize, stream: CUstream);
    Other cuMemcpyDtoDAsync_v2 / cuMemcpyDtoDAsync_v2_ptsz @ stream, (dst: CUdeviceptr, src: CUdeviceptr, n: usize,
        stream: CUstream);
    Other cuMemcpy2DAsync_v2 / cuMemcpy2DAsync_v2_ptsz @ stream, (copy: *const CUDA_MEMCPY2D, stream: CUstream);
    Other cuMemcpy3DAsync_v2 / cuMemcpy3DAsync_v2_ptsz @ stream, (copy: *const CUDA_MEMCPY3D, stream: CUstream);
    Other cuMemcpy3DPeerAsync / cuMemcpy3DPeerAsync_ptsz @ stream, (copy: *const CUDA_MEMCPY3D_PEER, stream: CUstream);
    Other cuMemsetD8Async / cuMemsetD8Async_ptsz @ stream, (dst: CUdeviceptr, value: u8, n: usize, stream: CUstream);
    Other cuMemsetD16Async / cuMemsetD16Async_ptsz @ stream, (dst: CUdeviceptr, value: u16, n: usize, stream: CUstream);
    Other cuMemsetD32Async / cuMemsetD32Async_ptsz @ stream, (dst: CUdeviceptr, value: c_uint, n: usize, stream: CUstream);
    Other cuMemsetD2D8Async / cuMemsetD2D8Async_ptsz @ stream, (dst: CUdeviceptr, pitch: usize, value: u8, w: usize,
        h: usize, stream: CUstream);
    Other cuMemsetD2D16Async / cuMemsetD2D16Async_ptsz @ stream, (dst: CUdeviceptr, pitch: usize, value: u16, w: usize,
        h: usize, stream: CUstream);
    Other cuMemsetD2D32Async / cuMemsetD2D32Async_ptsz @ stream, (dst: CUdeviceptr, pitch: usize, value: c_uint, w: usize,
        h: usize, stream: CUstream);
    Other cuStreamWriteValue32_v2 / cuStreamWriteValue32_v2_ptsz @ stream, (stream: CUstream, addr: CUdeviceptr, value: u32,
        flags: c_uint);
    Other cuStreamWriteValue64_v2 / cuStreamWriteValue64_v2_ptsz @ stream, (stream: CUstream, addr: CUdeviceptr, value: u64,
        flags: c_uint);
    Other cuStreamBatchMemOp_v2 / cuStreamBatchMemOp_v2_ptsz @ stream, (stream: CUstream, count: c_uint,
        ops: *mut CUstreamBatchMemOpParams, flags: c_uint);
}

// The runtime launches kernels through private driver entry points; in a
// program that links the runtime dynamically its own launch call is where the
// stream shows, above all a per-thread default stream (`--default-stream
// per-thread` makes every launch a `_ptsz` one), which no other call may show.
twins!(cudaLaunchKernel / cudaLaunchKernel_ptsz (f: *const c_void, grid: dim3, block: dim3, args: *mut Ptr,
    shared: usize, stream: cudaStream_t) |real, per_thread| {
    intercept::work_queued(stream as u64, per_thread, intercept::Work::Launch);
    real!([real](f, grid, block, args, shared, stream))
});

// The other launches a shared runtime exports: `cudaLaunchKernelEx` (cluster
// launches, CUTLASS's Hopper kernels) carries its stream in its config.
twins!(cudaLaunchKernelExC / cudaLaunchKernelExC_ptsz (config: *const cudaLaunchConfig_t, f: *const c_void,
    args: *mut Ptr) |real, per_thread| {
    intercept::work_queued(runtime_stream_of(config) as u64, per_thread, intercept::Work::Launch);
    real!([real](config, f, args))
});

twins!(cudaLaunchCooperativeKernel / cudaLaunchCooperativeKernel_ptsz (f: *const c_void, grid: dim3, block: dim3,
    args: *mut Ptr, shared: usize, stream: cudaStream_t) |real, per_thread| {
    intercept::work_queued(stream as u64, per_thread, intercept::Work::Launch);
    real!([real](f, grid, block, args, shared, stream))
});

pub static RUNTIME_TABLE: &[super::Entry] = &[
    entry!(cudaLaunchKernel),
    entry!(cudaLaunchKernel_ptsz),
    entry!(cudaLaunchKernelExC),
    entry!(cudaLaunchKernelExC_ptsz),
    entry!(cudaLaunchCooperativeKernel),
    entry!(cudaLaunchCooperativeKernel_ptsz),
];

/// `cudaLaunchKernelExC`'s stream, read as `stream_of` reads the driver's.
unsafe fn runtime_stream_of(config: *const cudaLaunchConfig_t) -> cudaStream_t {
    if config.is_null() {
        std::ptr::null_mut()
    } else {
        (*config).stream
    }
}

/// `cuLaunchKernelEx` carries its stream inside its `CUlaunchConfig`; a
/// null config (the call then fails) is taken as the legacy stream.
unsafe fn stream_of(config: *const CUlaunchConfig) -> CUstream {
    if config.is_null() {
        std::ptr::null_mut()
    } else {
        (*config).hStream
    }
}
