//! The names events refer to (phases), each stored once: an event carries a
//! small id, and the writer puts the text into the line.

use parking_lot::Mutex;
use std::collections::HashMap;

struct Table {
    ids: HashMap<Box<str>, u32>,
    texts: Vec<Box<str>>,
}

static TABLE: Mutex<Option<Table>> = Mutex::new(None);

/// Names beyond this many share the last id's text: a program that makes a
/// new phase name per step must not grow cupool's memory without bound.
const MAX_NAMES: usize = 1 << 16;

/// The id of `text`, stored on first use.
pub fn intern(text: &str) -> u32 {
    let mut guard = TABLE.lock();
    let table = guard.get_or_insert_with(|| Table { ids: HashMap::new(), texts: vec!["(too many names)".into()] });
    if let Some(&id) = table.ids.get(text) {
        return id;
    }
    if table.texts.len() >= MAX_NAMES {
        return 0;
    }
    let id = table.texts.len() as u32;
    table.texts.push(text.into());
    table.ids.insert(text.into(), id);
    id
}

/// Runs `f` with the text of `id` ("" for an id never handed out).
pub fn with_text<R>(id: u32, f: impl FnOnce(&str) -> R) -> R {
    let guard = TABLE.lock();
    let text = guard.as_ref().and_then(|t| t.texts.get(id as usize)).map_or("", |t| t);
    f(text)
}

/// The text of `id`, if it was handed out.
pub fn text_of(id: u32) -> Option<String> {
    TABLE.lock().as_ref().and_then(|t| t.texts.get(id as usize)).map(|t| t.to_string())
}

pub fn lock_for_fork() {
    std::mem::forget(TABLE.lock());
}

/// # Safety
/// Only after `lock_for_fork`, in the same thread or its forked child. The
/// child keeps the names: ids it inherited stay valid.
pub unsafe fn unlock_after_fork() {
    TABLE.force_unlock();
}
