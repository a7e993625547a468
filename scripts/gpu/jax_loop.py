# GPU check of `cupool check`: a JAX training loop on the default
# allocator (XLA's BFC arena, XLA_PYTHON_CLIENT_PREALLOCATE=false), whose
# arena grows while it warms up. Clean, it must pass; LEAK=1 keeps each
# step's output in a list (the line marked ALLOCATED). The loop dispatches
# far faster than the recorder samples: MARK=1 marks its steps with
# cupool.mark(), and the leak is found at that line; unmarked, the kept
# arrays are first seen together and the check says it cannot judge them.
import os
import jax
import jax.numpy as jnp

try:
    import cupool
except ImportError:
    cupool = None

leak = os.environ.get("LEAK") == "1"
marked = os.environ.get("MARK") == "1" and cupool is not None


def loss(w, x, y):
    return jnp.mean((jnp.tanh(x @ w) - y) ** 2)


step = jax.jit(lambda w, x, y: w - 0.1 * jax.grad(loss)(w, x, y))
key = jax.random.PRNGKey(0)
w = jax.random.normal(key, (1024, 1024))  # 4 MiB
x = jax.random.normal(key, (1024, 1024))
y = jnp.zeros((1024, 1024))
kept = []
for i in range(40):
    if marked:
        cupool.mark("step %d" % i)
    w = step(w, x, y)
    if leak:
        kept.append(w * 2.0)  # ALLOCATED
print(f"result: ok {float(loss(w, x, y)):.4f}")
