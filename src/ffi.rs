//! The few CUDA types and constants the shim needs, with the real ABI.
//! Declared by hand: the shim must build where no CUDA toolkit exists.

#![allow(non_camel_case_types)]

use std::ffi::c_void;

pub type CUresult = i32;
pub type cudaError_t = i32;
pub type CUdeviceptr = u64;
pub type CUdevice = i32;
pub type CUcontext = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUmemoryPool = *mut c_void;
pub type CUmemGenericAllocationHandle = u64;

pub const CUDA_SUCCESS: CUresult = 0;
/// Also `cudaErrorMemoryAllocation`: runtime and driver share the value.
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
/// Also `cudaErrorInvalidValue`.
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;
/// `cudaErrorSharedObjectSymbolNotFound`: what we return when the real runtime
/// function cannot be found at all, so there is nothing to pass through to.
pub const CUDA_ERROR_SYMBOL_NOT_FOUND_RT: cudaError_t = 302;

/// `struct cudaPitchedPtr`.
#[repr(C)]
pub struct CudaPitchedPtr {
    pub ptr: *mut c_void,
    pub pitch: usize,
    pub xsize: usize,
    pub ysize: usize,
}

/// `struct cudaExtent`, passed by value to `cudaMalloc3D`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CudaExtent {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
}

/// The head of `CUmemAllocationProp`: only the location is read.
#[repr(C)]
pub struct CuMemAllocationPropHead {
    pub alloc_type: u32,
    pub requested_handle_types: u32,
    pub location_type: u32,
    pub location_id: i32,
}
pub const CU_MEM_LOCATION_TYPE_DEVICE: u32 = 1;
