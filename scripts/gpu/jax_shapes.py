# GPU check of `cupool check` on JAX loops the rules were not built around
# (XLA's arena, not preallocated). SHAPE: scan (steps fused by lax.scan,
# ten chunks), shapes (the batch grows every eight steps: a new compile
# each time), donate (the weights donated to each step), adam (a tree of
# layers with Adam's moments, all donated), host (each batch put from host
# memory, steps dispatched ahead and waited for every tenth), remat
# (rematerialised layers, vmapped over four models), cond (each step one
# compiled program with loops and branches inside: ten inner updates by a
# fori_loop, each a lax.cond on the step, then a while_loop whose trip
# count changes with the step). Clean, each must
# pass; LEAK=1 keeps every step's weights (the line marked ALLOCATED) and
# marks its steps, found at that line.
import os
import jax
import jax.numpy as jnp
import numpy as np

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
elif shape == "adam":
    w = {"a": w, "b": jax.random.normal(key, (512, 512)), "c": jnp.zeros(512)}
    moments = jax.tree_util.tree_map(jnp.zeros_like, (w, w))

    def tree_loss(p, x):
        return jnp.mean((jnp.tanh(jnp.tanh(x @ p["a"]) @ p["b"] + p["c"]) - 0.5) ** 2)

    def adam(state, x):
        p, (m, v) = state
        g = jax.grad(tree_loss)(p, x)
        m = jax.tree_util.tree_map(lambda m, g: 0.9 * m + 0.1 * g, m, g)
        v = jax.tree_util.tree_map(lambda v, g: 0.999 * v + 0.001 * g * g, v, g)
        p = jax.tree_util.tree_map(lambda p, m, v: p - 1e-3 * m / (jnp.sqrt(v) + 1e-8), p, m, v)
        return p, (m, v)

    jitted = jax.jit(adam, donate_argnums=0)
    w = (w, moments)
    step = lambda w, i: jitted(w, jax.random.normal(jax.random.fold_in(key, i), (256, 512)))
elif shape == "host":
    jitted = jax.jit(update)
    data = np.random.default_rng(0).standard_normal((40, 256, 512), dtype=np.float32)
    step = lambda w, i: jitted(w, jax.device_put(data[i]))
elif shape == "remat":
    layer = jax.checkpoint(lambda w, x: jnp.tanh(x @ w))
    many = jax.vmap(lambda w, x: jnp.mean((layer(w, layer(w, x)) - 0.5) ** 2), in_axes=(0, None))
    jitted = jax.jit(lambda w, x: w - 0.1 * jax.grad(lambda w: many(w, x).sum())(w))
    w = jnp.stack([w] * 4)
    step = lambda w, i: jitted(w, jax.random.normal(jax.random.fold_in(key, i), (256, 512)))
elif shape == "cond":

    def inner(w, x, i):
        body = lambda k, w: jax.lax.cond((i + k) % 3 == 0, lambda w: update(w, x), lambda w: 0.99 * w, w)
        w = jax.lax.fori_loop(0, 10, body, w)
        return jax.lax.while_loop(lambda c: c[1] < i % 4, lambda c: (update(c[0], x), c[1] + 1), (w, 0))[0]

    jitted = jax.jit(inner)
    step = lambda w, i: jitted(w, jax.random.normal(jax.random.fold_in(key, i), (256, 512)), i)
else:
    jitted = jax.jit(update)
    step = lambda w, i: jitted(w, jax.random.normal(jax.random.fold_in(key, i), (128 * (1 + i // 8), 512)))
kept = []
for i in range(40):
    if leak and cupool is not None:
        cupool.mark("step %d" % i)
    w = step(w, i)
    first = jax.tree_util.tree_leaves(w)[0]
    if leak:
        kept.append(first + 1.0)  # ALLOCATED
    if shape != "host" or i % 10 == 9:
        first.block_until_ready()
print(f"result: ok {float(jnp.sum(jax.tree_util.tree_leaves(w)[0])):.4f}")
