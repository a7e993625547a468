//! Runtime API hooks, exported under the real names. They catch programs and
//! libraries that link `libcudart.so` dynamically (also when it was loaded
//! `RTLD_LOCAL`: the global scope, where cupool sits, is searched first).
//! Programs with a static runtime never call these; the driver hooks see them.

#![allow(non_snake_case)]

use super::{entry, pitch_for, pitched_bytes, twins};
use crate::cuda::{cudaExtent, cudaMemPool_t, cudaPitchedPtr, cudaStream_t, Status};
use crate::intercept::{self, out_ptr, AllocCall};
use crate::real;
use cupool_core::log::{Api, MemKind};
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

type Ptr = *mut c_void;

/// The outcome of a runtime allocation that writes a pointer to `out`.
unsafe fn allocated(r: Status, out: *mut Ptr, size: usize) -> intercept::Outcome {
    (r, out_ptr(out.cast::<u64>().cast_const(), r), size as u64)
}

#[no_mangle]
pub unsafe extern "C" fn cudaMalloc(dev_ptr: *mut Ptr, size: usize) -> Status {
    let bytes = if dev_ptr.is_null() { 0 } else { size as u64 };
    let call = AllocCall::new(Api::CudaMalloc, MemKind::Device, bytes);
    intercept::pooled_allocation(
        call,
        |p| *dev_ptr = p as Ptr,
        || allocated(real!(cudaMalloc(dev_ptr, size)), dev_ptr, size),
    )
}

#[no_mangle]
pub unsafe extern "C" fn cudaFree(dev_ptr: Ptr) -> Status {
    intercept::free(Api::CudaFree, dev_ptr as u64, || real!(cudaFree(dev_ptr)))
}

// Stream-ordered allocations, each with its per-thread-default-stream twin.

twins!(cudaMallocAsync / cudaMallocAsync_ptsz (dev_ptr: *mut Ptr, size: usize, stream: cudaStream_t) |real, per_thread| {
    let api = if per_thread { Api::CudaMallocAsyncPtsz } else { Api::CudaMallocAsync };
    let call = AllocCall::new(api, MemKind::Async, size as u64).on_stream(stream as u64);
    intercept::allocation(call, || {
        allocated(real!([real](dev_ptr, size, stream)), dev_ptr, size)
    })
});

twins!(cudaFreeAsync / cudaFreeAsync_ptsz (dev_ptr: Ptr, stream: cudaStream_t) |real, per_thread| {
    let api = if per_thread { Api::CudaFreeAsyncPtsz } else { Api::CudaFreeAsync };
    intercept::free(api, dev_ptr as u64, || real!([real](dev_ptr, stream)))
});

twins!(cudaMallocFromPoolAsync / cudaMallocFromPoolAsync_ptsz
    (ptr: *mut Ptr, size: usize, pool: cudaMemPool_t, stream: cudaStream_t) |real, per_thread| {
    let api = if per_thread { Api::CudaMallocFromPoolAsyncPtsz } else { Api::CudaMallocFromPoolAsync };
    let call = AllocCall::new(api, MemKind::Async, size as u64).on_stream(stream as u64);
    intercept::allocation(call, || {
        allocated(real!([real](ptr, size, pool, stream)), ptr, size)
    })
});

#[no_mangle]
pub unsafe extern "C" fn cudaMallocManaged(dev_ptr: *mut Ptr, size: usize, flags: c_uint) -> Status {
    let call = AllocCall::new(Api::CudaMallocManaged, MemKind::Managed, size as u64);
    intercept::allocation(call, || allocated(real!(cudaMallocManaged(dev_ptr, size, flags)), dev_ptr, size))
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocPitch(dev_ptr: *mut Ptr, pitch: *mut usize, width: usize, height: usize) -> Status {
    let pooled_pitch = pitch_for(width);
    let bytes = if dev_ptr.is_null() || pitch.is_null() { 0 } else { pitched_bytes(pooled_pitch, &[height]) };
    let write = |p: u64| {
        *dev_ptr = p as Ptr;
        *pitch = pooled_pitch;
    };
    let call = AllocCall::new(Api::CudaMallocPitch, MemKind::Pitched, bytes);
    intercept::pooled_allocation(call, write, || {
        let r = real!(cudaMallocPitch(dev_ptr, pitch, width, height));
        let bytes =
            if r == 0 && !pitch.is_null() { (*pitch).saturating_mul(height) } else { width.saturating_mul(height) };
        allocated(r, dev_ptr, bytes)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMalloc3D(pitched: *mut cudaPitchedPtr, extent: cudaExtent) -> Status {
    let pooled_pitch = pitch_for(extent.width);
    let bytes = if pitched.is_null() { 0 } else { pitched_bytes(pooled_pitch, &[extent.height, extent.depth]) };
    let write = |p: u64| {
        *pitched = cudaPitchedPtr { ptr: p as Ptr, pitch: pooled_pitch, xsize: extent.width, ysize: extent.height };
    };
    let call = AllocCall::new(Api::CudaMalloc3D, MemKind::Pitched, bytes);
    intercept::pooled_allocation(call, write, || {
        let r = real!(cudaMalloc3D(pitched, extent));
        if r == 0 && !pitched.is_null() {
            let p = &*pitched;
            (r, p.ptr as u64, pitched_bytes(p.pitch, &[extent.height, extent.depth]))
        } else {
            (r, 0, pitched_bytes(extent.width, &[extent.height, extent.depth]))
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocHost(ptr: *mut Ptr, size: usize) -> Status {
    let call = AllocCall::new(Api::CudaMallocHost, MemKind::Host, size as u64);
    intercept::allocation(call, || allocated(real!(cudaMallocHost(ptr, size)), ptr, size))
}

#[no_mangle]
pub unsafe extern "C" fn cudaHostAlloc(ptr: *mut Ptr, size: usize, flags: c_uint) -> Status {
    let call = AllocCall::new(Api::CudaHostAlloc, MemKind::Host, size as u64);
    intercept::allocation(call, || allocated(real!(cudaHostAlloc(ptr, size, flags)), ptr, size))
}

#[no_mangle]
pub unsafe extern "C" fn cudaFreeHost(ptr: Ptr) -> Status {
    intercept::free(Api::CudaFreeHost, ptr as u64, || real!(cudaFreeHost(ptr)))
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemGetInfo(free: *mut usize, total: *mut usize) -> Status {
    intercept::mem_info(free, total, || real!(cudaMemGetInfo(free, total)))
}

#[no_mangle]
pub unsafe extern "C" fn cudaDeviceReset() -> Status {
    let device = || {
        let mut device = -1;
        real!(cudaGetDevice(&mut device));
        device
    };
    intercept::primary_reset(Api::CudaDeviceReset, device, || real!(cudaDeviceReset()))
}

#[no_mangle]
pub unsafe extern "C" fn cudaGetDriverEntryPoint(
    symbol: *const c_char,
    func: *mut Ptr,
    flags: c_ulonglong,
    status: *mut c_int,
) -> Status {
    let r = real!(cudaGetDriverEntryPoint(symbol, func, flags, status));
    if r == 0 {
        super::procaddr::substitute(func);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn cudaGetDriverEntryPointByVersion(
    symbol: *const c_char,
    func: *mut Ptr,
    version: c_uint,
    flags: c_ulonglong,
    status: *mut c_int,
) -> Status {
    let r = real!(cudaGetDriverEntryPointByVersion(symbol, func, version, flags, status));
    if r == 0 {
        super::procaddr::substitute(func);
    }
    r
}

/// Runtime functions a caller may look up with `dlsym`, with cupool's wrapper for each.
pub static TABLE: &[super::Entry] = &[
    entry!(cudaMalloc),
    entry!(cudaFree),
    entry!(cudaMallocAsync),
    entry!(cudaMallocAsync_ptsz),
    entry!(cudaFreeAsync),
    entry!(cudaFreeAsync_ptsz),
    entry!(cudaMallocFromPoolAsync),
    entry!(cudaMallocFromPoolAsync_ptsz),
    entry!(cudaMallocManaged),
    entry!(cudaMallocPitch),
    entry!(cudaMalloc3D),
    entry!(cudaMallocHost),
    entry!(cudaHostAlloc),
    entry!(cudaFreeHost),
    entry!(cudaMemGetInfo),
    entry!(cudaDeviceReset),
    entry!(cudaGetDriverEntryPoint),
    entry!(cudaGetDriverEntryPointByVersion),
];
