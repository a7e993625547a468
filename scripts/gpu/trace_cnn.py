# torchvision ResNet-18 training, a few steps: an allocation trace for `cupool replay`.
import torch, torchvision
m = torchvision.models.resnet18().cuda()
opt = torch.optim.SGD(m.parameters(), lr=0.01)
for i in range(8):
    x = torch.randn(32 + 8 * (i % 3), 3, 224, 224, device="cuda")
    loss = m(x).logsumexp(1).mean()
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
print("result: ok")
