# JAX workload for gpu-check.sh: XLA reaches the driver directly.
import jax, jax.numpy as jnp
x = jnp.ones((1024, 1024))
for i in range(20):
    x = (x @ x) / 1024.0
print(f"result: devices={len(jax.devices())} value={float(x[0, 0]):.3f}")
