use super::*;
use crate::check::finding::{Findings, LeakKind};
use crate::check::growth::{self, SiteKey};
use crate::check::suppress::Suppressions;
use crate::check::testlog::LogBuilder;
use cupool_core::model::Process;
use cupool_core::options::Options;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// Python stacks of the simulated training script, by stack id.
const SCRIPT: &str = "/src/train.py";
fn stacks() -> Vec<Vec<(String, String, u32)>> {
    let s = |frames: &[(&str, &str, u32)]| {
        frames.iter().map(|(f, file, l)| (f.to_string(), file.to_string(), *l)).collect()
    };
    vec![
        s(&[("<module>", SCRIPT, 14)]), // x = torch.randn(...)
        s(&[("forward", "/torch/nn/modules/linear.py", 125), ("<module>", SCRIPT, 15)]), // out = model(x)
        s(&[
            ("_init_group", "/torch/optim/adamw.py", 90),
            ("step", "/torch/optim/adamw.py", 200),
            ("<module>", SCRIPT, 18),
        ]),
    ]
}

/// A PyTorch process with its caching allocator on, as cupool and PyTorch
/// each record it: every step makes an input (site 0) and an output (site
/// 1, kept by the previous step's variable until rebound); the optimizer
/// makes its state in step 1 (site 2); with `leak` every output is kept,
/// and the cache grows a 2 MiB segment per step for it (cupool's log sees
/// only those segments, allocated from `segments_from`).
fn pytorch_loop(steps: usize, leak: bool, marks: bool, segments_from: &str) -> (Log, History) {
    pytorch_loop_with(steps, leak, marks, segments_from, |_, _| {})
}

/// [`pytorch_loop`], with `also` called on the log at the end of each step.
fn pytorch_loop_with(
    steps: usize,
    leak: bool,
    marks: bool,
    segments_from: &str,
    mut also: impl FnMut(&mut LogBuilder, usize),
) -> (Log, History) {
    let pid = 42;
    let mut b = LogBuilder::new(pid, "python train.py").module_site(1, segments_from);
    let mut events: Vec<TraceEvent> = Vec::new();
    let mut next = 0x9000_0000_0000u64;
    let mut tensor = |b: &mut LogBuilder, events: &mut Vec<TraceEvent>, stack: u32, size: u64| {
        next += size;
        events.push(TraceEvent("alloc".into(), next, size, sample_us(pid, b), Some(stack)));
        (next, size)
    };
    let free = |b: &mut LogBuilder, events: &mut Vec<TraceEvent>, (addr, size): (u64, u64)| {
        let t = sample_us(pid, b);
        events.push(TraceEvent("free_requested".into(), addr, size, t, None));
        events.push(TraceEvent("free_completed".into(), addr, size, t, None));
    };
    let mut out = None;
    for step in 0..steps {
        if marks {
            b.mark(&format!("step {step}"));
        }
        if step == 0 || leak {
            let t = sample_us(pid, &mut b);
            let seg = b.alloc(2 * MIB, Some(1));
            events.push(TraceEvent("segment_alloc".into(), seg, 2 * MIB, t, None));
        }
        let x = tensor(&mut b, &mut events, 0, 4 * KIB);
        let new_out = tensor(&mut b, &mut events, 1, 16 * KIB);
        if let Some(old) = out.replace(new_out) {
            if !leak {
                free(&mut b, &mut events, old);
            }
        }
        if step == 1 {
            tensor(&mut b, &mut events, 2, 64 * KIB);
        }
        free(&mut b, &mut events, x);
        also(&mut b, step);
    }
    let log = b.exit(0);
    // PyTorch stamps a segment when cudaMalloc returned it, as cupool does.
    let at: HashMap<u64, u64> = log.events.iter().filter_map(|e| Some((e.ptr?, e.t_ns))).collect();
    for e in events.iter_mut().filter(|e| e.0 == "segment_alloc") {
        e.3 = i64::from(pid) * 1000 + (at[&e.1] / 1000) as i64;
    }
    let history = History {
        schema: Framework::Torch.schema().into(),
        version: VERSION,
        framework: Framework::Torch,
        pid,
        run_id: String::new(),
        torch: "2.11.0".into(),
        max_entries: 200_000,
        stacks: stacks(),
        devices: vec![DeviceTrace { device: 0, events, full: false }],
        segments: vec![],
        path: PathBuf::from("cupool-torch.42.json"),
        phases: vec![],
    };
    (log, history)
}

fn check(logs: &[Log], histories: &[History]) -> Findings {
    let processes: Vec<Process> = logs.iter().cloned().map(Process::new).collect();
    let supp = Suppressions::load(&[]).unwrap();
    crate::check::examine::examine(&processes, histories, vec![], &supp, &Options::default(), vec![])
}

/// The growing tensors of `h`, the history of `log`'s process.
fn tensors_grown(log: &Log, h: &History) -> Vec<growth::Grown> {
    growth::analyse_process(&h.process(&Process::new(log.clone())), 4, &|_| false, &|_| false, 0).unwrap()
}

const LIBC10: &str = "/site-packages/torch/lib/libc10_cuda.so";

#[test]
fn a_history_file_is_read_and_checked() {
    let dir = std::env::temp_dir().join(format!("cupool-torch-read-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let doc = r#"{"schema":"cupool-torch","version":1,"pid":7,"run_id":"r","torch":"2.11.0","max_entries":10,
        "stacks":[[["f","/a.py",3],["<module>","/b.py",9]]],
        "devices":[{"device":0,"events":[["alloc",4096,512,100,0],["free_requested",4096,512,101,null],["oom",0,1,102,null]],"full":true}],
        "segments":[[0,8192,2097152]],"complete":true}"#;
    std::fs::write(dir.join("cupool-torch.7.json"), doc).unwrap();
    std::fs::write(dir.join("cupool-torch.7.1.json"), doc.replace("\"version\":1", "\"version\":9")).unwrap();
    std::fs::write(dir.join(".cupool-torch.8.json.tmp"), "{").unwrap();
    std::fs::write(dir.join("cupool.7.json"), "").unwrap();
    let found = files(&dir);
    assert_eq!(
        found,
        [dir.join("cupool-torch.7.1.json"), dir.join("cupool-torch.7.json")],
        "temporary files are not read"
    );
    let h = read(&found[1]).unwrap();
    assert_eq!((h.pid, h.run_id.as_str(), h.max_entries, h.wrapped()), (7, "r", 10, true));
    assert_eq!(h.segment_addresses(), HashSet::from([8192]));
    let frames = h.frames(0);
    assert_eq!(
        frames.iter().map(|f| f.text(0)).collect::<Vec<_>>(),
        ["#0 f /a.py:3 [python]", "#0 <module> /b.py:9 [python]"]
    );
    assert!(h.frames(1).is_empty());
    let e = read(&found[0]).unwrap_err();
    assert!(e.contains("cupool-torch version 9; this cupool reads version 1"), "{e}");
    std::fs::write(dir.join("cupool-torch.9.json"), doc.replace("cupool-torch", "cupool-tests")).unwrap();
    let e = read(&dir.join("cupool-torch.9.json")).unwrap_err();
    assert!(e.contains("not a cupool framework history"), "{e}");
    // The timeline: the alloc and its free; the oom is not memory.
    let log = LogBuilder::new(7, "python a.py").options(|o| o.run_id = "r".into()).exit(0);
    let t = h.timeline(&Process::new(log.clone()));
    let kinds: Vec<_> = t.iter().map(|e| (e.ev.known(), e.ptr, e.stack, e.seq)).collect();
    assert_eq!(kinds, [(Some(EventKind::Alloc), Some(4096), Some(0), 0), (Some(EventKind::Free), Some(4096), None, 1)]);
    assert_eq!(t[0].api.as_ref().map(|a| a.as_str()), Some("PyTorch"));
    assert_eq!(of(std::slice::from_ref(&h), &log).count(), 1);
    let other_run = LogBuilder::new(7, "python a.py").options(|o| o.run_id = "s".into()).exit(0);
    assert_eq!(of(std::slice::from_ref(&h), &other_run).count(), 0, "another run's process with the same pid");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tensors_kept_per_step_grow_at_their_python_line() {
    let (log, h) = pytorch_loop(30, true, false, LIBC10);
    let grown = tensors_grown(&log, &h);
    assert_eq!(grown.len(), 1, "{grown:#?}");
    let g = &grown[0];
    assert_eq!(g.key, SiteKey::Stack(1));
    assert_eq!((g.growth.bytes_per_phase, g.growth.phases_from.as_str()), (16 * KIB, "repetition"));
    assert_eq!(g.growth.phase, "PyTorch (tensor) at one site", "the input, allocated first in each step, is the clock");
    assert_eq!((g.bytes, g.count), (29 * 16 * KIB, 29), "what is live at the last period's end");
    // A clean loop: optimizer state in step 1, then flat.
    let (log, h) = pytorch_loop(30, false, false, LIBC10);
    assert_eq!(tensors_grown(&log, &h), vec![]);
}

#[test]
fn the_logs_phases_are_placed_among_the_tensors() {
    let (log, h) = pytorch_loop(20, true, true, LIBC10);
    let timeline = h.timeline(&Process::new(log.clone()));
    assert!(timeline.windows(2).all(|w| w[0].t_ns <= w[1].t_ns && w[0].seq < w[1].seq));
    let grown = tensors_grown(&log, &h);
    assert_eq!(grown.len(), 1, "{grown:#?}");
    assert_eq!((grown[0].key.clone(), grown[0].growth.phases_from.as_str()), (SiteKey::Stack(1), "mark"));
    assert_eq!((grown[0].growth.phase.as_str(), grown[0].growth.bytes_per_phase), ("step #", 16 * KIB));
    // PyTorch stamps that are not Unix time: the cache's segments place them.
    let mut shifted = h.clone();
    for e in &mut shifted.devices[0].events {
        e.3 -= 1_000_000_000;
    }
    let moved = shifted.timeline(&Process::new(log.clone()));
    assert_eq!(
        moved.iter().map(|e| (e.t_ns, e.seq)).collect::<Vec<_>>(),
        timeline.iter().map(|e| (e.t_ns, e.seq)).collect::<Vec<_>>()
    );
}

#[test]
fn with_the_history_the_finding_names_the_line_that_keeps_tensors() {
    // Without it: the segments of the cache grow, at the cache's own site,
    // which a warm-up does too: a note that says what judges it, no finding.
    let (log, h) = pytorch_loop(30, true, false, LIBC10);
    let f = check(std::slice::from_ref(&log), &[]);
    assert_eq!(f.failing().count(), 0, "{:#?}", f.findings);
    let note = f.notes.iter().find(|n| n.contains("PyTorch's caching allocator grew by 2.0 MiB per phase"));
    assert!(note.is_some_and(|n| n.contains("torch_history")), "{:?}", f.notes);
    // With it: the tensors, at the script's line, and nothing at the cache.
    let f = check(std::slice::from_ref(&log), std::slice::from_ref(&h));
    let failing: Vec<_> = f.failing().collect();
    assert_eq!(failing.len(), 1, "{failing:#?}");
    let g = failing[0];
    assert_eq!((g.kind, g.what.as_str(), g.bytes, g.count), (LeakKind::Growth, "PyTorch (tensor)", 29 * 16 * KIB, 29));
    let texts: Vec<String> = g.frames.iter().enumerate().map(|(i, fr)| fr.text(i)).collect();
    assert_eq!(texts, ["#0 forward /torch/nn/modules/linear.py:125 [python]", "#1 <module> /src/train.py:15 [python]"]);
    assert_eq!(g.growth.as_ref().map(|g| g.bytes_per_phase), Some(16 * KIB));
    assert_eq!(g.processes[0].pid, 42);
    assert!(
        f.findings.iter().any(|x| x.kind == LeakKind::Exit && x.suppressed_by.is_some()),
        "the segments at exit: a known cache"
    );
    // The cache's segments are told by their addresses too, wherever they were allocated from.
    let (log, h) = pytorch_loop(30, true, false, "/opt/lib/libsomething.so");
    let f = check(std::slice::from_ref(&log), std::slice::from_ref(&h));
    let growth: Vec<_> = f.findings.iter().filter(|x| x.kind == LeakKind::Growth).collect();
    assert_eq!(growth.len(), 1, "{growth:#?}");
    assert_eq!(growth[0].what, "PyTorch (tensor)");
}

#[test]
fn a_clean_loop_with_the_cache_on_has_no_finding() {
    for marks in [false, true] {
        let (log, h) = pytorch_loop(30, false, marks, LIBC10);
        let f = check(std::slice::from_ref(&log), std::slice::from_ref(&h));
        assert_eq!(f.failing().count(), 0, "{:#?}", f.findings);
        assert!(!f.verdict.fails);
    }
}

#[test]
fn a_history_too_short_to_judge_leaves_the_segments_to_judge() {
    let (log, mut h) = pytorch_loop(30, true, false, LIBC10);
    // Only the cache's segment events: no tensor allocations to judge.
    h.devices[0].events.retain(|e| e.0 == "segment_alloc");
    let f = check(std::slice::from_ref(&log), std::slice::from_ref(&h));
    assert_eq!(f.failing().count(), 0, "arena growth alone fails nothing: {:#?}", f.findings);
    assert!(f.notes.iter().any(|n| n.contains("it recorded no tensor")), "{:?}", f.notes);
    assert!(f.notes.iter().any(|n| n.contains("PyTorch's caching allocator grew")), "{:?}", f.notes);
    // One that overflowed says so.
    let (log, mut h) = pytorch_loop(30, true, false, LIBC10);
    h.devices[0].full = true;
    let f = check(std::slice::from_ref(&log), std::slice::from_ref(&h));
    assert!(f.notes.iter().any(|n| n.contains("kept only its last 200000 events per device")), "{:?}", f.notes);
}

const XLA: &str = "/site-packages/jax_plugins/xla_cuda13/xla_cuda_plugin.so";

/// A JAX process as cupool and the JAX recorder each see it: XLA's arena
/// grows by a large region every step (cupool's log sees only those, made
/// on XLA's threads, no Python frame); the recorder samples the live
/// arrays: an input each step, kept with `leak` (the arrays the arena grew for).
/// JAX's sampled record of process `pid`: `events` on device 0, stack `i`
/// being `<module>` at `file`:`lines[i]`, and the edges it sampled at.
fn jax_record(
    pid: u32,
    file: &str,
    lines: &[u32],
    events: Vec<TraceEvent>,
    phases: Vec<(String, String, i64)>,
) -> History {
    History {
        schema: Framework::Jax.schema().into(),
        version: VERSION,
        framework: Framework::Jax,
        pid,
        run_id: String::new(),
        torch: String::new(),
        max_entries: 0,
        stacks: lines.iter().map(|&l| vec![("<module>".into(), file.into(), l)]).collect(),
        devices: vec![DeviceTrace { device: 0, events, full: false }],
        segments: vec![],
        path: PathBuf::from(format!("cupool-jax.{pid}.json")),
        phases,
    }
}

/// The time of the builder's clock in the recorder's microseconds (the
/// recorder's clock starts elsewhere: offset by the pid).
fn sample_us(pid: u32, b: &mut LogBuilder) -> i64 {
    i64::from(pid) * 1000 + (b.now_ns() / 1000) as i64
}

fn jax_loop(steps: usize, leak: bool) -> (Log, History) {
    let pid = 43;
    let mut b = LogBuilder::new(pid, "python jax_train.py").module_site(1, XLA);
    let mut events: Vec<TraceEvent> = Vec::new();
    let mut key = 0u64;
    for step in 0..steps {
        b.mark(&format!("step {step}"));
        b.alloc(8 * MIB, Some(1)); // the arena grows whether the program leaks or not
        key += 1;
        let t = sample_us(pid, &mut b);
        events.push(TraceEvent("alloc".into(), key, 64 * KIB, t, Some(0)));
        if !leak {
            let t = sample_us(pid, &mut b);
            events.push(TraceEvent("free_requested".into(), key, 64 * KIB, t, None));
        }
    }
    let log = b.exit(0);
    (log, jax_record(pid, "/src/jax_train.py", &[21], events, vec![]))
}

#[test]
fn jax_arena_growth_alone_is_a_note_and_kept_arrays_are_found_at_their_line() {
    // Without the arrays: the arena grows the same with or without a leak.
    for leak in [false, true] {
        let (log, _) = jax_loop(20, leak);
        let f = check(std::slice::from_ref(&log), &[]);
        assert_eq!(f.failing().count(), 0, "leak {leak}: {:#?}", f.findings);
        assert!(f.notes.iter().any(|n| n.contains("JAX's arena (XLA's BFC allocator) grew")), "{:?}", f.notes);
    }
    // With them: the leak at the line that made the arrays, and nothing at the arena.
    let (log, h) = jax_loop(20, true);
    let f = check(std::slice::from_ref(&log), std::slice::from_ref(&h));
    let failing: Vec<_> = f.failing().collect();
    assert_eq!(failing.len(), 1, "{failing:#?}");
    assert_eq!((failing[0].kind, failing[0].what.as_str()), (LeakKind::Growth, "JAX (array)"));
    assert_eq!(failing[0].frames[0].text(0), "#0 <module> /src/jax_train.py:21 [python]");
    assert!(!f.notes.iter().any(|n| n.contains("arena (XLA's BFC allocator) grew")), "{:?}", f.notes);
    // A clean loop with the arrays: nothing.
    let (log, h) = jax_loop(20, false);
    let f = check(std::slice::from_ref(&log), std::slice::from_ref(&h));
    assert_eq!(f.failing().count(), 0, "{:#?}", f.findings);
}

/// JAX emits NVTX ranges of its own while it compiles (`XlaPass:…`, many of
/// one name), and a program makes its parameters between compiles: the
/// arrays grow from range to range during setup, which is no leak. The
/// recorder's times are its samples', not the arrays', so ranges are not
/// placed among them: its growth is judged by its own repetition.
#[test]
fn arrays_made_between_jax_compile_ranges_are_not_growth() {
    let pid = 44;
    let mut b = LogBuilder::new(pid, "python jax_setup.py").module_site(1, XLA);
    let mut events: Vec<TraceEvent> = Vec::new();
    let mut key = 0u64;
    for _ in 0..8 {
        b.nvtx("XlaPass:#name=cublas-gemm-rewriter,module=fused_multiply", |b| b.idle(1000));
        key += 1; // a parameter, kept for the whole run
        let t = sample_us(pid, &mut b);
        events.push(TraceEvent("alloc".into(), key, 512 * KIB, t, Some(0)));
    }
    for _ in 0..30 {
        key += 1; // a step's temporary
        let t = sample_us(pid, &mut b);
        events.push(TraceEvent("alloc".into(), key, 64 * KIB, t, Some(1)));
        b.idle(1000);
        let t = sample_us(pid, &mut b);
        events.push(TraceEvent("free_requested".into(), key, 64 * KIB, t, None));
    }
    let log = b.exit(0);
    let h = jax_record(pid, "/src/jax_setup.py", &[12, 20], events, vec![]);
    let f = check(std::slice::from_ref(&log), std::slice::from_ref(&h));
    assert_eq!(f.failing().count(), 0, "{:#?}", f.findings);
}

/// A JAX program that makes its parameters in one go (a list of arrays,
/// all new in one sample of the recorder) and then runs a clean loop:
/// arrays seen together were made at once, not one per step.
#[test]
fn arrays_first_seen_in_one_sample_are_not_a_loop() {
    let pid = 45;
    let mut b = LogBuilder::new(pid, "python jax_params.py").module_site(1, XLA);
    let mut events: Vec<TraceEvent> = Vec::new();
    b.idle(100_000_000);
    let sample = sample_us(pid, &mut b);
    for key in 1..=40 {
        events.push(TraceEvent("alloc".into(), key, 256 * KIB, sample, Some(0)));
    }
    for key in 41..45 {
        b.idle(100_000_000);
        let t = sample_us(pid, &mut b);
        events.push(TraceEvent("alloc".into(), key, 256 * KIB, t, Some(1)));
        if key > 41 {
            events.push(TraceEvent("free_requested".into(), key - 1, 256 * KIB, t, None));
        }
    }
    let log = b.exit(0);
    let h = jax_record(pid, "/src/jax_params.py", &[9, 14], events, vec![]);
    let f = check(std::slice::from_ref(&log), std::slice::from_ref(&h));
    assert_eq!(f.failing().count(), 0, "{:#?}", f.findings);
    let note = f.notes.iter().find(|n| n.contains("first saw 40 arrays made at <module> /src/jax_params.py:9"));
    assert!(note.is_some_and(|n| n.contains("cupool.mark()")), "{:?}", f.notes);
    assert!(!f.notes.iter().any(|n| n.contains("growth was not checked")), "the batches say why: {:?}", f.notes);
}

/// A loop faster than the sampling that keeps an array a step, marked
/// with cupool.mark(): the recorder sampled at each mark and kept the
/// marks in its record, so each array lies in its own step.
#[test]
fn marks_in_a_sampled_record_place_a_fast_loops_arrays_in_their_steps() {
    let pid = 46;
    let mut b = LogBuilder::new(pid, "python jax_fast.py").module_site(1, XLA);
    let (mut events, mut phases) = (Vec::new(), Vec::new());
    for step in 0..20u64 {
        let t = sample_us(pid, &mut b);
        if step > 0 {
            events.push(TraceEvent("alloc".into(), step, 64 * KIB, t, Some(0)));
        }
        phases.push(("mark".to_string(), format!("step {step}"), t + 1));
        b.idle(2_000);
    }
    let log = b.exit(0);
    let mut h = jax_record(pid, "/src/jax_fast.py", &[7], events, phases);
    let f = check(std::slice::from_ref(&log), std::slice::from_ref(&h));
    let failing: Vec<_> = f.failing().collect();
    assert_eq!(failing.len(), 1, "{:#?}", f.findings);
    assert_eq!(failing[0].frames[0].text(0), "#0 <module> /src/jax_fast.py:7 [python]");
    // The same arrays, all first seen by one sample without marks: a note, not a finding.
    let t = h.devices[0].events[0].3;
    h.devices[0].events.iter_mut().for_each(|e| e.3 = t);
    h.phases.clear();
    let f = check(std::slice::from_ref(&log), std::slice::from_ref(&h));
    assert_eq!(f.failing().count(), 0, "{:#?}", f.findings);
    assert!(f.notes.iter().any(|n| n.contains("first saw 19 arrays")), "{:?}", f.notes);
}

/// CuPy's pool is known by the arrays made in it: a log allocation is the
/// pool's when an array of the record was made in it while it was live,
/// not when an array once lay at its address before it was made (after the
/// pool gave its chunks back, a later allocation may land there).
#[test]
fn cupy_pool_chunks_are_the_allocations_arrays_were_made_in() {
    let pid = 44;
    let mut b = LogBuilder::new(pid, "python cupy_train.py");
    let chunk = b.alloc(64 * KIB, Some(1));
    let made = sample_us(pid, &mut b);
    b.free(chunk); // free_all_blocks()
    b.idle(10_000_000);
    let later = b.alloc(4 * KIB, Some(0));
    let log = b.exit(0);
    let events = vec![
        TraceEvent("alloc".into(), chunk + 512, 1024, made, Some(0)),
        TraceEvent("free_requested".into(), chunk + 512, 1024, made, None),
        TraceEvent("alloc".into(), later, 1024, made, Some(0)),
    ];
    let mut h = jax_record(pid, "/src/cupy_train.py", &[12], events, vec![]);
    h.framework = Framework::Cupy;
    h.schema = Framework::Cupy.schema().into();
    let p = Process::new(log);
    let event_of = |ptr: u64| p.allocations.iter().find(|a| a.addr == ptr).unwrap().event;
    let held = h.holders(&p);
    assert_eq!(held, HashSet::from([event_of(chunk)]), "the chunk, not the later allocation at an old address");
    // JAX's keys are no addresses: its record holds nothing of the log's.
    h.framework = Framework::Jax;
    assert!(h.holders(&p).is_empty());
}

/// A short run that copies its weights to pinned host memory every tenth
/// step: PyTorch's host cache allocates six blocks, six more while the
/// first copy is still held, then reuses them. With the tensors judged from
/// PyTorch's record, what the log has left is the host cache's two bursts,
/// which are no loop while the tensors show the steps going on.
#[test]
fn a_host_cache_filled_in_two_bursts_is_not_the_loop() {
    let (log, h) = pytorch_loop_with(40, false, false, LIBC10, |b, step| {
        if step == 9 || step == 19 {
            for _ in 0..6 {
                b.alloc_as("cudaHostAlloc", "host", 2 * MIB, Some(3));
            }
        }
    });
    let f = check(std::slice::from_ref(&log), std::slice::from_ref(&h));
    // (Kept to the end, the blocks are exit leaks here; a frame in PyTorch's
    // library makes them a known cache's.)
    let growth: Vec<_> = f.findings.iter().filter(|f| f.kind == LeakKind::Growth).collect();
    assert_eq!(growth.len(), 0, "{growth:#?}");
    // Judged without the tensors, the bursts are a short loop keeping a block a period.
    let alone = growth::analyse_process(&Process::new(log), 4, &|_| false, &|_| false, 0).unwrap();
    assert!(alone.iter().any(|g| g.key == SiteKey::Stack(3)), "{alone:#?}");
}
