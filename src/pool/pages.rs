//! The device side of a VMM-backed pool (`backing=vmm`): address ranges,
//! physical pages and their mappings through CUDA's virtual memory
//! management, fenced like a segment pool (`fence.rs` is its timeline).
//!
//! Every mapping is made accessible to the pool's device and to each device
//! that can reach it as a peer: a `cudaMalloc` block becomes reachable from a
//! peer as soon as the program enables peer access, and a page mapped before
//! that cannot learn of it later. A refused map or grant marks the backend
//! broken: the context's later allocations go to CUDA (`engine.rs`).

use super::fence::{CudaBackend, InContext};
use crate::cuda::{
    CUdevice, CUmemAccessDesc, CUmemAllocationProp, CUmemGenericAllocationHandle, OUT_OF_MEMORY, SUCCESS,
};
use crate::real;
use crate::runtime::clock;
use cudarc::driver::sys::{
    CUmemAccess_flags, CUmemAllocationGranularity_flags, CUmemAllocationHandleType, CUmemAllocationType, CUmemLocation,
    CUmemLocationType,
};
use cupool_core::log::PageCosts;
use cupool_core::pool::Timeline;
use cupool_core::vmm::PageBackend;
use std::ffi::c_int;

pub struct CudaPages {
    pub timeline: CudaBackend,
    ctx: u64,
    device: i32,
    access: Vec<CUmemAccessDesc>,
    /// A map or grant was refused: no more blocks from these pages.
    pub broken: bool,
    /// Pages are created with a POSIX file descriptor handle, so a block
    /// exported through IPC can be shared (`pool::ipc`); dropped where the
    /// device refuses it.
    pub shareable: bool,
    pub costs: PageCosts,
}

fn location(device: i32) -> CUmemLocation {
    CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: device }
}

fn page_properties(device: i32, shareable: bool) -> CUmemAllocationProp {
    // SAFETY: a plain C struct; all-zero is its documented "nothing asked" state.
    let mut prop: CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    // As PyTorch's expandable segments ask for them: a file descriptor per
    // page, only made when a block is exported.
    prop.requestedHandleTypes = if shareable {
        CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    } else {
        CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE
    };
    prop.location = location(device);
    prop
}

impl CudaPages {
    /// The backend of `ctx`'s pool on `device` and its page size (the
    /// device's recommended granularity, at least 2 MiB); `None` when the
    /// device cannot map pages (no VMM support).
    pub fn new(ctx: u64, device: i32) -> Option<(CudaPages, u64)> {
        let _current = InContext::enter(ctx)?;
        let recommended = CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED as c_int;
        let granularity = |shareable| {
            let mut g = 0usize;
            // SAFETY: the driver's `cuMemGetAllocationGranularity` writes only into `g`, a live local, and
            // reads the properties, a temporary alive for the call.
            let r = unsafe {
                real!(cuMemGetAllocationGranularity(&mut g, &page_properties(device, shareable), recommended))
            };
            (r == SUCCESS && g > 0).then_some(g)
        };
        let (granularity, shareable) = match granularity(true) {
            Some(g) => (g, true),
            None => (granularity(false)?, false),
        };
        let page = (granularity as u64).max(2 << 20).next_multiple_of(granularity as u64);
        let mut count: c_int = 0;
        // SAFETY: the driver's `cuDeviceGetCount` writes only into `count`, a live local.
        unsafe { real!(cuDeviceGetCount(&mut count)) };
        let readers = (0..count.max(1)).filter(|&d| d == device || can_access_peer(d, device));
        let access = readers
            .map(|d| CUmemAccessDesc {
                location: location(d),
                flags: CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            })
            .collect();
        let pages = CudaPages {
            timeline: CudaBackend::new(ctx),
            ctx,
            device,
            access,
            broken: false,
            shareable,
            costs: PageCosts::default(),
        };
        Some((pages, page))
    }

    fn refused(&mut self) -> bool {
        self.broken = true;
        false
    }
}

/// Can device `reader` reach `owner`'s memory?
fn can_access_peer(reader: i32, owner: i32) -> bool {
    let mut can: c_int = 0;
    // SAFETY: the driver's `cuDeviceCanAccessPeer` writes only into `can`, a live local.
    let r = unsafe { real!(cuDeviceCanAccessPeer(&mut can, reader as CUdevice, owner as CUdevice)) };
    r == SUCCESS && can != 0
}

impl PageBackend for CudaPages {
    fn reserve(&mut self, size: u64, align: u64) -> Option<u64> {
        let _current = InContext::enter(self.ctx)?;
        let mut addr = 0;
        // SAFETY: the driver's `cuMemAddressReserve` writes only into `addr`, a live local.
        let r = unsafe { real!(cuMemAddressReserve(&mut addr, size as usize, align as usize, 0, 0)) };
        (r == SUCCESS).then_some(addr)
    }

    fn create_page(&mut self, size: u64) -> Option<u64> {
        let _current = InContext::enter(self.ctx)?;
        let t = clock::monotonic_ns();
        let mut handle: CUmemGenericAllocationHandle = 0;
        // SAFETY: the driver's `cuMemCreate` writes only into `handle`, a live local, and reads the
        // properties, a temporary alive for the call.
        let mut create = |shareable| unsafe {
            real!(cuMemCreate(&mut handle, size as usize, &page_properties(self.device, shareable), 0))
        };
        let mut r = create(self.shareable);
        if r != SUCCESS && r != OUT_OF_MEMORY && self.shareable {
            // Shareable pages refused for another reason than memory: plain
            // pages from now on (their blocks cannot be exported).
            self.shareable = false;
            r = create(false);
        }
        self.costs.create_ns += clock::monotonic_ns() - t;
        (r == SUCCESS).then_some(handle)
    }

    fn map(&mut self, addr: u64, size: u64, handle: u64) -> bool {
        let Some(_current) = InContext::enter(self.ctx) else { return self.refused() };
        let t = clock::monotonic_ns();
        // SAFETY: the driver's `cuMemMap` of `handle`, a page this backend created, into a range it reserved:
        // the VMM pool maps a page only where its range has no page.
        let r = unsafe { real!(cuMemMap(addr, size as usize, 0, handle, 0)) };
        self.costs.map_ns += clock::monotonic_ns() - t;
        r == SUCCESS || self.refused()
    }

    fn device_memory(&mut self) -> Option<(u64, u64)> {
        let _current = InContext::enter(self.ctx)?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: the driver's `cuMemGetInfo_v2` writes only into `free` and `total`, live locals.
        let r = unsafe { real!(cuMemGetInfo_v2(&mut free, &mut total)) };
        (r == SUCCESS).then_some((free as u64, total as u64))
    }

    fn grant(&mut self, addr: u64, size: u64) -> bool {
        let Some(_current) = InContext::enter(self.ctx) else { return self.refused() };
        let t = clock::monotonic_ns();
        // SAFETY: the driver's `cuMemSetAccess` reads `self.access.len()` descriptors from `self.access`,
        // alive for the call.
        let r = unsafe { real!(cuMemSetAccess(addr, size as usize, self.access.as_ptr(), self.access.len())) };
        self.costs.access_ns += clock::monotonic_ns() - t;
        r == SUCCESS || self.refused()
    }

    fn unmap(&mut self, addr: u64, size: u64) {
        // Only pages no block holds and no queued work can touch come here
        // (the pool's fences), so the unmap cannot pull memory from under a kernel.
        let _current = InContext::enter(self.ctx);
        let t = clock::monotonic_ns();
        // SAFETY: the driver's `cuMemUnmap` of a range the VMM pool mapped; only pages no block holds and no
        // queued work can touch come here (the pool's fences).
        unsafe { real!(cuMemUnmap(addr, size as usize)) };
        self.costs.unmap_ns += clock::monotonic_ns() - t;
    }

    fn release_page(&mut self, handle: u64) {
        let _current = InContext::enter(self.ctx);
        let t = clock::monotonic_ns();
        // SAFETY: the driver's `cuMemRelease` of a page this backend created; the VMM pool releases each page
        // once, after unmapping it.
        unsafe { real!(cuMemRelease(handle)) };
        self.costs.release_ns += clock::monotonic_ns() - t;
    }
}

impl Timeline for CudaPages {
    cupool_core::delegate_timeline!(timeline);
}
