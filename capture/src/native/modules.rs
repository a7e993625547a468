//! The loaded modules as the dynamic linker lists them, read from their
//! program headers in memory: address ranges, the build id, and where the
//! `.eh_frame_hdr` / `.eh_frame` unwind tables lie.
//!
//! Everything here allocates and takes the loader's lock: it runs when
//! modules are registered or listed, never on a capture's fast path.

use std::ffi::{c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use libc::{dl_phdr_info, Elf64_Phdr, PF_R, PT_GNU_EH_FRAME, PT_LOAD, PT_NOTE};

use super::ModuleInfo;

/// A range of memory inside one of a module's readable `PT_LOAD` segments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Region {
    pub addr: u64,
    pub len: usize,
}

/// What identifies one loaded object: no two live objects share a load
/// bias, and the program-header address tells a reload at the same place
/// apart from the object seen before.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Key {
    pub name: CString,
    pub base: u64,
    pub phdr: u64,
}

/// One module read from its program headers.
pub(crate) struct Parsed {
    pub key: Key,
    pub info: ModuleInfo,
    pub eh_frame_hdr: Option<Region>,
    /// Starts at `.eh_frame` and runs to the end of its segment: finding the
    /// section's exact end would mean walking every CIE/FDE, faulting in all
    /// of a large library's unwind pages up front. The unwinder only reads
    /// the entries the index points at, and gimli bounds every read by it.
    pub eh_frame: Option<Region>,
    /// The header's search table is usable; without it framehop indexes the
    /// entries itself.
    pub hdr_has_table: bool,
}

/// Calls `f` for every loaded object, under the loader's lock, with the
/// loader's count of objects ever loaded (`dlpi_adds`; 0 when the loader does
/// not say). The count only grows, so an unchanged one means nothing was
/// loaded since. `f` returns whether to go on.
pub(crate) fn iterate(f: &mut dyn FnMut(&dl_phdr_info, u64) -> bool) {
    unsafe extern "C" fn callback(info: *mut dl_phdr_info, size: usize, data: *mut c_void) -> c_int {
        // SAFETY: `data` is the closure passed below, alive for the whole call.
        let f = unsafe { &mut *(data as *mut &mut dyn FnMut(&dl_phdr_info, u64) -> bool) };
        if info.is_null() {
            return 0;
        }
        // SAFETY: the loader hands a valid entry for the duration of the callback.
        let info = unsafe { &*info };
        let adds = if size >= std::mem::offset_of!(dl_phdr_info, dlpi_subs) { info.dlpi_adds } else { 0 };
        // A panic must not unwind into the loader (it would abort the program).
        match catch_unwind(AssertUnwindSafe(|| f(info, adds))) {
            Ok(true) => 0,
            _ => 1,
        }
    }
    let mut f = f;
    // SAFETY: the callback only touches `f`, which outlives the call.
    unsafe {
        libc::dl_iterate_phdr(Some(callback), &mut f as *mut &mut dyn FnMut(&dl_phdr_info, u64) -> bool as *mut c_void)
    };
}

fn phdrs(info: &dl_phdr_info) -> &[Elf64_Phdr] {
    if info.dlpi_phdr.is_null() || info.dlpi_phnum == 0 {
        return &[];
    }
    // SAFETY: the loader's entry describes `dlpi_phnum` headers at `dlpi_phdr`.
    unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) }
}

pub(crate) fn key_of(info: &dl_phdr_info) -> Key {
    let name = if info.dlpi_name.is_null() {
        CString::default()
    } else {
        // SAFETY: a NUL-terminated string owned by the loader.
        unsafe { CStr::from_ptr(info.dlpi_name) }.to_owned()
    };
    Key { name, base: info.dlpi_addr, phdr: info.dlpi_phdr as u64 }
}

/// Reads one module. Must run inside [`iterate`]'s callback (the module cannot
/// be unloaded meanwhile). Returns `None` for an entry with no loadable segment.
pub(crate) fn parse(info: &dl_phdr_info) -> Option<Parsed> {
    let base = info.dlpi_addr;
    let headers = phdrs(info);
    // Runtime ranges of the loadable segments; only memory inside a readable
    // one is ever read.
    let loads: Vec<(u64, u64, bool)> = headers
        .iter()
        .filter(|p| p.p_type == PT_LOAD && p.p_memsz > 0)
        .filter_map(|p| {
            // Wrapping: a prelinked object loaded below its link address has
            // a "negative" bias.
            let start = base.wrapping_add(p.p_vaddr);
            Some((start, start.checked_add(p.p_memsz)?, p.p_flags & PF_R != 0))
        })
        .collect();
    let start = loads.iter().map(|l| l.0).min()?;
    let end = loads.iter().map(|l| l.1).max()?;
    let readable_end = |addr: u64| loads.iter().find(|l| l.2 && l.0 <= addr && addr < l.1).map(|l| l.1);
    let region = |addr: u64, len: u64| -> Option<Region> {
        let seg_end = readable_end(addr)?;
        (len > 0 && addr.checked_add(len)? <= seg_end).then_some(Region { addr, len: len as usize })
    };

    let mut build_id = Vec::new();
    let mut eh_frame_hdr = None;
    for p in headers {
        let addr = base.wrapping_add(p.p_vaddr);
        match p.p_type {
            PT_NOTE if build_id.is_empty() => {
                if let Some(r) = region(addr, p.p_memsz) {
                    let align = if p.p_align == 8 { 8 } else { 4 };
                    build_id = find_build_id(bytes(r), align).unwrap_or_default();
                }
            }
            PT_GNU_EH_FRAME => eh_frame_hdr = region(addr, p.p_memsz),
            _ => {}
        }
    }

    let mut eh_frame = None;
    let mut hdr_has_table = false;
    if let Some(hdr) = eh_frame_hdr {
        if let Some(parsed) = parse_eh_frame_hdr(bytes(hdr), hdr.addr) {
            hdr_has_table = parsed.has_table;
            eh_frame =
                readable_end(parsed.eh_frame).and_then(|seg_end| region(parsed.eh_frame, seg_end - parsed.eh_frame));
        }
    }

    let key = key_of(info);
    let path = key.name.to_string_lossy().into_owned();
    Some(Parsed { key, info: ModuleInfo { path, base, start, end, build_id }, eh_frame_hdr, eh_frame, hdr_has_table })
}

/// The bytes of a region of a loaded module.
pub(crate) fn bytes(r: Region) -> &'static [u8] {
    // SAFETY: regions are only made inside readable loaded segments; callers
    // use the slice while the module cannot be unloaded (inside the loader's
    // callback, or after pinning it, see `unwind::register`).
    unsafe { std::slice::from_raw_parts(r.addr as *const u8, r.len) }
}

fn find_build_id(notes: &[u8], align: usize) -> Option<Vec<u8>> {
    const NT_GNU_BUILD_ID: u32 = 3;
    let align_up = |x: usize| x.checked_add(align - 1).map(|x| x & !(align - 1));
    let mut pos = 0usize;
    while pos.checked_add(12)? <= notes.len() {
        let namesz = read_u32(notes, pos)? as usize;
        let descsz = read_u32(notes, pos + 4)? as usize;
        let kind = read_u32(notes, pos + 8)?;
        let name_end = (pos + 12).checked_add(namesz)?;
        let desc_start = align_up(name_end)?;
        let desc_end = desc_start.checked_add(descsz)?;
        if desc_end > notes.len() {
            return None;
        }
        if kind == NT_GNU_BUILD_ID && &notes[pos + 12..name_end] == b"GNU\0" {
            return Some(notes[desc_start..desc_end].to_vec());
        }
        pos = align_up(desc_end)?;
    }
    None
}

struct EhFrameHdr {
    /// Runtime address of `.eh_frame`.
    eh_frame: u64,
    has_table: bool,
}

/// Decodes the header of `.eh_frame_hdr` (`hdr_addr` is where it lies).
fn parse_eh_frame_hdr(hdr: &[u8], hdr_addr: u64) -> Option<EhFrameHdr> {
    const OMIT: u8 = 0xff;
    let (&version, rest) = hdr.split_first()?;
    if version != 1 || rest.len() < 3 {
        return None;
    }
    let (ptr_enc, count_enc, table_enc) = (rest[0], rest[1], rest[2]);
    let (eh_frame, used) = read_encoded(&hdr[4..], ptr_enc, hdr_addr + 4, hdr_addr)?;
    let count = if count_enc == OMIT || table_enc == OMIT {
        0
    } else {
        read_encoded(&hdr[4 + used..], count_enc, hdr_addr + 4 + used as u64, hdr_addr).map_or(0, |c| c.0)
    };
    Some(EhFrameHdr { eh_frame, has_table: count > 0 })
}

/// Reads one DWARF pointer-encoded value (`DW_EH_PE_*`) of fixed size.
/// `field_addr` is the value's own address (for pc-relative values),
/// `data_base` the `.eh_frame_hdr` start (data-relative ones). Returns the
/// value and how many bytes it took.
fn read_encoded(b: &[u8], enc: u8, field_addr: u64, data_base: u64) -> Option<(u64, usize)> {
    let (raw, size) = match enc & 0x0f {
        0x00 | 0x04 => (read_u64(b, 0)?, 8),
        0x02 => (u64::from(u16::from_le_bytes(b.get(..2)?.try_into().ok()?)), 2),
        0x03 => (u64::from(read_u32(b, 0)?), 4),
        0x0a => (i16::from_le_bytes(b.get(..2)?.try_into().ok()?) as i64 as u64, 2),
        0x0b => (read_u32(b, 0)? as i32 as i64 as u64, 4),
        0x0c => (read_u64(b, 0)?, 8),
        _ => return None,
    };
    let value = match enc & 0x70 {
        0x00 => raw,
        0x10 => field_addr.wrapping_add(raw),
        0x30 => data_base.wrapping_add(raw),
        _ => return None,
    };
    // An indirect pointer (0x80) would need a read through memory not
    // known to be mapped.
    (enc & 0x80 == 0).then_some((value, size))
}

fn read_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at.checked_add(4)?)?.try_into().ok()?))
}

fn read_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at.checked_add(8)?)?.try_into().ok()?))
}

/// Where the executable's, the vDSO's and the dynamic linker's headers lie
/// (auxiliary vector): those three stay mapped for the life of the process.
pub(crate) struct Permanent {
    exe_phdr: u64,
    vdso: u64,
    interp_base: u64,
}

impl Permanent {
    pub fn get() -> Self {
        // SAFETY: getauxval only reads the auxiliary vector; 0 means absent.
        unsafe {
            Permanent {
                exe_phdr: libc::getauxval(libc::AT_PHDR),
                vdso: libc::getauxval(libc::AT_SYSINFO_EHDR),
                interp_base: libc::getauxval(libc::AT_BASE),
            }
        }
    }

    pub fn is_exe(&self, key: &Key) -> bool {
        self.exe_phdr != 0 && key.phdr == self.exe_phdr
    }

    pub fn contains(&self, key: &Key, start: u64, end: u64) -> bool {
        self.is_exe(key)
            || (self.vdso != 0 && (start..end).contains(&self.vdso))
            || (self.interp_base != 0 && key.base == self.interp_base)
    }
}

/// Takes a reference on the loaded object `key` names, so that it stays
/// mapped for good. Fails (taking nothing) when the name finds no object, or
/// a different one than the entry seen (another namespace, a reload).
pub(crate) fn pin(key: &Key) -> bool {
    // Minimal prefix of glibc's `struct link_map` (public <link.h> layout).
    #[repr(C)]
    struct LinkMap {
        l_addr: u64,
    }
    if key.name.is_empty() {
        return false;
    }
    // SAFETY: RTLD_NOLOAD never loads or initialises anything; it only looks
    // up an object already loaded and, when found, counts one more reference.
    let handle = unsafe { libc::dlopen(key.name.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
    if handle.is_null() {
        return false;
    }
    let mut map: *const LinkMap = std::ptr::null();
    // SAFETY: RTLD_DI_LINKMAP stores one pointer to the object's link_map.
    let ok = unsafe { libc::dlinfo(handle, libc::RTLD_DI_LINKMAP, &mut map as *mut _ as *mut c_void) } == 0
        && !map.is_null()
        // SAFETY: a live link_map, kept alive by the reference just taken.
        && unsafe { (*map).l_addr } == key.base;
    if !ok {
        // SAFETY: drops the one reference taken above.
        unsafe { libc::dlclose(handle) };
    }
    ok
}

/// The modules loaded now; see [`super::loaded_modules`].
pub(crate) fn list() -> Vec<ModuleInfo> {
    let permanent = Permanent::get();
    let mut out = Vec::new();
    iterate(&mut |info, _| {
        if let Some(p) = parse(info) {
            let is_exe = permanent.is_exe(&p.key);
            out.push((p.info, is_exe));
        }
        true
    });
    let exe_path = std::fs::read_link("/proc/self/exe").ok().map(|p| p.to_string_lossy().into_owned());
    out.into_iter()
        .map(|(mut info, is_exe)| {
            if is_exe && info.path.is_empty() {
                if let Some(path) = &exe_path {
                    info.path = path.clone();
                }
            }
            info
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pc_relative_sdata4_is_decoded_from_the_fields_address() {
        let field = (-0x100i32).to_le_bytes();
        assert_eq!(read_encoded(&field, 0x1b, 0x5000, 0), Some((0x4f00, 4)));
    }

    #[test]
    fn data_relative_and_absolute_values() {
        assert_eq!(read_encoded(&8u32.to_le_bytes(), 0x33, 0, 0x1000), Some((0x1008, 4)));
        assert_eq!(read_encoded(&0x1234u64.to_le_bytes(), 0x00, 0, 0), Some((0x1234, 8)));
        assert_eq!(read_encoded(&[1, 2, 3, 4], 0x9b, 0, 0), None, "indirect");
        assert_eq!(read_encoded(&[1, 2], 0x0b, 0, 0), None, "short");
    }

    #[test]
    fn build_id_note_is_found_after_another_note() {
        let mut notes = Vec::new();
        for (kind, name, desc) in [(1u32, &b"GNU\0"[..], &[9u8; 16][..]), (3, b"GNU\0", &[0xab, 0xcd, 0xef])] {
            notes.extend((name.len() as u32).to_le_bytes());
            notes.extend((desc.len() as u32).to_le_bytes());
            notes.extend(kind.to_le_bytes());
            notes.extend(name);
            notes.extend(desc);
            notes.resize(notes.len().next_multiple_of(4), 0);
        }
        assert_eq!(find_build_id(&notes, 4), Some(vec![0xab, 0xcd, 0xef]));
        assert_eq!(find_build_id(&notes[..notes.len() - 8], 4), None, "truncated");
    }

    #[test]
    fn hdr_without_a_table_is_told_apart() {
        let mut hdr = vec![1, 0x1b, 0xff, 0xff];
        hdr.extend(0x40i32.to_le_bytes());
        let parsed = parse_eh_frame_hdr(&hdr, 0x1000).unwrap();
        assert_eq!(parsed.eh_frame, 0x1044);
        assert!(!parsed.has_table);
        hdr[2] = 0x03;
        hdr[3] = 0x3b;
        hdr.extend(5u32.to_le_bytes());
        assert!(parse_eh_frame_hdr(&hdr, 0x1000).unwrap().has_table);
        assert!(parse_eh_frame_hdr(&[2, 0x1b, 0xff, 0xff, 0, 0, 0, 0], 0).is_none(), "version");
    }
}
