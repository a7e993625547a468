# GPU check of `cupool check`: a JAX training step (grad + update), clean.
import jax
import jax.numpy as jnp


def loss(w, x, y):
    return jnp.mean((jnp.tanh(x @ w) - y) ** 2)


step = jax.jit(lambda w, x, y: w - 0.1 * jax.grad(loss)(w, x, y))
key = jax.random.PRNGKey(0)
w = jax.random.normal(key, (512, 512))
x = jax.random.normal(key, (256, 512))
y = jnp.zeros((256, 512))
for _ in range(20):
    w = step(w, x, y)
print(f"result: ok {float(loss(w, x, y)):.4f}")
