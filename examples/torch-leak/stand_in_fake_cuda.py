"""STAND-IN for the example log, until one recorded on a GPU replaces it.

Made by scripts/example-stand-in.sh on a machine without a GPU: the loop of
examples/torch-leak/train.py, as device allocations through the fake CUDA
runtime of tests/fake/ (by ctypes) instead of PyTorch, with the steps marked
by cupool_mark instead of NVTX. Same plan: 1 MiB of weights and 2 MiB of
optimizer state, per step a 1 MiB output and a 4 MiB temporary, every tenth
step an evaluation; each step's output kept by mistake (the line marked
LEAK), allocated on the line marked ALLOCATED.
"""

import ctypes
import os
import sys

MIB = 1 << 20
cudart = ctypes.CDLL(os.environ.get("FAKE_CUDART", "libcudart.so.13"), mode=os.RTLD_GLOBAL)
process = ctypes.CDLL(None)  # cupool's hooks come first under cupool
_malloc, _free = process.cudaMalloc, process.cudaFree
_malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
_free.argtypes = [ctypes.c_void_p]
mark = getattr(process, "cupool_mark", None)
if mark is not None:
    mark.argtypes = [ctypes.c_char_p]


def ok(status):
    if status != 0:
        sys.exit("result: FAIL cudaMalloc")


def free(p):
    _free(p)


steps = int(os.environ.get("STEPS", "40"))
weights, state = ctypes.c_void_p(), ctypes.c_void_p()
ok(_malloc(ctypes.byref(weights), MIB))
ok(_malloc(ctypes.byref(state), 2 * MIB))
outputs = []  # for metrics at the end


def train_step():
    out, grads = ctypes.c_void_p(), ctypes.c_void_p()
    ok(_malloc(ctypes.byref(out), MIB))  # ALLOCATED
    ok(_malloc(ctypes.byref(grads), 4 * MIB))
    free(grads)
    return out


def evaluate():
    activations = ctypes.c_void_p()
    ok(_malloc(ctypes.byref(activations), 4 * MIB))
    free(activations)


for step in range(steps):
    if mark is not None:
        mark(b"step %d" % step)
    out = train_step()
    outputs.append(out)  # LEAK: one 1 MiB output kept per step
    if step % 10 == 9:
        evaluate()
free(state)
free(weights)
print(f"result: ok steps={steps} kept={len(outputs)}")
