//! The definitions of one log, indexed: which module, string and stack an id
//! names. Reports resolve allocation sites through it.

use super::read::Log;
use super::schema::{Definition, ModuleRecord, StackRecord};
use std::collections::HashMap;

#[derive(Debug, Default, Clone)]
pub struct Sites {
    /// Sorted by `start`.
    pub modules: Vec<ModuleRecord>,
    strings: HashMap<u32, String>,
    stacks: HashMap<u32, StackRecord>,
}

impl Sites {
    pub fn of(log: &Log) -> Sites {
        let mut sites = Sites::default();
        for d in &log.definitions {
            sites.add(d);
        }
        sites
    }

    /// One more definition (of a log still being written).
    pub fn add(&mut self, d: &Definition) {
        match d {
            Definition::Module(m) => {
                let at = self.modules.partition_point(|x| x.start <= m.start);
                self.modules.insert(at, m.clone());
            }
            Definition::String(s) => {
                self.strings.insert(s.id, s.text.clone());
            }
            Definition::Stack(s) => {
                self.stacks.insert(s.id, s.clone());
            }
        }
    }

    pub fn stack(&self, id: u32) -> Option<&StackRecord> {
        self.stacks.get(&id)
    }

    /// The text of string `id`; `"?"` for an id the log does not define.
    pub fn string(&self, id: u32) -> &str {
        self.strings.get(&id).map_or("?", String::as_str)
    }

    /// The module holding `addr`, if the log lists one.
    pub fn module_of(&self, addr: u64) -> Option<&ModuleRecord> {
        let i = self.modules.partition_point(|m| m.start <= addr);
        self.modules[..i].iter().rev().find(|m| addr < m.end)
    }

    pub fn is_empty(&self) -> bool {
        self.stacks.is_empty()
    }
}
