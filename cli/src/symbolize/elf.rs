//! One module's file: its build id, DWARF (its own or a separate debug
//! file's) and function symbols, read once and kept for lookups.

use std::borrow::Cow;
use std::fs::File;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};

/// Where distributions install separate debug files (`*-dbg`, `*-debuginfo`).
const DEBUG_ROOT: &str = "/usr/lib/debug";

/// How far back a lookup walks from the nearest preceding symbol for one that
/// covers the address: far enough for a function that encloses a few smaller
/// sized symbols, short enough that an address in no function stays cheap.
const NESTED_SYMBOLS: usize = 8;

pub(super) enum OpenError {
    /// No file at the path.
    Missing,
    /// The file is not the one that ran.
    BuildIdDiffers {
        on_disk: Vec<u8>,
    },
    Other(String),
}

/// Section bytes for gimli: a range of a mapped file, or bytes decompressed
/// from a compressed section. Either way the slice neither moves nor changes
/// while a clone lives, which is what gimli's `EndianReader` asks for.
#[derive(Clone, Debug)]
enum Bytes {
    Mapped { map: Arc<Mmap>, start: usize, len: usize },
    Owned(Arc<[u8]>),
}

impl Bytes {
    /// `part` is a slice of `map` when the section is stored as it is; the
    /// copy is for anything else (never expected from `object`, but a slice
    /// from elsewhere must not be turned into a range of the map).
    fn of(map: &Arc<Mmap>, part: &[u8]) -> Bytes {
        let base = map.as_ptr() as usize;
        let start = (part.as_ptr() as usize).wrapping_sub(base);
        if start <= map.len() && part.len() <= map.len() - start {
            Bytes::Mapped { map: map.clone(), start, len: part.len() }
        } else {
            Bytes::Owned(part.into())
        }
    }
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped { map, start, len } => &map[*start..*start + *len],
            Bytes::Owned(bytes) => bytes,
        }
    }
}

// SAFETY: the slice is inside an `Arc`'s allocation (the mapping or the
// owned bytes), which stays where it is for as long as any clone holds it.
unsafe impl gimli::StableDeref for Bytes {}
// SAFETY: as above: a clone of `Bytes` clones the `Arc`, so it derefs to the same slice, which stays where it
// is.
unsafe impl gimli::CloneStableDeref for Bytes {}

type Reader = gimli::EndianReader<gimli::RunTimeEndian, Bytes>;

/// One frame before the module's name and offset are added.
pub(super) struct RawFrame {
    pub function: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
}

pub(super) struct Lookup {
    /// Innermost first; empty when nothing names the address.
    pub frames: Vec<RawFrame>,
    /// What went wrong with the debug info, as a line for the report.
    pub debug_problem: Option<String>,
}

pub(super) struct Image {
    dwarf: Option<addr2line::Context<Reader>>,
    /// What went wrong loading the debug info, as a line for the report.
    debug_problem: Option<String>,
    symbols: Symbols,
}

impl Image {
    /// Reads the file at `path`, unless its build id is not `expected` (when
    /// both are known).
    pub fn open(path: &Path, expected: &[u8]) -> Result<Image, OpenError> {
        let map = map(path).map_err(|e| match e {
            MapError::Missing => OpenError::Missing,
            MapError::Other(why) => OpenError::Other(why),
        })?;
        let file =
            object::File::parse(&**map).map_err(|e| OpenError::Other(format!("not a readable ELF file ({e})")))?;
        // A corrupt note reads as no build id: the file is then trusted as the
        // log's, as a file that has none is.
        let build_id = file.build_id().ok().flatten().unwrap_or_default().to_vec();
        if !expected.is_empty() && !build_id.is_empty() && build_id != expected {
            return Err(OpenError::BuildIdDiffers { on_disk: build_id });
        }

        let mut symbols = Symbols::read(&file, &map, false);
        let (dwarf, debug_problem) = if has_dwarf(&file) {
            load_dwarf(&file, &map, path)
        } else if let Some((debug_path, debug_map)) = find_debug_file(path, &file, &build_id) {
            match object::File::parse(&**debug_map) {
                Ok(debug) => {
                    // `strip` and `objcopy --only-keep-debug` move the full
                    // symbol table into the debug file too.
                    if symbols.is_empty() {
                        symbols = Symbols::read(&debug, &debug_map, false);
                    }
                    load_dwarf(&debug, &debug_map, &debug_path)
                }
                Err(e) => {
                    (None, Some(unreadable(format_args!("{}: not a readable ELF file: {e}", debug_path.display()))))
                }
            }
        } else {
            (None, None)
        };
        if symbols.is_empty() {
            symbols = Symbols::read(&file, &map, true);
        }
        Ok(Image { dwarf, debug_problem, symbols })
    }

    /// The frames at `svma`, a file-relative address.
    pub fn lookup(&self, svma: u64) -> Lookup {
        let mut debug_problem = self.debug_problem.clone();
        let mut frames = Vec::new();
        if let Some(dwarf) = &self.dwarf {
            match dwarf_frames(dwarf, svma) {
                Ok(found) => frames = found,
                // Half a chain of inlined calls would be worse than none:
                // fall back to the symbol table whole.
                Err(e) => debug_problem = Some(unreadable(e)),
            }
        }
        // Code the DWARF covers without naming its function (assembly,
        // functions from objects built without -g) still has a symbol.
        if frames.last().is_none_or(|f| f.function.is_none()) {
            // A stripped library keeps only its exported functions: code
            // between them (its own hidden functions) is named after the
            // nearest exported one before it, `name+0xoffset`, as perf and
            // heaptrack name it.
            let name = match self.symbols.name_at(svma) {
                Some(name) => Some(addr2line::demangle_auto(name, None).into_owned()),
                None if self.symbols.dynamic => self
                    .symbols
                    .nearest_before(svma)
                    .map(|(name, start)| format!("{}+{:#x}", addr2line::demangle_auto(name, None), svma - start)),
                None => None,
            };
            if let Some(name) = name {
                match frames.last_mut() {
                    Some(outer) => outer.function = Some(name),
                    None => frames.push(RawFrame { function: Some(name), file: None, line: None }),
                }
            }
        }
        Lookup { frames, debug_problem }
    }
}

/// Maps the file rather than reading it: CUDA libraries run to hundreds of
/// megabytes, of which a lookup touches the symbol table and a few DWARF units.
enum MapError {
    Missing,
    Other(String),
}

fn map(path: &Path) -> Result<Arc<Mmap>, MapError> {
    let file = File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => MapError::Missing,
        _ => MapError::Other(format!("cannot open ({e})")),
    })?;
    // SAFETY: the mapping is private and read-only. A file truncated while
    // mapped would fault on access; reports read installed binaries and
    // libraries after the run, as debuggers and profilers do, and accept that.
    let map = unsafe { Mmap::map(&file) }.map_err(|e| MapError::Other(format!("cannot map ({e})")))?;
    Ok(Arc::new(map))
}

fn has_dwarf(file: &object::File) -> bool {
    file.section_by_name(".debug_info").is_some_and(|s| s.size() > 0)
}

/// The DWARF of `file` (at `path`), or why there is none; possibly both,
/// when it loads but without the supplementary file it refers to.
fn load_dwarf(
    file: &object::File,
    map: &Arc<Mmap>,
    path: &Path,
) -> (Option<addr2line::Context<Reader>>, Option<String>) {
    let endian = if file.is_little_endian() { gimli::RunTimeEndian::Little } else { gimli::RunTimeEndian::Big };
    let mut dwarf = match gimli::Dwarf::load(|id| section(file, map, id.name(), endian)) {
        Ok(dwarf) => dwarf,
        Err(e) => return (None, Some(unreadable(e))),
    };
    let mut warning = None;
    // dwz moves what several debug files share into one supplementary file.
    // Without it, line tables still read; the names it holds read as none.
    if let Ok(Some((sup_path, sup_id))) = file.gnu_debugaltlink() {
        let loaded = find_supplementary(path, sup_path, sup_id)
            .ok_or_else(|| format!("supplementary DWARF file {} not found", show(sup_path)))
            .and_then(|sup| {
                let sup_file = object::File::parse(&**sup)
                    .map_err(|e| format!("supplementary DWARF file {} unreadable ({e})", show(sup_path)))?;
                dwarf.load_sup(|id| section(&sup_file, &sup, id.name(), endian))
            });
        if let Err(e) = loaded {
            warning = Some(format!("{e}; lines still read, names only where the symbol table has them"));
        }
    }
    match addr2line::Context::from_dwarf(dwarf) {
        Ok(context) => (Some(context), warning),
        Err(e) => (None, Some(unreadable(e))),
    }
}

fn unreadable(e: impl std::fmt::Display) -> String {
    format!("debug info unreadable ({e}); names come from the symbol table")
}

fn section(file: &object::File, map: &Arc<Mmap>, name: &str, endian: gimli::RunTimeEndian) -> Result<Reader, String> {
    let bytes = match file.section_by_name(name) {
        None => Bytes::Owned(Arc::from(&[][..])),
        Some(section) => match section.uncompressed_data() {
            Ok(Cow::Borrowed(part)) => Bytes::of(map, part),
            Ok(Cow::Owned(data)) => Bytes::Owned(data.into()),
            Err(e) => return Err(format!("section {name} unreadable ({e})")),
        },
    };
    Ok(gimli::EndianReader::new(bytes, endian))
}

fn dwarf_frames(dwarf: &addr2line::Context<Reader>, svma: u64) -> Result<Vec<RawFrame>, gimli::Error> {
    // Split DWARF (.dwo) is not followed: its skeleton units still give lines.
    let mut iter = dwarf.find_frames(svma).skip_all_loads()?;
    let mut frames = Vec::new();
    while let Some(frame) = iter.next()? {
        let function = match &frame.function {
            Some(name) => Some(name.demangle()?.into_owned()),
            None => None,
        };
        let (file, line) = match frame.location {
            Some(loc) => (loc.file.map(str::to_owned), loc.line),
            None => (None, None),
        };
        frames.push(RawFrame { function, file, line });
    }
    Ok(frames)
}

/// The separate debug file of a stripped module, found the way gdb finds it:
/// by build id under /usr/lib/debug/.build-id, then by the file's
/// .gnu_debuglink name beside it, in .debug/ beside it, and under
/// /usr/lib/debug. A candidate counts only if it is that module's: same build
/// id, or, with no build id to compare, the CRC that the debuglink records.
fn find_debug_file(path: &Path, file: &object::File, build_id: &[u8]) -> Option<(PathBuf, Arc<Mmap>)> {
    if build_id.len() >= 2 {
        let hex = super::hex(build_id);
        let candidate = Path::new(DEBUG_ROOT).join(".build-id").join(&hex[..2]).join(format!("{}.debug", &hex[2..]));
        if let Some(found) = check_debug_file(&candidate, build_id, None) {
            return Some((candidate, found));
        }
    }
    let (name, crc) = file.gnu_debuglink().ok().flatten()?;
    let name = Path::new(os_str(name));
    // The debuglink is relative to the real file, not to a symlink to it
    // (libfoo.so.1 -> libfoo.so.1.2.3).
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let dir = real.parent()?;
    let under_root = Path::new(DEBUG_ROOT).join(dir.strip_prefix("/").unwrap_or(dir));
    for candidate in [dir.join(name), dir.join(".debug").join(name), under_root.join(name)] {
        if std::fs::canonicalize(&candidate).is_ok_and(|c| c == real) {
            continue;
        }
        if let Some(found) = check_debug_file(&candidate, build_id, Some(crc)) {
            return Some((candidate, found));
        }
    }
    None
}

fn check_debug_file(candidate: &Path, build_id: &[u8], crc: Option<u32>) -> Option<Arc<Mmap>> {
    let map = map(candidate).ok()?;
    let theirs = object::File::parse(&**map).ok()?.build_id().ok().flatten().unwrap_or_default().to_vec();
    let matches = if !build_id.is_empty() && !theirs.is_empty() {
        theirs == build_id
    } else {
        crc.is_some_and(|crc| crc32fast::hash(&map) == crc)
    };
    matches.then_some(map)
}

/// The dwz supplementary file named by .gnu_debugaltlink: its path is
/// relative to the debug file that names it, or else found by its build id.
fn find_supplementary(debug_path: &Path, sup_path: &[u8], sup_id: &[u8]) -> Option<Arc<Mmap>> {
    let named = Path::new(os_str(sup_path));
    let mut candidates = vec![debug_path.parent().unwrap_or(Path::new("")).join(named)];
    if sup_id.len() >= 2 {
        let hex = super::hex(sup_id);
        candidates.push(Path::new(DEBUG_ROOT).join(".build-id").join(&hex[..2]).join(format!("{}.debug", &hex[2..])));
    }
    candidates.iter().find_map(|c| check_debug_file(c, sup_id, None))
}

fn os_str(bytes: &[u8]) -> &std::ffi::OsStr {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::OsStr::from_bytes(bytes)
}

fn show(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A module's sized function symbols, sorted by address; names stay in the
/// mapped file until a lookup needs one.
struct Symbols {
    map: Arc<Mmap>,
    entries: Vec<Symbol>,
    /// Read from `.dynsym`: the exported functions only.
    dynamic: bool,
}

struct Symbol {
    start: u64,
    end: u64,
    /// Byte range of the name within `map`.
    name: (usize, usize),
}

impl Symbols {
    /// `.dynsym` when `dynamic`, else `.symtab`.
    fn read(file: &object::File, map: &Arc<Mmap>, dynamic: bool) -> Symbols {
        let base = map.as_ptr() as usize;
        let mut entries: Vec<(Symbol, u8)> = Vec::new();
        let symbols = if dynamic { file.dynamic_symbols() } else { file.symbols() };
        for sym in symbols {
            // Unsized symbols (assembly labels) say nothing about where a
            // function ends, so they cannot say that an address is in it.
            if sym.kind() != SymbolKind::Text || !sym.is_definition() || sym.size() == 0 {
                continue;
            }
            let Ok(name) = sym.name_bytes() else { continue };
            let offset = (name.as_ptr() as usize).wrapping_sub(base);
            if name.is_empty() || offset > map.len() || name.len() > map.len() - offset {
                continue;
            }
            // Of aliases at one address, a global name is the one the source uses.
            let rank = if sym.is_global() {
                0
            } else if sym.is_weak() {
                1
            } else {
                2
            };
            let end = sym.address().saturating_add(sym.size());
            entries.push((Symbol { start: sym.address(), end, name: (offset, name.len()) }, rank));
        }
        entries.sort_by_key(|(s, rank)| (s.start, *rank, s.name));
        entries.dedup_by_key(|(s, _)| s.start);
        Symbols { map: map.clone(), entries: entries.into_iter().map(|(s, _)| s).collect(), dynamic }
    }

    fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The nearest function symbol that starts at or before `svma`, and where it starts.
    fn nearest_before(&self, svma: u64) -> Option<(Cow<'_, str>, u64)> {
        let after = self.entries.partition_point(|s| s.start <= svma);
        let sym = self.entries[..after].last()?;
        Some((String::from_utf8_lossy(&self.map[sym.name.0..sym.name.0 + sym.name.1]), sym.start))
    }

    /// The name of the sized function symbol covering `svma`.
    fn name_at(&self, svma: u64) -> Option<Cow<'_, str>> {
        let after = self.entries.partition_point(|s| s.start <= svma);
        let sym = self.entries[..after].iter().rev().take(NESTED_SYMBOLS).find(|s| svma < s.end)?;
        Some(String::from_utf8_lossy(&self.map[sym.name.0..sym.name.0 + sym.name.1]))
    }
}
