# The transformer of scripts/gpu/torch_transformer.py, with the CPU's lead over
# the GPU at each step: an event recorded at each step's start, its GPU time
# against the CPU time it was queued at (both from a synchronized start), and
# the GPU's time per step by sequence length (BENCHMARKS.md, section 12).
import os, time, torch
# The baseline workload's own definitions (model, optimizer, step), not a copy
# of them: everything in torch_transformer.py before its warm-up.
_base = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_transformer.py")).read()
exec(_base[:_base.index("for i in range(5): step(i)")])
for i in range(5): step(i)
torch.cuda.synchronize(); N = 60
evs, cpu = [], []
t0 = time.perf_counter()
for i in range(N + 1):
    e = torch.cuda.Event(enable_timing=True); e.record(); evs.append(e); cpu.append(time.perf_counter() - t0)
    if i < N: step(i)
torch.cuda.synchronize(); dt = (time.perf_counter() - t0) / N
gpu = [evs[0].elapsed_time(e) / 1e3 for e in evs]
lag = [(g - c) * 1e3 for g, c in zip(gpu, cpu)]
steps = [(gpu[i + 1] - gpu[i]) * 1e3 for i in range(N)]
by_len = {}
for i in range(N): by_len.setdefault(lens[(i * 7) % len(lens)], []).append(steps[i])
print(f"mode={os.environ.get('MODE','?')} ms/iter={dt*1e3:.2f} lead_ms min={min(lag[1:]):.1f} median={sorted(lag)[N//2]:.1f} max={max(lag):.1f} "
      f"cpu_ms/iter={cpu[-1]/N*1e3:.2f} step_ms_by_len=" + " ".join(f"{L}:{sorted(v)[len(v)//2]:.2f}" for L, v in sorted(by_len.items())))
print("   lead per step:", " ".join(f"{x:.0f}" for x in lag))
