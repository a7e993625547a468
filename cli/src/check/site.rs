//! Allocation sites as `cupool check` groups, shows and matches them.

use crate::sites::{Resolver, ShownFrame};
use cupool_core::model::Process;
use std::collections::{BTreeSet, HashMap, HashSet};

/// One allocation site of one process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Site {
    /// Identical sites of all processes share it: the text of the frames;
    /// for a site without frames, what was allocated and its size.
    pub key: String,
    pub frames: Vec<ShownFrame>,
    /// Frames of the stack left out of `frames` (`sites::collapse`).
    pub hidden: u64,
    /// `cudaMalloc (device)`.
    pub what: String,
    /// Full paths of the modules of its native frames: suppressions match
    /// them as well as the file names the frames show.
    pub modules: Vec<String>,
}

impl Site {
    /// A site of `frames`, innermost first, as people read them
    /// (`sites::collapse`); one without frames is told apart by what was
    /// allocated and its size.
    pub fn new(frames: Vec<ShownFrame>, what: String, modules: Vec<String>, size: u64) -> Site {
        let (frames, hidden) = crate::sites::collapse(frames);
        let key = if frames.is_empty() {
            format!("{what} {size}")
        } else {
            frames.iter().enumerate().map(|(i, f)| f.text(i)).collect::<Vec<_>>().join("\n")
        };
        Site { key, frames, hidden, what, modules }
    }

    /// What a suppression pattern is matched against.
    pub fn match_texts(&self) -> Vec<&str> {
        let mut texts = frame_texts(&self.frames);
        texts.extend(self.modules.iter().map(String::as_str));
        texts
    }
}

/// Every frame's function, module and file.
pub fn frame_texts(frames: &[ShownFrame]) -> Vec<&str> {
    frames.iter().flat_map(|f| [f.function.as_deref(), f.module.as_deref(), f.file.as_deref()]).flatten().collect()
}

/// Names the sites of one process, resolving each stack once.
pub struct Namer<'a> {
    p: &'a Process,
    resolver: Option<Resolver>,
    stacks: HashMap<u32, (Vec<ShownFrame>, Vec<String>)>,
}

impl<'a> Namer<'a> {
    pub fn new(p: &'a Process) -> Namer<'a> {
        Namer { p, resolver: None, stacks: HashMap::new() }
    }

    /// The site of an allocation made through `api` (memory of `kind`,
    /// `size` bytes) from stack `stack`, if one was recorded.
    pub fn site(&mut self, stack: Option<u32>, api: &str, kind: &str, size: u64) -> Site {
        let what = format!("{api} ({kind})");
        let (frames, modules) = match stack {
            Some(id) => {
                let log = &self.p.log;
                let resolver = self.resolver.get_or_insert_with(|| Resolver::new(log));
                self.stacks.entry(id).or_insert_with(|| (resolver.frames(id), resolver.module_paths(id))).clone()
            }
            None => (Vec::new(), Vec::new()),
        };
        Site::new(frames, what, modules, size)
    }

    /// The stacks of the process's allocations with a native frame in a
    /// module whose file name `module` accepts.
    pub fn stacks_in(&mut self, module: &dyn Fn(&str) -> bool) -> HashSet<u32> {
        let ids: BTreeSet<u32> = self.p.allocations.iter().filter_map(|a| a.stack).collect();
        if ids.is_empty() {
            return HashSet::new();
        }
        let log = &self.p.log;
        let resolver = self.resolver.get_or_insert_with(|| Resolver::new(log));
        let file_name = |p: &str| p.rsplit('/').next().unwrap_or(p).to_string();
        ids.into_iter().filter(|&id| resolver.module_paths(id).iter().any(|p| module(&file_name(p)))).collect()
    }

    /// Module files that could not be used to name frames, by path.
    pub fn unusable(&self) -> Vec<(String, crate::symbolize::Problem)> {
        self.resolver.as_ref().map(Resolver::unusable).unwrap_or_default()
    }
}
