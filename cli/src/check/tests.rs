//! The check from logs to report and exit status, on logs made by hand.

use super::finding::{Finding, Findings, LeakKind, ProcessRef};
use super::suppress::Suppressions;
use super::testlog::LogBuilder;
use super::{status, text};
use crate::sites::ShownFrame;
use cupool_core::log::Log;
use cupool_core::model::Process;
use cupool_core::options::{self, Options};

const TORCH: &str = "/venv/lib/python3.12/site-packages/torch/lib/libc10_cuda.so";

/// The check of `logs`, each read into its process.
fn examine(
    logs: &[Log],
    histories: &[super::history::History],
    tests: Vec<Finding>,
    supp: &Suppressions,
    opts: &Options,
    notes: Vec<String>,
) -> Findings {
    let processes: Vec<Process> = logs.iter().cloned().map(Process::new).collect();
    super::examine::examine(&processes, histories, tests, supp, opts, notes)
}

/// Rank 0 and rank 1 of one job: both leak 3 x 1000 bytes at the same
/// Python site; rank 0 also leaks 5000 bytes at another, two pieces of
/// managed memory from no recorded site, and holds PyTorch's cache at exit.
fn job() -> Vec<Log> {
    let rank = |r: u32| {
        let mut b = LogBuilder::new(100 + r, "python train.py --epochs 3")
            .rank(r)
            .python_site(1, &[("/src/model.py", "build", 30), ("/src/train.py", "main", 12)])
            .python_site(2, &[("/src/train.py", "load", 7)])
            .module_site(3, TORCH);
        for _ in 0..3 {
            b.alloc(1000, Some(1));
        }
        if r == 0 {
            b.alloc(5000, Some(2));
            b.alloc_as("cudaMallocManaged", "managed", 4096, None);
            b.alloc_as("cudaMallocManaged", "managed", 4096, None);
            b.alloc(2 << 20, Some(3));
        }
        b.exit(0)
    };
    vec![rank(0), rank(1)]
}

fn defaults() -> Suppressions {
    Suppressions::load(&[]).unwrap()
}

fn report(f: &Findings) -> String {
    let mut out = Vec::new();
    text::write(f, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

fn opts(spec: &str) -> Options {
    let (o, errors) = options::parse(spec);
    assert!(errors.is_empty(), "{errors:?}");
    o
}

#[test]
fn the_report_groups_identical_sites_of_all_processes_largest_first() {
    let f = examine(&job(), &[], vec![], &defaults(), &Options::default(), vec![]);
    let want = "\
cupool: 2 process(es) checked

ERROR: cupool: detected CUDA memory leaks

Direct leak of 8192 byte(s) in 2 allocation(s) allocated from:
    (no stack recorded: cudaMallocManaged (managed), 4096 byte(s) each)
  in pid 100 (rank 0): python train.py --epochs 3

Direct leak of 6000 byte(s) in 6 allocation(s) allocated from:
    #0 build /src/model.py:30 [python]
    #1 main /src/train.py:12 [python]
  in pid 100 (rank 0): python train.py --epochs 3
  in pid 101 (rank 1): python train.py --epochs 3

Direct leak of 5000 byte(s) in 1 allocation(s) allocated from:
    #0 load /src/train.py:7 [python]
  in pid 100 (rank 0): python train.py --epochs 3

cupool: held at exit by known caches: 2097152 byte(s) (2.0 MiB) in 1 allocation(s) (libc10_cuda.so); not leaks
-----------------------------------------------------
Suppressions used:
  count      bytes template
      1    2097152 libc10_cuda.so (default)
-----------------------------------------------------
cupool: note: /venv/lib/python3.12/site-packages/torch/lib/libc10_cuda.so: file not found; its frames show as module+offset only
SUMMARY: cupool: 19192 byte(s) leaked in 9 allocation(s).
";
    assert_eq!(report(&f), want);
    assert!(f.verdict.fails);
    assert_eq!(f.processes.iter().map(|p| (p.pid, p.rank)).collect::<Vec<_>>(), [(100, Some(0)), (101, Some(1))]);
    let cache = f.findings.last().unwrap();
    assert_eq!(cache.suppressed_by.as_deref(), Some("libc10_cuda.so"));
    assert_eq!(cache.frames[0].module.as_deref(), Some("libc10_cuda.so"), "shown by file name, matched by path too");
}

#[test]
fn a_clean_run_says_so_and_lists_the_caches() {
    let mut b = LogBuilder::new(7, "python infer.py").module_site(3, TORCH);
    b.alloc(1 << 20, Some(3));
    let p = b.alloc(4096, None);
    b.free(p);
    let f = examine(&[b.exit(0)], &[], vec![], &defaults(), &Options::default(), vec![]);
    let text = report(&f);
    assert!(!text.contains("ERROR") && !text.contains("SUMMARY"), "{text}");
    assert!(text.ends_with("module+offset only\ncupool: no leaks\n"), "{text}");
    assert!(text.contains("held at exit by known caches: 1048576 byte(s) (1.0 MiB) in 1 allocation(s)"), "{text}");
    assert!(!f.verdict.fails);
}

#[test]
fn a_users_suppressions_are_counted_with_the_defaults() {
    let dir = std::env::temp_dir().join(format!("cupool-check-supp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("ci.supp");
    std::fs::write(&file, "# data loader keeps its staging buffers\nleak:^load$\nleak:nothing_matches_this\n").unwrap();
    let supp = Suppressions::load(std::slice::from_ref(&file)).unwrap();
    let f = examine(&job(), &[], vec![], &supp, &Options::default(), vec![]);
    let used: Vec<(&str, &str, u64, u64, u64)> = f
        .suppressions_used
        .iter()
        .map(|u| (u.pattern.as_str(), u.source.as_str(), u.findings, u.allocations, u.bytes))
        .collect();
    let source = file.display().to_string();
    assert_eq!(used, [("libc10_cuda.so", "default", 1, 1, 2 << 20), ("^load$", source.as_str(), 1, 1, 5000)]);
    let text = report(&f);
    assert!(text.contains(&format!("      1       5000 ^load$ ({source})\n")), "{text}");
    assert!(text.contains("SUMMARY: cupool: 14192 byte(s) leaked in 8 allocation(s)."), "{text}");
    assert!(!text.contains("#0 load"), "a suppressed finding is not listed: {text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A loop that keeps 1000 bytes per marked step until exit.
fn leaky_loop(pid: u32) -> Log {
    let mut b = LogBuilder::new(pid, "python loop.py").python_site(1, &[("/src/loop.py", "step", 4)]);
    for step in 0..10 {
        b.mark(&format!("step {step}"));
        let t = b.alloc(8192, None);
        b.alloc(1000, Some(1));
        b.free(t);
    }
    b.exit(0)
}

#[test]
fn a_growing_site_is_reported_with_its_phases_and_counted_once() {
    let f = examine(&[leaky_loop(5)], &[], vec![], &defaults(), &Options::default(), vec![]);
    let text = report(&f);
    let want_growth = "\
Growing leak of 1000 byte(s) per phase over 9 phases (site now holds 9000 byte(s) in 9 allocation(s)) allocated from:
    #0 step /src/loop.py:4 [python]
  phases: 'step #' (cupool_mark)
  in pid 5: python loop.py
";
    assert!(text.contains(want_growth), "{text}");
    assert!(
        text.contains("Direct leak of 10000 byte(s) in 10 allocation(s) allocated from:\n    #0 step /src/loop.py:4")
    );
    assert!(text.contains("SUMMARY: cupool: 10000 byte(s) leaked in 10 allocation(s)."), "growth is not added: {text}");
    assert_eq!(f.findings[0].kind, LeakKind::Exit, "largest first");
    let g = f.findings[1].growth.as_ref().unwrap();
    assert_eq!((g.bytes_per_phase, g.phases, g.phases_from.as_str()), (1000, 9, "mark"));
}

#[test]
fn fail_on_and_max_leak_bytes_decide_what_fails() {
    let logs = [leaky_loop(5)];
    let growth_only = examine(&logs, &[], vec![], &defaults(), &opts("fail_on=growth"), vec![]);
    assert!(growth_only.verdict.fails);
    assert_eq!(growth_only.verdict.leaked_bytes, 9000, "the growing site's bytes, when exit leaks do not count");
    let text = report(&growth_only);
    assert!(text.contains("  reported only: fail_on does not name exit leaks\n"), "{text}");
    let exit_only = examine(&logs, &[], vec![], &defaults(), &opts("fail_on=exit"), vec![]);
    assert_eq!(exit_only.verdict.leaked_bytes, 10_000);
    let none = examine(&logs, &[], vec![], &defaults(), &opts("fail_on=none"), vec![]);
    assert!(!none.verdict.fails);
    assert!(report(&none).contains("cupool: no leaks"));
    let tolerated = examine(&logs, &[], vec![], &defaults(), &opts("max_leak_bytes=10000"), vec![]);
    assert!(!tolerated.verdict.fails);
    let text = report(&tolerated);
    assert!(text.contains("10000 byte(s) leaked, no more than max_leak_bytes=10000: the job does not fail"), "{text}");
    let over = examine(&logs, &[], vec![], &defaults(), &opts("max_leak_bytes=9999"), vec![]);
    assert!(over.verdict.fails);
}

#[test]
fn exit_status_program_failure_wins_then_could_not_check_then_leaks() {
    let o = opts("exitcode=42");
    let leaking = examine(&[leaky_loop(5)], &[], vec![], &defaults(), &o, vec![]);
    let clean = examine(&[], &[], vec![], &defaults(), &o, vec![]);
    assert_eq!(status(Some(3), true, true, &leaking, &o), 3);
    assert_eq!(status(Some(137), false, false, &clean, &o), 137);
    assert_eq!(status(Some(0), false, true, &leaking, &o), super::exit::COULD_NOT_CHECK);
    assert_eq!(status(None, true, false, &leaking, &o), super::exit::COULD_NOT_CHECK);
    assert_eq!(status(Some(0), true, true, &leaking, &o), 42);
    assert_eq!(status(None, true, true, &leaking, &Options::default()), 23);
    assert_eq!(status(Some(0), true, true, &clean, &o), 0);
    assert_eq!(status(None, true, true, &leaking, &opts("exitcode=0")), 0);
}

#[test]
fn a_killed_process_is_checked_from_what_its_log_holds() {
    let mut b = LogBuilder::new(9, "python worker.py").python_site(1, &[("/src/worker.py", "run", 3)]);
    b.alloc(777, Some(1));
    let f =
        examine(&[b.killed()], &[], vec![], &defaults(), &Options::default(), vec!["x.json: bad; not checked".into()]);
    let text = report(&f);
    assert!(
        text.contains("Direct leak of 777 byte(s) in 1 allocation(s) allocated from:\n    #0 run /src/worker.py:3"),
        "{text}"
    );
    assert!(text.contains("cupool: note: x.json: bad; not checked\n"), "{text}");
    assert!(
        text.contains("cupool: note: pid 9: the log has no end record (killed, replaced by exec, or still running)"),
        "{text}"
    );
}

#[test]
fn test_leaks_are_grouped_named_and_suppressed_by_their_frames() {
    let frame = |file: &str, function: &str| ShownFrame::python(function, file, 5);
    let process = ProcessRef { pid: 300, rank: None, cmdline: "python -m pytest".into() };
    let test = |name: &str, frames: Vec<ShownFrame>, bytes: u64| Finding {
        kind: LeakKind::Test,
        bytes,
        count: 1,
        frames,
        what: "cudaMalloc (device)".into(),
        processes: vec![process.clone()],
        test: Some(name.into()),
        ..Default::default()
    };
    let found = vec![
        test("tests/test_a.py::test_keeps", vec![frame("/src/tests/test_a.py", "test_keeps")], 512),
        test("tests/test_a.py::test_keeps", vec![frame("/src/tests/test_a.py", "test_keeps")], 512),
        test("tests/test_b.py::test_cupy", vec![frame("/venv/site-packages/cupy/cuda/memory.py", "malloc")], 4096),
    ];
    let session = LogBuilder::new(300, "python -m pytest").exit(0);
    let f = examine(&[session], &[], found, &defaults(), &Options::default(), vec![]);
    let text = report(&f);
    assert!(
        text.contains(
            "Test leak of 1024 byte(s) in 2 allocation(s) in test tests/test_a.py::test_keeps allocated from:\n    \
             #0 test_keeps /src/tests/test_a.py:5 [python]\n  in pid 300: python -m pytest\n"
        ),
        "{text}"
    );
    // A test's leak allocated by CuPy's pool is the test's, not the cache's:
    // the default suppressions hold for exit leaks only.
    let cupy = f.findings.iter().find(|x| x.test.as_deref() == Some("tests/test_b.py::test_cupy")).unwrap();
    assert_eq!(cupy.suppressed_by, None);
    assert_eq!(f.verdict.leaked_bytes, 1024 + 4096);
}

#[test]
fn a_finding_names_at_most_four_processes() {
    let logs: Vec<Log> = (0..6)
        .map(|r| {
            let mut b = LogBuilder::new(200 + r, "python ddp.py").rank(r);
            b.alloc(64, None);
            b.exit(0)
        })
        .collect();
    let f = examine(&logs, &[], vec![], &defaults(), &Options::default(), vec![]);
    let text = report(&f);
    assert!(text.contains("  in pid 203 (rank 3): python ddp.py\n  and 2 more process(es)\n"), "{text}");
    assert_eq!(f.findings[0].processes.len(), 6);
}

#[test]
fn growth_freed_only_after_the_loop_is_growth_and_says_so() {
    // A list kept for the loop's end, freed after it: the loop's memory grows
    // with its length, and the report says that it was all freed later.
    for marked in [true, false] {
        let mut b = LogBuilder::new(7, "python loop.py").python_site(1, &[("/src/loop.py", "step", 4)]);
        let mut kept = Vec::new();
        for step in 0..40 {
            if marked {
                b.mark(&format!("step {step}"));
            }
            let t = b.alloc(8192, None);
            kept.push(b.alloc(1000, Some(1)));
            b.free(t);
        }
        b.idle(1_000_000);
        for p in kept {
            b.free(p);
        }
        let f = examine(&[b.exit(0)], &[], vec![], &defaults(), &Options::default(), vec![]);
        assert_eq!(f.findings.len(), 1, "{}", report(&f));
        let g = &f.findings[0];
        assert_eq!((g.kind, g.freed_later), (LeakKind::Growth, true), "{}", report(&f));
        assert!(report(&f).contains(&format!("\n  {}\n", text::FREED_LATER)), "{}", report(&f));
        let message = super::sarif::message(g);
        assert!(message.contains("live at the last phase from one site"), "{message}");
        assert!(message.ends_with(&format!("in pid 7 (python loop.py); {}", text::FREED_LATER)), "{message}");
        assert!(f.verdict.fails, "still a leak a longer run dies of");
    }
    // Kept to the end: not freed later.
    let f = examine(&[leaky_loop(5)], &[], vec![], &defaults(), &Options::default(), vec![]);
    assert!(!f.findings.iter().any(|g| g.freed_later), "{}", report(&f));
    assert!(!report(&f).contains(text::FREED_LATER));
    let growth = f.findings.iter().find(|g| g.kind == LeakKind::Growth).unwrap();
    let message = super::sarif::message(growth);
    assert!(message.starts_with("8.8 KiB live from one site") && message.ends_with("(python loop.py)"), "{message}");
}
