# An allocation trace for `cupool replay`: torchvision ResNet-18 training at
# a smaller batch than the bundled resnet18 trace (16-24 images of 160-224
# pixels), PyTorch's cache off.
import torch
import torchvision

torch.manual_seed(0)
m = torchvision.models.resnet18().cuda()
opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
for i in range(12):
    side = (160, 192, 224)[i % 3]
    x = torch.randn(16 + 4 * (i % 3), 3, side, side, device="cuda")
    loss = m(x).logsumexp(1).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
print("result: ok")
