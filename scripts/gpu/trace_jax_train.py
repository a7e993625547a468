# An allocation trace for `cupool replay`: a JAX MLP trained with a
# hand-written Adam for 40 steps on batches of three sizes, JAX on the
# platform allocator (each buffer a request; set by the recording script).
import jax
import jax.numpy as jnp

key = jax.random.PRNGKey(0)
sizes = [784, 1024, 1024, 512, 10]
params = []
for i, (m, n) in enumerate(zip(sizes[:-1], sizes[1:])):
    params.append((jax.random.normal(jax.random.fold_in(key, i), (m, n)) * 0.02, jnp.zeros(n)))


def loss(params, x, y):
    for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b)
    w, b = params[-1]
    return jnp.mean((x @ w + b - y) ** 2)


@jax.jit
def step(params, m, v, x, y, t):
    g = jax.grad(loss)(params, x, y)
    m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, m, g)
    v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, v, g)
    params = jax.tree.map(lambda p, m, v: p - 1e-3 * m / (jnp.sqrt(v) + 1e-8), params, m, v)
    return params, m, v


m = jax.tree.map(jnp.zeros_like, params)
v = jax.tree.map(jnp.zeros_like, params)
for t in range(40):
    batch = (64, 256, 1024)[t % 3]
    x = jax.random.normal(jax.random.fold_in(key, 100 + t), (batch, 784))
    y = jax.random.normal(jax.random.fold_in(key, 200 + t), (batch, 10))
    params, m, v = step(params, m, v, x, y, t)
jax.block_until_ready(params)
print("result: ok", float(loss(params, x, y)))
