//! The log file: its name, its header, and writing drained events into it.

use super::{buffers, definitions, strings};
use crate::runtime::clock::TickScale;
use crate::runtime::fds::KeptFd;
use crate::runtime::{diag, options, process};
use cupool_core::log::{self, Event, EventKind, EventLine};
use parking_lot::Mutex;
use std::time::Duration;

/// The open log; `None` until the first event and after the end is written.
pub static LOG: Mutex<Option<LogFile>> = Mutex::new(None);

/// Text written per `write`: a backlog of a million events would otherwise
/// grow a string of 140 MB (page faults and copies, 250 ns an event where
/// formatting takes 50) before the first byte reached the file.
const WRITE_BYTES: usize = 1 << 20;

pub struct LogFile {
    fd: KeptFd,
    path: String,
    text: String,
    batch: Vec<Event>,
    definitions: Vec<log::Definition>,
    /// Turns the events' ticks into nanoseconds since the start.
    scale: TickScale,
    /// Bytes written whole: the file always ends with a whole line there.
    written: u64,
    /// A write failed (a full disk): no more events are written, only the
    /// end record is tried once more at the close.
    stopped: bool,
    /// Events in `text`, counted as dropped if its write fails.
    in_text: usize,
}

impl LogFile {
    /// Creates `cupool.<pid>.json` in the log directory and writes its header.
    pub fn create() -> Option<LogFile> {
        let opts = options::get();
        let dir = std::path::Path::new(&opts.log_dir);
        if let Err(e) = std::fs::create_dir_all(dir) {
            diag::error(&format!("cannot create log_dir {}: {e}; no log will be written", dir.display()));
            return None;
        }
        let pid = std::process::id();
        let mut fd = -1;
        let mut path = String::new();
        // A process that exec()s keeps its pid: never overwrite an earlier image's log.
        for n in 0..100 {
            path = if n == 0 {
                format!("{}/cupool.{pid}.json", dir.display())
            } else {
                format!("{}/cupool.{pid}.{n}.json", dir.display())
            };
            let c = std::ffi::CString::new(path.as_str()).ok()?;
            let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC;
            // SAFETY: `c` is a NUL-terminated path alive for the call.
            fd = unsafe { libc::open(c.as_ptr(), flags, 0o644) };
            if fd >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
                break;
            }
        }
        if fd < 0 {
            diag::error(&format!("cannot create {path}: {}; no log will be written", std::io::Error::last_os_error()));
            return None;
        }
        let mut text = String::with_capacity(WRITE_BYTES + 4096);
        log::write_header(&mut text, &process::info(), opts);
        log::write_event(&mut text, &Event::new(EventKind::Start, log::Api::None), EventLine::First);
        if let Err(e) = write_all(fd, text.as_bytes()) {
            diag::error(&format!("cannot write {path}: {e}; no log will be written"));
            // SAFETY: `fd` is the file this function opened, closed once here before it is dropped.
            unsafe { libc::close(fd) };
            let _ = std::fs::remove_file(&path);
            return None;
        }
        let written = text.len() as u64;
        text.clear();
        diag::note(&format!("writing {path}"));
        let kept = KeptFd::new();
        kept.keep(fd);
        Some(LogFile {
            fd: kept,
            path,
            text,
            batch: Vec::with_capacity(1024),
            definitions: Vec::new(),
            scale: TickScale::new(),
            written,
            stopped: false,
            in_text: 0,
        })
    }

    /// Writes every queued event.
    pub fn drain(&mut self, patience: Duration) {
        buffers::drain(&mut self.batch, patience);
        if self.stopped {
            buffers::count_dropped(self.batch.len());
            self.batch.clear();
            // Kept for the end record's leaks, which may name their stacks.
            definitions::drain(&mut self.definitions, patience);
            return;
        }
        // After the events are collected: each was stamped before this point.
        self.scale.advance();
        // Taken after the events: what they refer to was defined before they
        // were queued, so it is in this batch of definitions or an earlier one.
        definitions::drain(&mut self.definitions, patience);
        for d in self.definitions.drain(..) {
            log::write_definition(&mut self.text, &d);
        }
        // Out of `self` while it is written: `flush` borrows all of it.
        let batch_len = self.batch.len();
        let mut batch = std::mem::take(&mut self.batch);
        for (k, e) in batch.iter_mut().enumerate() {
            if self.stopped {
                buffers::count_dropped(batch_len - k);
                break;
            }
            e.t_ns = self.scale.to_ns(e.t_ns);
            let e = &*e;
            if matches!(e.kind, EventKind::PhaseBegin | EventKind::PhaseEnd) {
                strings::with_text(e.aux as u32, |name| {
                    log::write_named_event(&mut self.text, e, EventLine::Later, name)
                });
            } else {
                log::write_event(&mut self.text, e, EventLine::Later);
            }
            self.in_text += 1;
            if self.text.len() >= WRITE_BYTES {
                self.flush();
            }
        }
        batch.clear();
        self.batch = batch; // its capacity kept for the next drain
        self.flush();
    }

    /// Writes what is queued, then `tail` (the end record), and closes the
    /// file. After a failed write the end record is tried once more: the
    /// log is then whole but for the events it counts as dropped, or, if
    /// that fails too, a log cut short (as by SIGKILL), still readable.
    pub fn close_with(mut self, tail: impl FnOnce(&mut String)) {
        self.drain(Duration::from_millis(100));
        if self.stopped {
            // With the definitions its leaks may name, which the stopped drains kept.
            for d in self.definitions.drain(..) {
                log::write_definition(&mut self.text, &d);
            }
            tail(&mut self.text);
            if self.write_text().is_err() {
                self.cut_back();
            }
        } else {
            tail(&mut self.text);
            self.flush();
        }
        self.fd.close();
    }

    /// Closes the file without writing (a forked child holds its parent's).
    pub fn abandon(self) {
        self.fd.close();
    }

    /// Writes `text` whole to the log.
    fn write_text(&mut self) -> std::io::Result<()> {
        let fd = self.descriptor()?;
        write_all(fd, self.text.as_bytes())
    }

    /// The log's descriptor. Where the program closed it (and may have a
    /// file of its own under that number now), the log's file is opened
    /// again by its path, checked to be the same file, and the log goes on
    /// whole where it was.
    fn descriptor(&mut self) -> std::io::Result<i32> {
        if let Some(fd) = self.fd.get() {
            return Ok(fd);
        }
        let gone = || std::io::Error::other("the program closed its descriptor, and its path names another file now");
        let path = std::ffi::CString::new(self.path.as_str()).map_err(|_| gone())?;
        // SAFETY: `path` is a NUL-terminated path alive for the call.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
        let kept = if fd < 0 { None } else { self.fd.replace_if_same(fd) };
        let fd = kept.ok_or_else(gone)?;
        // SAFETY: `lseek` takes the log's descriptor, just opened again, and integers.
        if unsafe { libc::lseek(fd, self.written as libc::off_t, libc::SEEK_SET) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        diag::note(&format!("the program closed the descriptor of {}; opened again, the log goes on", self.path));
        Ok(fd)
    }

    fn flush(&mut self) {
        if !self.stopped && !self.text.is_empty() {
            match self.write_text() {
                Ok(()) => self.written += self.text.len() as u64,
                Err(e) => {
                    buffers::count_dropped(self.in_text);
                    self.stop(e);
                }
            }
        }
        self.in_text = 0;
        self.text.clear();
    }

    /// A write failed (a full disk, say): the log is best effort, the
    /// program is not. What the write left of a line would make the whole
    /// file unreadable, so the file is cut back to its last whole write.
    #[cold]
    fn stop(&mut self, e: std::io::Error) {
        self.cut_back();
        self.stopped = true;
        diag::error(&format!(
            "cannot write {}: {e}; later events are dropped (counted in the log's end where it can still be written), the program runs on",
            self.path
        ));
    }

    fn cut_back(&mut self) {
        let Ok(fd) = self.descriptor() else { return };
        // SAFETY: `ftruncate` and `lseek` take the log's open descriptor (checked to be it) and integers.
        unsafe {
            libc::ftruncate(fd, self.written as libc::off_t);
            libc::lseek(fd, self.written as libc::off_t, libc::SEEK_SET);
        }
    }
}

fn write_all(fd: i32, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: `write` reads at most `bytes.len()` bytes from `bytes`, alive for the call; `fd` is the
        // log's open file.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(e);
        }
        bytes = &bytes[n as usize..];
    }
    Ok(())
}
