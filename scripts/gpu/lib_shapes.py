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
# over three epochs). Clean, each must pass; LEAK=1 keeps a copy
# of one tensor a step (the line marked ALLOCATED) in the PyTorch shapes,
# where the leak is to be found.
import os

shape = os.environ.get("SHAPE", "lightning")
leak = os.environ.get("LEAK") == "1"
kept = []


def keep(t):
    if leak:
        kept.append(t.detach().clone())  # ALLOCATED


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


run = {"lightning": lightning, "geometric": geometric, "gpytorch": gpytorch_fit, "triton": triton_loop,
       "graph": graph, "numpyro": numpyro_nuts, "botorch": botorch_loop, "metrics": metrics}[shape]
print(f"result: ok {run():.4f}")
