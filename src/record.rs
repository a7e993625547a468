//! The seam between hooks and bookkeeping: what every hook calls after (or
//! around) the real CUDA call, and where pool mode takes over device allocations.

use crate::ffi::*;
use crate::real::{Lib, Slot};
use crate::tracker::{self, Live, Space};
use crate::{call_real, events, guard, state};
use cupool_core::log::{Api, Event, EventKind, MemKind};
use cupool_core::options::Mode;
use cupool_core::pool::BlockId;

static CU_CTX_GET_CURRENT: Slot = Slot::new(c"cuCtxGetCurrent", Lib::Driver);
static CU_CTX_GET_DEVICE: Slot = Slot::new(c"cuCtxGetDevice", Lib::Driver);
static CU_PRIMARY_CTX_GET_STATE: Slot = Slot::new(c"cuDevicePrimaryCtxGetState", Lib::Driver);
static CU_PRIMARY_CTX_RETAIN: Slot = Slot::new(c"cuDevicePrimaryCtxRetain", Lib::Driver);
static CU_PRIMARY_CTX_RELEASE: Slot = Slot::new(c"cuDevicePrimaryCtxRelease_v2", Lib::Driver);

/// The primary context of `device` if it is active (asked before a reset,
/// so that only its allocations are reported as dying with it).
pub fn primary_context(device: i32) -> Option<u64> {
    unsafe {
        let (mut flags, mut active) = (0u32, 0i32);
        let r = call_real!(
            CU_PRIMARY_CTX_GET_STATE,
            fn(CUdevice, *mut u32, *mut i32) -> CUresult,
            (device, &mut flags, &mut active),
            CUDA_ERROR_UNKNOWN
        );
        if r == CUDA_SUCCESS && active == 0 {
            return None; // retaining it would create it
        }
        let mut ctx: CUcontext = std::ptr::null_mut();
        let r = call_real!(
            CU_PRIMARY_CTX_RETAIN,
            fn(*mut CUcontext, CUdevice) -> CUresult,
            (&mut ctx, device),
            CUDA_ERROR_UNKNOWN
        );
        if r != CUDA_SUCCESS {
            return None;
        }
        call_real!(CU_PRIMARY_CTX_RELEASE, fn(CUdevice) -> CUresult, (device), CUDA_ERROR_UNKNOWN);
        Some(ctx as u64)
    }
}

/// A device's primary context is being reset: `primary` (from
/// `primary_context`, asked before) and what it holds die.
pub fn primary_reset(api: Api, device: i32, primary: Option<u64>) {
    let Some(ctx) = primary else { return };
    crate::pool::drop_context(|p| p.ctx == ctx);
    checkpoint(api, device, |l| l.ctx == ctx);
}

/// The context current on this thread; 0 when none.
#[inline]
pub fn current_context_only() -> u64 {
    let mut ctx: CUcontext = std::ptr::null_mut();
    let r = unsafe { call_real!(CU_CTX_GET_CURRENT, fn(*mut CUcontext) -> CUresult, (&mut ctx), CUDA_ERROR_UNKNOWN) };
    if r == CUDA_SUCCESS {
        ctx as u64
    } else {
        0
    }
}

/// The context current on this thread and its device; (0, -1) when none.
pub fn current_context() -> (u64, i32) {
    let ctx = current_context_only();
    if ctx == 0 {
        return (0, -1);
    }
    let mut dev: CUdevice = -1;
    let r = unsafe { call_real!(CU_CTX_GET_DEVICE, fn(*mut CUdevice) -> CUresult, (&mut dev), CUDA_ERROR_UNKNOWN) };
    (ctx, if r == CUDA_SUCCESS { dev } else { -1 })
}

/// Reads the pointer a successful allocation wrote to its out-parameter.
#[inline]
pub unsafe fn out_ptr<T: Copy + Into<u64>>(out: *const T, result: i32) -> u64 {
    if result == 0 && !out.is_null() {
        (*out).into()
    } else {
        0
    }
}

/// One allocation call: `api`, `kind`, the bytes it occupies, and its stream.
#[derive(Clone, Copy)]
pub struct Site {
    pub api: Api,
    pub kind: MemKind,
    pub space: Space,
}

impl Site {
    pub const fn new(api: Api, kind: MemKind) -> Site {
        Site { api, kind, space: Space::of(kind) }
    }
}

/// Wraps an allocating call: runs it, then records the result once.
/// `call` returns (CUDA result, pointer or handle, bytes occupied).
/// Nested inside another cupool hook (the runtime calling the driver), it
/// only passes through: the outer hook records.
#[inline]
pub fn track_alloc(site: Site, stream: u64, device_hint: Option<i32>, call: impl FnOnce() -> (i32, u64, u64)) -> i32 {
    let Some(_guard) = guard::Guard::enter() else {
        return call().0;
    };
    passthrough(site, stream, device_hint, call)
}

fn passthrough(site: Site, stream: u64, device_hint: Option<i32>, call: impl FnOnce() -> (i32, u64, u64)) -> i32 {
    let (result, ptr, bytes) = call();
    crate::diag::shielded(|| {
        let (ctx, dev) = current_context();
        let device = device_hint.unwrap_or(dev);
        if result == 0 {
            if ptr != 0 {
                // A 0-byte request succeeds with a NULL pointer: nothing was allocated.
                record_alloc(site, stream, ctx, device, ptr, bytes, tracker::NO_BLOCK, 0);
            }
        } else {
            record_failure(site, device, bytes, result);
        }
    });
    result
}

/// A device allocation that the pool may serve. `bytes` is what the call
/// occupies (pitch × rows for pitched memory); `write` stores the pointer
/// (and pitch) into the caller's out-parameters; `call` is the real CUDA call,
/// used in passthrough mode, for 0 bytes, and whenever the pool cannot help.
#[inline]
pub fn pooled_alloc(site: Site, bytes: u64, write: impl FnOnce(u64), call: impl FnOnce() -> (i32, u64, u64)) -> i32 {
    let Some(_guard) = guard::Guard::enter() else {
        return call().0;
    };
    if state::options().mode == Mode::Pool && bytes > 0 {
        if let Some(Some(result)) = crate::diag::shielded(|| from_pool(site, bytes)) {
            return match result {
                Ok(ptr) => {
                    write(ptr);
                    0
                }
                Err(code) => code,
            };
        }
    }
    passthrough(site, 0, None, call)
}

/// `None`: the pool cannot be used here (no context); the caller passes through.
fn from_pool(site: Site, bytes: u64) -> Option<Result<u64, i32>> {
    let mut ctx = current_context_only();
    if ctx == 0 && site.api.as_str().starts_with("cuda") {
        // The runtime creates its context lazily; let it, exactly as cudaMalloc would.
        unsafe {
            call_real!(crate::hooks::runtime::CUDA_FREE, fn(*mut std::ffi::c_void) -> i32, (std::ptr::null_mut()), 1)
        };
        ctx = current_context_only();
    }
    if ctx == 0 {
        return None;
    }
    // The device is asked only when this thread meets a new context.
    let pool = crate::pool::pool_of(ctx, || current_context().1);
    let device = pool.device;
    match crate::pool::allocate(pool, bytes) {
        Ok(block) => {
            record_alloc(site, 0, ctx, device, block.addr, bytes, block.id.to_raw(), pool as *const _ as usize);
            Some(Ok(block.addr))
        }
        Err(_) => {
            record_failure(site, device, bytes, CUDA_ERROR_OUT_OF_MEMORY);
            crate::report::out_of_memory(site.api, pool, bytes);
            Some(Err(CUDA_ERROR_OUT_OF_MEMORY))
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn record_alloc(site: Site, stream: u64, ctx: u64, device: i32, ptr: u64, bytes: u64, block: u32, pool: usize) {
    state::recording(); // starts the clock before the first allocation is stamped
    let live = Live {
        size: bytes,
        t_ns: state::now_ns(),
        ctx,
        device,
        kind: site.kind,
        api: site.api,
        tid: guard::tid(),
        stream,
        block,
        pool,
    };
    tracker::insert(site.space, ptr, live);
    let mut e = Event::new(EventKind::Alloc, site.api);
    e.mem = site.kind;
    e.device = device;
    e.ptr = ptr;
    e.size = bytes;
    e.aux = stream;
    events::record(e);
}

fn record_failure(site: Site, device: i32, bytes: u64, result: i32) {
    tracker::failed(site.kind, device);
    let mut e = Event::new(EventKind::AllocFailed, site.api);
    e.mem = site.kind;
    e.device = device;
    e.size = bytes;
    e.result = result;
    events::record(e);
}

/// Wraps a freeing call. The allocation leaves the table before the real free,
/// so another thread that is handed the same address right after cannot have
/// its record removed by us.
#[inline]
pub fn track_free(api: Api, space: Space, ptr: u64, call: impl FnOnce() -> i32) -> i32 {
    if ptr == 0 {
        return call(); // cudaFree(NULL) is the runtime's initialisation idiom, not a free
    }
    let Some(_guard) = guard::Guard::enter() else {
        return call();
    };
    let known = crate::diag::shielded(|| tracker::remove(space, ptr)).flatten();
    let stamp = events::stamp();
    let pooled = known.filter(|l| l.block != tracker::NO_BLOCK);
    let result = match pooled {
        Some(live) => {
            crate::diag::shielded(|| crate::pool::free(live.pool, BlockId::from_raw(live.block)));
            0
        }
        // Not a live allocation but inside a pool segment (a double free):
        // CUDA must not see it, or it would free the whole segment.
        None if known.is_none() && crate::pool::owns(ptr) => CUDA_ERROR_INVALID_VALUE,
        None => call(),
    };
    crate::diag::shielded(|| match (known, result) {
        (Some(live), 0) => {
            let mut e = Event::new(EventKind::Free, api);
            e.mem = live.kind;
            e.device = live.device;
            e.ptr = ptr;
            e.size = live.size;
            events::record_at(e, stamp);
        }
        (Some(live), _) => tracker::restore(space, ptr, live), // CUDA kept it: so do we
        (None, 0) => {} // allocated before cupool could see it (e.g. inside another hook's init)
        (None, r) => {
            let mut e = Event::new(EventKind::InvalidFree, api);
            e.ptr = ptr;
            e.result = r;
            events::record_at(e, stamp);
        }
    });
    result
}

/// Observes a VMM map or unmap: recorded in the timeline, not counted as memory
/// (the physical allocation was counted at `cuMemCreate`).
pub fn track_mapping(kind: EventKind, api: Api, ptr: u64, size: u64, handle: u64, result: i32) {
    if result != 0 || guard::inside() {
        return;
    }
    crate::diag::shielded(|| {
        let mut e = Event::new(kind, api);
        e.mem = MemKind::Vmm;
        e.ptr = ptr;
        e.size = size;
        e.aux = handle;
        events::record(e);
    });
}

/// A context (or a device's primary context) died, and everything it held
/// with it. `device` -1: take it from what died.
pub fn checkpoint(api: Api, device: i32, dies: impl FnMut(&Live) -> bool) {
    crate::diag::shielded(|| {
        let died = tracker::take_where(dies);
        let device = if device >= 0 { device } else { died.first().map_or(-1, |(_, l)| l.device) };
        crate::report::checkpoint(api, device, died);
    });
}
