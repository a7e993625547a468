"""CUDA graphs in PyTorch: torch.cuda.graph around a whole training step
(forward, backward, optimizer) replayed on new data, and
make_graphed_callables. Prints the losses and outputs: they must be the same
plainly and under cupool. With PYTORCH_NO_CUDA_MEMORY_CACHING=1 PyTorch may
refuse to capture: the exception's type is printed instead."""
import torch

torch.manual_seed(0)
dev = "cuda"
gen = torch.Generator().manual_seed(1)


def step_graph():
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(64, 256, device=dev)
    y = torch.randint(0, 10, (64,), device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    losses = []
    for _ in range(20):
        x.copy_(torch.randn(64, 256, generator=gen))
        y.copy_(torch.randint(0, 10, (64,), generator=gen))
        g.replay()
        losses.append(loss.item())
    return ",".join(f"{v:.5f}" for v in losses)


def graphed_callables():
    m = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.GELU(), torch.nn.Linear(128, 4)).to(dev)
    sample = torch.randn(32, 128, device=dev, requires_grad=True)
    gm = torch.cuda.make_graphed_callables(m, (sample,))
    outs = []
    for _ in range(10):
        xi = torch.randn(32, 128, generator=gen).to(dev).requires_grad_()
        o = gm(xi)
        o.sum().backward()
        outs.append(o.sum().item() + xi.grad.sum().item())
    return ",".join(f"{v:.4f}" for v in outs)


for name, f in (("step", step_graph), ("graphed", graphed_callables)):
    try:
        print(f"result: {name}={f()}")
    except Exception as e:
        print(f"result: {name} raised {type(e).__name__}")
