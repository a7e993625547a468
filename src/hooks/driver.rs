//! Driver API hooks. Exported under the real versioned names for programs
//! linked against `libcuda`, and handed out by `dlsym`/`cuGetProcAddress` to
//! everyone else: the static runtime, JAX/XLA, PyTorch's driver calls.

#![allow(non_snake_case)]

use super::{entry, pitch_for, pitched_bytes, twins};
use crate::cuda::{
    CUcontext, CUdevice, CUdeviceptr, CUmemAllocationProp, CUmemGenericAllocationHandle, CUmemLocationType,
    CUmemoryPool, CUpointer_attribute, CUstream, Status, INVALID_VALUE, NOT_FOUND, SUCCESS,
};
use crate::intercept::{self, out_ptr, AllocCall, Outcome, PooledPointer};
use crate::real;
use cupool_core::log::{Api, EventKind, MemKind};
use std::ffi::{c_int, c_uint, c_ulonglong, c_void};

type DevPtr = CUdeviceptr;

unsafe fn allocated(r: Status, out: *mut DevPtr, size: usize) -> Outcome {
    (r, out_ptr(out, r), size as u64)
}

unsafe fn host_allocated(r: Status, out: *mut *mut c_void, size: usize) -> Outcome {
    (r, out_ptr(out.cast::<u64>().cast_const(), r), size as u64)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut DevPtr, size: usize) -> Status {
    let bytes = if dptr.is_null() { 0 } else { size as u64 };
    let call = AllocCall::new(Api::CuMemAlloc, MemKind::Device, bytes);
    intercept::pooled_allocation(call, |p| *dptr = p, || allocated(real!(cuMemAlloc_v2(dptr, size)), dptr, size))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: DevPtr) -> Status {
    intercept::free(Api::CuMemFree, dptr, || real!(cuMemFree_v2(dptr)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut DevPtr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size: c_uint,
) -> Status {
    let pooled_pitch = pitch_for(width);
    let unpoolable = dptr.is_null() || pitch.is_null() || !matches!(element_size, 4 | 8 | 16);
    let bytes = if unpoolable { 0 } else { pitched_bytes(pooled_pitch, &[height]) };
    let write = |p: u64| {
        *dptr = p;
        *pitch = pooled_pitch;
    };
    let call = AllocCall::new(Api::CuMemAllocPitch, MemKind::Pitched, bytes);
    intercept::pooled_allocation(call, write, || {
        let r = real!(cuMemAllocPitch_v2(dptr, pitch, width, height, element_size));
        let bytes = if r == SUCCESS && !pitch.is_null() {
            (*pitch).saturating_mul(height)
        } else {
            width.saturating_mul(height)
        };
        allocated(r, dptr, bytes)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(dptr: *mut DevPtr, size: usize, flags: c_uint) -> Status {
    let call = AllocCall::new(Api::CuMemAllocManaged, MemKind::Managed, size as u64);
    intercept::allocation(call, || allocated(real!(cuMemAllocManaged(dptr, size, flags)), dptr, size))
}

// Stream-ordered allocations, each with its per-thread-default-stream twin.

twins!(cuMemAllocAsync / cuMemAllocAsync_ptsz (dptr: *mut DevPtr, size: usize, stream: CUstream) |real, per_thread| {
    let api = if per_thread { Api::CuMemAllocAsyncPtsz } else { Api::CuMemAllocAsync };
    let call = AllocCall::new(api, MemKind::Async, size as u64).on_stream(stream as u64);
    intercept::allocation(call, || {
        allocated(real!([real](dptr, size, stream)), dptr, size)
    })
});

twins!(cuMemFreeAsync / cuMemFreeAsync_ptsz (dptr: DevPtr, stream: CUstream) |real, per_thread| {
    let api = if per_thread { Api::CuMemFreeAsyncPtsz } else { Api::CuMemFreeAsync };
    intercept::free(api, dptr, || real!([real](dptr, stream)))
});

twins!(cuMemAllocFromPoolAsync / cuMemAllocFromPoolAsync_ptsz
    (dptr: *mut DevPtr, size: usize, pool: CUmemoryPool, stream: CUstream) |real, per_thread| {
    let api = if per_thread { Api::CuMemAllocFromPoolAsyncPtsz } else { Api::CuMemAllocFromPoolAsync };
    let call = AllocCall::new(api, MemKind::Async, size as u64).on_stream(stream as u64);
    intercept::allocation(call, || {
        allocated(real!([real](dptr, size, pool, stream)), dptr, size)
    })
});

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) -> Status {
    let call = AllocCall::new(Api::CuMemAllocHost, MemKind::Host, size as u64);
    intercept::allocation(call, || host_allocated(real!(cuMemAllocHost_v2(pp, size)), pp, size))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(pp: *mut *mut c_void, size: usize, flags: c_uint) -> Status {
    let call = AllocCall::new(Api::CuMemHostAlloc, MemKind::Host, size as u64);
    intercept::allocation(call, || host_allocated(real!(cuMemHostAlloc(pp, size, flags)), pp, size))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> Status {
    intercept::free(Api::CuMemFreeHost, p as u64, || real!(cuMemFreeHost(p)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: c_ulonglong,
) -> Status {
    // Only the location is read; a location type cudarc does not know is not a device.
    let device = (!prop.is_null()).then(|| std::ptr::addr_of!((*prop).location)).and_then(|loc| {
        let type_ = std::ptr::read(std::ptr::addr_of!((*loc).type_).cast::<u32>());
        (type_ == CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE as u32).then(|| (*loc).id)
    });
    let call = AllocCall::new(Api::CuMemCreate, MemKind::Vmm, size as u64).on_device(device);
    intercept::allocation(call, || {
        let r = real!(cuMemCreate(handle, size, prop, flags));
        (r, out_ptr(handle, r), size as u64)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> Status {
    intercept::release_handle(Api::CuMemRelease, handle, || real!(cuMemRelease(handle)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemMap(
    ptr: DevPtr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: c_ulonglong,
) -> Status {
    let r = real!(cuMemMap(ptr, size, offset, handle, flags));
    intercept::mapping(EventKind::Map, Api::CuMemMap, ptr, size as u64, handle, r);
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuMemUnmap(ptr: DevPtr, size: usize) -> Status {
    let r = real!(cuMemUnmap(ptr, size));
    intercept::mapping(EventKind::Unmap, Api::CuMemUnmap, ptr, size as u64, 0, r);
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> Status {
    intercept::mem_info(free, total, || real!(cuMemGetInfo_v2(free, total)))
}

/// Streams are observed, never changed: once one exists, pooled memory is
/// reused only after fences show the GPU is done with it.
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(stream: *mut CUstream, flags: c_uint) -> Status {
    let r = real!(cuStreamCreate(stream, flags));
    if r == SUCCESS && !stream.is_null() {
        intercept::stream_created(*stream as u64);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreateWithPriority(stream: *mut CUstream, flags: c_uint, priority: c_int) -> Status {
    let r = real!(cuStreamCreateWithPriority(stream, flags, priority));
    if r == SUCCESS && !stream.is_null() {
        intercept::stream_created(*stream as u64);
    }
    r
}

/// A thread binding a context is a thread using CUDA: the static runtime
/// binds the primary context on each thread's first call, and launches
/// through entry points no hook sees (`intercept::context_bound`).
#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> Status {
    let r = real!(cuCtxSetCurrent(ctx));
    if r == SUCCESS && !ctx.is_null() {
        intercept::context_bound();
    }
    r
}

/// The same sign as `cuCtxSetCurrent`'s.
#[no_mangle]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(ctx: CUcontext) -> Status {
    let r = real!(cuCtxPushCurrent_v2(ctx));
    if r == SUCCESS && !ctx.is_null() {
        intercept::context_bound();
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy_v2(stream: CUstream) -> Status {
    intercept::stream_destroyed(stream as u64);
    real!(cuStreamDestroy_v2(stream))
}

/// Writes a pooled block's own answer (its range, its buffer id) into the
/// answer to a pointer query.
unsafe fn translate_range(attribute: c_int, data: *mut c_void, block: &PooledPointer) {
    const START: c_int = CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR as c_int;
    const SIZE: c_int = CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE as c_int;
    const BUFFER_ID: c_int = CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID as c_int;
    const LEGACY_IPC: c_int = CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE as c_int;
    let PooledPointer::Block(base, size, id, exportable) = *block else { return };
    if data.is_null() {
        return;
    }
    match attribute {
        START => *(data as *mut DevPtr) = base,
        SIZE => *(data as *mut usize) = size as usize,
        BUFFER_ID if id != 0 => *(data as *mut u64) = id,
        // The driver says 0 for VMM pages; cupool exports the block as a
        // cudaMalloc block is exported (`intercept::ipc`).
        LEGACY_IPC => {
            if let Some(exportable) = exportable {
                *(data as *mut c_int) = exportable as c_int;
            }
        }
        _ => {}
    }
}

/// A freed pooled block gets the answer CUDA gives for memory that is not
/// allocated; the driver itself still sees the live segment around it.
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(data: *mut c_void, attribute: c_int, ptr: DevPtr) -> Status {
    let r = real!(cuPointerGetAttribute(data, attribute, ptr));
    if r == SUCCESS {
        match intercept::pooled_pointer(ptr) {
            PooledPointer::Freed => return INVALID_VALUE,
            block => translate_range(attribute, data, &block),
        }
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttributes(
    count: c_uint,
    attributes: *const c_int,
    data: *mut *mut c_void,
    ptr: DevPtr,
) -> Status {
    let r = real!(cuPointerGetAttributes(count, attributes, data, ptr));
    if r == SUCCESS && !attributes.is_null() && !data.is_null() {
        let block = intercept::pooled_pointer(ptr);
        for i in 0..count as usize {
            translate_range(*attributes.add(i), *data.add(i), &block);
        }
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(base: *mut DevPtr, size: *mut usize, ptr: DevPtr) -> Status {
    let r = real!(cuMemGetAddressRange_v2(base, size, ptr));
    if r == SUCCESS {
        match intercept::pooled_pointer(ptr) {
            PooledPointer::Block(b, s, ..) => {
                if !base.is_null() {
                    *base = b;
                }
                if !size.is_null() {
                    *size = s as usize;
                }
            }
            PooledPointer::Freed => return NOT_FOUND,
            PooledPointer::NotPooled => {}
        }
    }
    r
}

/// A pooled block is a `cudaMalloc` block to the program, even on VMM
/// pages: no handle of its own to retain (one page's handle would name
/// part of it, or more). CUDA's answer for `cudaMalloc` memory.
#[no_mangle]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut CUmemGenericAllocationHandle,
    addr: *mut c_void,
) -> Status {
    match intercept::pooled_pointer(addr as DevPtr) {
        PooledPointer::NotPooled => real!(cuMemRetainAllocationHandle(handle, addr)),
        _ => INVALID_VALUE,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> Status {
    intercept::context_destroy(ctx as u64, || real!(cuCtxDestroy_v2(ctx)))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> Status {
    intercept::primary_reset(Api::CuDevicePrimaryCtxReset, || dev, || real!(cuDevicePrimaryCtxReset_v2(dev)))
}

use super::procaddr::{cuGetProcAddress, cuGetProcAddress_v2};

/// Driver functions cupool wraps, for `dlsym` and `cuGetProcAddress` substitution.
pub static TABLE: &[super::Entry] = &[
    entry!(cuMemAlloc_v2),
    entry!(cuMemFree_v2),
    entry!(cuMemAllocPitch_v2),
    entry!(cuMemAllocManaged),
    entry!(cuMemAllocAsync),
    entry!(cuMemAllocAsync_ptsz),
    entry!(cuMemFreeAsync),
    entry!(cuMemFreeAsync_ptsz),
    entry!(cuMemAllocFromPoolAsync),
    entry!(cuMemAllocFromPoolAsync_ptsz),
    entry!(cuMemAllocHost_v2),
    entry!(cuMemHostAlloc),
    entry!(cuMemFreeHost),
    entry!(cuMemCreate),
    entry!(cuMemRelease),
    entry!(cuMemMap),
    entry!(cuMemUnmap),
    entry!(cuMemGetInfo_v2),
    entry!(cuCtxDestroy_v2),
    entry!(cuDevicePrimaryCtxReset_v2),
    entry!(cuStreamCreate),
    entry!(cuStreamCreateWithPriority),
    entry!(cuStreamDestroy_v2),
    entry!(cuCtxSetCurrent),
    entry!(cuCtxPushCurrent_v2),
    entry!(cuMemRetainAllocationHandle),
    entry!(cuPointerGetAttribute),
    entry!(cuPointerGetAttributes),
    entry!(cuMemGetAddressRange_v2),
    entry!(cuGetProcAddress),
    entry!(cuGetProcAddress_v2),
];
