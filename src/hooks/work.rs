//! Where GPU work is submitted. Pool mode reuses a freed block at once only
//! while every piece of work so far went to one stream; these hooks watch the
//! driver entry points that queue work (kernel launches, graph launches, async
//! copies and memsets, stream memory operations) and do nothing else: note
//! the stream, call the real function.

#![allow(non_snake_case)]

use crate::call_real;
use crate::ffi::*;
use crate::real::{Lib, Slot};
use std::ffi::{c_uint, c_void, CStr};

const MISSING: CUresult = CUDA_ERROR_NOT_FOUND;

const fn cstr(bytes: &'static [u8]) -> &'static CStr {
    match CStr::from_bytes_with_nul(bytes) {
        Ok(c) => c,
        Err(_) => panic!("symbol names are NUL-terminated"),
    }
}

type Ptr = *mut c_void;

/// One hook per entry point and its per-thread-default-stream twin; `@ name`
/// names the stream argument.
macro_rules! stream_hooks {
    ($( $name:ident / $ptsz:ident @ $stream:ident ( $($arg:ident : $ty:ty),* ); )*) => {
        mod slots {
            #![allow(non_upper_case_globals)]
            use super::*;
            $(
                pub static $name: Slot = Slot::new(cstr(concat!(stringify!($name), "\0").as_bytes()), Lib::Driver);
                pub static $ptsz: Slot = Slot::new(cstr(concat!(stringify!($ptsz), "\0").as_bytes()), Lib::Driver);
            )*
        }
        $(
            #[no_mangle]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
                crate::pool::note_work($stream as u64, false);
                call_real!(slots::$name, fn($($ty),*) -> CUresult, ($($arg),*), MISSING)
            }
            #[no_mangle]
            pub unsafe extern "C" fn $ptsz($($arg: $ty),*) -> CUresult {
                crate::pool::note_work($stream as u64, true);
                call_real!(slots::$ptsz, fn($($ty),*) -> CUresult, ($($arg),*), MISSING)
            }
        )*
        /// The submission hooks, for `dlsym` and `cuGetProcAddress` substitution.
        pub static TABLE: &[super::Entry] = &[
            $( super::entry!($name, slots::$name), super::entry!($ptsz, slots::$ptsz), )*
            super::entry!(cuLaunchKernelEx, slots_ex::cuLaunchKernelEx),
            super::entry!(cuLaunchKernelEx_ptsz, slots_ex::cuLaunchKernelEx_ptsz),
        ];
    };
}

stream_hooks! {
    cuLaunchKernel / cuLaunchKernel_ptsz @ stream (f: Ptr, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: CUstream, params: *mut Ptr, extra: *mut Ptr);
    cuLaunchCooperativeKernel / cuLaunchCooperativeKernel_ptsz @ stream (f: Ptr, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint,
        by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut Ptr);
    cuLaunchHostFunc / cuLaunchHostFunc_ptsz @ stream (stream: CUstream, f: Ptr, data: Ptr);
    cuGraphLaunch / cuGraphLaunch_ptsz @ stream (exec: Ptr, stream: CUstream);
    cuMemcpyAsync / cuMemcpyAsync_ptsz @ stream (dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream);
    cuMemcpyPeerAsync / cuMemcpyPeerAsync_ptsz @ stream (dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext,
        n: usize, stream: CUstream);
    cuMemcpyHtoDAsync_v2 / cuMemcpyHtoDAsync_v2_ptsz @ stream (dst: CUdeviceptr, src: Ptr, n: usize, stream: CUstream);
    cuMemcpyDtoHAsync_v2 / cuMemcpyDtoHAsync_v2_ptsz @ stream (dst: Ptr, src: CUdeviceptr, n: usize, stream: CUstream);
    cuMemcpyDtoDAsync_v2 / cuMemcpyDtoDAsync_v2_ptsz @ stream (dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream);
    cuMemcpy2DAsync_v2 / cuMemcpy2DAsync_v2_ptsz @ stream (copy: Ptr, stream: CUstream);
    cuMemcpy3DAsync_v2 / cuMemcpy3DAsync_v2_ptsz @ stream (copy: Ptr, stream: CUstream);
    cuMemcpy3DPeerAsync / cuMemcpy3DPeerAsync_ptsz @ stream (copy: Ptr, stream: CUstream);
    cuMemsetD8Async / cuMemsetD8Async_ptsz @ stream (dst: CUdeviceptr, value: u8, n: usize, stream: CUstream);
    cuMemsetD16Async / cuMemsetD16Async_ptsz @ stream (dst: CUdeviceptr, value: u16, n: usize, stream: CUstream);
    cuMemsetD32Async / cuMemsetD32Async_ptsz @ stream (dst: CUdeviceptr, value: u32, n: usize, stream: CUstream);
    cuMemsetD2D8Async / cuMemsetD2D8Async_ptsz @ stream (dst: CUdeviceptr, pitch: usize, value: u8, w: usize, h: usize,
        stream: CUstream);
    cuMemsetD2D16Async / cuMemsetD2D16Async_ptsz @ stream (dst: CUdeviceptr, pitch: usize, value: u16, w: usize, h: usize,
        stream: CUstream);
    cuMemsetD2D32Async / cuMemsetD2D32Async_ptsz @ stream (dst: CUdeviceptr, pitch: usize, value: u32, w: usize, h: usize,
        stream: CUstream);
    cuStreamWriteValue32_v2 / cuStreamWriteValue32_v2_ptsz @ stream (stream: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint);
    cuStreamWriteValue64_v2 / cuStreamWriteValue64_v2_ptsz @ stream (stream: CUstream, addr: CUdeviceptr, value: u64, flags: c_uint);
    cuStreamBatchMemOp_v2 / cuStreamBatchMemOp_v2_ptsz @ stream (stream: CUstream, count: c_uint, ops: Ptr, flags: c_uint);
}

/// `cuLaunchKernelEx` carries its stream inside `CUlaunchConfig`.
#[repr(C)]
pub struct LaunchConfigHead {
    dims_and_shared: [c_uint; 7],
    stream: CUstream,
}

mod slots_ex {
    #![allow(non_upper_case_globals)]
    use super::*;
    pub static cuLaunchKernelEx: Slot = Slot::new(c"cuLaunchKernelEx", Lib::Driver);
    pub static cuLaunchKernelEx_ptsz: Slot = Slot::new(c"cuLaunchKernelEx_ptsz", Lib::Driver);
}

unsafe fn launch_ex(
    slot: &Slot,
    config: *const LaunchConfigHead,
    f: Ptr,
    params: *mut Ptr,
    extra: *mut Ptr,
    ptsz: bool,
) -> CUresult {
    if !config.is_null() {
        crate::pool::note_work((*config).stream as u64, ptsz);
    }
    call_real!(
        slot,
        fn(*const LaunchConfigHead, Ptr, *mut Ptr, *mut Ptr) -> CUresult,
        (config, f, params, extra),
        MISSING
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const LaunchConfigHead,
    f: Ptr,
    params: *mut Ptr,
    extra: *mut Ptr,
) -> CUresult {
    launch_ex(&slots_ex::cuLaunchKernelEx, config, f, params, extra, false)
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx_ptsz(
    config: *const LaunchConfigHead,
    f: Ptr,
    params: *mut Ptr,
    extra: *mut Ptr,
) -> CUresult {
    launch_ex(&slots_ex::cuLaunchKernelEx_ptsz, config, f, params, extra, true)
}
