//! cupool as an NVTX tool. NVTX (header-only, v3) loads the library named by
//! `NVTX_INJECTION64_PATH` on a program's first NVTX call and calls its
//! `InitializeInjectionNvtx2`, which fills NVTX's function slots; `cupool run`
//! points that variable at the shim. Only ranges are taken (as phases); every
//! other slot stays NVTX's own no-op.

#![allow(non_snake_case)]

use crate::intercept::phases::{self, Message};
use cupool_core::log::Api;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

type GetExportTable = unsafe extern "C" fn(u32) -> *const c_void;
type Slot = *mut *const c_void;
type GetModuleFunctionTable = unsafe extern "C" fn(c_int, *mut *mut Slot, *mut c_uint) -> c_int;

/// `NvtxExportTableCallbacks`.
#[repr(C)]
struct ExportTableCallbacks {
    struct_size: usize,
    get_module_function_table: Option<GetModuleFunctionTable>,
}

const ETID_CALLBACKS: u32 = 1;
const MODULE_CORE: c_int = 1;
const MODULE_CORE2: c_int = 5;

/// `nvtxEventAttributes_t` (v2/v3 layout), up to the message.
#[repr(C)]
pub struct EventAttributes {
    version: u16,
    size: u16,
    category: u32,
    color_type: i32,
    color: u32,
    payload_type: i32,
    reserved0: i32,
    payload: u64,
    message_type: i32,
    message: *const c_void,
}

const MESSAGE_ASCII: i32 = 1;
const MESSAGE_UNICODE: i32 = 2;
const MESSAGE_REGISTERED: i32 = 3;

/// The text is borrowed, not copied, when it is UTF-8 (XLA names every
/// operation it runs): a message lives for the NVTX call that carries it,
/// and its `Message` does not outlive the hook.
unsafe fn ascii<'a>(s: *const c_char) -> Message<'a> {
    if s.is_null() {
        Message::None
    } else {
        Message::Text(String::from_utf8_lossy(CStr::from_ptr(s).to_bytes()))
    }
}

/// `wchar_t` is UTF-32 on Linux.
unsafe fn wide<'a>(s: *const u32) -> Message<'a> {
    if s.is_null() {
        return Message::None;
    }
    let mut text = String::new();
    for i in 0..4096 {
        match *s.add(i) {
            0 => break,
            c => text.push(char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER)),
        }
    }
    Message::Text(text.into())
}

unsafe fn message_of<'a>(attr: *const EventAttributes) -> Message<'a> {
    // Attributes too small to hold a message carry none.
    if attr.is_null() || ((*attr).size as usize) < std::mem::size_of::<EventAttributes>() {
        return Message::None;
    }
    match (*attr).message_type {
        MESSAGE_ASCII => ascii((*attr).message.cast()),
        MESSAGE_UNICODE => wide((*attr).message.cast()),
        MESSAGE_REGISTERED => Message::Registered((*attr).message as usize),
        _ => Message::None,
    }
}

unsafe extern "C" fn range_push_a(message: *const c_char) -> c_int {
    phases::nvtx_push(Api::NvtxRangePushA, 0, ascii(message))
}
unsafe extern "C" fn range_push_w(message: *const u32) -> c_int {
    phases::nvtx_push(Api::NvtxRangePushW, 0, wide(message))
}
unsafe extern "C" fn range_push_ex(attr: *const EventAttributes) -> c_int {
    phases::nvtx_push(Api::NvtxRangePushEx, 0, message_of(attr))
}
extern "C" fn range_pop() -> c_int {
    phases::nvtx_pop(Api::NvtxRangePop, 0)
}
unsafe extern "C" fn range_start_a(message: *const c_char) -> u64 {
    phases::nvtx_start(Api::NvtxRangeStartA, ascii(message))
}
unsafe extern "C" fn range_start_w(message: *const u32) -> u64 {
    phases::nvtx_start(Api::NvtxRangeStartW, wide(message))
}
unsafe extern "C" fn range_start_ex(attr: *const EventAttributes) -> u64 {
    phases::nvtx_start(Api::NvtxRangeStartEx, message_of(attr))
}
extern "C" fn range_end(id: u64) {
    phases::nvtx_end(Api::NvtxRangeEnd, id)
}
unsafe extern "C" fn domain_range_push_ex(domain: *const c_void, attr: *const EventAttributes) -> c_int {
    phases::nvtx_push(Api::NvtxDomainRangePushEx, domain as usize, message_of(attr))
}
extern "C" fn domain_range_pop(domain: *const c_void) -> c_int {
    phases::nvtx_pop(Api::NvtxDomainRangePop, domain as usize)
}
unsafe extern "C" fn domain_range_start_ex(_domain: *const c_void, attr: *const EventAttributes) -> u64 {
    phases::nvtx_start(Api::NvtxDomainRangeStartEx, message_of(attr))
}
extern "C" fn domain_range_end(_domain: *const c_void, id: u64) {
    phases::nvtx_end(Api::NvtxDomainRangeEnd, id)
}
unsafe extern "C" fn domain_register_string_a(_domain: *const c_void, text: *const c_char) -> usize {
    match ascii(text) {
        Message::Text(t) => phases::register(&t),
        _ => phases::register(""),
    }
}
unsafe extern "C" fn domain_register_string_w(_domain: *const c_void, text: *const u32) -> usize {
    match wide(text) {
        Message::Text(t) => phases::register(&t),
        _ => phases::register(""),
    }
}
/// A domain's handle: an id of its own (never null), so that push/pop
/// ranges nest per domain as NVTX says.
extern "C" fn domain_create(_name: *const c_void) -> usize {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Fills `module`'s slots at the given callback ids.
unsafe fn fill(get: GetModuleFunctionTable, module: c_int, handlers: impl Iterator<Item = (usize, *const c_void)>) {
    let mut table: *mut Slot = std::ptr::null_mut();
    let mut size: c_uint = 0;
    if get(module, &mut table, &mut size) == 0 || table.is_null() {
        return;
    }
    for (cbid, handler) in handlers {
        if cbid < size as usize {
            let slot = *table.add(cbid);
            if !slot.is_null() {
                *slot = handler;
            }
        }
    }
}

/// Called by NVTX once per process, on its first call, when
/// `NVTX_INJECTION64_PATH` names this library. Returns 1 to attach.
#[no_mangle]
pub unsafe extern "C" fn InitializeInjectionNvtx2(get_export_table: Option<GetExportTable>) -> c_int {
    if !crate::runtime::options::get().nvtx {
        return 0;
    }
    let Some(get_export_table) = get_export_table else { return 0 };
    let callbacks = get_export_table(ETID_CALLBACKS).cast::<ExportTableCallbacks>();
    if callbacks.is_null() || (*callbacks).struct_size < std::mem::size_of::<ExportTableCallbacks>() {
        return 0;
    }
    let Some(get) = (*callbacks).get_module_function_table else { return 0 };
    // (module, NVTX's callback id in it (nvtxDetail/nvtxTypes.h), handler)
    let handlers: [(c_int, usize, *const c_void); 16] = [
        (MODULE_CORE, 4, range_start_ex as *const c_void),
        (MODULE_CORE, 5, range_start_a as *const c_void),
        (MODULE_CORE, 6, range_start_w as *const c_void),
        (MODULE_CORE, 7, range_end as *const c_void),
        (MODULE_CORE, 8, range_push_ex as *const c_void),
        (MODULE_CORE, 9, range_push_a as *const c_void),
        (MODULE_CORE, 10, range_push_w as *const c_void),
        (MODULE_CORE, 11, range_pop as *const c_void),
        (MODULE_CORE2, 2, domain_range_start_ex as *const c_void),
        (MODULE_CORE2, 3, domain_range_end as *const c_void),
        (MODULE_CORE2, 4, domain_range_push_ex as *const c_void),
        (MODULE_CORE2, 5, domain_range_pop as *const c_void),
        (MODULE_CORE2, 10, domain_register_string_a as *const c_void),
        (MODULE_CORE2, 11, domain_register_string_w as *const c_void),
        (MODULE_CORE2, 12, domain_create as *const c_void),
        (MODULE_CORE2, 13, domain_create as *const c_void),
    ];
    for module in [MODULE_CORE, MODULE_CORE2] {
        fill(get, module, handlers.iter().filter(|h| h.0 == module).map(|h| (h.1, h.2)));
    }
    1
}
