//! Shared by the native-stack tests: naming captured frames (from the test
//! executable's own symbol table, or `dladdr` for shared objects) and building
//! small C libraries with the system compiler.
#![allow(dead_code)]

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::process::Command;

use cupool_capture::native::loaded_modules;

/// The executable's function symbols at their runtime addresses. Test
/// functions are not exported, so `dladdr` cannot name them.
pub struct ExeSymbols {
    funcs: Vec<(u64, u64, String)>,
}

impl ExeSymbols {
    pub fn load() -> ExeSymbols {
        let exe = std::fs::canonicalize("/proc/self/exe").unwrap();
        let module = loaded_modules()
            .into_iter()
            .find(|m| Path::new(&m.path) == exe)
            .expect("the executable is among the loaded modules");
        let elf = std::fs::read(&exe).unwrap();
        let u16_at = |at: usize| u16::from_le_bytes(elf[at..at + 2].try_into().unwrap()) as usize;
        let u32_at = |at: usize| u32::from_le_bytes(elf[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_le_bytes(elf[at..at + 8].try_into().unwrap());
        let (shoff, shentsize, shnum) = (u64_at(0x28) as usize, u16_at(0x3a), u16_at(0x3c));
        let section = |i: usize| shoff + i * shentsize;
        let symtab = (0..shnum).map(section).find(|&s| u32_at(s + 4) == 2).expect("a .symtab");
        let strtab = section(u32_at(symtab + 40) as usize);
        let (sym_off, sym_size) = (u64_at(symtab + 24) as usize, u64_at(symtab + 32) as usize);
        let str_off = u64_at(strtab + 24) as usize;
        let mut funcs = Vec::new();
        for sym in (sym_off..sym_off + sym_size).step_by(24) {
            let (info, value, size) = (elf[sym + 4], u64_at(sym + 8), u64_at(sym + 16));
            if info & 0xf != 2 || value == 0 || size == 0 {
                continue;
            }
            let name_at = str_off + u32_at(sym) as usize;
            let name = CStr::from_bytes_until_nul(&elf[name_at..]).unwrap().to_string_lossy().into_owned();
            funcs.push((value + module.base, value + module.base + size, name));
        }
        ExeSymbols { funcs }
    }

    /// The function a return address returns into.
    pub fn name(&self, ra: u64) -> Option<&str> {
        let pc = ra - 1;
        self.funcs.iter().find(|(start, end, _)| (*start..*end).contains(&pc)).map(|f| f.2.as_str())
    }

    /// A name for each frame: the executable's symbol, else the exported
    /// symbol `dladdr` finds, else "?".
    pub fn names(&self, frames: &[u64]) -> Vec<String> {
        frames
            .iter()
            .map(|&ra| match self.name(ra) {
                Some(name) => name.to_string(),
                None => dladdr_name(ra).unwrap_or_else(|| "?".to_string()),
            })
            .collect()
    }
}

pub fn dladdr_name(ra: u64) -> Option<String> {
    // SAFETY: `Dl_info` is pointers and integers: all-zero (null pointers) is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `dladdr` only writes into `info`, a live local; the address is looked up, never dereferenced.
    if unsafe { libc::dladdr((ra - 1) as *const libc::c_void, &mut info) } == 0 || info.dli_sname.is_null() {
        return None;
    }
    // SAFETY: `dladdr` succeeded and `dli_sname` is non-null: a NUL-terminated name the dynamic linker keeps
    // while the object is loaded; it is copied at once.
    Some(unsafe { CStr::from_ptr(info.dli_sname) }.to_string_lossy().into_owned())
}

/// Where in `names` each of `wanted` appears first (by substring), in order
/// of `wanted`; panics with the whole stack when one is missing.
pub fn positions(names: &[String], wanted: &[&str]) -> Vec<usize> {
    wanted
        .iter()
        .map(|w| names.iter().position(|n| n.contains(w)).unwrap_or_else(|| panic!("{w} not in the stack {names:#?}")))
        .collect()
}

/// Compiles `source` into the shared object `file_name` (in a directory of
/// its own under the target's temporary directory) with the system `cc`.
pub fn build_so(dir_name: &str, file_name: &str, source: &str, flags: &[&str]) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("native-{dir_name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(format!("{dir_name}.c"));
    std::fs::write(&src, source).unwrap();
    let out = dir.join(file_name);
    let status = Command::new("cc")
        .args(["-shared", "-fPIC"])
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .status()
        .expect("the system C compiler (cc) runs");
    assert!(status.success(), "cc failed on {}", src.display());
    out
}

/// `dlopen`s `path` (never closed) and looks up `symbol` in it.
pub fn open_symbol(path: &Path, symbol: &str) -> usize {
    let path = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: `path` is a NUL-terminated string alive for the call; the library is one this test suite just
    // compiled, whose initialisers are its own C code.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!handle.is_null(), "dlopen {path:?}");
    let name = CString::new(symbol).unwrap();
    // SAFETY: `handle` is the non-null handle just returned by `dlopen`, never closed; `name` is
    // NUL-terminated.
    let sym = unsafe { libc::dlsym(handle, name.as_ptr()) };
    assert!(!sym.is_null(), "{symbol} in {path:?}");
    sym as usize
}

/// Runs `attempt` until it returns `Some` or a few seconds pass: a library
/// loaded after the module table was built is found at the next rescan,
/// which captures may trigger at most every 100 ms.
pub fn eventually<T>(mut attempt: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        if let Some(found) = attempt() {
            return Some(found);
        }
        if std::time::Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
