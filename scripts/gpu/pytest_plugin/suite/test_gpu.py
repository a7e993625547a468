import gc, pytest, torch
from conftest import KEEP

MIB = 1 << 20

def test_a_matmul_clean(model, batch):
    y = model(batch)           # cuBLAS: a workspace is kept after this
    assert y.shape == (256, 1024)

def test_b_leak():
    KEEP.append(torch.empty(4 * MIB, dtype=torch.uint8, device="cuda"))

def test_c_cache_reuse_clean():
    x = torch.empty(4 * MIB, dtype=torch.uint8, device="cuda")
    del x

def test_d_cycle_clean():
    class Node: pass
    a, b = Node(), Node()
    a.t = torch.empty(MIB, device="cuda"); a.o, b.o = b, a

def test_e_fails_holding():
    t = torch.empty(MIB, device="cuda")
    assert t is None

def test_f_cupy_leak():
    import cupy
    KEEP.append(cupy.empty(2 * MIB, dtype=cupy.uint8))

def test_g_no_cuda():
    assert sum(range(10)) == 45

@pytest.mark.cupool_no_leak_check
def test_h_opted_out():
    KEEP.append(torch.empty(8 * MIB, dtype=torch.uint8, device="cuda"))

def test_i_matmul_again_clean(model):
    model(torch.randn(64, 1024, device="cuda")).sum().item()
