# GPU check of `cupool check` on libraries the rules were not built
# around. SHAPE: lightning (PyTorch Lightning's Trainer, three epochs with
# validation), geometric (PyTorch Geometric's graph convolutions on random
# graphs of changing sizes), gpytorch (an exact Gaussian process fitted by
# Adam, then a prediction), triton (a Triton kernel on arrays of changing
# sizes), graph (a model captured by hand with torch.cuda.graph and
# replayed every step), numpyro (NUTS sampling a regression: JAX compiling
# and running a loop of its own), botorch (Bayesian optimisation: a GP
# fitted again to one more point each round), metrics (TorchMetrics'
# AUROC, which keeps every batch's predictions until each epoch's reset,
# over three epochs), flax (Flax NNX with Optax's AdamW, batch norm and
# dropout, evaluated every tenth step), equinox (an Equinox MLP, gradients
# clipped, batches of three sizes), timm (timm's ViT in bfloat16 autocast
# with an EMA of its weights), peft (LoRA on a GPT-2 built from its config,
# gradient checkpointing, sequences of four lengths), accelerate (Hugging
# Face Accelerate: bfloat16, accumulation over four batches, a pinned
# loader, a one-cycle schedule). Clean, each must pass; LEAK=1 keeps a
# copy of one tensor or array a step (the line marked ALLOCATED), where the
# leak is to be found; MARK=1 marks the JAX shapes' steps with
# cupool.mark().
import os

shape = os.environ.get("SHAPE", "lightning")
leak = os.environ.get("LEAK") == "1"
kept = []


def keep(t):
    if leak:
        kept.append(t.detach().clone() if hasattr(t, "detach") else t + 1)  # ALLOCATED


def mark(i):
    if os.environ.get("MARK") == "1":
        import cupool

        cupool.mark("step %d" % i)


def lightning():
    import pytorch_lightning as pl
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))

        def training_step(self, batch, i):
            x, y = batch
            out = self.model(x)
            keep(out)
            return F.mse_loss(out, y)

        def validation_step(self, batch, i):
            x, y = batch
            self.log("val", F.mse_loss(self.model(x), y))

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), 1e-3)

    data = TensorDataset(torch.randn(2048, 64), torch.randn(2048, 1))
    trainer = pl.Trainer(max_epochs=3, accelerator="gpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=4)
    trainer.fit(Net(), DataLoader(data, batch_size=64), DataLoader(data, batch_size=256))
    return trainer.callback_metrics["val"].item()


def geometric():
    import torch
    import torch.nn.functional as F
    from torch_geometric.nn import GCNConv

    conv1, conv2 = GCNConv(16, 64).cuda(), GCNConv(64, 4).cuda()
    opt = torch.optim.Adam(list(conv1.parameters()) + list(conv2.parameters()), 1e-2)
    total = 0.0
    for step in range(40):
        n = 500 + 37 * (step % 7)
        x = torch.randn(n, 16, device="cuda")
        edges = torch.randint(0, n, (2, 4 * n), device="cuda")
        out = conv2(F.relu(conv1(x, edges)), edges)
        keep(out)
        loss = out.pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        total += loss.item()
    return total


def gpytorch_fit():
    import gpytorch
    import torch

    x = torch.linspace(0, 1, 1000, device="cuda")
    y = torch.sin(x * 6.28) + 0.1 * torch.randn_like(x)

    class GP(gpytorch.models.ExactGP):
        def __init__(self, likelihood):
            super().__init__(x, y, likelihood)
            self.mean = gpytorch.means.ConstantMean()
            self.cov = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())

        def forward(self, at):
            return gpytorch.distributions.MultivariateNormal(self.mean(at), self.cov(at))

    likelihood = gpytorch.likelihoods.GaussianLikelihood().cuda()
    model = GP(likelihood).cuda()
    model.train()
    likelihood.train()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    for _ in range(40):
        opt.zero_grad()
        output = model(x)
        keep(output.mean)
        loss = -mll(output, y)
        loss.backward()
        opt.step()
    model.eval()
    likelihood.eval()
    with torch.no_grad(), gpytorch.settings.fast_pred_var():
        return likelihood(model(torch.linspace(0, 1, 200, device="cuda"))).mean.sum().item()


def triton_loop():
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def add(x, y, out, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)

    total = 0.0
    for step in range(40):
        n = (1 << 20) + 4099 * (step % 5)
        x = torch.randn(n, device="cuda")
        y = torch.randn_like(x)
        out = torch.empty_like(x)
        add[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
        keep(out)
        total += out[:4].sum().item()
    return total


def graph():
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 10)).cuda()
    static_x = torch.randn(64, 512, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(3):
            model(static_x)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g):
        static_y = model(static_x)
    total = 0.0
    for _ in range(40):
        static_x.copy_(torch.randn(64, 512, device="cuda"))
        g.replay()
        keep(static_y)
        total += static_y.sum().item()
    return total


def numpyro_nuts():
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import MCMC, NUTS

    def regression(x, y=None):
        w = numpyro.sample("w", dist.Normal(0, 1).expand([8]))
        b = numpyro.sample("b", dist.Normal(0, 1))
        numpyro.sample("y", dist.Normal(x @ w + b, 1), obs=y)

    x = jax.random.normal(jax.random.PRNGKey(1), (500, 8))
    y = x @ jnp.arange(8.0) + 0.5 + jax.random.normal(jax.random.PRNGKey(2), (500,))
    mcmc = MCMC(NUTS(regression), num_warmup=200, num_samples=200, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), x, y)
    return float(mcmc.get_samples()["b"].mean())


def botorch_loop():
    import torch
    from botorch.acquisition.logei import qLogExpectedImprovement
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import SingleTaskGP
    from botorch.optim import optimize_acqf
    from gpytorch.mlls import ExactMarginalLogLikelihood

    torch.manual_seed(0)
    kw = {"device": "cuda", "dtype": torch.float64}
    f = lambda x: -((x - 0.3) ** 2).sum(-1, keepdim=True)
    x = torch.rand(8, 4, **kw)
    y = f(x)
    bounds = torch.stack([torch.zeros(4, **kw), torch.ones(4, **kw)])
    for _ in range(12):
        model = SingleTaskGP(x, y)
        fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
        acq = qLogExpectedImprovement(model, best_f=y.max())
        candidate, _ = optimize_acqf(acq, bounds=bounds, q=1, num_restarts=4, raw_samples=64)
        keep(candidate)
        x, y = torch.cat([x, candidate]), torch.cat([y, f(candidate)])
    return y.max().item()


def metrics():
    import torch
    import torchmetrics

    torch.manual_seed(0)
    auroc = torchmetrics.AUROC(task="binary").cuda()
    model = torch.nn.Linear(32, 1).cuda()
    total = 0.0
    for _ in range(3):
        for _ in range(20):
            x = torch.randn(256, 32, device="cuda")
            target = (x[:, 0] > 0).long()
            with torch.no_grad():
                scores = model(x).squeeze(1).sigmoid()
            auroc.update(scores, target)
            keep(scores)
        total += auroc.compute().item()
        auroc.reset()
    return total


def flax_loop():
    import jax
    import optax
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.a, self.b = nnx.Linear(64, 256, rngs=rngs), nnx.Linear(256, 10, rngs=rngs)
            self.norm, self.drop = nnx.BatchNorm(256, rngs=rngs), nnx.Dropout(0.1, rngs=rngs)

        def __call__(self, x):
            return self.b(self.drop(nnx.relu(self.norm(self.a(x)))))

    model = Net(nnx.Rngs(0))
    opt = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)

    @nnx.jit
    def step(model, opt, x, y):
        loss_of = lambda m: optax.softmax_cross_entropy_with_integer_labels(m(x), y).mean()
        loss, grads = nnx.value_and_grad(loss_of)(model)
        opt.update(model, grads)
        return loss

    evaluate = nnx.jit(lambda m, x: m(x).argmax(-1))
    key, accuracy = jax.random.PRNGKey(0), 0.0
    for i in range(40):
        mark(i)
        x = jax.random.normal(jax.random.fold_in(key, i), (128, 64))
        y = (x[:, 0] > 0).astype("int32") + (x[:, 1] > 0).astype("int32")
        loss = step(model, opt, x, y)
        keep(x)
        if i % 10 == 9:
            model.eval()
            accuracy = float((evaluate(model, x) == y).mean())
            model.train()
    return float(loss) + accuracy


def equinox_loop():
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import optax

    key = jax.random.PRNGKey(0)
    model = eqx.nn.MLP(32, 1, 128, 3, key=key)
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))
    state = opt.init(eqx.filter(model, eqx.is_array))

    @eqx.filter_jit
    def step(model, state, x, y):
        loss_of = lambda m: jnp.mean((jax.vmap(m)(x) - y) ** 2)
        loss, grads = eqx.filter_value_and_grad(loss_of)(model)
        updates, state = opt.update(grads, state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), state, loss

    for i in range(40):
        mark(i)
        x = jax.random.normal(jax.random.fold_in(key, i), ((64, 96, 128)[i % 3], 32))
        model, state, loss = step(model, state, x, jnp.sin(x[:, :1]))
        keep(x)
    return float(loss)


def timm_loop():
    import timm
    import timm.utils
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", img_size=64, num_classes=10).cuda()
    ema = timm.utils.ModelEmaV3(model, decay=0.99)
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    for _ in range(30):
        x, y = torch.randn(32, 3, 64, 64, device="cuda"), torch.randint(0, 10, (32,), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        ema.update(model)
        keep(loss)
    with torch.no_grad():
        return ema.module(x).float().mean().item()


def peft_lora():
    import torch
    import transformers as tf
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=4000, n_layer=4, n_embd=256, n_head=4, use_cache=False))
    model.gradient_checkpointing_enable()
    model.enable_input_require_grads()
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["c_attn"], fan_in_fan_out=True, task_type="CAUSAL_LM")
    model = get_peft_model(model, lora).cuda()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], 1e-3)
    for i in range(30):
        ids = torch.randint(0, 4000, (8, 64 + 32 * (i % 4)), device="cuda")
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        keep(out.logits[:, -1])
    return out.loss.item()


def accelerate_loop():
    import torch
    import torch.nn.functional as F
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    acc = Accelerator(mixed_precision="bf16", gradient_accumulation_steps=4)
    model = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.GELU(), torch.nn.Linear(512, 10))
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    data = TensorDataset(torch.randn(2048, 128), torch.randint(0, 10, (2048,)))
    loader = DataLoader(data, batch_size=32, shuffle=True, pin_memory=True)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, 1e-3, total_steps=2 * len(loader))
    model, opt, loader, sched = acc.prepare(model, opt, loader, sched)
    for _ in range(2):
        for x, y in loader:
            with acc.accumulate(model):
                loss = F.cross_entropy(model(x), y)
                acc.backward(loss)
                opt.step()
                sched.step()
                opt.zero_grad()
            keep(loss)
    return loss.item()


run = {"lightning": lightning, "geometric": geometric, "gpytorch": gpytorch_fit, "triton": triton_loop,
       "graph": graph, "numpyro": numpyro_nuts, "botorch": botorch_loop, "metrics": metrics, "flax": flax_loop,
       "equinox": equinox_loop, "timm": timm_loop, "peft": peft_lora, "accelerate": accelerate_loop}[shape]
print(f"result: ok {run():.4f}")
