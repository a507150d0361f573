"""The attacker's network copy: image convolutions by space-to-depth (leaklab.attacks.rl.image_convs)."""

import pytest
import torch
from torch import nn

from leaklab.attacks.rl.image_convs import SpaceToDepthConv2d, attack_network
from leaklab.models.perception import PerceptionSpec, build_perception_net


@pytest.mark.parametrize("cin,cout,kernel,stride,size,bias", [
    (3, 64, 8, 4, (150, 150), True),  # wide-rgb's RGB stream's first convolution
    (1, 16, 8, 4, (37, 41), True),  # sizes the stride does not divide: the last rows and columns unread
    (2, 5, (6, 4), (3, 2), (29, 31), False),  # unequal strides, no bias
])
def test_space_to_depth_convolution_computes_the_direct_one(cin, cout, kernel, stride, size, bias):
    g = torch.Generator().manual_seed(0)
    conv = nn.Conv2d(cin, cout, kernel, stride=stride, bias=bias).double()
    fast = SpaceToDepthConv2d.of(conv)
    assert fast.weight is conv.weight and fast.bias is conv.bias
    x = torch.rand(2, cin, *size, generator=g, dtype=torch.float64, requires_grad=True)
    out, out_fast = conv(x), fast(x)
    assert out_fast.shape == out.shape
    torch.testing.assert_close(out_fast, out, rtol=1e-12, atol=1e-12)
    error = torch.randn(out.shape, generator=g, dtype=torch.float64)
    params = [x] + list(conv.parameters())
    for a, b in zip(torch.autograd.grad(out_fast, params, error), torch.autograd.grad(out, params, error)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("conv", [
    nn.Conv2d(3, 8, 8, stride=4, padding=1), nn.Conv2d(3, 8, 8, stride=4, dilation=2),
    nn.Conv2d(4, 8, 8, stride=4, groups=2), nn.Conv2d(3, 8, 7, stride=4), nn.Conv2d(3, 8, 3, stride=1),
    SpaceToDepthConv2d(3, 8, 8, stride=4),
], ids=["padding", "dilation", "groups", "kernel-not-a-multiple", "stride-1", "already-rearranged"])
def test_space_to_depth_takes_only_plain_strided_convolutions(conv):
    assert not SpaceToDepthConv2d.fits(conv)


def test_attack_network_rearranges_only_the_convolutions_on_the_images():
    net = build_perception_net(PerceptionSpec(setting="S1", arch="wide-rgb"), seed=0)
    rng = torch.get_rng_state()
    fast = attack_network(net)
    assert torch.equal(torch.get_rng_state(), rng)  # nothing drawn: the attacks' draws stay as they were
    rearranged = {name for name, m in fast.named_modules() if isinstance(m, SpaceToDepthConv2d)}
    assert rearranged == {"conv.rgb.0", "conv.depth.0"}  # the 4/2 and 3/1 convolutions read feature maps
    assert not any(isinstance(m, SpaceToDepthConv2d) for m in net.modules())  # the original untouched
    mine, theirs = dict(fast.named_parameters()), dict(net.named_parameters())
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) and mine[k].data_ptr() != theirs[k].data_ptr() for k in mine)
    g = torch.Generator().manual_seed(1)
    x, box = torch.rand(1, 4, 150, 150, generator=g), torch.rand(1, 4, generator=g) * 2 - 1
    with torch.no_grad():
        torch.testing.assert_close(fast(x, box), net(x, box), rtol=1e-5, atol=1e-6)


def test_attack_network_leaves_unstrided_image_convolutions_as_they_are():
    net = build_perception_net(PerceptionSpec(setting="S2", arch="deep"), seed=0)  # 5x5, padding 2, stride 1
    assert not any(isinstance(m, SpaceToDepthConv2d) for m in attack_network(net).modules())


class _NormedNet(nn.Module):
    """A user's network with BatchNorm and Dropout among the image convolutions."""

    def __init__(self):
        super().__init__()
        self.spec = PerceptionSpec(setting="S2", image_size=36)
        self.conv = nn.Sequential(nn.Conv2d(1, 4, 8, stride=4), nn.BatchNorm2d(4), nn.Dropout(0.5), nn.ReLU(),
                                  nn.Flatten())


def test_attack_network_probe_leaves_the_copys_state_and_modes():
    net = _NormedNet()
    net.conv[2].eval()  # modes differ module by module
    rng = torch.get_rng_state()
    fast = attack_network(net)
    assert torch.equal(torch.get_rng_state(), rng)  # Dropout drew nothing
    assert isinstance(fast.conv[0], SpaceToDepthConv2d)
    assert [m.training for m in fast.modules()] == [m.training for m in net.modules()]  # the client's modes
    mine, theirs = fast.state_dict(), net.state_dict()
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)  # BatchNorm's statistics and count untouched
