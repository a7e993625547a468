# GPU check of allocation sites (scripts/gpu-sites.sh) for JAX, run with
# XLA_PYTHON_CLIENT_ALLOCATOR=platform so each buffer is its own allocation.
import jax
import jax.numpy as jnp

x = jnp.ones((1024, 1024))
(x @ x).block_until_ready()


def planted():
    return jax.device_put(jnp.zeros(512 << 20, dtype=jnp.uint8))  # PLANTED


big = planted()
big.block_until_ready()
print("result: ok")
