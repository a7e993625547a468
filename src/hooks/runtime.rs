//! Runtime API hooks, exported under the real names. They catch programs and
//! libraries that link `libcudart.so` dynamically (also when it was loaded
//! `RTLD_LOCAL`: the global scope, where cupool sits, is searched first).
//! Programs with a static runtime never call these; the driver hooks see them.

#![allow(non_snake_case)]

use crate::call_real;
use crate::ffi::*;
use crate::real::{Lib, Slot};
use crate::record::{out_ptr, pooled_alloc, track_alloc, track_free, Site};
use crate::tracker::Space;
use cupool_core::log::{Api, MemKind};
use std::ffi::{c_char, c_uint, c_ulonglong, c_void};

const MISSING: cudaError_t = CUDA_ERROR_SYMBOL_NOT_FOUND_RT;

super::slots! { Lib::Runtime;
    CUDA_MALLOC = c"cudaMalloc";
    CUDA_FREE = c"cudaFree";
    CUDA_MALLOC_ASYNC = c"cudaMallocAsync";
    CUDA_MALLOC_ASYNC_PTSZ = c"cudaMallocAsync_ptsz";
    CUDA_FREE_ASYNC = c"cudaFreeAsync";
    CUDA_FREE_ASYNC_PTSZ = c"cudaFreeAsync_ptsz";
    CUDA_MALLOC_FROM_POOL_ASYNC = c"cudaMallocFromPoolAsync";
    CUDA_MALLOC_FROM_POOL_ASYNC_PTSZ = c"cudaMallocFromPoolAsync_ptsz";
    CUDA_MALLOC_MANAGED = c"cudaMallocManaged";
    CUDA_MALLOC_PITCH = c"cudaMallocPitch";
    CUDA_MALLOC_3D = c"cudaMalloc3D";
    CUDA_MALLOC_HOST = c"cudaMallocHost";
    CUDA_HOST_ALLOC = c"cudaHostAlloc";
    CUDA_FREE_HOST = c"cudaFreeHost";
    CUDA_MEM_GET_INFO = c"cudaMemGetInfo";
    CUDA_DEVICE_RESET = c"cudaDeviceReset";
    CUDA_GET_DEVICE = c"cudaGetDevice";
    CUDA_GET_DRIVER_ENTRY_POINT = c"cudaGetDriverEntryPoint";
    CUDA_GET_DRIVER_ENTRY_POINT_BY_VERSION = c"cudaGetDriverEntryPointByVersion";
}

type Ptr = *mut c_void;

#[no_mangle]
pub unsafe extern "C" fn cudaMalloc(dev_ptr: *mut Ptr, size: usize) -> cudaError_t {
    let bytes = if dev_ptr.is_null() { 0 } else { size as u64 };
    pooled_alloc(
        Site::new(Api::CudaMalloc, MemKind::Device),
        bytes,
        |p| *dev_ptr = p as Ptr,
        || {
            let r = call_real!(CUDA_MALLOC, fn(*mut Ptr, usize) -> cudaError_t, (dev_ptr, size), MISSING);
            (r, out_ptr(dev_ptr.cast::<u64>().cast_const(), r), size as u64)
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn cudaFree(dev_ptr: Ptr) -> cudaError_t {
    track_free(Api::CudaFree, Space::Pointer, dev_ptr as u64, || {
        call_real!(CUDA_FREE, fn(Ptr) -> cudaError_t, (dev_ptr), MISSING)
    })
}

unsafe fn malloc_async(slot: &Slot, api: Api, dev_ptr: *mut Ptr, size: usize, stream: Ptr) -> cudaError_t {
    track_alloc(Site::new(api, MemKind::Async), stream as u64, None, || {
        let r = call_real!(slot, fn(*mut Ptr, usize, Ptr) -> cudaError_t, (dev_ptr, size, stream), MISSING);
        (r, out_ptr(dev_ptr.cast::<u64>().cast_const(), r), size as u64)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocAsync(dev_ptr: *mut Ptr, size: usize, stream: Ptr) -> cudaError_t {
    malloc_async(&CUDA_MALLOC_ASYNC, Api::CudaMallocAsync, dev_ptr, size, stream)
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocAsync_ptsz(dev_ptr: *mut Ptr, size: usize, stream: Ptr) -> cudaError_t {
    malloc_async(&CUDA_MALLOC_ASYNC_PTSZ, Api::CudaMallocAsyncPtsz, dev_ptr, size, stream)
}

unsafe fn free_async(slot: &Slot, api: Api, dev_ptr: Ptr, stream: Ptr) -> cudaError_t {
    track_free(api, Space::Pointer, dev_ptr as u64, || {
        call_real!(slot, fn(Ptr, Ptr) -> cudaError_t, (dev_ptr, stream), MISSING)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaFreeAsync(dev_ptr: Ptr, stream: Ptr) -> cudaError_t {
    free_async(&CUDA_FREE_ASYNC, Api::CudaFreeAsync, dev_ptr, stream)
}

#[no_mangle]
pub unsafe extern "C" fn cudaFreeAsync_ptsz(dev_ptr: Ptr, stream: Ptr) -> cudaError_t {
    free_async(&CUDA_FREE_ASYNC_PTSZ, Api::CudaFreeAsyncPtsz, dev_ptr, stream)
}

unsafe fn malloc_from_pool_async(
    slot: &Slot,
    api: Api,
    ptr: *mut Ptr,
    size: usize,
    pool: Ptr,
    stream: Ptr,
) -> cudaError_t {
    track_alloc(Site::new(api, MemKind::Async), stream as u64, None, || {
        let r = call_real!(slot, fn(*mut Ptr, usize, Ptr, Ptr) -> cudaError_t, (ptr, size, pool, stream), MISSING);
        (r, out_ptr(ptr.cast::<u64>().cast_const(), r), size as u64)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocFromPoolAsync(ptr: *mut Ptr, size: usize, pool: Ptr, stream: Ptr) -> cudaError_t {
    malloc_from_pool_async(&CUDA_MALLOC_FROM_POOL_ASYNC, Api::CudaMallocFromPoolAsync, ptr, size, pool, stream)
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocFromPoolAsync_ptsz(
    ptr: *mut Ptr,
    size: usize,
    pool: Ptr,
    stream: Ptr,
) -> cudaError_t {
    malloc_from_pool_async(&CUDA_MALLOC_FROM_POOL_ASYNC_PTSZ, Api::CudaMallocFromPoolAsyncPtsz, ptr, size, pool, stream)
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocManaged(dev_ptr: *mut Ptr, size: usize, flags: c_uint) -> cudaError_t {
    track_alloc(Site::new(Api::CudaMallocManaged, MemKind::Managed), 0, None, || {
        let r = call_real!(
            CUDA_MALLOC_MANAGED,
            fn(*mut Ptr, usize, c_uint) -> cudaError_t,
            (dev_ptr, size, flags),
            MISSING
        );
        (r, out_ptr(dev_ptr.cast::<u64>().cast_const(), r), size as u64)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocPitch(
    dev_ptr: *mut Ptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
) -> cudaError_t {
    let pooled_pitch = super::pitch_for(width);
    let bytes = if dev_ptr.is_null() || pitch.is_null() { 0 } else { (pooled_pitch * height) as u64 };
    let write = |p: u64| {
        *dev_ptr = p as Ptr;
        *pitch = pooled_pitch;
    };
    pooled_alloc(Site::new(Api::CudaMallocPitch, MemKind::Pitched), bytes, write, || {
        let r = call_real!(
            CUDA_MALLOC_PITCH,
            fn(*mut Ptr, *mut usize, usize, usize) -> cudaError_t,
            (dev_ptr, pitch, width, height),
            MISSING
        );
        let bytes = if r == 0 && !pitch.is_null() { (*pitch * height) as u64 } else { (width * height) as u64 };
        (r, out_ptr(dev_ptr.cast::<u64>().cast_const(), r), bytes)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMalloc3D(pitched: *mut CudaPitchedPtr, extent: CudaExtent) -> cudaError_t {
    let pooled_pitch = super::pitch_for(extent.width);
    let bytes = if pitched.is_null() { 0 } else { (pooled_pitch * extent.height * extent.depth) as u64 };
    let write = |p: u64| {
        *pitched = CudaPitchedPtr { ptr: p as Ptr, pitch: pooled_pitch, xsize: extent.width, ysize: extent.height };
    };
    pooled_alloc(Site::new(Api::CudaMalloc3D, MemKind::Pitched), bytes, write, || {
        let r =
            call_real!(CUDA_MALLOC_3D, fn(*mut CudaPitchedPtr, CudaExtent) -> cudaError_t, (pitched, extent), MISSING);
        if r == 0 && !pitched.is_null() {
            let p = &*pitched;
            (r, p.ptr as u64, (p.pitch * extent.height * extent.depth) as u64)
        } else {
            (r, 0, (extent.width * extent.height * extent.depth) as u64)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocHost(ptr: *mut Ptr, size: usize) -> cudaError_t {
    track_alloc(Site::new(Api::CudaMallocHost, MemKind::Host), 0, None, || {
        let r = call_real!(CUDA_MALLOC_HOST, fn(*mut Ptr, usize) -> cudaError_t, (ptr, size), MISSING);
        (r, out_ptr(ptr.cast::<u64>().cast_const(), r), size as u64)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaHostAlloc(ptr: *mut Ptr, size: usize, flags: c_uint) -> cudaError_t {
    track_alloc(Site::new(Api::CudaHostAlloc, MemKind::Host), 0, None, || {
        let r = call_real!(CUDA_HOST_ALLOC, fn(*mut Ptr, usize, c_uint) -> cudaError_t, (ptr, size, flags), MISSING);
        (r, out_ptr(ptr.cast::<u64>().cast_const(), r), size as u64)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaFreeHost(ptr: Ptr) -> cudaError_t {
    track_free(Api::CudaFreeHost, Space::Pointer, ptr as u64, || {
        call_real!(CUDA_FREE_HOST, fn(Ptr) -> cudaError_t, (ptr), MISSING)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemGetInfo(free: *mut usize, total: *mut usize) -> cudaError_t {
    let _guard = crate::guard::Guard::enter();
    let r = call_real!(CUDA_MEM_GET_INFO, fn(*mut usize, *mut usize) -> cudaError_t, (free, total), MISSING);
    if r == 0 {
        super::apply_limit(free, total);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn cudaDeviceReset() -> cudaError_t {
    let Some(_guard) = crate::guard::Guard::enter() else {
        return call_real!(CUDA_DEVICE_RESET, fn() -> cudaError_t, (), MISSING);
    };
    let mut device = -1;
    call_real!(CUDA_GET_DEVICE, fn(*mut i32) -> cudaError_t, (&mut device), MISSING);
    let primary = crate::diag::shielded(|| crate::record::primary_context(device)).flatten();
    let r = call_real!(CUDA_DEVICE_RESET, fn() -> cudaError_t, (), MISSING);
    if r == 0 {
        crate::record::primary_reset(Api::CudaDeviceReset, device, primary);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn cudaGetDriverEntryPoint(
    symbol: *const c_char,
    func: *mut Ptr,
    flags: c_ulonglong,
    status: *mut i32,
) -> cudaError_t {
    let r = call_real!(
        CUDA_GET_DRIVER_ENTRY_POINT,
        fn(*const c_char, *mut Ptr, c_ulonglong, *mut i32) -> cudaError_t,
        (symbol, func, flags, status),
        MISSING
    );
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
    status: *mut i32,
) -> cudaError_t {
    let r = call_real!(
        CUDA_GET_DRIVER_ENTRY_POINT_BY_VERSION,
        fn(*const c_char, *mut Ptr, c_uint, c_ulonglong, *mut i32) -> cudaError_t,
        (symbol, func, version, flags, status),
        MISSING
    );
    if r == 0 {
        super::procaddr::substitute(func);
    }
    r
}

/// Runtime functions a caller may look up with `dlsym`, with cupool's wrapper for each.
pub static TABLE: &[super::Entry] = &[
    super::entry!(cudaMalloc, CUDA_MALLOC),
    super::entry!(cudaFree, CUDA_FREE),
    super::entry!(cudaMallocAsync, CUDA_MALLOC_ASYNC),
    super::entry!(cudaMallocAsync_ptsz, CUDA_MALLOC_ASYNC_PTSZ),
    super::entry!(cudaFreeAsync, CUDA_FREE_ASYNC),
    super::entry!(cudaFreeAsync_ptsz, CUDA_FREE_ASYNC_PTSZ),
    super::entry!(cudaMallocFromPoolAsync, CUDA_MALLOC_FROM_POOL_ASYNC),
    super::entry!(cudaMallocFromPoolAsync_ptsz, CUDA_MALLOC_FROM_POOL_ASYNC_PTSZ),
    super::entry!(cudaMallocManaged, CUDA_MALLOC_MANAGED),
    super::entry!(cudaMallocPitch, CUDA_MALLOC_PITCH),
    super::entry!(cudaMalloc3D, CUDA_MALLOC_3D),
    super::entry!(cudaMallocHost, CUDA_MALLOC_HOST),
    super::entry!(cudaHostAlloc, CUDA_HOST_ALLOC),
    super::entry!(cudaFreeHost, CUDA_FREE_HOST),
    super::entry!(cudaMemGetInfo, CUDA_MEM_GET_INFO),
    super::entry!(cudaDeviceReset, CUDA_DEVICE_RESET),
    super::entry!(cudaGetDriverEntryPoint, CUDA_GET_DRIVER_ENTRY_POINT),
    super::entry!(cudaGetDriverEntryPointByVersion, CUDA_GET_DRIVER_ENTRY_POINT_BY_VERSION),
];
