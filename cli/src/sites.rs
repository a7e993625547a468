//! Allocation sites in reports: per-site figures from a log's timeline, and
//! the frames of a site, symbolised from the module files on disk.

use crate::symbolize::{self, Module, Symbolizer};
use cupool_core::log::{Definition, Log, ModuleRecord, Sites};
use cupool_core::model::{Moment, Process, What};
use serde::Serialize;
use std::collections::HashMap;

/// What one allocation site did over the run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SiteFigures {
    pub stack: u32,
    /// Allocations made from it.
    pub allocs: u64,
    /// Bytes those allocations occupied, all together.
    pub total_bytes: u64,
    /// The most bytes from it live at one time.
    pub peak_bytes: u64,
    /// Bytes from it still live at the end of the timeline.
    pub live_bytes: u64,
}

/// Per-site figures of process `p`, from its allocations (a log written
/// with `trace=0` has none), every kind of memory.
pub fn figures(p: &Process) -> Vec<SiteFigures> {
    let mut by_site: HashMap<u32, SiteFigures> = HashMap::new();
    for m in p.moments() {
        match m {
            Moment::Change(i) => {
                let What::Alloc(id) = p.changes[i].what else { continue };
                let a = &p.allocations[id];
                let Some(stack) = a.stack else { continue };
                let f = by_site.entry(stack).or_insert_with(|| SiteFigures { stack, ..Default::default() });
                f.allocs += 1;
                f.total_bytes += a.size;
                f.live_bytes += a.size;
                f.peak_bytes = f.peak_bytes.max(f.live_bytes);
            }
            Moment::Ended(id) => {
                let a = &p.allocations[id];
                if let Some(f) = a.stack.and_then(|s| by_site.get_mut(&s)) {
                    f.live_bytes = f.live_bytes.saturating_sub(a.size);
                }
            }
        }
    }
    by_site.into_values().collect()
}

/// One frame of a site as a report shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ShownFrame {
    /// `python` or `native`.
    pub lang: &'static str,
    pub function: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
    /// File name of a native frame's module, and the address in it that was looked up.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
}

impl ShownFrame {
    /// A Python frame: `function` at `file`:`line` (line 0: not known).
    pub fn python(function: impl Into<String>, file: impl Into<String>, line: u32) -> ShownFrame {
        ShownFrame {
            lang: "python",
            function: Some(function.into()),
            file: Some(file.into()),
            line: (line > 0).then_some(line),
            module: None,
            offset: None,
        }
    }

    /// A native frame as `symbolize::format_frame` writes it; a Python frame
    /// as `#i function file:line [python]`.
    pub fn text(&self, i: usize) -> String {
        if let (Some(module), Some(offset)) = (&self.module, self.offset) {
            let f = symbolize::Frame {
                function: self.function.clone(),
                file: self.file.clone(),
                line: self.line,
                module: module.clone(),
                offset,
            };
            return symbolize::format_frame(i, &f);
        }
        let mut s = format!("#{i} {}", self.function.as_deref().unwrap_or("??"));
        if let Some(file) = &self.file {
            s.push(' ');
            s.push_str(file);
            if let Some(line) = self.line {
                s.push_str(&format!(":{line}"));
            }
        }
        s.push_str(" [python]");
        s
    }
}

/// Who wrote a frame: what a report shows of a stack, and where a finding points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The program's own code: where a finding points.
    User,
    /// A library or the language's standard library: shown, for it says what allocated.
    Library,
    /// cupool's own (its Python package, the shim): never shown.
    Cupool,
    /// The interpreter running Python code, and the foreign-function
    /// trampolines (libffi, `_ctypes`) between it and native code: hidden
    /// where the stack has Python frames, which say the same for people.
    Interpreter,
    /// The test runner calling the test (pytest, pluggy, unittest): hidden.
    TestRunner,
}

/// The last path component of `path` and the one before it.
fn tail2(path: &str) -> (&str, &str) {
    let mut parts = path.rsplit('/');
    let file = parts.next().unwrap_or("");
    (parts.next().unwrap_or(""), file)
}

impl ShownFrame {
    /// Who wrote the frame.
    pub fn origin(&self) -> Origin {
        let file = self.file.as_deref().unwrap_or("");
        if self.lang == "python" {
            let (dir, name) = tail2(file);
            if dir == "cupool" && name.ends_with(".py") {
                return Origin::Cupool;
            }
            let runner = ["/_pytest/", "/pluggy/", "/pytest/", "/unittest/", "/xdist/", "/execnet/"];
            if runner.iter().any(|r| file.contains(r)) || file.ends_with("/pytest") {
                return Origin::TestRunner;
            }
            // Code generated at run time counts as the library's: PyTorch's compiled graphs.
            let library = ["site-packages/", "dist-packages/", "/lib/python3", "/lib64/python3", "/torchinductor_"];
            if file.starts_with('<') || library.iter().any(|l| file.contains(l)) {
                return Origin::Library;
            }
            return Origin::User;
        }
        let module = self.module.as_deref().unwrap_or("");
        let function = self.function.as_deref().unwrap_or("");
        if module.starts_with("libcupool") {
            return Origin::Cupool;
        }
        let interpreter = module.starts_with("libpython")
            || (module.starts_with("python") && !module.contains(".so"))
            || module.starts_with("libffi")
            || module.starts_with("_ctypes")
            || function.starts_with("ffi_call")
            || function.starts_with("_Py")
            || function.starts_with("Py");
        if interpreter {
            return Origin::Interpreter;
        }
        let system = ["/usr/", "/lib/", "/lib64/", "/opt/", "site-packages/", "dist-packages/"];
        if file.is_empty() || system.iter().any(|p| file.starts_with(p) || file.contains(p)) {
            Origin::Library
        } else {
            Origin::User
        }
    }
}

/// The frames people read: cupool's own dropped; where the stack has
/// Python frames, the interpreter and the foreign-function trampolines
/// under them dropped; the test runner's frames dropped. Returns the
/// frames kept, innermost first, and how many were left out.
pub fn collapse(frames: Vec<ShownFrame>) -> (Vec<ShownFrame>, u64) {
    let python = frames.iter().any(|f| f.lang == "python");
    let before = frames.len();
    let kept: Vec<ShownFrame> = frames
        .into_iter()
        .filter(|f| match f.origin() {
            Origin::Cupool | Origin::TestRunner => false,
            Origin::Interpreter => !python,
            Origin::User | Origin::Library => true,
        })
        .collect();
    let hidden = (before - kept.len()) as u64;
    (kept, hidden)
}

/// The innermost frame the user wrote, if any: preferably one in `file`
/// (a test leak's test file), else the first Python frame of the user's,
/// else the first native one.
pub fn user_frame<'a>(frames: &'a [ShownFrame], file: Option<&str>) -> Option<&'a ShownFrame> {
    let user = |f: &&ShownFrame| f.origin() == Origin::User && f.file.is_some();
    let in_file = |f: &&ShownFrame| {
        file.is_some_and(|want| {
            f.file.as_deref().is_some_and(|have| have == want || have.ends_with(&format!("/{want}")))
        })
    };
    frames
        .iter()
        .find(|f| in_file(f) && user(f))
        .or_else(|| frames.iter().filter(|f| f.lang == "python").find(user))
        .or_else(|| frames.iter().find(user))
}

/// Whether a frame is in code the user did not write (every [`Origin`] but
/// the user's): views fold such frames (the flame graph) or look past them
/// (`cupool top`'s one-line sites).
pub fn is_library(f: &ShownFrame) -> bool {
    f.origin() != Origin::User
}

/// Resolves the stacks of one log into frames.
pub struct Resolver {
    sites: Sites,
    symbolizer: Symbolizer,
}

fn module_of(m: &ModuleRecord) -> Module {
    Module { path: m.path.clone(), base: m.base, start: m.start, end: m.end, build_id: hex(&m.build_id) }
}

impl Resolver {
    pub fn new(log: &Log) -> Resolver {
        let sites = Sites::of(log);
        let modules = sites.modules.iter().map(module_of).collect();
        Resolver { sites, symbolizer: Symbolizer::new(modules) }
    }

    /// One more definition (of a log still being written).
    pub fn add(&mut self, d: &Definition) {
        self.sites.add(d);
        if let Definition::Module(m) = d {
            self.symbolizer.add(module_of(m));
        }
    }

    /// The frames of stack `id`, innermost first: the Python frames (what the
    /// user's code was doing), then the native ones, without CUDA's own
    /// frames at the top (a statically linked CUDA runtime lives in the program).
    pub fn frames(&mut self, id: u32) -> Vec<ShownFrame> {
        let Some(stack) = self.sites.stack(id).cloned() else { return Vec::new() };
        let mut out: Vec<ShownFrame> = stack
            .python
            .iter()
            .map(|p| ShownFrame::python(self.sites.string(p.1), self.sites.string(p.0), p.2))
            .collect();
        let mut native = Vec::new();
        for &addr in &stack.native {
            for f in self.symbolizer.frames(addr) {
                native.push(ShownFrame {
                    lang: "native",
                    module: Some(f.module),
                    offset: Some(f.offset),
                    function: f.function,
                    file: f.file,
                    line: f.line,
                });
            }
        }
        // cupool's own frames: trimmed at the top when captured; below the
        // program's `main` there is its exit-status wrapper.
        native.retain(|f| !f.module.as_deref().is_some_and(|m| m.starts_with("libcupool")));
        let cuda_top = native.iter().take_while(|f| f.function.as_deref().is_some_and(is_cuda_internal)).count();
        if cuda_top < native.len() {
            native.drain(..cuda_top);
        }
        out.extend(native);
        out
    }

    /// The paths of the modules the native frames of stack `id` lie in,
    /// innermost first, each once.
    pub fn module_paths(&self, id: u32) -> Vec<String> {
        let mut paths: Vec<String> = Vec::new();
        for &addr in self.sites.stack(id).map(|s| s.native.as_slice()).unwrap_or(&[]) {
            if let Some(m) = self.sites.module_of(addr.saturating_sub(1)) {
                if !paths.contains(&m.path) {
                    paths.push(m.path.clone());
                }
            }
        }
        paths
    }

    /// Lines about module files that could not be used as the log says.
    pub fn problems(&self) -> Vec<String> {
        self.symbolizer.problems()
    }

    /// The module files that could not be used as the log says, by path.
    pub fn unusable(&self) -> Vec<(String, crate::symbolize::Problem)> {
        self.symbolizer.unusable()
    }
}

/// A function of the CUDA runtime or driver API, or of the runtime's
/// internals: what a statically linked runtime puts above the program's own frames.
pub fn is_cuda_internal(function: &str) -> bool {
    let api = |prefix: &str| {
        function.strip_prefix(prefix).and_then(|rest| rest.chars().next()).is_some_and(|c| c.is_ascii_uppercase())
    };
    function.starts_with("cudart::")
        || function.starts_with("__cudart")
        || function.starts_with("libcudart_static")
        || api("cuda")
        || api("cu")
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).filter_map(|i| u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()).collect()
}

/// The `n` sites of `p` with the largest peak, the `n` with the most
/// allocations, and the `n` with the most bytes still live at the end.
pub fn top(p: &Process, n: usize) -> (Vec<SiteFigures>, Vec<SiteFigures>, Vec<SiteFigures>) {
    let all = figures(p);
    let mut by_peak = all.clone();
    by_peak.sort_by_key(|f| (std::cmp::Reverse(f.peak_bytes), f.stack));
    by_peak.truncate(n);
    let mut by_count = all.clone();
    by_count.sort_by_key(|f| (std::cmp::Reverse(f.allocs), f.stack));
    by_count.truncate(n);
    let mut by_live: Vec<SiteFigures> = all.into_iter().filter(|f| f.live_bytes > 0).collect();
    by_live.sort_by_key(|f| (std::cmp::Reverse(f.live_bytes), f.stack));
    by_live.truncate(n);
    (by_peak, by_count, by_live)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_functions_are_told_from_the_programs() {
        for f in ["cudaMalloc", "cuMemAlloc_v2", "cudart::globalState::initializeDriver()", "__cudart1234"] {
            assert!(is_cuda_internal(f), "{f}");
        }
        for f in ["main", "cudaish_helper", "cub::DeviceScan", "curl_easy", "allocate_buffers"] {
            assert!(!is_cuda_internal(f), "{f}");
        }
    }

    fn py(function: &str, file: &str, line: u32) -> ShownFrame {
        ShownFrame::python(function, file, line)
    }

    fn native(function: &str, module: &str) -> ShownFrame {
        ShownFrame {
            lang: "native",
            function: Some(function.into()),
            file: None,
            line: None,
            module: Some(module.into()),
            offset: Some(0x10),
        }
    }

    /// A pytest test's leak through a helper of its own, under cupool's
    /// decorator, reached from pytest through pluggy, with the interpreter
    /// and libffi below the Python frames.
    fn pytest_stack() -> Vec<ShownFrame> {
        vec![
            py("empty", "/venv/lib/python3.11/site-packages/torch/cuda/memory.py", 80),
            py("make_buffer", "/repo/tests/helpers.py", 12),
            py("wrapper", "/venv/lib/python3.11/site-packages/cupool/__init__.py", 298),
            py("test_keeps", "/repo/tests/test_models.py", 31),
            py("pytest_pyfunc_call", "/venv/lib/python3.11/site-packages/_pytest/python.py", 187),
            py("_multicall", "/venv/lib/python3.11/site-packages/pluggy/_callers.py", 103),
            py("<module>", "/venv/bin/pytest", 8),
            native("ffi_call_unix64", "libffi.so.8"),
            native("_ctypes_callproc", "_ctypes.cpython-311-x86_64-linux-gnu.so"),
            native("_PyEval_EvalFrameDefault", "libpython3.11.so.1.0"),
            native("at::empty", "libtorch_cuda.so"),
            native("main", "python3.11"),
        ]
    }

    #[test]
    fn frames_people_need_not_read_are_collapsed() {
        let (kept, hidden) = collapse(pytest_stack());
        let names: Vec<&str> = kept.iter().map(|f| f.function.as_deref().unwrap()).collect();
        assert_eq!(names, ["empty", "make_buffer", "test_keeps", "at::empty"]);
        assert_eq!(hidden, 8, "cupool's wrapper, three of the runner, the interpreter's and libffi's");
        // Without Python frames, native frames of any library stay: they are the stack.
        let native_only = vec![native("cudaMalloc", "libcudart.so.13"), native("PyInit_x", "libpython3.11.so.1.0")];
        assert_eq!(collapse(native_only.clone()), (native_only, 0));
    }

    #[test]
    fn a_test_leak_points_at_the_test_not_at_its_helper() {
        let (kept, _) = collapse(pytest_stack());
        let at = |file| user_frame(&kept, file).and_then(|f| f.function.as_deref());
        assert_eq!(at(Some("tests/test_models.py")), Some("test_keeps"));
        assert_eq!(at(None), Some("make_buffer"), "other leaks: the innermost frame the user wrote");
        assert_eq!(at(Some("tests/elsewhere.py")), Some("make_buffer"));
    }

    #[test]
    fn a_compiled_models_generated_code_is_not_the_users() {
        let frames = vec![
            py("call", "/tmp/torchinductor_root/cq/cqej3uo5q5ilu4twmcfxkdptyxz4z4zep4vw4v7d7jbmheh5scmj.py", 127),
            py("run", "/venv/lib/python3.12/site-packages/torch/_inductor/utils.py", 3401),
            py("<module>", "/repo/train.py", 42),
        ];
        assert_eq!(frames[0].origin(), Origin::Library);
        assert_eq!(user_frame(&frames, None).and_then(|f| f.line), Some(42));
    }

    #[test]
    fn hex_build_ids_read_back() {
        assert_eq!(hex("a1b2ff"), vec![0xa1, 0xb2, 0xff]);
        assert_eq!(hex(""), Vec::<u8>::new());
    }
}

/// A site with its frames, as `cupool report` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct ShownSite {
    #[serde(flatten)]
    pub figures: SiteFigures,
    pub frames: Vec<ShownFrame>,
}

/// The top sites of one log.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SitesReport {
    pub by_peak: Vec<ShownSite>,
    pub by_count: Vec<ShownSite>,
    /// Sites holding bytes still live at the end of the timeline, most first.
    pub by_live: Vec<ShownSite>,
    /// Module files that could not be used to name frames.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

/// The `n` top sites of `p` by peak bytes, by count and by bytes still live, with their frames.
pub fn report(p: &Process, n: usize) -> SitesReport {
    let (by_peak, by_count, by_live) = top(p, n);
    if by_peak.is_empty() {
        return SitesReport::default();
    }
    let mut resolver = Resolver::new(&p.log);
    let mut show = |f: SiteFigures| ShownSite { frames: resolver.frames(f.stack), figures: f };
    let by_peak = by_peak.into_iter().map(&mut show).collect();
    let by_count = by_count.into_iter().map(&mut show).collect();
    let by_live = by_live.into_iter().map(&mut show).collect();
    SitesReport { by_peak, by_count, by_live, problems: resolver.problems() }
}

/// Frames shown per site in the text report.
const TEXT_FRAMES: usize = 12;

/// The text form: the sites by peak, then those by count that were not shown already.
pub fn print_text(pid: u32, r: &SitesReport, out: &mut dyn std::io::Write) {
    if r.by_peak.is_empty() {
        return;
    }
    let _ = writeln!(out, "cupool: top allocation sites of pid {pid}, by peak bytes live:");
    let mut shown = std::collections::HashSet::new();
    for s in &r.by_peak {
        shown.insert(s.figures.stack);
        print_site(s, out);
    }
    for (list, title) in [(&r.by_count, "by number of allocations"), (&r.by_live, "by bytes still live at the end")] {
        let more: Vec<&ShownSite> = list.iter().filter(|s| !shown.contains(&s.figures.stack)).collect();
        if !more.is_empty() {
            let _ = writeln!(out, "cupool: and {title}:");
            for s in more {
                shown.insert(s.figures.stack);
                print_site(s, out);
            }
        }
    }
    for p in &r.problems {
        let _ = writeln!(out, "cupool: note: {p}");
    }
}

fn print_site(s: &ShownSite, out: &mut dyn std::io::Write) {
    let f = &s.figures;
    let _ = writeln!(
        out,
        "  peak {} in {} allocation(s) ({} in all, {} still live)",
        crate::units::human_bytes(f.peak_bytes),
        f.allocs,
        crate::units::human_bytes(f.total_bytes),
        crate::units::human_bytes(f.live_bytes)
    );
    for (i, frame) in s.frames.iter().take(TEXT_FRAMES).enumerate() {
        let _ = writeln!(out, "    {}", frame.text(i));
    }
    if s.frames.len() > TEXT_FRAMES {
        let _ = writeln!(out, "    ... {} more frame(s)", s.frames.len() - TEXT_FRAMES);
    }
    if s.frames.is_empty() {
        let _ = writeln!(out, "    (no frames: the log does not define this site)");
    }
}
