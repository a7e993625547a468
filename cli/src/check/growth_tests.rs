use super::*;
use crate::check::testlog::LogBuilder;
use cupool_core::log::Log;
use cupool_core::model::group_name as phase_name;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

#[test]
fn a_steady_rise_grows_a_plateau_does_not() {
    let leak: Vec<u64> = (0..20).map(|i| 100 + 10 * i).collect();
    assert_eq!(grows(&leak), Some(Fit { gain: 10 * 17, per_sample: 10 }), "from the third sample on");
    // Warm-up growth, then flat.
    let plateau: Vec<u64> = (0..20).map(|i| 100 * (i.min(5) + 1)).collect();
    assert_eq!(grows(&plateau), None);
    // A cache that fills ever more slowly.
    let saturating: Vec<u64> = (0..20).map(|i| 1000 - 1000 / (i + 1)).collect();
    assert_eq!(grows(&saturating), None);
    // Up and down with the data.
    let fluctuating: Vec<u64> = (0..20).map(|i| 100 + (i * 37 % 11) * 10).collect();
    assert_eq!(grows(&fluctuating), None);
    // Up and down, drifting up: it falls back too often to be a leak.
    let drifting: Vec<u64> = (0..20).map(|i| 100 + i * 5 + (i % 2) * 40).collect();
    assert_eq!(grows(&drifting), None);
}

#[test]
fn a_leak_in_every_other_phase_grows() {
    let every_other: Vec<u64> = (0..20).map(|i| 100 + 10 * (i / 2)).collect();
    assert!(grows(&every_other).is_some());
    // One late jump is a cache meeting a larger input, not a leak.
    let one_jump: Vec<u64> = (0..20).map(|i| if i < 15 { 100 } else { 200 }).collect();
    assert_eq!(grows(&one_jump), None);
}

#[test]
fn three_phases_after_the_warm_up_are_the_least_that_can_grow() {
    assert!(grows(&[0, 10, 20, 30]).is_some());
    assert_eq!(grows(&[0, 10, 20]), None);
    assert_eq!(grows(&[]), None);
    assert_eq!(grows(&[5, 5, 5, 5, 5]), None);
}

#[test]
fn phase_names_ignore_their_numbers() {
    assert_eq!(phase_name("epoch 12"), "epoch #");
    assert_eq!(phase_name("step 3/100"), "step #/#");
    assert_eq!(phase_name("forward"), "forward");
    assert_eq!(phase_name("7"), "#");
}

#[test]
fn thinning_keeps_the_last_and_at_most_max() {
    let items: Vec<usize> = (0..1000).collect();
    let t = every_nth(&items, 256);
    assert!(t.items.len() <= 256 && t.items.last() == Some(&999), "{}", t.items.len());
    assert_eq!(t.stride, 4);
    let t = every_nth(&items[..10], 256);
    assert_eq!((t.items.len(), t.stride), (10, 1));
}

/// A training loop: weights made once, optimizer state in the second step
/// (warm-up), an activation and a gradient made and freed every step, and,
/// with `leak`, 1000 bytes kept every step at site 3.
fn training(steps: usize, marks: bool, leak: bool) -> Log {
    let mut b = LogBuilder::new(10, "python train.py");
    b.alloc(MIB, Some(1));
    for step in 0..steps {
        if marks {
            b.mark(&format!("step {step}"));
        }
        let act = b.alloc(4 * KIB * (1 + step as u64 % 3), Some(2));
        let grad = b.alloc(8 * KIB, Some(4));
        if step == 1 {
            b.alloc(MIB / 2, Some(5));
        }
        if leak {
            b.alloc(1000, Some(3));
        }
        b.free(act);
        b.free(grad);
    }
    b.exit(0)
}

fn check(log: &Log) -> Vec<Grown> {
    analyse(log, 4, &|_| false).unwrap()
}

#[test]
fn a_marked_loop_that_keeps_a_buffer_per_step_is_found() {
    let found = check(&training(20, true, true));
    assert_eq!(found.len(), 1, "{found:#?}");
    let g = &found[0];
    assert_eq!(g.key, SiteKey::Stack(3));
    assert_eq!((g.growth.phases_from.as_str(), g.growth.phase.as_str()), ("mark", "step #"));
    assert_eq!(g.growth.bytes_per_phase, 1000);
    assert_eq!(g.growth.phases, 19, "the last mark's phase never ends");
    assert_eq!(g.growth.sites, 1);
    assert_eq!((g.bytes, g.count), (19_000, 19), "live at the end of the last phase");
}

#[test]
fn a_clean_marked_loop_is_not() {
    assert_eq!(check(&training(20, true, false)), vec![]);
}

#[test]
fn without_marks_the_loop_is_found_from_its_allocations() {
    let found = check(&training(30, false, true));
    assert_eq!(found.len(), 1, "{found:#?}");
    let g = &found[0];
    assert_eq!(g.key, SiteKey::Stack(3));
    assert_eq!(g.growth.phases_from, "repetition");
    assert_eq!(g.growth.bytes_per_phase, 1000);
    assert_eq!(g.growth.phases, 29, "periods between the clock's 30 allocations");
    assert_eq!(g.growth.phase, "cudaMalloc (device) at one site", "site 2 allocates first in each step");
    assert_eq!(check(&training(30, false, false)), vec![]);
}

#[test]
fn without_stacks_sites_are_told_apart_by_api_and_size() {
    let mut b = LogBuilder::new(11, "prog");
    for _ in 0..12 {
        let a = b.alloc(64 * KIB, None);
        b.alloc_as("cudaMallocManaged", "managed", 4096, None);
        b.free(a);
    }
    let found = check(&b.exit(0));
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].key, SiteKey::Bare { api: "cudaMallocManaged".into(), kind: "managed".into(), size: 4096 });
    assert_eq!((found[0].api.as_str(), found[0].kind.as_str()), ("cudaMallocManaged", "managed"));
}

/// Memory that follows the data: batches of pseudo-random sizes, each kept
/// for a few steps (a prefetch queue), never more than 4 at a time.
fn fluctuating(marks: bool) -> Log {
    let mut b = LogBuilder::new(12, "python serve.py");
    let mut queue = std::collections::VecDeque::new();
    let mut seed = 12345u64;
    for step in 0..40 {
        if marks {
            b.mark(&format!("batch {step}"));
        }
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let size = (1 + (seed >> 33) % 64) * 64 * KIB;
        let tmp = b.alloc(32 * KIB, Some(2));
        queue.push_back(b.alloc(size, Some(6)));
        let keep = 1 + (seed >> 40) as usize % 4;
        while queue.len() > keep {
            b.free(queue.pop_front().unwrap());
        }
        b.free(tmp);
    }
    b.exit(0)
}

#[test]
fn memory_that_goes_up_and_down_is_not_growth() {
    assert_eq!(check(&fluctuating(true)), vec![]);
    assert_eq!(check(&fluctuating(false)), vec![]);
}

/// A pool that hands a new 2 MiB segment to whichever allocation misses its
/// cache (the program keeps a tensor per step inside it), sometimes giving
/// an old segment back: no single site grows steadily, the process does.
fn pooled(leak: bool) -> Log {
    let mut b = LogBuilder::new(13, "python train.py");
    let mut segments = Vec::new();
    let mut seed = 99u64;
    for step in 0..40 {
        b.mark(&format!("step {step}"));
        for _ in 0..2 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let site = 10 + (seed >> 33) as u32 % 8;
            segments.push(b.alloc(2 * MIB, Some(site)));
        }
        let give_back = if leak { 1 } else { 2 };
        for _ in 0..give_back {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let i = (seed >> 33) as usize % segments.len();
            b.free(segments.swap_remove(i));
        }
    }
    b.exit(0)
}

#[test]
fn growth_spread_over_a_pools_sites_is_one_finding() {
    let found = check(&pooled(true));
    let spread: Vec<&Grown> = found.iter().filter(|g| g.growth.sites > 1).collect();
    assert_eq!(spread.len(), 1, "{found:#?}");
    let g = spread[0];
    assert!(matches!(g.key, SiteKey::Stack(10..=17)), "{:?}", g.key);
    assert!((MIB..=3 * MIB).contains(&g.growth.bytes_per_phase), "{}", g.growth.bytes_per_phase);
    assert_eq!(check(&pooled(false)), vec![]);
}

#[test]
fn repeated_nvtx_ranges_are_phases() {
    let mut b = LogBuilder::new(14, "python train.py");
    for step in 0..10 {
        b.nvtx("train_step", |b| {
            let t = b.alloc(KIB, Some(2));
            if step % 2 == 0 {
                b.alloc(512, Some(3));
            }
            b.free(t);
        });
    }
    let found = check(&b.exit(0));
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!((found[0].growth.phases_from.as_str(), found[0].growth.phase.as_str()), ("nvtx", "train_step"));
    assert_eq!(found[0].growth.phases, 10);
}

#[test]
fn a_phase_written_for_each_device_is_one_phase() {
    let mut b = LogBuilder::new(15, "python train.py");
    for _ in 0..10 {
        b.nvtx_on("ncclAllReduce", &[0, 1], |b| {
            b.alloc(512, Some(3));
        });
    }
    let found = check(&b.exit(0));
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!((found[0].growth.phase.as_str(), found[0].growth.phases), ("ncclAllReduce", 10));
}

/// A communication library's set-up: a buffer per channel, allocated in a
/// burst and kept; then a loop whose memory is all in a cache cupool does
/// not see, so that nothing is allocated between its phases.
fn set_up_then_cached_loop(nvtx: bool) -> Log {
    let mut b = LogBuilder::new(16, "python ddp.py");
    let buffers: Vec<u64> = (0..24).map(|_| b.alloc(2 * MIB, Some(7))).collect();
    for _ in 0..100 {
        b.idle(20_000_000);
        if nvtx {
            b.nvtx("ncclAllReduce", |_| {});
        }
    }
    // The communicator is destroyed at the end.
    for p in buffers {
        b.free(p);
    }
    b.exit(0)
}

#[test]
fn a_burst_of_set_up_allocations_is_not_a_loop_that_grows() {
    // The phases of the loop count, though nothing is allocated between them.
    assert_eq!(check(&set_up_then_cached_loop(true)), vec![]);
    // Without phases, the burst repeats regularly, but it is over long
    // before the run is: set-up, not the loop the program spends its time in.
    // No loop is left, and the check says so instead of finding growth.
    let why = analyse(&set_up_then_cached_loop(false), 4, &|_| false).unwrap_err();
    assert!(why.to_string().contains("growth was not checked"), "{why}");
}

#[test]
fn a_loop_after_a_bigger_burst_of_set_up_is_still_the_loop() {
    // Three set-up sites allocate 24 times each in a burst (more sites share
    // that count than the loop's two), then a loop of 100 steps leaks.
    let mut b = LogBuilder::new(17, "python ddp.py");
    for _ in 0..24 {
        for site in [7, 8, 9] {
            b.alloc(2 * MIB, Some(site));
        }
    }
    for _ in 0..100 {
        b.idle(20_000_000);
        let t = b.alloc(64 * KIB, Some(2));
        b.alloc(1000, Some(3));
        b.free(t);
    }
    let found = check(&b.exit(0));
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!((found[0].key.clone(), found[0].growth.bytes_per_phase), (SiteKey::Stack(3), 1000));
}

#[test]
fn phases_of_the_pytest_plugin_are_not_repetitions() {
    let mut b = LogBuilder::new(15, "python -m pytest");
    for t in 0..10 {
        b.nvtx(&format!("test:tests/test_x.py::test_{t}"), |b| {
            b.alloc(512, Some(3));
        });
    }
    let log = b.exit(0);
    assert_eq!(analyse(&log, 4, &|n| n.starts_with("test:")).unwrap(), vec![], "nor is the run of tests a loop");
    assert_eq!(analyse(&log, 4, &|_| false).unwrap().len(), 1);
}

#[test]
fn growth_needs_every_allocation_and_free() {
    let log = LogBuilder::new(16, "prog").options(|o| o.trace = false).exit(0);
    assert_eq!(analyse(&log, 4, &|_| false).unwrap_err(), NotChecked::TraceOff);
    let mut log = training(20, true, false);
    log.end.as_mut().unwrap().dropped_events = 3;
    assert_eq!(analyse(&log, 4, &|_| false).unwrap_err(), NotChecked::LostEvents(3));
}

#[test]
fn a_busy_process_without_repetition_says_growth_was_not_checked() {
    let mut b = LogBuilder::new(17, "prog");
    for i in 0..20u64 {
        b.alloc(1000 + i, None); // every size once: nothing repeats
    }
    let e = analyse(&b.exit(0), 4, &|_| false).unwrap_err();
    assert_eq!(e, NotChecked::NoRepetition);
    let mut quiet = LogBuilder::new(18, "prog");
    quiet.alloc(1000, None);
    assert_eq!(analyse(&quiet.exit(0), 4, &|_| false).unwrap(), vec![]);
}

#[test]
fn growth_phases_sets_how_many_phases_are_needed() {
    let log = training(6, true, true);
    assert_eq!(analyse(&log, 4, &|_| false).unwrap().len(), 1);
    assert_eq!(analyse(&log, 6, &|_| false).unwrap(), vec![], "5 phases ended, fewer than 6");
}

/// A generation's cache: the same few buffers, each replaced by a larger one
/// every step (a token more), freed when generation ends. Bytes grow and the
/// number of allocations does not: replaced, not kept.
fn generation(steps: u64, marks: bool) -> Log {
    let mut b = LogBuilder::new(12, "python generate.py");
    let weights = b.alloc(MIB, Some(1));
    let mut cache: Vec<u64> = (0..4).map(|_| b.alloc(4 * KIB, Some(2))).collect();
    for step in 1..=steps {
        if marks {
            b.mark(&format!("token {step}"));
        }
        let logits = b.alloc(8 * KIB, Some(3));
        for slot in cache.iter_mut() {
            let larger = b.alloc(4 * KIB * (step + 1), Some(2));
            b.free(*slot);
            *slot = larger;
        }
        b.free(logits);
    }
    for slot in cache {
        b.free(slot);
    }
    b.free(weights);
    b.exit(0)
}

#[test]
fn buffers_replaced_by_larger_ones_grow_but_are_not_kept() {
    for marks in [true, false] {
        let found = check(&generation(30, marks));
        assert_eq!(found.len(), 1, "marks {marks}: {found:#?}");
        let g = &found[0];
        assert_eq!(g.key, SiteKey::Stack(2));
        assert!(g.replaced, "the same 4 allocations, larger each step: {g:#?}");
        assert_eq!(g.count, 4);
    }
}

/// A loop inside a function that keeps one more buffer every step (a
/// history of losses) and drops them all when it returns: the
/// accumulation is the leak, whether or not it is freed at the end.
#[test]
fn buffers_kept_step_after_step_are_a_leak_even_when_freed_at_the_end() {
    let mut b = LogBuilder::new(13, "python train.py");
    let mut history = Vec::new();
    for step in 0..25 {
        b.mark(&format!("step {step}"));
        let act = b.alloc(64 * KIB, Some(1));
        history.push(b.alloc(512, Some(7)));
        b.free(act);
    }
    b.mark("done");
    for h in history {
        b.free(h);
    }
    let found = check(&b.exit(0));
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!((found[0].key.clone(), found[0].replaced), (SiteKey::Stack(7), false));
    assert_eq!(found[0].growth.bytes_per_phase, 512);
}

#[test]
fn the_check_notes_replaced_buffers_and_fails_on_kept_ones() {
    use crate::check::suppress::Suppressions;
    use cupool_core::model::Process;
    use cupool_core::options::Options;
    let judge = |log: Log| {
        let supp = Suppressions::load(&[]).unwrap();
        crate::check::examine::examine(&[Process::new(log)], &[], vec![], &supp, &Options::default(), vec![])
    };
    let f = judge(generation(30, true));
    assert_eq!(f.failing().count(), 0, "{:#?}", f.findings);
    assert!(f.notes.iter().any(|n| n.contains("each replaced by a larger one")), "{:?}", f.notes);
    let f = judge(training(20, true, true));
    assert_eq!(f.failing().filter(|x| x.kind == crate::check::finding::LeakKind::Growth).count(), 1);
}

/// A short program (well under a second, where exit work may take as long
/// as the loop) that sets up a model layer by layer, a weight and a bias
/// each, then runs a clean loop of fewer steps than it has layers.
#[test]
fn a_short_run_that_builds_a_model_then_loops_cleanly_does_not_grow() {
    let mut b = LogBuilder::new(19, "python tiny.py");
    for _ in 0..40 {
        b.alloc(256 * KIB, Some(7));
        b.alloc(KIB, Some(8));
        b.idle(100_000);
    }
    for _ in 0..10 {
        let act = b.alloc(64 * KIB, Some(2));
        let grad = b.alloc(64 * KIB, Some(3));
        b.idle(10_000_000);
        b.free(act);
        b.free(grad);
    }
    b.idle(100_000_000);
    let found = analyse(&b.exit(0), 4, &|_| false);
    assert!(found.as_ref().is_ok_and(Vec::is_empty) || found == Err(NotChecked::NoRepetition), "{found:#?}");
}

/// A short C program that allocates its buffers back to back, works for
/// half a second without allocating, and frees them.
#[test]
fn a_short_run_whose_buffers_are_set_up_at_once_does_not_grow() {
    let mut b = LogBuilder::new(20, "./solver");
    let buffers: Vec<u64> = (0..16).map(|_| b.alloc(4 * MIB, Some(7))).collect();
    b.idle(500_000_000);
    for p in buffers {
        b.free(p);
    }
    let found = analyse(&b.exit(0), 4, &|_| false);
    assert!(found.as_ref().is_ok_and(Vec::is_empty) || found == Err(NotChecked::NoRepetition), "{found:#?}");
}

/// Sixteen steps of 5 ms, each keeping a 4 MiB buffer.
fn short_loop_keeping_a_buffer_a_step(pid: u32, cmdline: &str) -> LogBuilder {
    let mut b = LogBuilder::new(pid, cmdline);
    for _ in 0..16 {
        b.alloc(4 * MIB, Some(7));
        b.idle(5_000_000);
    }
    b
}

/// The same short program, but each buffer is kept by a step of a loop
/// that works between them: a leak, short run or not.
#[test]
fn a_short_loop_that_keeps_a_buffer_per_step_grows() {
    let mut b = short_loop_keeping_a_buffer_a_step(21, "./solver");
    b.idle(300_000_000); // exit work as long as the loop
    assert_eq!(check(&b.exit(0)).len(), 1);
}

/// A short run whose log sees only a host cache filling in two bursts (the
/// weights copied out every tenth step, the second copy made while the
/// first is still held), while the loop's own memory is in a framework's
/// cache, whose record of its objects shows the loop going on after them.
#[test]
fn bursts_are_no_loop_while_the_framework_goes_on_allocating() {
    let mut b = LogBuilder::new(22, "python train.py");
    let mut objects_until = 0;
    for step in 0..40 {
        if step == 9 || step == 19 {
            for _ in 0..6 {
                b.alloc(2 * MIB, Some(7));
                b.idle(200_000);
            }
        }
        b.idle(5_000_000);
        objects_until = b.now_ns();
    }
    b.idle(300_000_000);
    let p = Process::new(b.exit(0));
    // The log alone cannot tell the bursts from a short loop keeping a buffer a step.
    assert_eq!(analyse_leaving_out(&p, 4, &|_| false, &|_| false, 0).unwrap().len(), 1);
    let found = analyse_leaving_out(&p, 4, &|_| false, &|_| false, objects_until);
    assert!(found.as_ref().is_ok_and(Vec::is_empty) || found == Err(NotChecked::NoRepetition), "{found:#?}");
}

/// A short loop that keeps a buffer a step at its own pace, then a longer
/// pass of the framework's work (an evaluation) that the log does not see:
/// still the loop, and its leak is found.
#[test]
fn a_short_loop_at_its_own_pace_stays_the_loop_while_the_framework_works_on() {
    let mut b = short_loop_keeping_a_buffer_a_step(24, "python train.py");
    b.idle(100_000_000);
    let objects_until = b.now_ns();
    b.idle(50_000_000);
    let p = Process::new(b.exit(0));
    assert_eq!(analyse_leaving_out(&p, 4, &|_| false, &|_| false, objects_until).unwrap().len(), 1);
}

#[test]
fn bursts_are_told_from_a_loops_pace() {
    // Two bursts of six, as a host cache fills.
    assert!(bursty(&[0, 1, 2, 3, 4, 5, 100, 101, 102, 103, 104, 105], 8));
    assert!(!bursty(&(0..20).map(|i| i * 10).collect::<Vec<_>>(), 8));
    // An evaluation every fifth step, five steps long: a pause each time, but as many as the loop has steps.
    let eval_every_fifth: Vec<u64> =
        (0..40).scan(0, |t, i| Some(std::mem::replace(t, *t + if i % 5 == 4 { 50 } else { 10 }))).collect();
    assert!(!bursty(&eval_every_fifth, 8));
    // Twelve buffers back to back each step, sixteen steps.
    let per_layer: Vec<u64> = (0..16u64).flat_map(|step| (0..12).map(move |l| step * 5_000 + l)).collect();
    assert!(!bursty(&per_layer, 8));
    // A slow first step, then a steady loop.
    let slow_first: Vec<u64> = std::iter::once(0).chain((0..9).map(|i| 2_000 + 50 * i)).collect();
    assert!(!bursty(&slow_first, 8));
    assert!(!bursty(&[7], 8));
    assert!(!bursty(&[7, 9], 8));
}

/// A short loop that keeps a buffer per layer each step, back to back,
/// then a longer pass of the framework's work: still the loop.
#[test]
fn a_short_loop_allocating_per_layer_stays_the_loop_while_the_framework_works_on() {
    let mut b = LogBuilder::new(26, "python train.py");
    for _ in 0..16 {
        for _ in 0..12 {
            b.alloc(64 * KIB, Some(7));
            b.idle(10_000);
        }
        b.idle(5_000_000);
    }
    b.idle(100_000_000);
    let objects_until = b.now_ns();
    b.idle(50_000_000);
    let p = Process::new(b.exit(0));
    assert_eq!(analyse_leaving_out(&p, 4, &|_| false, &|_| false, objects_until).unwrap().len(), 1);
}

/// A JAX program's set-up: six times, XLA's NVTX ranges of one kind
/// (`ranges`, given the time's number), with a math library's workspace
/// set up after every other; then a clean loop that allocates and frees a
/// buffer a step.
fn set_up_then_a_clean_loop(pid: u32, mut ranges: impl FnMut(&mut LogBuilder, usize)) -> Log {
    let mut b = LogBuilder::new(pid, "python jax_step.py");
    for time in 0..6 {
        ranges(&mut b, time);
        if time % 2 == 1 {
            b.alloc(16 * MIB, Some(7));
        }
    }
    for _ in 0..40 {
        let t = b.alloc(MIB, Some(2));
        b.idle(1_000_000);
        b.free(t);
    }
    b.idle(300_000_000);
    b.exit(0)
}

/// The set-up's ranges are compiles, each named `range` and its number.
fn compiles_then_a_loop(range: &str) -> Log {
    set_up_then_a_clean_loop(23, |b, compile| b.nvtx(&format!("{range}{compile}#"), |b| b.idle(1_000_000)))
}

#[test]
fn a_compilers_ranges_are_not_the_programs_loop() {
    // The same ranges named as steps would make the set-up a growth leak.
    let as_steps = check(&compiles_then_a_loop("step "));
    assert_eq!(as_steps.iter().map(|g| g.key.clone()).collect::<Vec<_>>(), vec![SiteKey::Stack(7)]);
    for range in [
        "XlaPass:#name=fusion-wrapper,module=loop_multiply_fusion,program_id=",
        "XlaCompile:#module=jit_step,program_id=",
        // A stage of a compile named otherwise, as on the threads a compile
        // spreads parts of a module over, where no compile range encloses it.
        "XlaEmitGpuAsm:#module=LLVMDialectModule,program_id=",
    ] {
        assert_eq!(check(&compiles_then_a_loop(range)), vec![], "{range}");
    }
    // Named alike but not in XLA's form (TensorFlow labels an op named after its type so).
    assert_eq!(check(&compiles_then_a_loop("XlaLaunch:XlaLaunch ")).len(), 1);
}

/// A program compiled with its loop inside (a `while`, a `scan`) runs as
/// one program: the runtime's range per operation repeats, and an
/// operation reached for the first time late in the run sets up a buffer
/// it keeps (XLA's conditional, its pinned host buffer).
#[test]
fn a_compiled_programs_operations_are_not_the_programs_loop() {
    let operations_then_a_loop = |range: &str| {
        set_up_then_a_clean_loop(29, |b, op| {
            b.nvtx(&format!("{range}{op},unique_hlo_op_id={op}#"), |b| b.idle(1_000_000))
        })
    };
    let as_steps = check(&operations_then_a_loop("step #hlo_op=copy."));
    assert_eq!(as_steps.iter().map(|g| g.key.clone()).collect::<Vec<_>>(), vec![SiteKey::Stack(7)]);
    assert_eq!(check(&operations_then_a_loop("Thunk:#hlo_op=copy.")), vec![]);
}

/// A host callback, run inside one of the program's operations, marks the
/// steps of a loop compiled into the program: the marks are the program's.
#[test]
fn marks_made_inside_a_compiled_programs_operation_are_the_programs() {
    let mut b = LogBuilder::new(31, "python jax_callback.py");
    for step in 0..20 {
        b.nvtx("Thunk:#hlo_op=custom-call.1,unique_hlo_op_id=12#", |b| b.mark(&format!("step {step}")));
        b.alloc(1000, Some(3));
        b.idle(1_000_000);
    }
    let found = check(&b.exit(0));
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].key, SiteKey::Stack(3));
    assert_eq!((found[0].growth.phases_from.as_str(), found[0].growth.phase.as_str()), ("mark", "step #"));
}

/// XLA's autotuner runs each candidate it compiled, an `XlaModule` range
/// of one name each time, inside its measurement's range (or, not
/// `measured`, the same runs alone).
fn autotuning_then_a_loop(measured: bool) -> Log {
    set_up_then_a_clean_loop(25, |b, candidate| {
        let name = format!("XlaModule:#hlo_module=gemm_fusion_dot,program_id={candidate}#");
        let run = |b: &mut LogBuilder| b.nvtx(&name, |b| b.idle(100_000));
        if measured {
            b.nvtx("XlaAutotunerMeasurement:#hlo_op=dot.1#", run);
        } else {
            run(b);
        }
    })
}

#[test]
fn programs_run_inside_a_compilers_ranges_are_not_the_programs_loop() {
    assert_eq!(check(&autotuning_then_a_loop(false)).len(), 1, "runs of a program outside a compile are phases");
    assert_eq!(check(&autotuning_then_a_loop(true)), vec![]);
}

/// XLA's autotuner (since the compile's ranges are spread over threads)
/// runs its candidates, a module it built for a fusion each, with no range
/// of the compile around them on their thread: their `XlaModule` ranges do
/// not name a program.
#[test]
fn modules_xla_built_for_itself_are_not_the_programs_loop() {
    let candidates_then_a_loop = |program_id: &str| {
        set_up_then_a_clean_loop(26, |b, candidate| {
            let run = format!("XlaModule:#hlo_module=gemm_fusion_dot_general.{candidate}{program_id}#");
            b.thread(3);
            b.nvtx(&run, |b| b.idle(100_000));
            b.thread(1);
        })
    };
    assert_eq!(check(&candidates_then_a_loop(",program_id=7")).len(), 1, "a program's runs are phases");
    assert_eq!(check(&candidates_then_a_loop("")), vec![]);
}

/// The same autotuning while another thread opens a range of its own
/// between each measurement's range and the run inside it: the run's
/// parent is the other thread's range, the measurement behind it.
#[test]
fn a_compilers_ranges_enclose_across_another_threads_ranges() {
    let log = set_up_then_a_clean_loop(27, |b, candidate| {
        let measurement = "XlaAutotunerMeasurement:#hlo_op=dot.1#";
        let run = format!("XlaModule:#hlo_module=gemm_fusion_dot,program_id={candidate}#");
        // Names without digits: one range each, no repeated phase of their own.
        let loading = format!("loading {}", ["a", "b", "c", "d", "e", "f"][candidate]);
        b.nvtx_push(measurement);
        b.thread(2);
        b.nvtx_push(&loading);
        b.thread(1);
        b.nvtx(&run, |b| b.idle(100_000));
        b.nvtx_pop(measurement);
        b.thread(2);
        b.nvtx_pop(&loading);
        b.thread(1);
    });
    assert_eq!(check(&log), vec![]);
}

/// Another thread opens a range while a compile runs and keeps it open
/// while the program's steps run: the steps' parent is that range, and the
/// compile behind it had ended before they began. They are phases.
#[test]
fn steps_after_a_compile_are_phases_across_another_threads_range() {
    let mut b = LogBuilder::new(28, "python jax_step.py");
    let compile = "XlaCompile:#module=jit_step,program_id=1#";
    b.nvtx_push(compile);
    b.thread(2);
    b.nvtx_push("prefetching");
    b.thread(1);
    b.nvtx_pop(compile);
    for step in 0..20 {
        b.nvtx(&format!("step {step}"), |b| {
            let t = b.alloc(MIB, Some(2));
            b.alloc(1000, Some(3));
            b.free(t);
        });
    }
    b.thread(2);
    b.nvtx_pop("prefetching");
    b.thread(1);
    let found = check(&b.exit(0));
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!((found[0].key.clone(), found[0].growth.phases_from.as_str()), (SiteKey::Stack(3), "nvtx"));
}
