//! cupool as an NVTX *client* of another tool, doing what the header-only
//! NVTX v3 library does inside every program that includes it: load the
//! library named by `NVTX_INJECTION64_PATH`, give its
//! `InitializeInjectionNvtx2` an export table whose function slots it fills
//! (of those cupool uses only `nvtxDomainCreateA`), then give its
//! `InitializeInjectionNvtxExtension` the slots of the memory module
//! (`nvToolsExtMem.h`). Ids and layouts are NVTX's (`nvtxTypes.h`,
//! `nvtxExtTypes.h`, `nvToolsExtMem.h`); a tool checks the sizes it is given,
//! so each struct carries its own.

use crate::cuda::resolve::dlsym;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::mem::size_of;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// NVTX_VERSION of the headers whose protocol this follows.
const NVTX_VERSION: u16 = 3;

// ---- core modules: the export table a tool attaches through --------------

/// Callback ids per core module (`NvtxCallbackModule` 1..=6: core, CUDA,
/// OpenCL, CUDA runtime, core2, sync), as NVTX reports them.
const MODULE_SIZES: [usize; 7] = [0, 16, 9, 15, 7, 16, 7];
const MAX_IDS: usize = 16;
const MODULE_CORE2: usize = 5;
const CORE2_DOMAIN_CREATE_A: usize = 12;

/// Function slots the tool fills, and per module the table of pointers to
/// them that NVTX hands out (null at id 0 and past the end, as NVTX's).
struct CoreTables {
    slots: [[AtomicUsize; MAX_IDS]; 7],
    tables: [[AtomicPtr<usize>; MAX_IDS + 1]; 7],
}

static CORE: CoreTables = CoreTables {
    slots: [const { [const { AtomicUsize::new(0) }; MAX_IDS] }; 7],
    tables: [const { [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_IDS + 1] }; 7],
};

unsafe extern "C" fn get_module_function_table(
    module: c_int,
    out_table: *mut *mut *mut usize,
    out_size: *mut c_uint,
) -> c_int {
    let Some(m) = usize::try_from(module).ok().filter(|&m| m < MODULE_SIZES.len() && MODULE_SIZES[m] > 0) else {
        return 0;
    };
    for id in 1..MODULE_SIZES[m] {
        CORE.tables[m][id].store(CORE.slots[m][id].as_ptr(), Ordering::Release);
    }
    if !out_size.is_null() {
        *out_size = MODULE_SIZES[m] as c_uint;
    }
    if !out_table.is_null() {
        *out_table = CORE.tables[m].as_ptr() as *mut *mut usize;
    }
    1
}

/// `NvtxExportTableCallbacks`.
#[repr(C)]
struct Callbacks {
    struct_size: usize,
    get_module_function_table: unsafe extern "C" fn(c_int, *mut *mut *mut usize, *mut c_uint) -> c_int,
}

/// `NvtxExportTableVersionInfo`.
#[repr(C)]
struct VersionInfo {
    struct_size: usize,
    version: u32,
    reserved0: u32,
    set_injection_nvtx_version: extern "C" fn(u32),
}

extern "C" fn set_injection_nvtx_version(_version: u32) {}

static CALLBACKS: Callbacks = Callbacks { struct_size: size_of::<Callbacks>(), get_module_function_table };
static VERSION_INFO: VersionInfo = VersionInfo {
    struct_size: size_of::<VersionInfo>(),
    version: NVTX_VERSION as u32,
    reserved0: 0,
    set_injection_nvtx_version,
};

unsafe extern "C" fn get_export_table(id: u32) -> *const c_void {
    match id {
        1 => (&raw const CALLBACKS).cast(),    // NVTX_ETID_CALLBACKS
        3 => (&raw const VERSION_INFO).cast(), // NVTX_ETID_VERSIONINFO
        _ => std::ptr::null(),
    }
}

type InitCore = unsafe extern "C" fn(unsafe extern "C" fn(u32) -> *const c_void) -> c_int;

// ---- the memory extension -------------------------------------------------

const MODULE_ID_MEM: u16 = 1;
const COMPAT_ID_MEM: u16 = 0x0102;
const HEAP_REGISTER: usize = 1;
const HEAP_UNREGISTER: usize = 2;
const HEAP_RESET: usize = 3;
const REGIONS_REGISTER: usize = 4;
const REGIONS_UNREGISTER: usize = 6;

const HEAP_USAGE_SUB_ALLOCATOR: u32 = 1;
const MEM_TYPE_VIRTUAL_ADDRESS: u32 = 1;
const REGION_REF_POINTER: u32 = 1;
const MESSAGE_ASCII: u32 = 1;

/// The memory module's function slots as NVTX versions lay them out, as
/// (segment id, slots): the `dev-mem-api` headers that compute-sanitizer's
/// own sample builds with (slot 0 holds callback id 1), NVTX 3.2 and later
/// (slot i holds id i), and the 2024 `dev` headers (the same, from segment 0).
/// A tool fills only a layout it knows, so each is offered in turn:
/// compute-sanitizer 2025.3 fills the first and ignores the last.
const LAYOUTS: [(usize, usize); 3] = [(1, 16), (1, 63), (0, 17)];

static MEM_SLOTS: [AtomicUsize; 64] = [const { AtomicUsize::new(0) }; 64];

extern "C" fn get_export_function(_id: u32) -> isize {
    0 // the memory module exports nothing
}

/// `nvtxExtModuleSegment_t`.
#[repr(C)]
struct ModuleSegment {
    segment_id: usize,
    slot_count: usize,
    function_slots: *mut usize,
}

/// `nvtxExtModuleInfo_t`.
#[repr(C)]
struct ModuleInfo {
    nvtx_ver: u16,
    struct_size: u16,
    module_id: u16,
    compat_id: u16,
    segments_count: usize,
    segments: *mut ModuleSegment,
    get_export_function: extern "C" fn(u32) -> isize,
    ext_info: *const c_void,
}

type InitExtension = unsafe extern "C" fn(*mut ModuleInfo) -> c_int;

/// `nvtxMemVirtualRangeDesc_t`.
#[repr(C)]
struct VirtualRange {
    size: usize,
    ptr: u64,
}

/// `nvtxMemHeapDesc_t`.
#[repr(C)]
struct HeapDesc {
    ext_compat_id: u16,
    struct_size: u16,
    reserved0: u32,
    usage: u32,
    kind: u32,
    type_specific_desc_size: usize,
    type_specific_desc: *const VirtualRange,
    category: u32,
    message_type: u32,
    message: *const c_char,
}

/// `nvtxMemRegionsRegisterBatch_t`.
#[repr(C)]
struct RegionsRegister {
    ext_compat_id: u16,
    struct_size: u16,
    region_type: u32,
    heap: usize,
    region_count: usize,
    region_desc_element_size: usize,
    region_desc_elements: *const VirtualRange,
    region_handle_elements_out: *mut usize,
}

/// `nvtxMemRegionsUnregisterBatch_t`.
#[repr(C)]
struct RegionsUnregister {
    ext_compat_id: u16,
    struct_size: u16,
    ref_type: u32,
    ref_count: usize,
    ref_element_size: usize,
    ref_elements: *const u64,
}

type HeapRegister = unsafe extern "C" fn(usize, *const HeapDesc) -> usize;
type HeapRelease = unsafe extern "C" fn(usize, usize);
type RegisterRegions = unsafe extern "C" fn(usize, *const RegionsRegister);
type UnregisterRegions = unsafe extern "C" fn(usize, *const RegionsUnregister);
type DomainCreateA = unsafe extern "C" fn(*const c_char) -> usize;

/// The tool's memory functions, and cupool's domain.
pub struct Mem {
    domain: usize,
    heap_register: HeapRegister,
    /// `nvtxMemHeapUnregister`, or `nvtxMemHeapReset` from a tool without it.
    heap_release: HeapRelease,
    regions_register: RegisterRegions,
    regions_unregister: UnregisterRegions,
}

impl Mem {
    /// Registers `size` bytes at `addr` as a sub-allocator heap: the tool
    /// then treats every byte of it outside a registered region as unallocated.
    pub fn register_heap(&self, addr: u64, size: u64) -> usize {
        let range = VirtualRange { size: size as usize, ptr: addr };
        let desc = HeapDesc {
            ext_compat_id: COMPAT_ID_MEM,
            struct_size: size_of::<HeapDesc>() as u16,
            reserved0: 0,
            usage: HEAP_USAGE_SUB_ALLOCATOR,
            kind: MEM_TYPE_VIRTUAL_ADDRESS,
            type_specific_desc_size: size_of::<VirtualRange>(),
            type_specific_desc: &range,
            category: 0,
            message_type: MESSAGE_ASCII,
            message: c"cupool pool segment".as_ptr(),
        };
        // SAFETY: `heap_register` is the tool's `nvtxMemHeapRegister` (a slot it filled in `offer`), of
        // NVTX's prototype `HeapRegister`; `desc` and the range it points to live until the call returns, and
        // a tool copies what it keeps.
        unsafe { (self.heap_register)(self.domain, &desc) }
    }

    pub fn unregister_heap(&self, heap: usize) {
        // A null handle is NVTX's "whole process" heap, which cannot be unregistered.
        if heap != 0 {
            // SAFETY: `heap_release` is the tool's `nvtxMemHeapUnregister` or `nvtxMemHeapReset` (`offer`),
            // of NVTX's prototype `HeapRelease`; `heap` is a handle that tool returned from `register_heap`.
            unsafe { (self.heap_release)(self.domain, heap) }
        }
    }

    pub fn register_region(&self, heap: usize, addr: u64, size: u64) {
        let range = VirtualRange { size: size as usize, ptr: addr };
        let batch = RegionsRegister {
            ext_compat_id: COMPAT_ID_MEM,
            struct_size: size_of::<RegionsRegister>() as u16,
            region_type: MEM_TYPE_VIRTUAL_ADDRESS,
            heap,
            region_count: 1,
            region_desc_element_size: size_of::<VirtualRange>(),
            region_desc_elements: &range,
            region_handle_elements_out: std::ptr::null_mut(), // a virtual-address region is named by its address
        };
        // SAFETY: `regions_register` is the tool's `nvtxMemRegionsRegister` (`offer`), of NVTX's prototype;
        // `batch` and the range it points to live until the call returns, and the null out-pointer asks for
        // no region handles.
        unsafe { (self.regions_register)(self.domain, &batch) }
    }

    pub fn unregister_region(&self, addr: u64) {
        let batch = RegionsUnregister {
            ext_compat_id: COMPAT_ID_MEM,
            struct_size: size_of::<RegionsUnregister>() as u16,
            ref_type: REGION_REF_POINTER,
            ref_count: 1,
            ref_element_size: size_of::<u64>(),
            ref_elements: &addr,
        };
        // SAFETY: `regions_unregister` is the tool's `nvtxMemRegionsUnregister` (`offer`), of NVTX's
        // prototype; `batch` and `addr`, which it points to, live until the call returns.
        unsafe { (self.regions_unregister)(self.domain, &batch) }
    }
}

/// Attaches to the memory extension of the tool named by
/// `NVTX_INJECTION64_PATH`. `Ok(None)`: there is no tool to tell, or it is
/// cupool itself; `Err`: why a tool that is there cannot be told.
pub fn attach() -> Result<Option<Mem>, String> {
    let Some(path) = std::env::var_os("NVTX_INJECTION64_PATH").filter(|p| !p.is_empty()) else {
        return Ok(None);
    };
    let name = path.to_string_lossy().into_owned();
    let c_path = CString::new(path.as_bytes()).map_err(|_| "NVTX_INJECTION64_PATH holds a NUL byte".to_string())?;
    // SAFETY: `c_path` is a NUL-terminated string alive for the call. Loading the tool runs its initialisers,
    // as the NVTX library itself would in a program that uses NVTX.
    let tool = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_LAZY) };
    if tool.is_null() {
        return Err(format!("cannot load the NVTX tool {name}"));
    }
    // Another copy of cupool is cupool too: it takes no memory annotations.
    // SAFETY: `tool` is the handle `dlopen` just returned (checked non-null); the name is a NUL-terminated
    // literal.
    if tool == own_handle() || !unsafe { dlsym(tool, c"cupool_api_version") }.is_null() {
        return Ok(None);
    }
    // SAFETY: `tool` is the handle `dlopen` just returned (checked non-null); the name is a NUL-terminated
    // literal.
    let init_extension = unsafe { dlsym(tool, c"InitializeInjectionNvtxExtension") };
    if init_extension.is_null() {
        return Err(format!("the NVTX tool {name} has no memory extension"));
    }
    // NVTX initialises the core first; a failure there leaves the extension to try alone.
    // SAFETY: `tool` is the handle `dlopen` just returned (checked non-null); the name is a NUL-terminated
    // literal.
    let init_core = unsafe { dlsym(tool, c"InitializeInjectionNvtx2") };
    if !init_core.is_null() {
        // SAFETY: `init_core` is the tool's non-null `InitializeInjectionNvtx2`, whose prototype NVTX fixes
        // as `InitCore`; `get_export_table` answers only with pointers to statics, valid for the process.
        unsafe { std::mem::transmute::<*mut c_void, InitCore>(init_core)(get_export_table) };
    }
    // SAFETY: `init_extension` is the tool's non-null `InitializeInjectionNvtxExtension`, whose prototype
    // NVTX fixes as `InitExtension`.
    let init_extension = unsafe { std::mem::transmute::<*mut c_void, InitExtension>(init_extension) };
    let Some(functions) = LAYOUTS.iter().find_map(|&layout| offer(init_extension, layout)) else {
        return Err(format!("the NVTX tool {name} registers no heaps and regions"));
    };
    let [heap_register, heap_release, regions_register, regions_unregister] = functions;
    // SAFETY: each value is a function slot the tool filled (`offer` keeps only slots above 1, NVTX's
    // "disabled" mark) for the callback id that NVTX's memory extension gives that prototype; `domain` calls
    // the tool's `nvtxDomainCreateA` the same way.
    Ok(Some(unsafe {
        Mem {
            domain: domain(),
            heap_register: std::mem::transmute::<usize, HeapRegister>(heap_register),
            heap_release: std::mem::transmute::<usize, HeapRelease>(heap_release),
            regions_register: std::mem::transmute::<usize, RegisterRegions>(regions_register),
            regions_unregister: std::mem::transmute::<usize, UnregisterRegions>(regions_unregister),
        }
    }))
}

/// Offers the memory module in one slot layout; the functions cupool needs
/// when the tool filled them: heap register, heap unregister (or reset),
/// regions register and unregister.
fn offer(init_extension: InitExtension, (segment_id, slot_count): (usize, usize)) -> Option<[usize; 4]> {
    for slot in &MEM_SLOTS {
        slot.store(0, Ordering::Relaxed);
    }
    let mut segment = ModuleSegment { segment_id, slot_count, function_slots: MEM_SLOTS.as_ptr().cast_mut().cast() };
    let mut info = ModuleInfo {
        nvtx_ver: NVTX_VERSION,
        struct_size: size_of::<ModuleInfo>() as u16,
        module_id: MODULE_ID_MEM,
        compat_id: COMPAT_ID_MEM,
        segments_count: 1,
        segments: &mut segment,
        get_export_function,
        ext_info: std::ptr::null(),
    };
    // SAFETY: `init_extension` is the tool's extension initialiser (NVTX's prototype); `info` and the
    // `segment` it points to live until it returns, and the slots it may fill are `MEM_SLOTS`, a static of
    // `slot_count` or more atomics.
    if unsafe { init_extension(&mut info) } == 0 {
        return None;
    }
    // NVTX marks slots a tool left as 1 (disabled). Slot 0 is filled only by
    // a tool that puts callback id 1 there, whatever layout it was offered.
    let filled = |i: usize| Some(MEM_SLOTS[i].load(Ordering::Acquire)).filter(|&f| f > 1);
    let first = usize::from(filled(0).is_none());
    let slot = |id: usize| filled(id - 1 + first);
    Some([
        slot(HEAP_REGISTER)?,
        slot(HEAP_UNREGISTER).or(slot(HEAP_RESET))?,
        slot(REGIONS_REGISTER)?,
        slot(REGIONS_UNREGISTER)?,
    ])
}

/// cupool's own domain, so the tool can tell its annotations from the
/// program's; the global domain (0) when the tool creates none.
fn domain() -> usize {
    match CORE.slots[MODULE_CORE2][CORE2_DOMAIN_CREATE_A].load(Ordering::Acquire) {
        0 => 0,
        // SAFETY: `create` is the function the tool put in the core2 slot of `nvtxDomainCreateA` (non-zero),
        // of NVTX's prototype `DomainCreateA`; the name is a NUL-terminated literal.
        create => unsafe { std::mem::transmute::<usize, DomainCreateA>(create)(c"cupool".as_ptr()) },
    }
}

/// This library's handle, to recognise `NVTX_INJECTION64_PATH` naming it
/// (`cupool run` sets it so), whatever path it is named by.
fn own_handle() -> *mut c_void {
    // SAFETY: `Dl_info` is pointers and integers: all-zero (null pointers) is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let here = own_handle as fn() -> *mut c_void as *const c_void;
    // SAFETY: `dladdr` only writes into `info`, a live local; `here` is the address of a function of this
    // library.
    if unsafe { libc::dladdr(here, &mut info) } == 0 || info.dli_fname.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: `dladdr` succeeded and `dli_fname` is non-null: a NUL-terminated path the dynamic linker keeps
    // while this library is loaded, which is for the whole process.
    let file: &CStr = unsafe { CStr::from_ptr(info.dli_fname) };
    // SAFETY: `file` is a NUL-terminated path; with `RTLD_NOLOAD` nothing is loaded, so no initialiser runs.
    unsafe { libc::dlopen(file.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) }
}
