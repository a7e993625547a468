//! CUDA as cupool sees it: the types of the entry points it stands in front
//! of (from `cudarc`'s `sys` modules, so nothing is needed at build time) and
//! one typed table of the real functions, each declared once with its
//! signature and resolved once (`table.rs`).
//!
//! Results stay raw `i32` at the C ABI: a driver newer than `cudarc` may
//! return codes its enums do not know, and reading one into a Rust enum
//! would be undefined behaviour.

pub mod resolve;
mod table;

pub use table::{real, sig, MainFn};

pub use cudarc::driver::sys::{
    cudaError_enum as DriverError, CUcontext, CUdevice, CUdeviceptr, CUevent, CUfunction, CUgraphExec, CUhostFn,
    CUipcMemHandle, CUlaunchConfig, CUmemAccessDesc, CUmemAllocationProp, CUmemGenericAllocationHandle,
    CUmemLocationType, CUmemoryPool, CUpointer_attribute, CUstream, CUstreamBatchMemOpParams, CUstreamCaptureStatus,
    CUDA_MEMCPY2D, CUDA_MEMCPY3D, CUDA_MEMCPY3D_PEER,
};
pub use cudarc::runtime::sys::{
    cudaExtent, cudaIpcMemHandle_t, cudaLaunchConfig_t, cudaMemPool_t, cudaPitchedPtr, cudaStream_t, dim3,
};

use resolve::{Lib, Lookup};
use std::ffi::CStr;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A CUDA result (`CUresult` or `cudaError_t`; both APIs share the values cupool uses).
pub type Status = i32;

pub const SUCCESS: Status = DriverError::CUDA_SUCCESS as Status;
/// `cudaErrorInvalidValue` too.
pub const INVALID_VALUE: Status = DriverError::CUDA_ERROR_INVALID_VALUE as Status;
/// `cudaErrorMemoryAllocation` too.
pub const OUT_OF_MEMORY: Status = DriverError::CUDA_ERROR_OUT_OF_MEMORY as Status;
/// `cudaErrorDeviceUninitialized` ("invalid device context") too.
pub const INVALID_CONTEXT: Status = DriverError::CUDA_ERROR_INVALID_CONTEXT as Status;
/// "Not found": what `cuMemGetAddressRange` answers for memory that is not allocated.
pub const NOT_FOUND: Status = DriverError::CUDA_ERROR_NOT_FOUND as Status;
/// The stream-capture errors (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` …
/// `CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD`; the runtime's values are the same).
pub const CAPTURE_ERRORS: std::ops::RangeInclusive<Status> = DriverError::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
    as Status
    ..=DriverError::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD as Status;
/// What a hook returns when the real function does not exist at all, so
/// there is nothing to pass the call to: "named symbol not found", the same
/// value in the driver (`CUDA_ERROR_NOT_FOUND`) and the runtime
/// (`cudaErrorSymbolNotFound`).
pub const MISSING: Status = DriverError::CUDA_ERROR_NOT_FOUND as Status;

/// A real function of type `F`, looked up on first use.
pub struct Real<F> {
    name: &'static CStr,
    lib: Lib,
    /// 0: not looked up yet; `ABSENT`: looked up, not there; else the address.
    addr: AtomicUsize,
    _fn: PhantomData<F>,
}

const ABSENT: usize = 1;

// SAFETY: a `Real` holds no `F`, only its type: its state is an atomic and two immutable values (a `'static`
// name and a library tag), and `get` hands out copies of a code address that is valid for the whole process.
// Nothing in it needs one thread at a time.
unsafe impl<F> Sync for Real<F> {}

impl<F: Copy> Real<F> {
    pub const fn new(name: &'static CStr, lib: Lib) -> Real<F> {
        assert!(std::mem::size_of::<F>() == std::mem::size_of::<usize>(), "a Real holds a function pointer");
        Real { name, lib, addr: AtomicUsize::new(0), _fn: PhantomData }
    }

    /// The real function, or `None` when it cannot be found.
    #[inline]
    pub fn get(&self) -> Option<F> {
        // SAFETY: a non-zero address came from the dynamic linker for this
        // exact symbol, whose C prototype is `F` (checked where the table is declared).
        self.address().map(|p| unsafe { std::mem::transmute_copy::<usize, F>(&p) })
    }

    /// The real function if it was looked up already: never a lookup (a
    /// `vfork` child must not make one).
    pub fn resolved(&self) -> Option<F> {
        match self.addr.load(Ordering::Acquire) {
            0 | ABSENT => None,
            // SAFETY: as in `get`.
            p => Some(unsafe { std::mem::transmute_copy::<usize, F>(&p) }),
        }
    }

    #[inline]
    pub fn address(&self) -> Option<usize> {
        match self.addr.load(Ordering::Acquire) {
            0 => self.resolve(),
            ABSENT => None,
            p => Some(p),
        }
    }

    #[cold]
    fn resolve(&self) -> Option<usize> {
        match resolve::lookup(self.name, self.lib) {
            Lookup::Found(p) => {
                self.addr.store(p, Ordering::Release);
                Some(p)
            }
            Lookup::Absent => {
                self.addr.store(ABSENT, Ordering::Release);
                None
            }
            Lookup::NotYet => None,
        }
    }

    /// Records an address learned elsewhere (from `cuGetProcAddress` or a
    /// caller's `dlsym`) unless one is known already; returns the one in force.
    pub fn learn(&self, p: usize) -> usize {
        match self.addr.compare_exchange(0, p, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => p,
            Err(ABSENT) => {
                self.addr.store(p, Ordering::Release);
                p
            }
            Err(known) => known,
        }
    }
}

/// A real function of any type, as the `dlsym`/`cuGetProcAddress`
/// substitution tables see it.
pub trait RealFunction: Sync {
    fn name(&self) -> &'static CStr;
    fn address(&self) -> Option<usize>;
    fn learn(&self, p: usize) -> usize;
}

impl<F: Copy> RealFunction for Real<F> {
    fn name(&self) -> &'static CStr {
        self.name
    }
    fn address(&self) -> Option<usize> {
        Real::address(self)
    }
    fn learn(&self, p: usize) -> usize {
        Real::learn(self, p)
    }
}

/// Calls a real function from the table: `real!(cuMemAlloc_v2(dptr, size))`.
/// A missing function answers `MISSING`.
/// `real!([slot](args))` calls the function a `&Real` names (for twins
/// that share one prototype, such as an entry point and its `_ptsz` variant).
#[macro_export]
macro_rules! real {
    ($name:ident ( $($arg:expr),* $(,)? )) => {
        $crate::real!([$crate::cuda::real::$name]($($arg),*))
    };
    ([$real:expr] ( $($arg:expr),* $(,)? )) => {
        match $real.get() {
            Some(f) => f($($arg),*),
            None => $crate::cuda::MISSING,
        }
    };
}
