//! Report-time symbolisation of native stacks.
//!
//! A log carries each stack as raw return addresses plus the modules the
//! process had loaded (path, load bias, runtime range, GNU build id). Reports
//! map an address to its module, then read that module's file as it is on
//! disk now: DWARF line tables and inlined calls where the file (or its
//! separate debug file) has them, else the ELF symbol table, else nothing but
//! `module+offset`. A file whose build id differs from the log's is not read
//! at all: it is not the code that ran, and names from it would mislead.

mod elf;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::Path;

/// One module as the log lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Module {
    pub path: String,
    /// Load bias: runtime address = file virtual address + `base`.
    pub base: u64,
    /// Runtime address range of the module's mapped segments, `[start, end)`.
    pub start: u64,
    pub end: u64,
    /// The GNU build id the process saw, empty when the module has none.
    pub build_id: Vec<u8>,
}

/// One symbolised frame. A return address may give several (inlined calls),
/// innermost first; they share `module` and `offset`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// Demangled function name; `None` when neither DWARF nor a symbol names it.
    pub function: Option<String>,
    /// Source file as the DWARF names it (usually absolute).
    pub file: Option<String>,
    pub line: Option<u32>,
    /// File name of the module (`libfoo.so`), or `?` for an address in no module.
    pub module: String,
    /// The address looked up, relative to the module's file (its svma: what
    /// `addr2line -e FILE` and `objdump` take). That is the return address
    /// minus one, so that it lies inside the call instruction rather than on
    /// the next one, as LeakSanitizer prints it. For an address in no module,
    /// the runtime address minus one.
    pub offset: u64,
}

/// What became of a module's file when it was first needed.
enum Slot {
    NotOpened,
    Usable(Box<elf::Image>),
    /// Missing, unreadable, or not the file that ran: module+offset only.
    Unusable,
}

/// Why a module's frames show as module+offset only.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Problem {
    /// Its file is not where the run had it (a log read on another machine,
    /// a file deleted since).
    Missing,
    /// The file on disk is another build than the one that ran (the text says which).
    Changed(String),
    Other(String),
}

/// Maps return addresses of one process to frames. Each module's file is
/// opened on the first address that falls in it, once; each address is
/// resolved once.
pub struct Symbolizer {
    /// Sorted by `start`, so that an address finds its module by binary search.
    modules: Vec<Module>,
    slots: Vec<Slot>,
    /// By module index, so `problems` lists them in a stable order whatever
    /// order addresses came in.
    problems: Vec<Option<Problem>>,
    cache: HashMap<u64, Vec<Frame>>,
}

impl Symbolizer {
    pub fn new(mut modules: Vec<Module>) -> Symbolizer {
        modules.sort_by_key(|m| (m.start, m.end));
        let n = modules.len();
        Symbolizer {
            modules,
            slots: (0..n).map(|_| Slot::NotOpened).collect(),
            problems: vec![None; n],
            cache: HashMap::new(),
        }
    }

    /// One more module (of a log still being written).
    pub fn add(&mut self, module: Module) {
        let at = self.modules.partition_point(|m| (m.start, m.end) <= (module.start, module.end));
        self.modules.insert(at, module);
        self.slots.insert(at, Slot::NotOpened);
        self.problems.insert(at, None);
        // An address that fell in no module may fall in this one.
        self.cache.clear();
    }

    /// The frames of one captured return address (a runtime address).
    /// Never empty: at worst one frame with no function.
    pub fn frames(&mut self, return_addr: u64) -> Vec<Frame> {
        if let Some(frames) = self.cache.get(&return_addr) {
            return frames.clone();
        }
        let frames = self.resolve(return_addr);
        self.cache.insert(return_addr, frames.clone());
        frames
    }

    /// The modules that could not be used as the log says, by path, in the
    /// order of the modules. Only modules that some address has fallen in so
    /// far are looked at, so call it after symbolising.
    pub fn unusable(&self) -> Vec<(String, Problem)> {
        let path = |i: usize| match self.modules[i].path.as_str() {
            "" => "(module without a path)".to_string(),
            p => p.to_string(),
        };
        (0..self.problems.len()).filter_map(|i| Some((path(i), self.problems[i].clone()?))).collect()
    }

    /// [`Symbolizer::unusable`] as lines for the report (see [`describe`]).
    pub fn problems(&self) -> Vec<String> {
        describe(&self.unusable())
    }

    fn resolve(&mut self, return_addr: u64) -> Vec<Frame> {
        // A return address points after its call; the call itself, and so
        // the right line and inlining, is one byte earlier.
        let pc = return_addr.saturating_sub(1);
        let Some(index) = self.module_of(pc) else {
            return vec![Frame { function: None, file: None, line: None, module: "?".into(), offset: pc }];
        };
        let svma = pc.wrapping_sub(self.modules[index].base);
        let module = module_name(&self.modules[index].path);
        let bare = Frame { function: None, file: None, line: None, module: module.clone(), offset: svma };
        let Some(image) = self.image(index) else {
            return vec![bare];
        };
        let lookup = image.lookup(svma);
        if let Some(problem) = lookup.debug_problem {
            self.note_problem(index, Problem::Other(problem));
        }
        if lookup.frames.is_empty() {
            return vec![bare];
        }
        lookup
            .frames
            .into_iter()
            .map(|f| Frame { function: f.function, file: f.file, line: f.line, module: module.clone(), offset: svma })
            .collect()
    }

    fn module_of(&self, pc: u64) -> Option<usize> {
        // The last module starting at or below `pc`; ranges do not overlap.
        let after = self.modules.partition_point(|m| m.start <= pc);
        let index = after.checked_sub(1)?;
        (pc < self.modules[index].end).then_some(index)
    }

    /// The module's file, opened on first use; `None` when it cannot be used.
    fn image(&mut self, index: usize) -> Option<&elf::Image> {
        if let Slot::NotOpened = self.slots[index] {
            let module = &self.modules[index];
            self.slots[index] = match open(module) {
                Ok(Some(image)) => Slot::Usable(Box::new(image)),
                Ok(None) => Slot::Unusable,
                Err(why) => {
                    self.note_problem(index, why);
                    Slot::Unusable
                }
            };
        }
        match &self.slots[index] {
            Slot::Usable(image) => Some(image),
            _ => None,
        }
    }

    fn note_problem(&mut self, index: usize, problem: Problem) {
        if self.problems[index].is_none() {
            self.problems[index] = Some(problem);
        }
    }
}

const OFFSETS_ONLY: &str = "its frames show as module+offset only";
const OFFSETS_ONLY_PLURAL: &str = "their frames show as module+offset only";

/// Unusable modules (of one process or several, a path named once) as lines
/// to print once: one for all whose files were not found (a log read on
/// another machine misses most of them), one for all whose files changed
/// since the run, and one per module whose file or debug info cannot be read.
pub fn describe(unusable: &[(String, Problem)]) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    let unusable: Vec<&(String, Problem)> = unusable.iter().filter(|(path, _)| seen.insert(path)).collect();
    let of = |pick: fn(&Problem) -> bool| -> Vec<&(String, Problem)> {
        unusable.iter().copied().filter(|(_, p)| pick(p)).collect()
    };
    let named = |modules: &[&(String, Problem)]| {
        let names: Vec<String> = modules.iter().take(4).map(|(path, _)| module_name(path)).collect();
        match modules.len() - names.len() {
            0 => names.join(", "),
            more => format!("{} and {more} more", names.join(", ")),
        }
    };
    let mut lines = Vec::new();
    match &of(|p| matches!(p, Problem::Missing))[..] {
        [] => {}
        [(path, _)] => lines.push(format!("{path}: file not found; {OFFSETS_ONLY}")),
        many => lines.push(format!(
            "{} files of the run were not found where it had them ({}): {OFFSETS_ONLY_PLURAL}",
            many.len(),
            named(many)
        )),
    }
    match &of(|p| matches!(p, Problem::Changed(_)))[..] {
        [] => {}
        [(path, Problem::Changed(why))] => {
            lines.push(format!("{path}: {why}: the file changed since the run; {OFFSETS_ONLY}"))
        }
        many => lines.push(format!(
            "{} files changed since the run, their build ids not the log's ({}): {OFFSETS_ONLY_PLURAL}",
            many.len(),
            named(many)
        )),
    }
    for (path, problem) in unusable {
        if let Problem::Other(why) = problem {
            lines.push(format!("{path}: {why}"));
        }
    }
    lines
}

/// Opens a module's file. `Ok(None)`: there is no file to read, and nothing
/// is wrong with that (the vDSO lives only in memory).
fn open(module: &Module) -> Result<Option<elf::Image>, Problem> {
    if is_vdso(&module.path) {
        return Ok(None);
    }
    if module.path.is_empty() {
        return Err(Problem::Other(format!("the log gives no path; {OFFSETS_ONLY}")));
    }
    match elf::Image::open(Path::new(&module.path), &module.build_id) {
        Ok(image) => Ok(Some(image)),
        Err(elf::OpenError::Missing) => Err(Problem::Missing),
        Err(elf::OpenError::BuildIdDiffers { on_disk }) => {
            Err(Problem::Changed(format!("build id {} on disk, {} in the log", hex(&on_disk), hex(&module.build_id))))
        }
        Err(elf::OpenError::Other(why)) => Err(Problem::Other(format!("{why}; {OFFSETS_ONLY}"))),
    }
}

fn is_vdso(path: &str) -> bool {
    matches!(path, "linux-vdso.so.1" | "linux-gate.so.1" | "[vdso]")
}

fn module_name(path: &str) -> String {
    match Path::new(path).file_name() {
        Some(name) => name.to_string_lossy().into_owned(),
        None if path.is_empty() => "?".into(),
        None => path.into(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One frame as a report line, in LeakSanitizer's style:
///
/// ```text
/// #<index> <function> (<module>+0x<offset>) <file>:<line>
/// #3 main (prog_leak+0x1148) /src/prog_leak.c:42
/// #4 ?? (libfoo.so+0x2a0f)
/// ```
///
/// `??` stands for an unknown function; `file:line` is left out when the
/// file is unknown, `:line` when only the line is. LeakSanitizer writes
/// `#0 0x<pc> in <function> <file>:<line>` and `(<module>+0x<offset>)` only
/// when it has no file; a frame here carries no runtime address (it changes
/// from run to run), so `module+offset`, which does not, is always there and
/// always at the same place, where it keeps the columns of a stack aligned.
/// No indentation: the report indents as it nests.
pub fn format_frame(index: usize, f: &Frame) -> String {
    let function = f.function.as_deref().unwrap_or("??");
    let mut line = format!("#{index} {function} ({}+{:#x})", f.module, f.offset);
    if let Some(file) = &f.file {
        line.push(' ');
        line.push_str(file);
        if let Some(n) = f.line {
            line.push_str(&format!(":{n}"));
        }
    }
    line
}
