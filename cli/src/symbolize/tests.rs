//! The symbolizer against real binaries, compiled here with the system C and
//! C++ compilers, in the shapes a report meets: with DWARF, inlined calls,
//! symbols only, stripped, C++, separate debug files, and files that are not
//! what the log says. Where GNU addr2line is installed, it is the reference
//! for which function and line an address is.

use super::*;
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A made-up load bias, like a PIE's under ASLR.
const BASE: u64 = 0x5555_0000_0000;

/// A scratch directory, removed when the test ends.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("cupool-symbolize-{}-{n}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path(name);
        std::fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn run(program: &str, args: &[&str]) {
    let out = Command::new(program).args(args).output().unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Compiles `source` (C, or C++ for a .cpp name) into `dir/output`.
fn compile(dir: &Scratch, name: &str, source: &str, output: &str, flags: &[&str]) -> PathBuf {
    let src = dir.write(name, source);
    let out = dir.path(output);
    let compiler = if name.ends_with(".cpp") { "g++" } else { "cc" };
    let mut args: Vec<&str> = flags.to_vec();
    // Debian's compilers add a build id anyway; others may not.
    args.extend(["-Wl,--build-id", "-o", out.to_str().unwrap(), src.to_str().unwrap()]);
    run(compiler, &args);
    out
}

/// A symbol's address and size, from the file's own symbol table.
fn symbol(path: &Path, name: &str) -> (u64, u64) {
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let sym = file.symbols().chain(file.dynamic_symbols()).find(|s| s.name() == Ok(name));
    let sym = sym.unwrap_or_else(|| panic!("no symbol {name} in {}", path.display()));
    (sym.address(), sym.size())
}

fn section_address(path: &Path, name: &str) -> u64 {
    let data = std::fs::read(path).unwrap();
    object::File::parse(&*data).unwrap().section_by_name(name).unwrap().address()
}

fn build_id(path: &Path) -> Vec<u8> {
    let data = std::fs::read(path).unwrap();
    object::File::parse(&*data).unwrap().build_id().unwrap().unwrap_or_default().to_vec()
}

/// The module of `path` as the log would list it, loaded at `base`.
fn module_at(path: &Path, base: u64) -> Module {
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let end = file.segments().map(|s| s.address() + s.size()).max().unwrap();
    Module { path: path.to_str().unwrap().into(), base, start: base, end: base + end, build_id: build_id(path) }
}

fn module(path: &Path) -> Module {
    module_at(path, BASE)
}

/// The return address whose call instruction covers file address `svma`.
fn ret(base: u64, svma: u64) -> u64 {
    base + svma + 1
}

fn function(f: &Frame) -> &str {
    f.function.as_deref().unwrap_or("<none>")
}

/// GNU addr2line's frames for `svma`, innermost first, as (function, line);
/// `None` when it is not installed.
fn reference(path: &Path, svma: u64) -> Option<Vec<(String, Option<u32>)>> {
    let out = Command::new("addr2line")
        .args(["-f", "-i", "-C", "-e", path.to_str().unwrap(), &format!("{svma:#x}")])
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    Some(
        lines
            .chunks(2)
            .map(|pair| {
                // "file:line", "file:line (discriminator N)" or "??:0".
                let line = pair[1].split(" (").next().unwrap().rsplit(':').next().unwrap().parse().ok();
                (pair[0].to_string(), line.filter(|&n| n != 0))
            })
            .collect(),
    )
}

const PLANTED: &str = r#"#include <stdlib.h>
volatile int sink;

void *planted_site(int n)
{
    void *p = malloc(n);
    sink = n;
    return p;
}

int main(int argc, char **argv)
{
    free(planted_site(argc));
    return 0;
}
"#;
/// The lines of `planted_site`, from its name to its closing brace.
const PLANTED_LINES: std::ops::RangeInclusive<u32> = 4..=9;

#[test]
fn symbolize_dwarf_gives_function_file_and_line() {
    let dir = Scratch::new("dwarf");
    let prog = compile(&dir, "planted.c", PLANTED, "planted", &["-g", "-O0"]);
    let (addr, size) = symbol(&prog, "planted_site");
    let mut s = Symbolizer::new(vec![module(&prog)]);

    let inside = addr + size / 2;
    let frames = s.frames(ret(BASE, inside));
    assert_eq!(frames.len(), 1, "{frames:?}");
    let f = &frames[0];
    assert_eq!(f.function.as_deref(), Some("planted_site"));
    assert!(f.file.as_deref().is_some_and(|file| file.ends_with("/planted.c")), "{f:?}");
    assert!(f.line.is_some_and(|l| PLANTED_LINES.contains(&l)), "{f:?}");
    assert_eq!(f.module, "planted");
    assert_eq!(f.offset, inside);

    // Every instruction address of the function, against GNU addr2line.
    for svma in addr..addr + size {
        let ours = s.frames(ret(BASE, svma));
        assert_eq!(ours.len(), 1, "{svma:#x}: {ours:?}");
        assert_eq!(function(&ours[0]), "planted_site", "{svma:#x}");
        if let Some(theirs) = reference(&prog, svma) {
            assert_eq!(vec![(function(&ours[0]).to_string(), ours[0].line)], theirs, "{svma:#x}");
        }
    }
    assert!(s.problems().is_empty(), "{:?}", s.problems());
}

const INLINED: &str = r#"volatile int sink;

static inline __attribute__((always_inline)) int inner_step(int x)
{
    for (int i = 0; i < x; i++)
        sink += i * x;
    return sink;
}

__attribute__((noinline)) int outer_call(int x)
{
    int r = inner_step(x);
    return r + sink;
}

int main(int argc, char **argv)
{
    return outer_call(argc);
}
"#;

#[test]
fn symbolize_inlined_frame_comes_before_its_caller() {
    let dir = Scratch::new("inline");
    let prog = compile(&dir, "inlined.c", INLINED, "inlined", &["-g", "-O2"]);
    let (addr, size) = symbol(&prog, "outer_call");
    let mut s = Symbolizer::new(vec![module(&prog)]);

    let mut inlined_seen = 0;
    for svma in addr..addr + size {
        let frames = s.frames(ret(BASE, svma));
        assert_eq!(function(frames.last().unwrap()), "outer_call", "{svma:#x}: {frames:?}");
        if frames.len() == 2 {
            inlined_seen += 1;
            assert_eq!(function(&frames[0]), "inner_step", "{svma:#x}: {frames:?}");
            assert!(frames[0].line.is_some_and(|l| (3..=8).contains(&l)), "{frames:?}");
            // The caller's frame is at its call of the inlined function.
            assert_eq!(frames[1].line, Some(12), "{frames:?}");
            assert!(frames.iter().all(|f| f.offset == svma && f.module == "inlined"));
        }
        if let Some(theirs) = reference(&prog, svma) {
            let ours: Vec<_> = frames.iter().map(|f| (function(f).to_string(), f.line)).collect();
            assert_eq!(ours, theirs, "{svma:#x}");
        }
    }
    assert!(inlined_seen > 0, "no address of outer_call resolved to the inlined inner_step");
}

/// A function with a Rust mangled name, so the symbol table path meets one
/// without a Rust compiler.
const WITH_RUST_NAME: &str = r#"volatile int sink;
__attribute__((noinline)) void rust_named(void) __asm__("_ZN4core6option13expect_failed17h0123456789abcdefE");
__attribute__((noinline)) void rust_named(void) { sink = 1; }
__attribute__((noinline)) static int local_helper(int x) { return x + sink; }
__attribute__((noinline)) int planted_site(int n) { sink = n; return local_helper(n); }
int main(int argc, char **argv) { rust_named(); return planted_site(argc); }
"#;

#[test]
fn symbolize_without_debug_info_names_from_symbol_table() {
    let dir = Scratch::new("nodebug");
    let prog = compile(&dir, "nodebug.c", WITH_RUST_NAME, "nodebug", &["-O0"]);
    let mut s = Symbolizer::new(vec![module(&prog)]);

    let (addr, size) = symbol(&prog, "planted_site");
    for svma in [addr, addr + size / 2, addr + size - 1] {
        let frames = s.frames(ret(BASE, svma));
        assert_eq!(
            frames,
            vec![Frame {
                function: Some("planted_site".into()),
                file: None,
                line: None,
                module: "nodebug".into(),
                offset: svma
            }]
        );
    }
    // Local symbols are in .symtab too.
    let (addr, _) = symbol(&prog, "local_helper");
    assert_eq!(function(&s.frames(ret(BASE, addr + 1))[0]), "local_helper");
    let (addr, _) = symbol(&prog, "_ZN4core6option13expect_failed17h0123456789abcdefE");
    assert_eq!(function(&s.frames(ret(BASE, addr + 1))[0]), "core::option::expect_failed");
    // Past a function's end, its name does not stick: read-only data lies
    // after every function, the ELF header before them.
    let rodata = section_address(&prog, ".rodata");
    for svma in [rodata, 0x10] {
        let frames = s.frames(ret(BASE, svma));
        assert_eq!(
            frames,
            vec![Frame { function: None, file: None, line: None, module: "nodebug".into(), offset: svma }]
        );
    }
    assert!(s.problems().is_empty(), "{:?}", s.problems());
}

#[test]
fn symbolize_stripped_gives_module_and_offset() {
    let dir = Scratch::new("stripped");
    let prog = compile(&dir, "planted.c", PLANTED, "planted", &["-g", "-O0"]);
    let (addr, size) = symbol(&prog, "planted_site");
    run("strip", &[prog.to_str().unwrap()]);
    let mut s = Symbolizer::new(vec![module(&prog)]);
    let svma = addr + size / 2;
    assert_eq!(
        s.frames(ret(BASE, svma)),
        vec![Frame { function: None, file: None, line: None, module: "planted".into(), offset: svma }]
    );
    assert!(s.problems().is_empty(), "{:?}", s.problems());
}

const LIBRARY: &str = r#"volatile int sink;
__attribute__((noinline)) int exported_first(int x) { return x + sink; }
__attribute__((noinline)) static int hidden_step(int x) { return x * sink; }
__attribute__((noinline)) int exported_alloc(int n) { sink = n; return hidden_step(n) + 1; }
"#;

/// What a CUDA library looks like: stripped, with only its exported
/// functions in .dynsym.
#[test]
fn symbolize_stripped_library_names_exported_functions_from_dynsym() {
    let dir = Scratch::new("dynsym");
    let flags = ["-O1", "-fPIC", "-shared", "-fno-toplevel-reorder"];
    let lib = compile(&dir, "foo.c", LIBRARY, "libfoo.so", &flags);
    let (exported, exported_size) = symbol(&lib, "exported_alloc");
    let (first, _) = symbol(&lib, "exported_first");
    let (hidden, _) = symbol(&lib, "hidden_step");
    assert!(first < hidden && hidden < exported, "laid out as written");
    run("strip", &[lib.to_str().unwrap()]);
    let base = 0x7f12_3400_0000;
    let mut s = Symbolizer::new(vec![module_at(&lib, base)]);
    let frames = s.frames(ret(base, exported + exported_size / 2));
    assert_eq!(function(&frames[0]), "exported_alloc");
    assert_eq!(frames[0].module, "libfoo.so");
    // A hidden function: the nearest exported one before it, and how far past its start.
    let hidden_frame = &s.frames(ret(base, hidden + 1))[0];
    assert_eq!(function(hidden_frame), format!("exported_first+{:#x}", hidden_frame.offset - first));
    assert!(hidden_frame.offset > first);
}

const WIDGET: &str = r#"namespace ns {
struct Widget {
    int size;
    int grow(int by);
};
__attribute__((noinline)) int Widget::grow(int by)
{
    size += by;
    return size;
}
}

int main(int argc, char **argv)
{
    ns::Widget w{argc};
    return w.grow(2);
}
"#;

#[test]
fn symbolize_demangles_cpp() {
    let dir = Scratch::new("cpp");
    for (flags, output) in [(&["-g", "-O0"][..], "widget_g"), (&["-O0"][..], "widget")] {
        let prog = compile(&dir, "widget.cpp", WIDGET, output, flags);
        let (addr, size) = symbol(&prog, "_ZN2ns6Widget4growEi");
        let mut s = Symbolizer::new(vec![module(&prog)]);
        let frames = s.frames(ret(BASE, addr + size / 2));
        assert_eq!(frames.len(), 1, "{output}: {frames:?}");
        assert_eq!(function(&frames[0]), "ns::Widget::grow(int)", "{output}");
        assert_eq!(frames[0].line.is_some(), output == "widget_g", "{output}: {frames:?}");
    }
}

#[test]
fn symbolize_build_id_mismatch_is_not_trusted() {
    let dir = Scratch::new("mismatch");
    let prog = compile(&dir, "planted.c", PLANTED, "planted", &["-g", "-O0"]);
    let (addr, _) = symbol(&prog, "planted_site");
    let mut logged = module(&prog);
    assert_eq!(logged.build_id.len(), 20, "the test needs a build id");
    logged.build_id[0] ^= 0xff;
    let mut s = Symbolizer::new(vec![logged]);
    for _ in 0..2 {
        assert_eq!(
            s.frames(ret(BASE, addr + 4)),
            vec![Frame { function: None, file: None, line: None, module: "planted".into(), offset: addr + 4 }]
        );
    }
    let problems = s.problems();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].starts_with(prog.to_str().unwrap()) && problems[0].contains("build id"), "{problems:?}");

    // With the log's build id, the same file is used.
    let mut s = Symbolizer::new(vec![module(&prog)]);
    assert_eq!(function(&s.frames(ret(BASE, addr + 4))[0]), "planted_site");
}

#[test]
fn symbolize_missing_file_unreadable_file_and_no_module() {
    let dir = Scratch::new("missing");
    let junk = dir.write("libjunk.so", "this is not an ELF file");
    let modules = vec![
        Module {
            path: "/nonexistent/libgone.so".into(),
            base: 0x1000_0000,
            start: 0x1000_0000,
            end: 0x1001_0000,
            build_id: vec![1, 2],
        },
        Module {
            path: junk.to_str().unwrap().into(),
            base: 0x2000_0000,
            start: 0x2000_0000,
            end: 0x2001_0000,
            build_id: vec![],
        },
        Module {
            path: "linux-vdso.so.1".into(),
            base: 0x3000_0000,
            start: 0x3000_0000,
            end: 0x3000_2000,
            build_id: vec![],
        },
    ];
    let mut s = Symbolizer::new(modules);
    let bare =
        |module: &str, offset| vec![Frame { function: None, file: None, line: None, module: module.into(), offset }];
    assert_eq!(s.frames(0x1000_0100), bare("libgone.so", 0xff));
    assert_eq!(s.frames(0x1000_0200), bare("libgone.so", 0x1ff));
    assert_eq!(s.frames(0x2000_0100), bare("libjunk.so", 0xff));
    assert_eq!(s.frames(0x3000_0100), bare("linux-vdso.so.1", 0xff));
    // Between modules, below the first, past the last.
    assert_eq!(s.frames(0x1001_0001), bare("?", 0x1001_0000));
    assert_eq!(s.frames(0x0fff_ffff), bare("?", 0x0fff_fffe));
    assert_eq!(s.frames(0x3000_2001), bare("?", 0x3000_2000));
    assert_eq!(s.frames(0), bare("?", 0));

    let problems = s.problems();
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].starts_with("/nonexistent/libgone.so: file not found"), "{problems:?}");
    assert!(problems[1].starts_with(&format!("{}: not a readable ELF file", junk.display())), "{problems:?}");
}

/// A log read on another machine misses most of its files: one line says so
/// for all of them, naming the first few, and only those an address fell in;
/// across processes, a file is counted once.
#[test]
fn missing_files_are_one_line() {
    let gone = |i: u64| Module {
        path: format!("/nonexistent/lib{i}.so"),
        base: i << 28,
        start: i << 28,
        end: (i << 28) + 0x1000,
        build_id: vec![1, 2],
    };
    let mut s = Symbolizer::new((1..=7).map(gone).collect());
    for i in 1..=6u64 {
        s.frames((i << 28) + 0x10);
    }
    assert_eq!(
        s.problems(),
        ["6 files of the run were not found where it had them (lib1.so, lib2.so, lib3.so, lib4.so and 2 more): their \
          frames show as module+offset only"]
    );
    let mut other = Symbolizer::new((5..=9).map(gone).collect());
    for i in 5..=9u64 {
        other.frames((i << 28) + 0x10);
    }
    let both: Vec<_> = s.unusable().into_iter().chain(other.unusable()).collect();
    assert_eq!(
        describe(&both),
        ["9 files of the run were not found where it had them (lib1.so, lib2.so, lib3.so, lib4.so and 5 more): \
          their frames show as module+offset only"]
    );
}

/// A file cut short, or with its section headers garbled, must come out as
/// frames and problems, never as a panic.
#[test]
fn symbolize_corrupt_files_do_not_panic() {
    let dir = Scratch::new("corrupt");
    let prog = compile(&dir, "planted.c", PLANTED, "planted", &["-g", "-O0"]);
    let (addr, size) = symbol(&prog, "planted_site");
    let whole = std::fs::read(&prog).unwrap();
    let mut variants: Vec<Vec<u8>> =
        [64, 512, whole.len() / 2, whole.len() - 100].iter().map(|&n| whole[..n].to_vec()).collect();
    // Garble the tail, where the section headers and DWARF are, in strides.
    for stride in [7usize, 61, 251] {
        let mut bytes = whole.clone();
        for i in (whole.len() / 3..whole.len()).step_by(stride) {
            bytes[i] ^= 0x5a;
        }
        variants.push(bytes);
    }
    for (i, bytes) in variants.iter().enumerate() {
        let path = dir.path(&format!("corrupt{i}"));
        std::fs::write(&path, bytes).unwrap();
        let logged = Module {
            path: path.to_str().unwrap().into(),
            base: BASE,
            start: BASE,
            end: BASE + 0x10_0000,
            build_id: vec![],
        };
        let mut s = Symbolizer::new(vec![logged]);
        for svma in (addr..addr + size).chain([0, 0x10, 0xf_fffe]) {
            let frames = s.frames(ret(BASE, svma));
            assert!(!frames.is_empty() && frames.iter().all(|f| f.offset == svma));
        }
        let _ = s.problems();
    }
}

/// DWARF that cannot be read gives way to the symbol table, with a problem line.
#[test]
fn symbolize_unreadable_dwarf_falls_back_to_symbols() {
    let dir = Scratch::new("baddwarf");
    let prog = compile(&dir, "planted.c", PLANTED, "planted", &["-g", "-O0"]);
    let (addr, size) = symbol(&prog, "planted_site");
    let mut bytes = std::fs::read(&prog).unwrap();
    let (offset, len) = {
        let file = object::File::parse(&*bytes).unwrap();
        file.section_by_name(".debug_info").unwrap().file_range().unwrap()
    };
    // The first unit header's version (after its 4-byte length) as 0xffff.
    assert!(len > 6);
    bytes[offset as usize + 4..offset as usize + 6].copy_from_slice(&[0xff, 0xff]);
    std::fs::write(&prog, &bytes).unwrap();

    let mut s = Symbolizer::new(vec![module(&prog)]);
    let svma = addr + size / 2;
    assert_eq!(
        s.frames(ret(BASE, svma)),
        vec![Frame {
            function: Some("planted_site".into()),
            file: None,
            line: None,
            module: "planted".into(),
            offset: svma
        }]
    );
    let problems = s.problems();
    assert!(problems.len() == 1 && problems[0].contains("debug info unreadable"), "{problems:?}");
}

/// `objcopy --only-keep-debug` + `strip` + `--add-gnu-debuglink`, the way
/// distributions ship debug info: found beside the file and in .debug/.
#[test]
fn symbolize_separate_debug_file_by_debuglink() {
    let dir = Scratch::new("debuglink");
    let prog = compile(&dir, "planted.c", PLANTED, "planted", &["-g", "-O0"]);
    let (addr, size) = symbol(&prog, "planted_site");
    let p = prog.to_str().unwrap();
    let debug = dir.path("planted.debug");
    let d = debug.to_str().unwrap();
    run("objcopy", &["--only-keep-debug", p, d]);
    run("strip", &["--strip-all", p]);
    run("objcopy", &[&format!("--add-gnu-debuglink={d}"), p]);

    let svma = addr + size / 2;
    let check = |what: &str| {
        let mut s = Symbolizer::new(vec![module(&prog)]);
        let f = s.frames(ret(BASE, svma)).remove(0);
        assert_eq!(function(&f), "planted_site", "{what}: {f:?}");
        assert!(f.file.as_deref().is_some_and(|file| file.ends_with("/planted.c")), "{what}: {f:?}");
        assert!(f.line.is_some_and(|l| PLANTED_LINES.contains(&l)), "{what}: {f:?}");
        assert!(s.problems().is_empty(), "{what}: {:?}", s.problems());
    };
    check("beside");
    std::fs::create_dir(dir.path(".debug")).unwrap();
    std::fs::rename(&debug, dir.path(".debug/planted.debug")).unwrap();
    check("in .debug/");

    // Another program's debug file under that name is not this one's.
    let other = compile(&dir, "other.c", &PLANTED.replace("sink = n;", "sink = n + 1;"), "other", &["-g", "-O0"]);
    run("objcopy", &["--only-keep-debug", other.to_str().unwrap(), dir.path(".debug/planted.debug").to_str().unwrap()]);
    let mut s = Symbolizer::new(vec![module(&prog)]);
    assert_eq!(
        s.frames(ret(BASE, svma)),
        vec![Frame { function: None, file: None, line: None, module: "planted".into(), offset: svma }]
    );
}

/// A program that reports its own return addresses and its modules as the
/// dynamic linker has them (load bias `dlpi_addr`, PT_LOAD ranges), the way
/// the shim's capture does, with ASLR's real bias.
const SELF_REPORTING: &str = r#"#define _GNU_SOURCE
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
volatile int sink;
void *captured;
__attribute__((noinline)) void capture(void) { captured = __builtin_return_address(0); }
__attribute__((noinline)) void planted_site(void)
{
    capture();
    sink = 2;
}
static int module(struct dl_phdr_info *info, size_t size, void *data)
{
    unsigned long lo = ~0ul, hi = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD)
            continue;
        unsigned long start = info->dlpi_addr + ph->p_vaddr, end = start + ph->p_memsz;
        lo = start < lo ? start : lo;
        hi = end > hi ? end : hi;
    }
    char exe[4096];
    const char *name = info->dlpi_name;
    if (!name[0]) {
        name = realpath("/proc/self/exe", exe);
    }
    printf("module %lx %lx %lx %s\n", (unsigned long)info->dlpi_addr, lo, hi, name);
    return 0;
}
int main(void)
{
    planted_site();
    printf("ret %lx\n", (unsigned long)captured);
    printf("printf %lx\n", (unsigned long)&printf);
    dl_iterate_phdr(module, NULL);
    return 0;
}
"#;

#[test]
fn symbolize_real_process_with_its_own_load_bias() {
    let dir = Scratch::new("process");
    let prog = compile(&dir, "selfrep.c", SELF_REPORTING, "selfrep", &["-g", "-O0", "-fPIE", "-pie"]);
    let out = Command::new(&prog).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let mut ret_addr = None;
    let mut printf = None;
    let mut modules = Vec::new();
    for line in text.lines() {
        let words: Vec<&str> = line.splitn(5, ' ').collect();
        let hex = |i: usize| u64::from_str_radix(words[i], 16).unwrap();
        match words[0] {
            "ret" => ret_addr = Some(hex(1)),
            "printf" => printf = Some(hex(1)),
            "module" if words.len() == 5 => {
                let path = words[4].to_string();
                let build_id = if Path::new(&path).exists() { build_id(Path::new(&path)) } else { vec![] };
                modules.push(Module { base: hex(1), start: hex(2), end: hex(3), path, build_id });
            }
            _ => {}
        }
    }
    let ret_addr = ret_addr.unwrap();
    let exe =
        modules.iter().find(|m| m.path == prog.to_str().unwrap()).expect("the executable among the modules").clone();
    assert!(exe.base != 0, "a PIE is loaded at a bias: {exe:?}");
    let mut s = Symbolizer::new(modules);
    let frames = s.frames(ret_addr);
    // The call's own line, not the next one where the return address points.
    assert_eq!(
        frames,
        vec![Frame {
            function: Some("planted_site".into()),
            file: Some(dir.path("selfrep.c").to_str().unwrap().into()),
            line: Some(10),
            module: "selfrep".into(),
            offset: ret_addr - 1 - exe.base,
        }]
    );
    // In the C library, stripped as distributions ship it: from .dynsym,
    // or from its debug file where one is installed.
    let frames = s.frames(printf.unwrap() + 2);
    assert!(frames[0].module.starts_with("libc.so"), "{frames:?}");
    assert!(frames.last().unwrap().function.as_deref().is_some_and(|f| f.contains("printf")), "{frames:?}");
    assert!(s.problems().is_empty(), "{:?}", s.problems());
}

#[test]
fn symbolize_caches_by_address() {
    let dir = Scratch::new("cache");
    let prog = compile(&dir, "planted.c", PLANTED, "planted", &["-g", "-O0"]);
    let (addr, _) = symbol(&prog, "planted_site");
    let mut s = Symbolizer::new(vec![module(&prog)]);
    let first = s.frames(ret(BASE, addr + 4));
    assert_eq!(function(&first[0]), "planted_site");
    assert_eq!(s.frames(ret(BASE, addr + 4)), first);
    assert_eq!(s.cache.len(), 1);
    // A second call answers from the cache, not from the file.
    s.cache.get_mut(&ret(BASE, addr + 4)).unwrap()[0].function = Some("from the cache".into());
    assert_eq!(function(&s.frames(ret(BASE, addr + 4))[0]), "from the cache");
}

#[test]
fn symbolize_format_frame() {
    let full = Frame {
        function: Some("main".into()),
        file: Some("prog_leak.c".into()),
        line: Some(42),
        module: "prog_leak".into(),
        offset: 0x1149,
    };
    assert_eq!(format_frame(3, &full), "#3 main (prog_leak+0x1149) prog_leak.c:42");
    let bare = Frame { function: None, file: None, line: None, module: "libfoo.so".into(), offset: 0x2a10 };
    assert_eq!(format_frame(4, &bare), "#4 ?? (libfoo.so+0x2a10)");
    let no_line = Frame { line: None, function: Some("ns::Widget::grow(int)".into()), ..full.clone() };
    assert_eq!(format_frame(0, &no_line), "#0 ns::Widget::grow(int) (prog_leak+0x1149) prog_leak.c");
    let unknown = Frame { function: None, file: None, line: None, module: "?".into(), offset: 0x7f00_dead_beef };
    assert_eq!(format_frame(12, &unknown), "#12 ?? (?+0x7f00deadbeef)");
}

/// dwz moves what several programs' DWARF shares into one supplementary
/// file, named by .gnu_debugaltlink relative to the file that names it, as
/// Debian's and Fedora's debug packages ship it. Skipped where dwz is not
/// installed.
#[test]
fn symbolize_dwz_supplementary_file() {
    if Command::new("dwz").arg("--version").output().is_err() {
        eprintln!("dwz not installed: supplementary DWARF files not tested");
        return;
    }
    let dir = Scratch::new("dwz");
    dir.write("shared.h", "struct shared_thing { int a; long b; char name[16]; struct shared_thing *next; };\n");
    let progs: Vec<PathBuf> = (1..=2)
        .map(|n| {
            let source = format!(
                "#include <stdio.h>\n#include \"shared.h\"\nstruct shared_thing g;\n\
                 int planted_site(struct shared_thing *t) {{ return t->a + {n}; }}\n\
                 int main(void) {{ printf(\"%d\", planted_site(&g)); return 0; }}\n"
            );
            compile(&dir, &format!("p{n}.c"), &source, &format!("p{n}"), &["-g", "-O0"])
        })
        .collect();
    let (addr, size) = symbol(&progs[0], "planted_site");
    let (p1, p2) = (progs[0].to_str().unwrap(), progs[1].to_str().unwrap());
    let out = Command::new("dwz").current_dir(&dir.0).args(["-m", "common.debug", p1, p2]).output().unwrap();
    assert!(out.status.success(), "dwz: {}", String::from_utf8_lossy(&out.stderr));
    assert!(dir.path("common.debug").exists());
    // Only the DWARF, whose names dwz moved to common.debug, may name it now.
    run("objcopy", &["--strip-symbol=planted_site", p1]);

    let svma = addr + size / 2;
    let mut s = Symbolizer::new(vec![module(&progs[0])]);
    let f = s.frames(ret(BASE, svma)).remove(0);
    assert_eq!(function(&f), "planted_site", "{f:?}");
    assert!(f.file.as_deref().is_some_and(|file| file.ends_with("/p1.c")) && f.line == Some(4), "{f:?}");
    assert!(s.problems().is_empty(), "{:?}", s.problems());

    // Without it the line table still reads, but nothing names the function.
    std::fs::remove_file(dir.path("common.debug")).unwrap();
    let mut s = Symbolizer::new(vec![module(&progs[0])]);
    let frames = s.frames(ret(BASE, svma));
    assert_eq!(frames, vec![Frame { function: None, line: Some(4), module: "p1".into(), offset: svma, ..f }]);
    let problems = s.problems();
    assert!(
        problems.len() == 1 && problems[0].contains("supplementary DWARF file common.debug not found"),
        "{problems:?}"
    );
}
