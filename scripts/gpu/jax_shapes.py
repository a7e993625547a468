# GPU check of `cupool check` on JAX loops the rules were not built around
# (XLA's arena, not preallocated). SHAPE: scan (steps fused by lax.scan,
# ten chunks), shapes (the batch grows every eight steps: a new compile
# each time), donate (the weights donated to each step). Clean, each must
# pass; LEAK=1 keeps every step's weights (the line marked ALLOCATED) and
# marks its steps, found at that line.
import os
import jax
import jax.numpy as jnp

try:
    import cupool
except ImportError:
    cupool = None

shape = os.environ.get("SHAPE", "scan")
leak = os.environ.get("LEAK") == "1"


def loss(w, x):
    return jnp.mean((jnp.tanh(x @ w) - 0.5) ** 2)


def update(w, x):
    return w - 0.1 * jax.grad(loss)(w, x)


key = jax.random.PRNGKey(0)
w = jax.random.normal(key, (512, 512))
if shape == "scan":
    chunk = jax.jit(lambda w, xs: jax.lax.scan(lambda w, x: (update(w, x), None), w, xs)[0])
    step = lambda w, i: chunk(w, jax.random.normal(jax.random.fold_in(key, i), (4, 256, 512)))
elif shape == "donate":
    jitted = jax.jit(update, donate_argnums=0)
    step = lambda w, i: jitted(w, jax.random.normal(jax.random.fold_in(key, i), (256, 512)))
else:
    jitted = jax.jit(update)
    step = lambda w, i: jitted(w, jax.random.normal(jax.random.fold_in(key, i), (128 * (1 + i // 8), 512)))
kept = []
for i in range(40):
    if leak and cupool is not None:
        cupool.mark("step %d" % i)
    w = step(w, i)
    if leak:
        kept.append(w + 1.0)  # ALLOCATED
    w.block_until_ready()
print(f"result: ok {float(loss(w, jnp.ones((8, 512)))):.4f}")
