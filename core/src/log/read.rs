//! Reading logs back: complete or cut short, plain or gzipped.

use super::schema::{Definition, End, EventRecord, Header, READABLE_VERSIONS, SCHEMA};
use serde::Serialize;
use serde_json::Value;
use std::io::Read;
use std::path::{Path, PathBuf};

/// A parsed log. `end` is `None` when the process died before finishing it
/// (SIGKILL, power loss): the events up to the last whole line are still here.
///
/// Serializes back to the log's JSON document (without `path`).
#[derive(Debug, Clone, Serialize)]
pub struct Log {
    /// The file it was read from, or the name given to [`read_log_from`].
    #[serde(skip)]
    pub path: PathBuf,
    #[serde(flatten)]
    pub header: Header,
    pub events: Vec<EventRecord>,
    /// The definition lines (modules, strings, stacks), in the order written.
    /// A log written as one document keeps them here, not among the events.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub definitions: Vec<Definition>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end: Option<End>,
}

/// Why a log could not be read. Its `Display` names the file, and the line
/// where one applies: `logs/cupool.12.json:7: ...`.
#[derive(Debug)]
pub struct ReadError {
    pub path: PathBuf,
    /// 1-based line of the file, where the problem is on one line.
    pub line: Option<usize>,
    pub kind: ReadErrorKind,
}

#[derive(Debug)]
pub enum ReadErrorKind {
    /// The file could not be read or decompressed.
    Io(std::io::Error),
    /// Readable, but not a cupool log (the reason says what was found).
    NotALog(String),
    /// A cupool log of a version this build cannot read.
    Version(u64),
    /// A cupool log with a record that does not match the schema.
    Invalid(String),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.path.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        match &self.kind {
            ReadErrorKind::Io(e) => write!(f, ": {e}"),
            ReadErrorKind::NotALog(why) => write!(f, ": not a cupool log ({why})"),
            ReadErrorKind::Version(v) => {
                write!(
                    f,
                    ": cupool-log version {v} is not supported (this cupool reads versions {READABLE_VERSIONS:?})"
                )
            }
            ReadErrorKind::Invalid(why) => write!(f, ": {why}"),
        }
    }
}

impl std::error::Error for ReadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            ReadErrorKind::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<ReadError> for std::io::Error {
    fn from(e: ReadError) -> std::io::Error {
        let kind = match &e.kind {
            ReadErrorKind::Io(io) => io.kind(),
            _ => std::io::ErrorKind::InvalidData,
        };
        std::io::Error::new(kind, e.to_string())
    }
}

/// Reads the log at `path` (plain or gzipped; see [`read_log_from`]).
pub fn read_log(path: impl AsRef<Path>) -> Result<Log, ReadError> {
    let path = path.as_ref();
    let file = std::fs::File::open(path).map_err(|e| ReadError {
        path: path.to_owned(),
        line: None,
        kind: ReadErrorKind::Io(e),
    })?;
    read_log_from(file, path)
}

/// Reads a log from `reader`; `name` stands for the file in errors and in `Log::path`.
///
/// gzip is recognised by its magic bytes. A log cut short (the process was
/// killed) reads as far as its last whole line, with `end: None`. Anything
/// that is not a cupool log is an error.
pub fn read_log_from(reader: impl Read, name: impl AsRef<Path>) -> Result<Log, ReadError> {
    read_log_with_progress(reader, name, &mut |_, _| {})
}

/// [`read_log_from`], telling `progress(done, total)` how far it got in the
/// (decompressed) text now and then: for a progress bar over long logs.
pub fn read_log_with_progress(
    mut reader: impl Read,
    name: impl AsRef<Path>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Log, ReadError> {
    let path = name.as_ref();
    let fail = |line: Option<usize>, kind: ReadErrorKind| ReadError { path: path.to_owned(), line, kind };
    let mut raw = Vec::new();
    reader.read_to_end(&mut raw).map_err(|e| fail(None, ReadErrorKind::Io(e)))?;
    let bytes = maybe_gunzip(raw).map_err(|e| fail(None, ReadErrorKind::Io(e)))?;
    let text = match std::str::from_utf8(&bytes) {
        Ok(t) => t,
        // Cut in the middle of a character: keep what came before.
        Err(e) if e.error_len().is_none() => std::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap_or(""),
        Err(e) => return Err(fail(None, ReadErrorKind::NotALog(format!("not UTF-8 text: {e}")))),
    };
    let mut log = parse(text, progress).map_err(|(line, kind)| fail(line, kind))?;
    log.path = path.to_owned();
    Ok(log)
}

/// `bytes` decompressed when they start with gzip's magic, else unchanged.
/// A gzip stream cut short is an error: the shim writes plain text (a log cut
/// short by a killed process reads as far as its last line), so a gzipped log
/// that ends early was damaged after it was written, and reading part of it
/// would pass off a partial log as a whole one.
pub fn maybe_gunzip(bytes: Vec<u8>) -> std::io::Result<Vec<u8>> {
    if !bytes.starts_with(&[0x1f, 0x8b]) {
        return Ok(bytes);
    }
    let mut out = Vec::new();
    match flate2::read::GzDecoder::new(&bytes[..]).read_to_end(&mut out) {
        Ok(_) => Ok(out),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("the gzip stream is cut short after {} byte(s) (a truncated or damaged file)", out.len()),
        )),
        Err(e) => Err(e),
    }
}

type ParseError = (Option<usize>, ReadErrorKind);

fn invalid(line: Option<usize>, what: String) -> ParseError {
    (line, ReadErrorKind::Invalid(what))
}

/// Checks `schema` and `version` of a header object.
fn check_header(v: &Value, line: Option<usize>) -> Result<(), ParseError> {
    match v.get("schema") {
        Some(Value::String(s)) if s == SCHEMA => {}
        Some(other) => return Err((line, ReadErrorKind::NotALog(format!("\"schema\" is {other}, not \"{SCHEMA}\"")))),
        None => return Err((line, ReadErrorKind::NotALog(format!("no \"schema\":\"{SCHEMA}\"")))),
    }
    match v.get("version").and_then(Value::as_u64) {
        Some(n) if READABLE_VERSIONS.iter().any(|&r| u64::from(r) == n) => Ok(()),
        Some(n) => Err((line, ReadErrorKind::Version(n))),
        None => Err(invalid(line, "the header has no numeric \"version\"".into())),
    }
}

fn parse(text: &str, progress: &mut dyn FnMut(u64, u64)) -> Result<Log, ParseError> {
    if text.trim().is_empty() {
        return Err((None, ReadErrorKind::NotALog("the file is empty".into())));
    }
    let first = text.lines().next().unwrap_or("").trim_end();
    if first.ends_with("\"events\":[") {
        parse_lines(text, progress)
    } else {
        parse_document(text)
    }
}

fn header_from(mut v: Value, line: Option<usize>) -> Result<Header, ParseError> {
    if let Some(o) = v.as_object_mut() {
        o.remove("events");
        o.remove("end");
    }
    serde_json::from_value(v).map_err(|e| invalid(line, format!("header: {e}")))
}

/// The form the shim writes: a header line, one event per line, a trailer line.
fn parse_lines(text: &str, progress: &mut dyn FnMut(u64, u64)) -> Result<Log, ParseError> {
    let total = text.len() as u64;
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l.trim())).filter(|(_, l)| !l.is_empty()).peekable();
    let (_, first) = lines.next().unwrap_or((1, ""));
    let header = header_line(first).map_err(|kind| (Some(1), kind))?;
    // One event a line: the vector is allocated once, not doubled and copied 20 times.
    let mut events = Vec::with_capacity(text.bytes().filter(|&b| b == b'\n').count());
    let mut definitions = Vec::new();
    let mut end = None;
    while let Some((n, line)) = lines.next() {
        if n % PROGRESS_LINES == 0 {
            progress(line.as_ptr() as u64 - text.as_ptr() as u64, total);
        }
        let is_last = lines.peek().is_none();
        match line_of(line, header.version) {
            Ok(LogLine::Event(e)) => events.push(e),
            Ok(LogLine::Definition(d)) => definitions.push(d),
            Ok(LogLine::End(e)) => {
                end = e;
                break;
            }
            // A line that is not (yet) whole JSON is where a killed process stopped writing.
            Err((_, e)) if is_last && matches!(e.classify(), serde_json::error::Category::Eof) => break,
            Err((what, e)) => return Err(invalid(Some(n), format!("{what}: {e}"))),
        }
    }
    progress(total, total);
    Ok(Log { path: PathBuf::new(), header, events, definitions, end })
}

/// One line of a log as the shim writes it, after the header line.
#[derive(Debug)]
pub enum LogLine {
    Event(EventRecord),
    Definition(Definition),
    /// The last line: the end record, `None` from a writer that had none.
    End(Option<End>),
}

/// The header line (line 1) of a log as the shim writes it, up to `"events":[`.
pub fn header_line(line: &str) -> Result<Header, ReadErrorKind> {
    let header: Value = serde_json::from_str(&format!("{}]}}", line.trim()))
        .map_err(|e| ReadErrorKind::NotALog(format!("unreadable header line: {e}")))?;
    check_header(&header, Some(1)).map_err(|(_, kind)| kind)?;
    header_from(header, Some(1)).map_err(|(_, kind)| kind)
}

/// One whole line after the header; the error names what the line was
/// taken for. A line cut short fails with a JSON error of category `Eof`.
pub fn line_of(line: &str, version: u32) -> Result<LogLine, (&'static str, serde_json::Error)> {
    let line = line.trim();
    if line.starts_with(']') {
        // `],"end":{...}}`, or `]}` from a writer that had no end record.
        let tail: Value = serde_json::from_str(&format!("{{\"_\":[{line}")).map_err(|e| ("unreadable trailer", e))?;
        return match tail.get("end").filter(|v| !v.is_null()) {
            Some(v) => {
                serde_json::from_value::<End>(v.clone()).map(|e| LogLine::End(Some(e))).map_err(|e| ("end record", e))
            }
            None => Ok(LogLine::End(None)),
        };
    }
    let body = line.strip_prefix(',').unwrap_or(line);
    if body.starts_with("{\"def\"") {
        return serde_json::from_str::<Definition>(body).map(LogLine::Definition).map_err(|e| ("definition", e));
    }
    serde_json::from_str::<EventRecord>(body)
        .map(|e| LogLine::Event(e.with_defaults(version)))
        .map_err(|e| ("event", e))
}

/// Lines between two calls of a reader's progress function.
const PROGRESS_LINES: usize = 1 << 16;

/// Any other layout of one complete JSON document (pretty-printed, say).
fn parse_document(text: &str) -> Result<Log, ParseError> {
    let mut whole: Value = serde_json::from_str(text).map_err(|e| {
        (None, ReadErrorKind::NotALog(format!("neither a JSON document nor a cupool log header on line 1: {e}")))
    })?;
    if !whole.is_object() {
        return Err((None, ReadErrorKind::NotALog("the JSON document is not an object".into())));
    }
    check_header(&whole, None)?;
    let events = match whole.get_mut("events").map(Value::take) {
        Some(Value::Array(a)) => a,
        _ => return Err(invalid(None, "no \"events\" array".into())),
    };
    let end = whole.get_mut("end").map(Value::take).filter(|v| !v.is_null());
    let mut definitions = match whole.as_object_mut().and_then(|o| o.remove("definitions")) {
        Some(d) => {
            serde_json::from_value::<Vec<Definition>>(d).map_err(|e| invalid(None, format!("definitions: {e}")))?
        }
        None => Vec::new(),
    };
    let header = header_from(whole, None)?;
    let mut records = Vec::with_capacity(events.len());
    for (i, e) in events.into_iter().enumerate() {
        if e.get("def").is_some() {
            definitions
                .push(serde_json::from_value(e).map_err(|err| invalid(None, format!("definition #{i}: {err}")))?);
        } else {
            let record: EventRecord =
                serde_json::from_value(e).map_err(|err| invalid(None, format!("event #{i}: {err}")))?;
            records.push(record.with_defaults(header.version));
        }
    }
    let events: Vec<EventRecord> = records;
    let end =
        end.map(serde_json::from_value::<End>).transpose().map_err(|e| invalid(None, format!("end record: {e}")))?;
    Ok(Log { path: PathBuf::new(), header, events, definitions, end })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::ExitRecord;
    use crate::model::Process;

    /// The summary of the log `log`'s model gives.
    fn summarize(log: &Log) -> crate::model::Summary {
        Process::new(log.clone()).summary()
    }

    const COMPLETE: &str = concat!(
        "{\"schema\":\"cupool-log\",\"version\":2,\"process\":{\"pid\":5,\"cmdline\":[\"a\",\"b\"]},\"options\":{\"mode\":\"passthrough\"},\"events\":[\n",
        "{\"seq\":0,\"t_ns\":0,\"ev\":\"start\",\"tid\":1}\n",
        ",{\"seq\":1,\"t_ns\":5,\"ev\":\"alloc\",\"api\":\"cudaMalloc\",\"kind\":\"device\",\"ptr\":\"0x10\",\"size\":100,\"device\":0,\"tid\":1}\n",
        ",{\"seq\":2,\"t_ns\":6,\"ev\":\"alloc\",\"api\":\"cudaMalloc\",\"kind\":\"device\",\"ptr\":\"0x20\",\"size\":50,\"device\":0,\"tid\":1}\n",
        ",{\"seq\":3,\"t_ns\":7,\"ev\":\"free\",\"api\":\"cudaFree\",\"kind\":\"device\",\"ptr\":\"0x10\",\"size\":100,\"device\":0,\"tid\":1}\n",
        "],\"end\":{\"end_unix_ms\":9,\"duration_ms\":1,\"exit\":{\"how\":\"exit\",\"status\":0},",
        "\"devices\":[{\"device\":0,\"allocs\":2,\"frees\":1,\"failures\":0,\"current_bytes\":50,\"peak_bytes\":150,\"current_count\":1,\"peak_count\":2,\"reserved_bytes\":50,\"peak_reserved_bytes\":150}],",
        "\"host\":{\"device\":-1,\"allocs\":0,\"frees\":0,\"failures\":0,\"current_bytes\":0,\"peak_bytes\":0,\"current_count\":0,\"peak_count\":0,\"reserved_bytes\":0,\"peak_reserved_bytes\":0},",
        "\"leaks\":[{\"ptr\":\"0x20\",\"size\":50,\"device\":0,\"kind\":\"device\",\"api\":\"cudaMalloc\",\"age_ms\":0,\"tid\":1,\"at\":\"exit\"}],",
        "\"leak_summary\":{\"bytes\":50,\"count\":1},\"dropped_events\":0,\"pools\":[],\"ooms\":[],\"complete\":true}}\n"
    );

    fn read(text: &str) -> Result<Log, ReadError> {
        read_log_from(text.as_bytes(), "test.json")
    }

    #[test]
    fn complete_and_truncated_logs_agree() {
        let full = read(COMPLETE).unwrap();
        assert_eq!(full.events.len(), 4);
        let a = summarize(&full);
        assert!(a.complete);
        assert_eq!(a.cmdline, "a b");
        assert_eq!(a.exit, Some(ExitRecord::Exit { status: Some(0) }));
        // Cut in the middle of the trailer line, as SIGKILL would.
        let cut = &COMPLETE[..COMPLETE.find("],\"end\"").unwrap() + 12];
        let part = read(cut).unwrap();
        assert!(part.end.is_none());
        let b = summarize(&part);
        assert!(!b.complete);
        assert_eq!(b.devices, a.devices);
        assert_eq!(b.leak_bytes, 50);
        assert_eq!(b.leaks[0].ptr, Some(0x20));
        assert_eq!(b.leaks[0].at, "not finished");
        // Cut in the middle of an event line: the half line is dropped.
        let mid = &COMPLETE[..COMPLETE.find("\"seq\":3").unwrap() + 4];
        let part = read(mid).unwrap();
        assert_eq!(part.events.len(), 3);
        assert_eq!(summarize(&part).leak_bytes, 150);
        // Only the header line.
        let head = &COMPLETE[..COMPLETE.find('\n').unwrap() + 1];
        assert!(read(head).unwrap().events.is_empty());
    }

    /// Version 5's lines leave `api`, `kind` and `device` out at their
    /// defaults: read line by line or as one document, the log is the one
    /// that spells them out, and a field written at another value stays.
    /// An older log's lines are read as written.
    #[test]
    fn lines_that_leave_defaults_out_read_as_the_full_lines() {
        let compact = COMPLETE
            .replace("\"version\":2", "\"version\":5")
            .replace("\"api\":\"cudaMalloc\",\"kind\":\"device\",", "")
            .replace("\"api\":\"cudaFree\",\"kind\":\"device\",", "")
            .replace(",\"size\":50,\"device\":0,\"tid\"", ",\"size\":50,\"tid\"")
            .replace(",\"size\":100,\"device\":0,\"tid\"", ",\"size\":100,\"tid\"");
        assert!(!compact.contains("\"api\":\"cudaFree\""), "{compact}");
        let (full, lines) = (read(COMPLETE).unwrap(), read(&compact).unwrap());
        assert_eq!(lines.events, full.events);
        let v: Value = serde_json::from_str(&compact).unwrap();
        let document = read(&serde_json::to_string_pretty(&v).unwrap()).unwrap();
        assert_eq!(document.events, full.events);
        let host = compact.replacen(
            "\"size\":50,",
            "\"kind\":\"host\",\"api\":\"cuMemHostAlloc\",\"size\":50,\"device\":-1,",
            1,
        );
        // Written before version 5, a line that lacks them lacks them.
        let older = read(&compact.replace("\"version\":5", "\"version\":4")).unwrap();
        assert_eq!(
            (older.events[1].api.as_ref(), older.events[1].kind.as_ref(), older.events[1].device),
            (None, None, None)
        );
        let e = &read(&host).unwrap().events[2];
        assert_eq!(
            (e.api.as_ref().unwrap().as_str(), e.kind.as_ref().unwrap().as_str(), e.device),
            ("cuMemHostAlloc", "host", Some(-1))
        );
    }

    #[test]
    fn the_same_document_in_another_layout_reads_the_same() {
        let full = read(COMPLETE).unwrap();
        let v: Value = serde_json::from_str(COMPLETE).unwrap();
        let pretty = read(&serde_json::to_string_pretty(&v).unwrap()).unwrap();
        assert_eq!(pretty.header, full.header);
        assert_eq!(pretty.events, full.events);
        assert_eq!(pretty.end, full.end);
        // And a Log serializes back to the document.
        assert_eq!(serde_json::to_value(&full).unwrap()["end"], v["end"]);
        assert_eq!(serde_json::to_value(&full).unwrap()["events"], v["events"]);
    }

    #[test]
    fn gzip_is_recognised() {
        use std::io::Write as _;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(COMPLETE.as_bytes()).unwrap();
        let bytes = gz.finish().unwrap();
        let log = read_log_from(&bytes[..], "x.json.gz").unwrap();
        assert_eq!(log.events.len(), 4);
        assert!(log.end.is_some());
        // A gzip stream cut short is named as such, never read as a log cut short.
        for keep in [bytes.len() - 12, bytes.len() / 2, 20] {
            let e = read_log_from(&bytes[..keep], "x.json.gz").unwrap_err();
            assert!(e.to_string().starts_with("x.json.gz: "), "{e}");
            assert!(matches!(e.kind, ReadErrorKind::Io(_)), "{e}");
        }
        let e = read_log_from(&bytes[..bytes.len() - 12], "x.json.gz").unwrap_err();
        assert!(e.to_string().contains("cut short"), "{e}");
    }

    #[test]
    fn bundled_version_1_traces_read() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces");
        let log = read_log(dir.join("cupy.json.gz")).unwrap();
        assert_eq!(log.header.version, 1);
        assert_eq!(log.header.options.fence_us, 100, "missing option reads as its default");
        let end = log.end.as_ref().expect("complete trace");
        assert_eq!(end.exit, ExitRecord::Exit { status: Some(0) });
        assert!(log.events.len() > 100);
    }

    #[test]
    fn version_1_fences_text_is_read() {
        let mut v: Value = serde_json::from_str(COMPLETE).unwrap();
        let pool = serde_json::json!({"device":0,"context_destroyed":false,
            "allocated_bytes":{"current":1,"peak":2},"requested_bytes":{"current":1,"peak":2},
            "reserved_bytes":{"current":1,"peak":2},"active_bytes":{"current":1,"peak":2},
            "inactive_split_bytes":{"current":0,"peak":0},"segment":{"current":1,"peak":1},
            "num_device_alloc":1,"num_device_free":0,"num_alloc_retries":0,"num_ooms":0,"num_syncs":0,
            "num_waits":0,"largest_free_block":0,"multi_stream":false,
            "fences":"FenceCounters { recorded: 12, completed: 3, skipped_for_capture: 0, waits: 7 }",
            "peak_reserved_over_peak_requested":1.0});
        v["end"]["pools"] = serde_json::json!([pool]);
        v["version"] = 1.into();
        let log = read(&v.to_string()).unwrap();
        let f = log.end.unwrap().pools[0].fences;
        assert_eq!((f.recorded, f.completed, f.waits, f.syncs), (12, 3, 7, 0));
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let e = read("{\"a\":1").unwrap_err();
        assert!(e.to_string().starts_with("test.json: not a cupool log"), "{e}");
        let e = read("{\"hello\": 1}\n").unwrap_err();
        assert!(matches!(e.kind, ReadErrorKind::NotALog(_)), "{e}");
        assert!(e.to_string().contains("cupool-log"), "{e}");
        let e = read("").unwrap_err();
        assert_eq!(e.to_string(), "test.json: not a cupool log (the file is empty)");
        let e = read("not a trace").unwrap_err();
        assert!(matches!(e.kind, ReadErrorKind::NotALog(_)), "{e}");
        let e = read(&COMPLETE.replace("\"version\":2", "\"version\":9")).unwrap_err();
        assert!(matches!(e.kind, ReadErrorKind::Version(9)), "{e}");
        assert_eq!(e.line, Some(1));
        // A whole line that is not an event is an error, not a cut.
        let e = read(&COMPLETE.replace("\"seq\":2,", "")).unwrap_err();
        assert_eq!(e.line, Some(4), "{e}");
        assert!(e.to_string().starts_with("test.json:4: event"), "{e}");
        // So is garbage before the last line.
        let e = read(&COMPLETE.replace(",{\"seq\":2", ",{\"seq\":2#")).unwrap_err();
        assert_eq!(e.line, Some(4), "{e}");
        let e = read_log("/nonexistent/cupool.1.json").unwrap_err();
        assert!(e.to_string().starts_with("/nonexistent/cupool.1.json: "), "{e}");
    }

    #[test]
    fn unknown_names_are_kept() {
        let text = COMPLETE.replace("\"api\":\"cudaFree\"", "\"api\":\"cuMemFutureFree\"");
        let log = read(&text).unwrap();
        let api = log.events[3].api.as_ref().unwrap();
        assert_eq!(api.known(), None);
        assert_eq!(api.as_str(), "cuMemFutureFree");
        assert_eq!(serde_json::to_value(&log).unwrap()["events"][3]["api"], "cuMemFutureFree");
    }
}
