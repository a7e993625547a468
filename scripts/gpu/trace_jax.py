# A JAX training loop with its platform allocator (XLA_PYTHON_CLIENT_ALLOCATOR=
# platform: every buffer is a device allocation of its own, no BFC arena), on
# batches of a few shapes: a trace for `cupool replay`.
import jax
import jax.numpy as jnp


def init(key, sizes):
    keys = jax.random.split(key, len(sizes) - 1)
    return [(jax.random.normal(k, (a, b)) * a**-0.5, jnp.zeros(b)) for k, a, b in zip(keys, sizes, sizes[1:])]


def loss(params, x, y):
    for w, b in params[:-1]:
        x = jax.nn.gelu(x @ w + b)
    w, b = params[-1]
    return jnp.mean((x @ w + b - y) ** 2)


@jax.jit
def step(params, x, y):
    grads = jax.grad(loss)(params, x, y)
    return [(w - 1e-3 * gw, b - 1e-3 * gb) for (w, b), (gw, gb) in zip(params, grads)]


key = jax.random.PRNGKey(0)
params = init(key, [1024, 4096, 4096, 4096, 1024])
for i in range(30):
    batch = [256, 512, 1024][i % 3]
    x = jax.random.normal(jax.random.fold_in(key, i), (batch, 1024))
    params = step(params, x, jnp.zeros((batch, 1024)))
jax.block_until_ready(params)
print(f"result: ok {float(loss(params, x, jnp.zeros((batch, 1024)))):.4f}")
