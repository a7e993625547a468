//! Test leaks: what the pytest plugin (`python/cupool/pytest_plugin.py`)
//! measured per test, in `cupool-tests.<pid>.json` beside the logs
//! (docs/log-schema.md), with the allocation site taken from the log of the
//! same process.

use super::finding::{Finding, Held, Holding, LeakKind, ProcessRef};
use super::history::{self, History};
use crate::sites::Resolver;
use cupool_core::model::{AllocId, Family, Process, SpanId};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};

/// The `schema` of a per-test results file.
pub const SCHEMA: &str = "cupool-tests";
/// The version this build reads.
pub const VERSION: u32 = 1;
/// The plugin's phase around each test: `test:<nodeid>`.
const TEST_PHASE: &str = "test:";
/// The plugin's phase around a wider-scoped fixture's setup or teardown
/// inside a test: what happens there is not the test's.
const FIXTURE_PHASE: &str = "fixture:";

/// Phases the plugin names around each test (`test:<nodeid>`) and around a
/// wider fixture's setup or teardown (`fixture:<scope>:<name>`). Growth
/// analysis leaves them out: one test is not a repetition of the one before.
pub fn is_plugin_phase(name: &str) -> bool {
    name.starts_with(TEST_PHASE) || name.starts_with(FIXTURE_PHASE)
}

/// One results file, as read. Every field the plugin writes is parsed, so a
/// malformed file is refused, although the check reads only some of them.
#[allow(dead_code)]
#[derive(Clone, Debug, Deserialize)]
pub struct TestsFile {
    pub schema: String,
    pub version: u32,
    pub pid: u32,
    #[serde(default)]
    pub worker: Option<String>,
    /// The `run_id` option the process ran with (empty when none).
    #[serde(default)]
    pub run_id: String,
    #[serde(default)]
    pub tests: Vec<TestRecord>,
    /// False for a file whose process stopped before the session ended.
    #[serde(default)]
    pub complete: bool,
}

#[allow(dead_code)]
#[derive(Clone, Debug, Deserialize)]
pub struct TestRecord {
    pub nodeid: String,
    #[serde(default)]
    pub outcome: Option<String>,
    pub leaked_bytes: u64,
    #[serde(default)]
    pub leaked_count: Option<u64>,
    pub measured_by: String,
    #[serde(default)]
    pub devices: BTreeMap<String, DeviceLeak>,
    /// The test's `cupool_limit_memory` marker's argument, as written.
    #[serde(default)]
    pub limit: Option<String>,
}

#[allow(dead_code)]
#[derive(Clone, Debug, Deserialize)]
pub struct DeviceLeak {
    pub leaked_bytes: u64,
    #[serde(default)]
    pub leaked_count: Option<u64>,
}

/// What the plugin measured when no framework's counters were in use: the
/// shim's own, whose allocations the log has.
const MEASURED_BY_CUPOOL: &str = "cupool";

/// The test leaks of a run: every test in the `cupool-tests.*.json` files of
/// `log_dir` whose process is one of `processes` (same pid, same `run_id`,
/// its log in `log_dir`) and that left bytes allocated. A test that leaked in
/// several processes from the same site (a rerun, two xdist workers) is one
/// finding. Measured with cupool's own counters, a test's leak holds the
/// allocations of the log it made and left live; measured with a
/// framework's counters, the bytes it measured, at the site of the largest
/// object the framework's history (`histories`) shows the test made and
/// left live, where one was recorded.
///
/// Err: one line per file that cannot be read, each naming the file.
pub fn findings(processes: &[Process], histories: &[History], log_dir: &Path) -> Result<Vec<Finding>, String> {
    let mut problems = Vec::new();
    let mut out: Vec<Finding> = Vec::new();
    for path in results_files(log_dir) {
        let file = match read(&path) {
            Ok(f) => f,
            Err(e) => {
                problems.push(format!("{}: {e}", path.display()));
                continue;
            }
        };
        let mine = processes_of(processes, log_dir, &file);
        let Some(&first) = mine.first() else { continue };
        let leaking: Vec<&TestRecord> = file.tests.iter().filter(|t| t.leaked_bytes > 0).collect();
        if leaking.is_empty() {
            continue;
        }
        // The log that holds the test's phase; one process may have written
        // several (cupool.<pid>.<n>.json after an exec).
        let mut left: Vec<(usize, LeftByTest)> = mine.iter().map(|&i| (i, live_at_end(&processes[i]))).collect();
        let mut resolvers: HashMap<usize, Resolver> = HashMap::new();
        // The objects each framework history of these processes shows left live by each test.
        let mut objects: Vec<(&History, Process, LeftByTest)> = Vec::new();
        for &i in &mine {
            for h in history::of(histories, &processes[i].log) {
                let o = h.process(&processes[i]);
                let by_test = live_at_end(&o);
                objects.push((h, o, by_test));
            }
        }
        for t in leaking {
            let phase = test_phase(&t.nodeid);
            let found =
                left.iter_mut().find_map(|(i, s)| s.get_mut(&phase).and_then(VecDeque::pop_front).map(|l| (*i, l)));
            let (process, held) = found.unwrap_or((first, Vec::new()));
            let p = &processes[process];
            let stack = match largest(p, &held).and_then(|id| p.allocations[id].stack) {
                Some(stack) => resolvers.entry(process).or_insert_with(|| Resolver::new(&p.log)).frames(stack),
                // Nothing of the log's: the framework's objects say where, when it recorded them.
                None => objects
                    .iter_mut()
                    .find_map(|(h, o, by_test)| {
                        let made = by_test.get_mut(&phase).and_then(VecDeque::pop_front)?;
                        Some(h.frames(o.allocations[largest(o, &made)?].stack?))
                    })
                    .unwrap_or_default(),
            };
            let (frames, hidden_frames) = crate::sites::collapse(stack);
            let mut f = Finding {
                kind: LeakKind::Test,
                what: "device memory the test left allocated".into(),
                processes: vec![ProcessRef::of(&p.log)],
                test: Some(t.nodeid.clone()),
                frames,
                hidden_frames,
                ..Default::default()
            };
            if t.measured_by == MEASURED_BY_CUPOOL && !held.is_empty() {
                for id in held {
                    let bytes = p.allocations[id].size;
                    f.hold(Holding { what: Held::Allocation { process, id }, bytes, allocations: 1 });
                }
            } else {
                let allocations = t.leaked_count.unwrap_or(held.len() as u64);
                let what = Held::Measured { process, test: t.nodeid.clone() };
                f.hold(Holding { what, bytes: t.leaked_bytes, allocations });
            }
            add(&mut out, f);
        }
    }
    if !problems.is_empty() {
        return Err(problems.join("\n"));
    }
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.test.cmp(&b.test)));
    Ok(out)
}

/// The processes (indices in `processes`) a results file in `log_dir` is of:
/// its pid and `run_id`, their logs beside it (one process may have written
/// several logs: `cupool.<pid>.<n>.json` after an exec).
pub fn processes_of(processes: &[Process], log_dir: &Path, file: &TestsFile) -> Vec<usize> {
    (0..processes.len())
        .filter(|&i| {
            let log = &processes[i].log;
            log.path.parent() == Some(log_dir)
                && log.header.process.pid == file.pid
                && (file.run_id.is_empty() || log.header.options.run_id == file.run_id)
        })
        .collect()
}

/// The span of each `test:<nodeid>` phase of `p` that ended, by name, in order.
pub fn test_spans(p: &Process) -> HashMap<String, VecDeque<SpanId>> {
    let mut tests: Vec<SpanId> = (0..p.spans.len()).filter(|&s| is_test(p, s) && p.spans[s].end.is_some()).collect();
    tests.sort_by_key(|&s| p.spans[s].end);
    let mut out: HashMap<String, VecDeque<SpanId>> = HashMap::new();
    for s in tests {
        out.entry(p.spans[s].name.clone()).or_default().push_back(s);
    }
    out
}

/// The name of a test's phase in the log.
pub fn test_phase(nodeid: &str) -> String {
    format!("{TEST_PHASE}{nodeid}")
}

/// The largest of `ids`; among equals the first made, so the choice does not depend on hashing.
fn largest(p: &Process, ids: &[AllocId]) -> Option<AllocId> {
    ids.iter().copied().max_by_key(|&id| (p.allocations[id].size, std::cmp::Reverse(id)))
}

/// Merges `f` into the finding of the same test and site, if there is one.
fn add(out: &mut Vec<Finding>, f: Finding) {
    let same = |g: &Finding| g.test == f.test && g.frames == f.frames;
    match out.iter_mut().find(|g| same(g)) {
        Some(g) => g.absorb(f),
        None => out.push(f),
    }
}

/// `cupool-tests.<pid>.json` and `cupool-tests.<pid>.<n>.json` in `dir`, sorted.
pub fn results_files(dir: &Path) -> Vec<PathBuf> {
    crate::summary::sidecar_files(dir, "cupool-tests")
}

/// Reads one results file, whole or cut short (the plugin writes a line per
/// test, so a process that died mid-run leaves its finished tests readable).
pub fn read(path: &Path) -> Result<TestsFile, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let file = match serde_json::from_str::<TestsFile>(&text) {
        Ok(f) => f,
        // Not one document: the plugin's line layout, perhaps cut short.
        Err(_) if text.lines().next().is_some_and(|l| l.trim_end().ends_with('[')) => parse_lines(&text)?,
        Err(whole) => return Err(whole.to_string()),
    };
    if file.schema != SCHEMA {
        return Err(format!("not a cupool per-test results file (schema {:?}, expected {SCHEMA:?})", file.schema));
    }
    if file.version != VERSION {
        return Err(format!("{SCHEMA} version {}; this cupool reads version {VERSION}", file.version));
    }
    Ok(file)
}

fn parse_lines(text: &str) -> Result<TestsFile, String> {
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l.trim())).filter(|(_, l)| !l.is_empty()).peekable();
    let (_, first) = lines.next().ok_or("empty file")?;
    let mut file: TestsFile =
        serde_json::from_str(&format!("{first}]}}")).map_err(|e| format!("line 1: unreadable header: {e}"))?;
    while let Some((n, line)) = lines.next() {
        let last = lines.peek().is_none();
        let cut = |e: &serde_json::Error| last && e.classify() == serde_json::error::Category::Eof;
        if line.starts_with(']') {
            #[derive(Deserialize)]
            struct Tail {
                #[serde(default)]
                complete: bool,
            }
            match serde_json::from_str::<Tail>(&format!("{{\"_\":[{line}")) {
                Ok(t) => file.complete = t.complete,
                Err(e) if cut(&e) => {}
                Err(e) => return Err(format!("line {n}: unreadable trailer: {e}")),
            }
            if !last {
                return Err(format!("line {n}: text after the closing line"));
            }
            break;
        }
        match serde_json::from_str::<TestRecord>(line.strip_prefix(',').unwrap_or(line)) {
            Ok(t) => file.tests.push(t),
            Err(e) if cut(&e) => {}
            Err(e) => return Err(format!("line {n}: {e}")),
        }
    }
    Ok(file)
}

/// Per test phase name, for each time it ran: the allocations it left live.
type LeftByTest = HashMap<String, VecDeque<Vec<AllocId>>>;

/// For each `test:<nodeid>` phase of `p`, in the order they ended: the
/// allocations made inside it (not inside a nested `fixture:` phase) and
/// still live when it ended.
fn live_at_end(p: &Process) -> LeftByTest {
    let mut owners: HashMap<SpanId, Option<SpanId>> = HashMap::new();
    let mut held: BTreeMap<SpanId, Vec<AllocId>> = BTreeMap::new();
    for (id, a) in p.allocations.iter().enumerate() {
        let Some(test) = a.phase.and_then(|s| owner(p, s, &mut owners)) else { continue };
        let Some(end) = p.spans[test].end else { continue };
        if a.live_after(end) {
            held.entry(test).or_default().push(id);
        }
    }
    test_spans(p)
        .into_iter()
        .map(|(name, spans)| (name, spans.into_iter().map(|s| held.remove(&s).unwrap_or_default()).collect()))
        .collect()
}

fn is_test(p: &Process, s: SpanId) -> bool {
    p.spans[s].family == Family::Phase && p.spans[s].name.starts_with(TEST_PHASE)
}

/// The test an allocation made in phase `s` belongs to: the innermost test
/// phase around it, unless a fixture phase opened inside that test is around it too.
fn owner(p: &Process, s: SpanId, memo: &mut HashMap<SpanId, Option<SpanId>>) -> Option<SpanId> {
    if let Some(&known) = memo.get(&s) {
        return known;
    }
    let mut at = Some(s);
    let mut found = None;
    while let Some(span) = at {
        let x = &p.spans[span];
        if x.family == Family::Phase && x.name.starts_with(FIXTURE_PHASE) {
            break;
        }
        if is_test(p, span) {
            found = Some(span);
            break;
        }
        at = x.parent;
    }
    memo.insert(s, found);
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sites::ShownFrame;
    use cupool_core::log::Log;

    const MIB: u64 = 1 << 20;

    /// A log of pid 42: a header, `events` (one JSON object per line, seq given), an end.
    fn log(pid: u32, run_id: &str, events: &[String]) -> Log {
        let mut text = format!(
            "{{\"schema\":\"cupool-log\",\"version\":3,\"process\":{{\"pid\":{pid},\"ppid\":1,\"cmdline\":[\"python\",\"-m\",\"pytest\"],\"exe\":\"/usr/bin/python3\",\"start_unix_ms\":0}},\"options\":{{\"run_id\":\"{run_id}\"}},\"events\":[\n{{\"seq\":0,\"t_ns\":0,\"ev\":\"start\",\"tid\":1}}\n"
        );
        for e in events {
            text.push(',');
            text.push_str(e);
            text.push('\n');
        }
        text.push_str("]}\n");
        cupool_core::log::read_log_from(text.as_bytes(), format!("cupool.{pid}.json")).expect("a valid log")
    }

    /// The logs as processes whose logs lie in `dir`.
    fn in_dir(dir: &Path, logs: Vec<Log>) -> Vec<Process> {
        logs.into_iter()
            .map(|mut l| {
                l.path = dir.join(&l.path);
                Process::new(l)
            })
            .collect()
    }

    /// What each test phase of `log` left live: (the largest allocation's site and size, how many).
    fn left(log: &Log) -> HashMap<String, (Option<u32>, u64, usize)> {
        let p = Process::new(log.clone());
        live_at_end(&p)
            .into_iter()
            .map(|(name, mut ends)| {
                let held = ends.pop_back().unwrap();
                let largest = held.iter().max_by_key(|&&id| (p.allocations[id].size, std::cmp::Reverse(id)));
                let site = largest.map_or((None, 0), |&id| (p.allocations[id].stack, p.allocations[id].size));
                (name, (site.0, site.1, held.len()))
            })
            .collect()
    }

    struct Timeline {
        seq: u64,
        lines: Vec<String>,
    }

    impl Timeline {
        fn new() -> Timeline {
            Timeline { seq: 1, lines: Vec::new() }
        }
        fn push(&mut self, body: String) {
            self.lines.push(format!("{{\"seq\":{},\"t_ns\":{},{body}}}", self.seq, self.seq * 10));
            self.seq += 1;
        }
        /// One phase edge, written as the shim does: a line per device in use.
        fn phase(&mut self, ev: &str, name: &str, devices: &[i32]) {
            let api = if ev == "phase_begin" { "cupool_phase_begin" } else { "cupool_phase_end" };
            for d in devices {
                self.push(format!(
                    "\"ev\":\"{ev}\",\"api\":\"{api}\",\"name\":{},\"device\":{d},\"live\":0,\"reserved\":0,\"tid\":1",
                    serde_json::to_string(name).unwrap()
                ));
            }
        }
        fn alloc(&mut self, ptr: u64, size: u64, stack: Option<u32>) {
            let stack = stack.map(|s| format!(",\"stack\":{s}")).unwrap_or_default();
            self.push(format!(
                "\"ev\":\"alloc\",\"api\":\"cudaMalloc\",\"kind\":\"device\",\"ptr\":\"{ptr:#x}\",\"size\":{size},\"device\":0{stack},\"tid\":1"
            ));
        }
        fn free(&mut self, ptr: u64, size: u64) {
            self.push(format!(
                "\"ev\":\"free\",\"api\":\"cudaFree\",\"kind\":\"device\",\"ptr\":\"{ptr:#x}\",\"size\":{size},\"device\":0,\"tid\":1"
            ));
        }
    }

    #[test]
    fn the_largest_allocation_still_live_at_the_end_of_the_test_phase_is_the_site() {
        let mut t = Timeline::new();
        t.phase("phase_begin", "test:t.py::test_a", &[-1]);
        t.alloc(0x1000, MIB, Some(1)); // freed in the test
        t.alloc(0x2000, 2 * MIB, Some(2)); // leaked, the largest
        t.alloc(0x3000, 4096, Some(3)); // leaked
        t.phase("phase_begin", "fixture:session:model", &[0, 1]);
        t.alloc(0x4000, 8 * MIB, Some(4)); // the session fixture's, not the test's
        t.phase("phase_end", "fixture:session:model", &[0, 1]);
        t.phase("phase_begin", "user phase", &[0, 1]);
        t.alloc(0x5000, 512, None); // inside a phase of the test's own: the test's
        t.phase("phase_end", "user phase", &[0, 1]);
        t.free(0x1000, MIB);
        t.phase("phase_end", "test:t.py::test_a", &[0, 1]);
        t.phase("phase_begin", "test:t.py::test_b", &[0, 1]);
        t.alloc(0x6000, MIB, Some(6));
        t.free(0x2000, 2 * MIB); // test_a's leak freed later: still test_a's at its end
        t.free(0x6000, MIB);
        t.phase("phase_end", "test:t.py::test_b", &[0, 1]);
        let l = log(42, "", &t.lines);
        let live = left(&l);
        assert_eq!(live["test:t.py::test_a"], (Some(2), 2 * MIB, 3));
        assert_eq!(live["test:t.py::test_b"], (None, 0, 0));
        assert_eq!(live.len(), 2);
    }

    #[test]
    fn repeated_edges_of_one_name_are_told_apart_by_device() {
        // Two phases of the same name nested on one device: two edges, not one.
        let mut t = Timeline::new();
        t.phase("phase_begin", "test:x", &[0]);
        t.phase("phase_begin", "fixture:module:m", &[0]);
        t.phase("phase_begin", "fixture:module:m", &[0]);
        t.alloc(0x10, 100, Some(1));
        t.phase("phase_end", "fixture:module:m", &[0]);
        t.alloc(0x20, 50, Some(2)); // still inside the outer fixture phase
        t.phase("phase_end", "fixture:module:m", &[0]);
        t.alloc(0x30, 10, Some(3));
        t.phase("phase_end", "test:x", &[0]);
        let live = left(&log(1, "", &t.lines));
        assert_eq!(live["test:x"], (Some(3), 10, 1));
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("cupool-per-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn results(pid: u32, run_id: &str, tests: &[&str], closed: bool) -> String {
        let mut s = format!("{{\"schema\":\"cupool-tests\",\"version\":1,\"pid\":{pid},\"worker\":\"gw0\",\"run_id\":\"{run_id}\",\"tests\":[\n");
        for (i, t) in tests.iter().enumerate() {
            s.push_str(if i == 0 { "" } else { "," });
            s.push_str(t);
            s.push('\n');
        }
        if closed {
            s.push_str("],\"complete\":true}\n");
        }
        s
    }

    fn test_line(nodeid: &str, bytes: u64, count: Option<u64>) -> String {
        let count = count.map_or("null".to_string(), |c| c.to_string());
        format!(
            "{{\"nodeid\":\"{nodeid}\",\"outcome\":\"passed\",\"leaked_bytes\":{bytes},\"leaked_count\":{count},\"measured_by\":\"cupool\",\"devices\":{{}}}}"
        )
    }

    #[test]
    fn leaking_tests_become_findings_with_their_process_and_site() {
        let dir = scratch("findings");
        let mut t = Timeline::new();
        t.phase("phase_begin", "test:t.py::test_leak", &[-1]);
        t.alloc(0x2000, 3 * MIB, None);
        t.phase("phase_end", "test:t.py::test_leak", &[0]);
        let logs = in_dir(&dir, vec![log(42, "r1", &t.lines), log(43, "r1", &[])]);
        let a = test_line("t.py::test_leak", 3 * MIB, Some(1));
        let b = test_line("t.py::test_clean", 0, Some(0));
        let c = test_line("t.py::test_other_worker", 100, None);
        std::fs::write(dir.join("cupool-tests.42.json"), results(42, "r1", &[&a, &b], true)).unwrap();
        // Cut short by a crash, the last line half written.
        let cut = results(43, "r1", &[&c, &test_line("t.py::test_half", 7, None)], false);
        std::fs::write(dir.join("cupool-tests.43.json"), &cut[..cut.len() - 20]).unwrap();
        // From another run (another run_id), and a pid with no log: not this run's.
        std::fs::write(dir.join("cupool-tests.44.json"), results(42, "r0", &[&a], true)).unwrap();
        std::fs::write(dir.join("cupool-tests.45.json"), results(45, "r1", &[&a], true)).unwrap();
        std::fs::write(dir.join("cupool.42.json"), "not read here").unwrap();

        let f = findings(&logs, &[], &dir).unwrap();
        assert_eq!(f.len(), 2, "{f:#?}");
        assert_eq!(f[0].kind, LeakKind::Test);
        assert_eq!((f[0].test.as_deref(), f[0].bytes, f[0].count), (Some("t.py::test_leak"), 3 * MIB, 1));
        assert_eq!(f[0].processes, vec![ProcessRef { pid: 42, rank: None, cmdline: "python -m pytest".into() }]);
        assert!(f[0].frames.is_empty(), "the allocation has no site in the log");
        assert_eq!((f[1].test.as_deref(), f[1].bytes, f[1].count), (Some("t.py::test_other_worker"), 100, 0));
        assert_eq!(f[1].processes[0].pid, 43);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_same_test_leaking_in_two_processes_is_one_finding() {
        let dir = scratch("merge");
        let logs = in_dir(&dir, vec![log(7, "", &[]), log(8, "", &[])]);
        let a = test_line("t.py::test_leak", 10, Some(1));
        std::fs::write(dir.join("cupool-tests.7.json"), results(7, "", &[&a], true)).unwrap();
        std::fs::write(dir.join("cupool-tests.8.json"), results(8, "", &[&a], true)).unwrap();
        let f = findings(&logs, &[], &dir).unwrap();
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!((f[0].bytes, f[0].count, f[0].processes.len()), (20, 2, 2));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn malformed_files_are_errors_naming_the_file() {
        let dir = scratch("malformed");
        let logs = in_dir(&dir, vec![log(1, "", &[]), log(2, "", &[]), log(3, "", &[])]);
        std::fs::write(dir.join("cupool-tests.1.json"), "{\"schema\":\"other\",\"version\":1,\"pid\":1,\"tests\":[]}")
            .unwrap();
        let bad_line = results(2, "", &[&test_line("a", 1, None), "{\"nodeid\":5}", &test_line("b", 1, None)], true);
        std::fs::write(dir.join("cupool-tests.2.json"), bad_line).unwrap();
        std::fs::write(
            dir.join("cupool-tests.3.json"),
            results(3, "", &[], true).replace("\"version\":1", "\"version\":9"),
        )
        .unwrap();
        let e = findings(&logs, &[], &dir).unwrap_err();
        let lines: Vec<&str> = e.lines().collect();
        assert_eq!(lines.len(), 3, "{e}");
        assert!(
            lines[0].contains("cupool-tests.1.json") && lines[0].contains("not a cupool per-test results file"),
            "{e}"
        );
        assert!(lines[1].contains("cupool-tests.2.json") && lines[1].contains("line 3"), "{e}");
        assert!(lines[2].contains("cupool-tests.3.json") && lines[2].contains("version 9"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_results_files_are_listed() {
        let dir = scratch("names");
        for name in [
            "cupool-tests.1.json",
            "cupool-tests.1.2.json",
            "cupool-tests..json",
            "cupool-tests.x.json",
            "cupool.1.json",
        ] {
            std::fs::write(dir.join(name), "").unwrap();
        }
        let names: Vec<String> =
            results_files(&dir).iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(names, ["cupool-tests.1.2.json", "cupool-tests.1.json"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn frames_come_from_the_logs_sites() {
        // Python frames need only string and stack definitions.
        let mut t = Timeline::new();
        t.lines.push("{\"def\":\"string\",\"id\":1,\"text\":\"tests/test_x.py\"}".into());
        t.lines.push("{\"def\":\"string\",\"id\":2,\"text\":\"test_leak\"}".into());
        t.lines.push("{\"def\":\"stack\",\"id\":5,\"native\":[],\"python\":[[1,2,12]]}".into());
        t.phase("phase_begin", "test:tests/test_x.py::test_leak", &[-1]);
        t.alloc(0x100, 4096, Some(5));
        t.phase("phase_end", "test:tests/test_x.py::test_leak", &[0]);
        let dir = scratch("frames");
        let logs = in_dir(&dir, vec![log(9, "", &t.lines)]);
        std::fs::write(
            dir.join("cupool-tests.9.json"),
            results(9, "", &[&test_line("tests/test_x.py::test_leak", 4096, None)], true),
        )
        .unwrap();
        let f = findings(&logs, &[], &dir).unwrap();
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].count, 1, "from the log when the plugin had no count");
        let frame = ShownFrame::python("test_leak", "tests/test_x.py", 12);
        assert_eq!(f[0].frames, vec![frame]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
