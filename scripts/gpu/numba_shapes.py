# GPU check of `cupool check` on numba CUDA loops the rules were not built
# around. SHAPE: defer (each step's work inside cuda.defer_cleanup(), its
# arrays let go of after it), deferred (the same, but each step's arrays
# let go of inside the next step's defer_cleanup(): numba never frees
# while deferring, so its pending frees pile up, a real growth leak found
# at the arrays' line, DEFERRED below), streams (arrays of
# changing sizes copied in and out on two streams), many (small arrays,
# many a step, freed in numba's batches of pending deallocations). Clean,
# each must pass; LEAK=1 keeps one array a step (the line marked
# ALLOCATED), found at that line.
import contextlib
import os

import numpy as np

from numba_common import cuda, scale

shape = os.environ.get("SHAPE", "defer")
leak = os.environ.get("LEAK") == "1"
streams = [cuda.stream(), cuda.stream()]
kept, total = [], 0.0
arrays = []
for step in range(40):
    with cuda.defer_cleanup() if shape in ("defer", "deferred") else contextlib.nullcontext():
        stream = streams[step % 2] if shape == "streams" else 0  # 0: the default stream
        n = (1 << 18) + 4099 * (step % 9) if shape != "many" else 1000 + 17 * step
        arrays = [cuda.to_device(np.full(n, 1.5, dtype=np.float32), stream=stream)  # DEFERRED
                  for _ in range(16 if shape == "many" else 2)]
        for a in arrays:
            scale[(a.size + 255) // 256, 256, stream](a, 2.0)
        total += float(arrays[-1].copy_to_host(stream=stream)[0])
        stream.synchronize() if stream else cuda.synchronize()
        if leak:
            kept.append(cuda.device_array(1 << 18, dtype=np.float32))  # ALLOCATED
    if shape == "defer":
        arrays = []  # freed outside the deferral, where numba's pending frees are flushed
cuda.synchronize()
print(f"result: ok {total}")
