//! Driver API hooks. Exported under the real versioned names for programs
//! linked against `libcuda`, and handed out by `dlsym`/`cuGetProcAddress` to
//! everyone else: the static runtime, JAX/XLA, PyTorch's driver calls.

#![allow(non_snake_case)]

use crate::call_real;
use crate::ffi::*;
use crate::real::{Lib, Slot};
use crate::record::{out_ptr, pooled_alloc, track_alloc, track_free, track_mapping, Site};
use crate::tracker::Space;
use cupool_core::log::{Api, EventKind, MemKind};
use std::ffi::{c_uint, c_ulonglong, c_void};

const MISSING: CUresult = CUDA_ERROR_NOT_FOUND;

super::slots! { Lib::Driver;
    CU_MEM_ALLOC = c"cuMemAlloc_v2";
    CU_MEM_FREE = c"cuMemFree_v2";
    CU_MEM_ALLOC_PITCH = c"cuMemAllocPitch_v2";
    CU_MEM_ALLOC_MANAGED = c"cuMemAllocManaged";
    CU_MEM_ALLOC_ASYNC = c"cuMemAllocAsync";
    CU_MEM_ALLOC_ASYNC_PTSZ = c"cuMemAllocAsync_ptsz";
    CU_MEM_FREE_ASYNC = c"cuMemFreeAsync";
    CU_MEM_FREE_ASYNC_PTSZ = c"cuMemFreeAsync_ptsz";
    CU_MEM_ALLOC_FROM_POOL_ASYNC = c"cuMemAllocFromPoolAsync";
    CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ = c"cuMemAllocFromPoolAsync_ptsz";
    CU_MEM_ALLOC_HOST = c"cuMemAllocHost_v2";
    CU_MEM_HOST_ALLOC = c"cuMemHostAlloc";
    CU_MEM_FREE_HOST = c"cuMemFreeHost";
    CU_MEM_CREATE = c"cuMemCreate";
    CU_MEM_RELEASE = c"cuMemRelease";
    CU_MEM_MAP = c"cuMemMap";
    CU_MEM_UNMAP = c"cuMemUnmap";
    CU_MEM_GET_INFO = c"cuMemGetInfo_v2";
    CU_CTX_DESTROY = c"cuCtxDestroy_v2";
    CU_DEVICE_PRIMARY_CTX_RESET = c"cuDevicePrimaryCtxReset_v2";
    CU_STREAM_CREATE = c"cuStreamCreate";
    CU_STREAM_CREATE_WITH_PRIORITY = c"cuStreamCreateWithPriority";
    CU_STREAM_DESTROY = c"cuStreamDestroy_v2";
    CU_POINTER_GET_ATTRIBUTE = c"cuPointerGetAttribute";
    CU_POINTER_GET_ATTRIBUTES = c"cuPointerGetAttributes";
    CU_MEM_GET_ADDRESS_RANGE = c"cuMemGetAddressRange_v2";
}

type DevPtr = CUdeviceptr;
type Stream = CUstream;

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut DevPtr, size: usize) -> CUresult {
    let bytes = if dptr.is_null() { 0 } else { size as u64 };
    pooled_alloc(
        Site::new(Api::CuMemAlloc, MemKind::Device),
        bytes,
        |p| *dptr = p,
        || {
            let r = call_real!(CU_MEM_ALLOC, fn(*mut DevPtr, usize) -> CUresult, (dptr, size), MISSING);
            (r, out_ptr(dptr, r), size as u64)
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: DevPtr) -> CUresult {
    track_free(Api::CuMemFree, Space::Pointer, dptr, || {
        call_real!(CU_MEM_FREE, fn(DevPtr) -> CUresult, (dptr), MISSING)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut DevPtr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size: c_uint,
) -> CUresult {
    let pooled_pitch = super::pitch_for(width);
    let unpoolable = dptr.is_null() || pitch.is_null() || !matches!(element_size, 4 | 8 | 16);
    let bytes = if unpoolable { 0 } else { (pooled_pitch * height) as u64 };
    let write = |p: u64| {
        *dptr = p;
        *pitch = pooled_pitch;
    };
    pooled_alloc(Site::new(Api::CuMemAllocPitch, MemKind::Pitched), bytes, write, || {
        let r = call_real!(
            CU_MEM_ALLOC_PITCH,
            fn(*mut DevPtr, *mut usize, usize, usize, c_uint) -> CUresult,
            (dptr, pitch, width, height, element_size),
            MISSING
        );
        let bytes = if r == 0 && !pitch.is_null() { *pitch * height } else { width * height };
        (r, out_ptr(dptr, r), bytes as u64)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(dptr: *mut DevPtr, size: usize, flags: c_uint) -> CUresult {
    track_alloc(Site::new(Api::CuMemAllocManaged, MemKind::Managed), 0, None, || {
        let r =
            call_real!(CU_MEM_ALLOC_MANAGED, fn(*mut DevPtr, usize, c_uint) -> CUresult, (dptr, size, flags), MISSING);
        (r, out_ptr(dptr, r), size as u64)
    })
}

unsafe fn alloc_async(slot: &Slot, api: Api, dptr: *mut DevPtr, size: usize, stream: Stream) -> CUresult {
    track_alloc(Site::new(api, MemKind::Async), stream as u64, None, || {
        let r = call_real!(slot, fn(*mut DevPtr, usize, Stream) -> CUresult, (dptr, size, stream), MISSING);
        (r, out_ptr(dptr, r), size as u64)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(dptr: *mut DevPtr, size: usize, stream: Stream) -> CUresult {
    alloc_async(&CU_MEM_ALLOC_ASYNC, Api::CuMemAllocAsync, dptr, size, stream)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(dptr: *mut DevPtr, size: usize, stream: Stream) -> CUresult {
    alloc_async(&CU_MEM_ALLOC_ASYNC_PTSZ, Api::CuMemAllocAsyncPtsz, dptr, size, stream)
}

unsafe fn free_async(slot: &Slot, api: Api, dptr: DevPtr, stream: Stream) -> CUresult {
    track_free(api, Space::Pointer, dptr, || call_real!(slot, fn(DevPtr, Stream) -> CUresult, (dptr, stream), MISSING))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: DevPtr, stream: Stream) -> CUresult {
    free_async(&CU_MEM_FREE_ASYNC, Api::CuMemFreeAsync, dptr, stream)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(dptr: DevPtr, stream: Stream) -> CUresult {
    free_async(&CU_MEM_FREE_ASYNC_PTSZ, Api::CuMemFreeAsyncPtsz, dptr, stream)
}

unsafe fn alloc_from_pool_async(
    slot: &Slot,
    api: Api,
    dptr: *mut DevPtr,
    size: usize,
    pool: CUmemoryPool,
    stream: Stream,
) -> CUresult {
    track_alloc(Site::new(api, MemKind::Async), stream as u64, None, || {
        let r = call_real!(
            slot,
            fn(*mut DevPtr, usize, CUmemoryPool, Stream) -> CUresult,
            (dptr, size, pool, stream),
            MISSING
        );
        (r, out_ptr(dptr, r), size as u64)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut DevPtr,
    size: usize,
    pool: CUmemoryPool,
    stream: Stream,
) -> CUresult {
    alloc_from_pool_async(&CU_MEM_ALLOC_FROM_POOL_ASYNC, Api::CuMemAllocFromPoolAsync, dptr, size, pool, stream)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut DevPtr,
    size: usize,
    pool: CUmemoryPool,
    stream: Stream,
) -> CUresult {
    alloc_from_pool_async(
        &CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ,
        Api::CuMemAllocFromPoolAsyncPtsz,
        dptr,
        size,
        pool,
        stream,
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) -> CUresult {
    track_alloc(Site::new(Api::CuMemAllocHost, MemKind::Host), 0, None, || {
        let r = call_real!(CU_MEM_ALLOC_HOST, fn(*mut *mut c_void, usize) -> CUresult, (pp, size), MISSING);
        (r, out_ptr(pp.cast::<u64>().cast_const(), r), size as u64)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(pp: *mut *mut c_void, size: usize, flags: c_uint) -> CUresult {
    track_alloc(Site::new(Api::CuMemHostAlloc, MemKind::Host), 0, None, || {
        let r =
            call_real!(CU_MEM_HOST_ALLOC, fn(*mut *mut c_void, usize, c_uint) -> CUresult, (pp, size, flags), MISSING);
        (r, out_ptr(pp.cast::<u64>().cast_const(), r), size as u64)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    track_free(Api::CuMemFreeHost, Space::Pointer, p as u64, || {
        call_real!(CU_MEM_FREE_HOST, fn(*mut c_void) -> CUresult, (p), MISSING)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CuMemAllocationPropHead,
    flags: c_ulonglong,
) -> CUresult {
    let device = (!prop.is_null() && (*prop).location_type == CU_MEM_LOCATION_TYPE_DEVICE).then(|| (*prop).location_id);
    track_alloc(Site::new(Api::CuMemCreate, MemKind::Vmm), 0, device, || {
        let r = call_real!(
            CU_MEM_CREATE,
            fn(*mut CUmemGenericAllocationHandle, usize, *const CuMemAllocationPropHead, c_ulonglong) -> CUresult,
            (handle, size, prop, flags),
            MISSING
        );
        (r, out_ptr(handle, r), size as u64)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    track_free(Api::CuMemRelease, Space::VmmHandle, handle, || {
        call_real!(CU_MEM_RELEASE, fn(CUmemGenericAllocationHandle) -> CUresult, (handle), MISSING)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemMap(
    ptr: DevPtr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: c_ulonglong,
) -> CUresult {
    let r = call_real!(
        CU_MEM_MAP,
        fn(DevPtr, usize, usize, CUmemGenericAllocationHandle, c_ulonglong) -> CUresult,
        (ptr, size, offset, handle, flags),
        MISSING
    );
    track_mapping(EventKind::Map, Api::CuMemMap, ptr, size as u64, handle, r);
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuMemUnmap(ptr: DevPtr, size: usize) -> CUresult {
    let r = call_real!(CU_MEM_UNMAP, fn(DevPtr, usize) -> CUresult, (ptr, size), MISSING);
    track_mapping(EventKind::Unmap, Api::CuMemUnmap, ptr, size as u64, 0, r);
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    let r = call_real!(CU_MEM_GET_INFO, fn(*mut usize, *mut usize) -> CUresult, (free, total), MISSING);
    if r == CUDA_SUCCESS && !crate::guard::inside() {
        super::apply_limit(free, total);
    }
    r
}

/// Streams are observed (never changed): once one exists, pooled memory is
/// reused only after fences show the GPU is done with it.
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(stream: *mut CUstream, flags: c_uint) -> CUresult {
    let r = call_real!(CU_STREAM_CREATE, fn(*mut CUstream, c_uint) -> CUresult, (stream, flags), MISSING);
    if r == CUDA_SUCCESS && !stream.is_null() {
        crate::pool::stream_created(crate::record::current_context().0, *stream as u64);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreateWithPriority(stream: *mut CUstream, flags: c_uint, priority: i32) -> CUresult {
    let r = call_real!(
        CU_STREAM_CREATE_WITH_PRIORITY,
        fn(*mut CUstream, c_uint, i32) -> CUresult,
        (stream, flags, priority),
        MISSING
    );
    if r == CUDA_SUCCESS && !stream.is_null() {
        crate::pool::stream_created(crate::record::current_context().0, *stream as u64);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy_v2(stream: CUstream) -> CUresult {
    crate::pool::stream_destroyed(stream as u64);
    call_real!(CU_STREAM_DESTROY, fn(CUstream) -> CUresult, (stream), MISSING)
}

const CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: i32 = 11;
const CU_POINTER_ATTRIBUTE_RANGE_SIZE: i32 = 12;

/// A pooled block answers range queries as the allocation it is to the program.
unsafe fn translate_range(attribute: i32, data: *mut c_void, ptr: DevPtr) {
    if data.is_null() || !matches!(attribute, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR | CU_POINTER_ATTRIBUTE_RANGE_SIZE) {
        return;
    }
    if let Some(Some((base, size))) = crate::diag::shielded(|| crate::pool::block_range(ptr)) {
        if attribute == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR {
            *(data as *mut DevPtr) = base;
        } else {
            *(data as *mut usize) = size as usize;
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(data: *mut c_void, attribute: i32, ptr: DevPtr) -> CUresult {
    let r =
        call_real!(CU_POINTER_GET_ATTRIBUTE, fn(*mut c_void, i32, DevPtr) -> CUresult, (data, attribute, ptr), MISSING);
    if r == CUDA_SUCCESS {
        translate_range(attribute, data, ptr);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttributes(
    count: c_uint,
    attributes: *const i32,
    data: *mut *mut c_void,
    ptr: DevPtr,
) -> CUresult {
    let r = call_real!(
        CU_POINTER_GET_ATTRIBUTES,
        fn(c_uint, *const i32, *mut *mut c_void, DevPtr) -> CUresult,
        (count, attributes, data, ptr),
        MISSING
    );
    if r == CUDA_SUCCESS && !attributes.is_null() && !data.is_null() {
        for i in 0..count as usize {
            translate_range(*attributes.add(i), *data.add(i), ptr);
        }
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(base: *mut DevPtr, size: *mut usize, ptr: DevPtr) -> CUresult {
    let r = call_real!(
        CU_MEM_GET_ADDRESS_RANGE,
        fn(*mut DevPtr, *mut usize, DevPtr) -> CUresult,
        (base, size, ptr),
        MISSING
    );
    if r == CUDA_SUCCESS {
        if let Some(Some((b, s))) = crate::diag::shielded(|| crate::pool::block_range(ptr)) {
            if !base.is_null() {
                *base = b;
            }
            if !size.is_null() {
                *size = s as usize;
            }
        }
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    let Some(_guard) = crate::guard::Guard::enter() else {
        return call_real!(CU_CTX_DESTROY, fn(CUcontext) -> CUresult, (ctx), MISSING);
    };
    let r = call_real!(CU_CTX_DESTROY, fn(CUcontext) -> CUresult, (ctx), MISSING);
    if r == CUDA_SUCCESS {
        crate::pool::drop_context(|p| p.ctx == ctx as u64);
        crate::record::checkpoint(Api::CuCtxDestroy, -1, |l| l.ctx == ctx as u64);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    let Some(_guard) = crate::guard::Guard::enter() else {
        return call_real!(CU_DEVICE_PRIMARY_CTX_RESET, fn(CUdevice) -> CUresult, (dev), MISSING);
    };
    let primary = crate::diag::shielded(|| crate::record::primary_context(dev)).flatten();
    let r = call_real!(CU_DEVICE_PRIMARY_CTX_RESET, fn(CUdevice) -> CUresult, (dev), MISSING);
    if r == CUDA_SUCCESS {
        crate::record::primary_reset(Api::CuDevicePrimaryCtxReset, dev, primary);
    }
    r
}

/// Driver functions cupool wraps, for `dlsym` and `cuGetProcAddress` substitution.
pub static TABLE: &[super::Entry] = &[
    super::entry!(cuMemAlloc_v2, CU_MEM_ALLOC),
    super::entry!(cuMemFree_v2, CU_MEM_FREE),
    super::entry!(cuMemAllocPitch_v2, CU_MEM_ALLOC_PITCH),
    super::entry!(cuMemAllocManaged, CU_MEM_ALLOC_MANAGED),
    super::entry!(cuMemAllocAsync, CU_MEM_ALLOC_ASYNC),
    super::entry!(cuMemAllocAsync_ptsz, CU_MEM_ALLOC_ASYNC_PTSZ),
    super::entry!(cuMemFreeAsync, CU_MEM_FREE_ASYNC),
    super::entry!(cuMemFreeAsync_ptsz, CU_MEM_FREE_ASYNC_PTSZ),
    super::entry!(cuMemAllocFromPoolAsync, CU_MEM_ALLOC_FROM_POOL_ASYNC),
    super::entry!(cuMemAllocFromPoolAsync_ptsz, CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ),
    super::entry!(cuMemAllocHost_v2, CU_MEM_ALLOC_HOST),
    super::entry!(cuMemHostAlloc, CU_MEM_HOST_ALLOC),
    super::entry!(cuMemFreeHost, CU_MEM_FREE_HOST),
    super::entry!(cuMemCreate, CU_MEM_CREATE),
    super::entry!(cuMemRelease, CU_MEM_RELEASE),
    super::entry!(cuMemMap, CU_MEM_MAP),
    super::entry!(cuMemUnmap, CU_MEM_UNMAP),
    super::entry!(cuMemGetInfo_v2, CU_MEM_GET_INFO),
    super::entry!(cuCtxDestroy_v2, CU_CTX_DESTROY),
    super::entry!(cuDevicePrimaryCtxReset_v2, CU_DEVICE_PRIMARY_CTX_RESET),
    super::entry!(cuStreamCreate, CU_STREAM_CREATE),
    super::entry!(cuStreamCreateWithPriority, CU_STREAM_CREATE_WITH_PRIORITY),
    super::entry!(cuStreamDestroy_v2, CU_STREAM_DESTROY),
    super::entry!(cuPointerGetAttribute, CU_POINTER_GET_ATTRIBUTE),
    super::entry!(cuPointerGetAttributes, CU_POINTER_GET_ATTRIBUTES),
    super::entry!(cuMemGetAddressRange_v2, CU_MEM_GET_ADDRESS_RANGE),
    super::entry!(cuGetProcAddress, super::procaddr::CU_GET_PROC_ADDRESS),
    super::entry!(cuGetProcAddress_v2, super::procaddr::CU_GET_PROC_ADDRESS_V2),
];

use super::procaddr::{cuGetProcAddress, cuGetProcAddress_v2};
