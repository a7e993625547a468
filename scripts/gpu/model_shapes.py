# GPU check of `cupool check` on model families and loop shapes the rules
# were not built around. SHAPE: gan (a DCGAN, discriminator and generator
# stepped in turn, a grid of samples from fixed noise every tenth step
# taken to the host), detection (torchvision's Faster R-CNN trained on
# images of changing sizes with one to six boxes each), moe (a mixture of
# experts routing each token to one of four experts: every expert sees a
# different number of tokens each step), ppo (reinforcement learning: a
# rollout buffer made once, advantages computed backwards step by step,
# four epochs of shuffled minibatches), diffusion (a denoiser trained on
# random noise levels, twenty denoising steps sampled every tenth step),
# interop (CuPy arrays handed to PyTorch and back through DLPack, both
# frameworks' pools in use), scan (a JAX recurrent net unrolled by
# lax.scan under jax.checkpoint, its parameters donated to each step), stft
# (a classifier of spectrograms of clips of forty lengths: a new FFT plan
# for every new length, which PyTorch keeps in its plan cache).
# Clean, each must pass; LEAK=1 keeps a copy of one tensor or array a step
# (the line marked ALLOCATED), where the leak is to be found; MARK=1 marks
# the JAX shape's steps with cupool.mark().
import os

shape = os.environ.get("SHAPE", "gan")
leak = os.environ.get("LEAK") == "1"
kept = []


def keep(t):
    if leak:
        kept.append(t.detach().clone() if hasattr(t, "detach") else t * 1)  # ALLOCATED


def mark(i):
    if os.environ.get("MARK") == "1":
        import cupool

        cupool.mark("step %d" % i)


def gan():
    import torch
    from torch import nn

    g = nn.Sequential(
        nn.ConvTranspose2d(64, 128, 4, 1, 0), nn.BatchNorm2d(128), nn.ReLU(),
        nn.ConvTranspose2d(128, 64, 4, 2, 1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.ConvTranspose2d(64, 3, 4, 2, 1), nn.Tanh(),
    ).cuda()
    d = nn.Sequential(
        nn.Conv2d(3, 64, 4, 2, 1), nn.LeakyReLU(0.2),
        nn.Conv2d(64, 128, 4, 2, 1), nn.BatchNorm2d(128), nn.LeakyReLU(0.2),
        nn.Conv2d(128, 1, 4, 1, 0), nn.Flatten(),
    ).cuda()
    og = torch.optim.Adam(g.parameters(), 2e-4, betas=(0.5, 0.999))
    od = torch.optim.Adam(d.parameters(), 2e-4, betas=(0.5, 0.999))
    bce = nn.BCEWithLogitsLoss()
    fixed = torch.randn(16, 64, 1, 1, device="cuda")
    grids = []
    for step in range(40):
        real = torch.rand(32, 3, 16, 16, device="cuda") * 2 - 1
        fake = g(torch.randn(32, 64, 1, 1, device="cuda"))
        od.zero_grad()
        loss_d = bce(d(real), torch.ones(32, 1, device="cuda")) + bce(d(fake.detach()), torch.zeros(32, 1, device="cuda"))
        loss_d.backward()
        od.step()
        og.zero_grad()
        loss_g = bce(d(fake), torch.ones(32, 1, device="cuda"))
        loss_g.backward()
        og.step()
        keep(fake)
        if step % 10 == 9:
            with torch.no_grad():
                g.eval()
                grids.append(g(fixed).cpu())
                g.train()
    print("gan", float(loss_d), float(loss_g), len(grids))


def detection():
    import torch
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

    torch.manual_seed(0)
    model = fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None, num_classes=5).cuda().train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    sizes = [(240, 320), (320, 320), (288, 256), (320, 240)]
    for step in range(30):
        h, w = sizes[step % len(sizes)]
        images, targets = [], []
        for i in range(2):
            n = 1 + (step + i) % 6
            xy = torch.rand(n, 2, device="cuda") * torch.tensor([w - 40.0, h - 40.0], device="cuda")
            wh = 8 + torch.rand(n, 2, device="cuda") * 30
            targets.append({"boxes": torch.cat([xy, xy + wh], 1), "labels": torch.randint(1, 5, (n,), device="cuda")})
            images.append(torch.rand(3, h, w, device="cuda"))
        losses = model(images, targets)
        loss = sum(losses.values())
        opt.zero_grad()
        loss.backward()
        opt.step()
        keep(losses["loss_classifier"])
    print("detection", float(loss))


def moe():
    import torch
    from torch import nn

    torch.manual_seed(0)
    dim, experts = 128, 4
    router = nn.Linear(dim, experts).cuda()
    ffn = nn.ModuleList(nn.Sequential(nn.Linear(dim, 256), nn.GELU(), nn.Linear(256, dim)) for _ in range(experts)).cuda()
    head = nn.Linear(dim, 1).cuda()
    opt = torch.optim.AdamW([*router.parameters(), *ffn.parameters(), *head.parameters()], 1e-3)
    for step in range(40):
        x = torch.randn(16 * (8 + step % 5), dim, device="cuda")
        logits = router(x)
        gate, choice = logits.softmax(-1).max(-1)
        out = torch.zeros_like(x)
        for e in range(experts):
            idx = (choice == e).nonzero(as_tuple=True)[0]
            if idx.numel():
                out.index_add_(0, idx, ffn[e](x[idx]) * gate[idx, None])
        balance = logits.softmax(-1).mean(0).pow(2).sum() * experts
        loss = head(out).pow(2).mean() + 0.01 * balance
        opt.zero_grad()
        loss.backward()
        opt.step()
        keep(logits)
    print("moe", float(loss))


def ppo():
    import torch
    from torch import nn

    torch.manual_seed(0)
    n_env, horizon, obs_dim, actions = 16, 64, 8, 4
    policy = nn.Sequential(nn.Linear(obs_dim, 64), nn.Tanh(), nn.Linear(64, actions + 1)).cuda()
    opt = torch.optim.Adam(policy.parameters(), 3e-4)
    obs_buf = torch.zeros(horizon, n_env, obs_dim, device="cuda")
    act_buf = torch.zeros(horizon, n_env, dtype=torch.long, device="cuda")
    logp_buf = torch.zeros(horizon, n_env, device="cuda")
    rew_buf = torch.zeros(horizon, n_env, device="cuda")
    val_buf = torch.zeros(horizon + 1, n_env, device="cuda")
    obs = torch.randn(n_env, obs_dim, device="cuda")
    for it in range(15):
        with torch.no_grad():
            for t in range(horizon):
                out = policy(obs)
                dist = torch.distributions.Categorical(logits=out[:, :actions])
                a = dist.sample()
                obs_buf[t], act_buf[t], logp_buf[t], val_buf[t] = obs, a, dist.log_prob(a), out[:, actions]
                rew_buf[t] = (a == 1).float() - 0.1 * obs.pow(2).mean(1)
                obs = obs * 0.9 + 0.3 * torch.randn_like(obs)
            val_buf[horizon] = policy(obs)[:, actions]
            adv = torch.zeros_like(rew_buf)
            last = torch.zeros(n_env, device="cuda")
            for t in reversed(range(horizon)):
                delta = rew_buf[t] + 0.99 * val_buf[t + 1] - val_buf[t]
                last = delta + 0.99 * 0.95 * last
                adv[t] = last
            ret = adv + val_buf[:horizon]
        flat = horizon * n_env
        for _ in range(4):
            perm = torch.randperm(flat, device="cuda")
            for mb in perm.split(256):
                o, a = obs_buf.view(flat, -1)[mb], act_buf.view(-1)[mb]
                out = policy(o)
                dist = torch.distributions.Categorical(logits=out[:, :actions])
                ratio = (dist.log_prob(a) - logp_buf.view(-1)[mb]).exp()
                A = adv.view(-1)[mb]
                A = (A - A.mean()) / (A.std() + 1e-8)
                loss = -torch.min(ratio * A, ratio.clamp(0.8, 1.2) * A).mean()
                loss = loss + 0.5 * (out[:, actions] - ret.view(-1)[mb]).pow(2).mean() - 0.01 * dist.entropy().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
        keep(adv)
    print("ppo", float(loss))


def diffusion():
    import torch
    from torch import nn

    torch.manual_seed(0)
    steps = 20
    betas = torch.linspace(1e-4, 0.05, steps, device="cuda")
    alphas = (1 - betas).cumprod(0)

    class Denoiser(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(steps, 32)
            self.inp = nn.Conv2d(3, 32, 3, padding=1)
            self.mid = nn.Sequential(nn.GroupNorm(8, 32), nn.SiLU(), nn.Conv2d(32, 32, 3, padding=1))
            self.out = nn.Conv2d(32, 3, 3, padding=1)

        def forward(self, x, t):
            h = self.inp(x) + self.embed(t)[:, :, None, None]
            return self.out(self.mid(h) + h)

    net = Denoiser().cuda()
    opt = torch.optim.AdamW(net.parameters(), 1e-3)
    samples = []
    for step in range(40):
        x0 = torch.rand(16, 3, 24, 24, device="cuda") * 2 - 1
        t = torch.randint(0, steps, (16,), device="cuda")
        noise = torch.randn_like(x0)
        a = alphas[t][:, None, None, None]
        loss = (net(a.sqrt() * x0 + (1 - a).sqrt() * noise, t) - noise).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        keep(loss)
        if step % 10 == 9:
            with torch.inference_mode():
                x = torch.randn(4, 3, 24, 24, device="cuda")
                for i in reversed(range(steps)):
                    tt = torch.full((4,), i, device="cuda", dtype=torch.long)
                    eps = net(x, tt)
                    x = (x - betas[i] / (1 - alphas[i]).sqrt() * eps) / (1 - betas[i]).sqrt()
                    if i:
                        x = x + betas[i].sqrt() * torch.randn_like(x)
                samples.append(x.cpu())
    print("diffusion", float(loss), len(samples))


def interop():
    import cupy as cp
    import torch

    w = torch.randn(256, 256, device="cuda")
    total = 0.0
    for step in range(40):
        a = cp.random.standard_normal((64 * (1 + step % 4), 256), dtype=cp.float32)
        t = torch.from_dlpack(a)
        y = torch.relu(t @ w)
        back = cp.from_dlpack(y)
        total += float(cp.linalg.norm(back))
        keep(back)
    print("interop", total)


def scan():
    import jax
    import jax.numpy as jnp

    hidden, length = 64, 32
    k = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {
        "wx": jax.random.normal(k[0], (16, hidden)) * 0.1,
        "wh": jax.random.normal(k[1], (hidden, hidden)) * 0.1,
        "out": jax.random.normal(k[2], (hidden, 1)) * 0.1,
    }

    def loss_fn(p, xs, ys):
        @jax.checkpoint
        def cell(h, x):
            h = jnp.tanh(x @ p["wx"] + h @ p["wh"])
            return h, h @ p["out"]

        _, preds = jax.lax.scan(cell, jnp.zeros((xs.shape[1], hidden)), xs)
        return jnp.mean((preds[..., 0] - ys) ** 2)

    def update(p, xs, ys):
        loss, g = jax.value_and_grad(loss_fn)(p, xs, ys)
        return jax.tree_util.tree_map(lambda a, b: a - 0.05 * b, p, g), loss

    step_fn = jax.jit(update, donate_argnums=0)
    key = jax.random.PRNGKey(1)
    for i in range(40):
        mark(i)
        key, kx = jax.random.split(key)
        xs = jax.random.normal(kx, (length, 8 * (1 + i % 3), 16))
        params, loss = step_fn(params, xs, xs[..., 0].cumsum(0) * 0.1)
        keep(loss)
        loss.block_until_ready()
    print("scan", float(loss))


def stft():
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)
    conv = nn.Conv1d(201, 64, 3, padding=1).cuda()
    head = nn.Linear(64, 10).cuda()
    opt = torch.optim.Adam([*conv.parameters(), *head.parameters()], 1e-3)
    window = torch.hann_window(400, device="cuda")
    for step in range(40):
        wave = torch.randn(8, 8000 + 160 * (step * 37 % 50), device="cuda", requires_grad=True)
        spec = torch.stft(wave, 400, 160, window=window, return_complex=True).abs().pow(2).add(1e-6).log()
        logits = head(conv(spec).mean(-1))
        loss = F.cross_entropy(logits, torch.randint(0, 10, (8,), device="cuda"))
        opt.zero_grad()
        loss.backward()
        opt.step()
        keep(logits)
    print("stft", loss.item())


{"gan": gan, "detection": detection, "moe": moe, "ppo": ppo, "diffusion": diffusion,
 "interop": interop, "scan": scan, "stft": stft}[shape]()
