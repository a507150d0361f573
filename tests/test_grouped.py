"""The instance-batched simulator against the per-instance loop (stock autograd) it replaces."""

import pytest
import torch

from leaklab.attacks.inversion.grouped import (GroupedSimulator, _BatchNormBackward,
                                               _FrozenBatchNormBackward, supports)
from leaklab.attacks.inversion.simulate import UpdateSimulator, make_simulator
from leaklab.models import ModelSpec, build_model
from leaklab.threat import UpdateMetadata

# (model, width, image size): small, but every layer kind and a stride-2 ResNet shortcut
MODELS = [("convnet", 8, 16), ("lenet", None, 16), ("mlp", 32, 16), ("resnet18", 4, 32), ("convbig", 4, 16)]


def _model(name, width, size):
    spec = ModelSpec(name=name, num_classes=5, in_channels=3, image_size=size, width=width,
                     mean=(0.5, 0.4, 0.3), std=(0.2, 0.25, 0.3))
    model = build_model(spec, seed=1)
    g = torch.Generator().manual_seed(2)
    for m in model.modules():  # running statistics as after training (used in eval mode)
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.copy_(0.3 * torch.randn(m.running_mean.shape, generator=g))
            m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g))
    return model


def _close(a: list[torch.Tensor], b: list[torch.Tensor], tol: float) -> None:
    """Equal to ``tol`` relative to the update's scale (biases before batch norm have an exact
    gradient of 0, so a per-tensor relative error would compare rounding noise)."""
    scale = max(float(t.detach().abs().max()) for t in b)
    for x, y in zip(a, b):
        assert x.shape == y.shape and x.dtype == y.dtype == torch.float32
        assert float((x - y).detach().abs().max()) <= tol * scale


def _assert_same_double_backward(ours, ref, gy, x):
    """``ours`` and ``ref`` (gx, gw, gb) agree, and so do their gradients in ``gy`` and ``x`` under
    every combination of incoming gradients (a missing gradient must equal a zero one)."""
    for a, b in zip(ours, ref):
        assert torch.allclose(a, b, atol=1e-12)
    ups = (torch.randn_like(x), torch.randn(x.shape[1], dtype=x.dtype), torch.randn(x.shape[1], dtype=x.dtype))
    for used in [(1, 1, 1), (1, 0, 0), (0, 1, 0), (0, 0, 1)]:
        def loss(outs):
            return sum(u * (o * c).sum() for u, o, c in zip(used, outs, ups))
        g_ours = torch.autograd.grad(loss(ours), (gy, x), retain_graph=True, allow_unused=True)
        g_ref = torch.autograd.grad(loss(ref), (gy, x), retain_graph=True, allow_unused=True)
        for a, b in zip(g_ours, g_ref):
            if b is None or a is None:
                assert (a is None or float(a.abs().max()) == 0) and (b is None or float(b.abs().max()) == 0)
            else:
                assert torch.allclose(a, b, atol=1e-12)


@pytest.mark.parametrize("name,width,size", MODELS)
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("train_mode", [True, False])
def test_per_instance_updates_and_image_gradients_match_the_loop(name, width, size, batch, train_mode):
    torch.manual_seed(0)
    model = _model(name, width, size)
    meta = UpdateMetadata(batch_size=batch, train_mode=train_mode)
    loop, grouped = UpdateSimulator(model, meta), GroupedSimulator(model, meta)
    assert grouped.names == loop.names
    images = torch.rand(3, batch, 3, size, size, requires_grad=True)
    labels = torch.randint(0, 5, (3, batch))
    expected, got = loop(images, labels), grouped(images, labels)
    _close(got, expected, 1e-5)
    # the gradient an attack takes: d <updates, v> / d images, through the double backward
    v = [torch.randn_like(t) for t in expected]
    ge = torch.autograd.grad(sum((t * w).sum() for t, w in zip(expected, v)), images)[0]
    gg = torch.autograd.grad(sum((t * w).sum() for t, w in zip(got, v)), images)[0]
    assert float((gg - ge).abs().max()) <= 1e-5 * float(ge.abs().max())


@pytest.mark.parametrize("instances", [1, 2])
def test_strided_1x1_shortcut_with_few_channels(instances):
    # oneDNN's channels-last weight gradient of a strided 1x1 convolution with 2-7 input channels and 2 or more
    # images corrupted the heap (torch 2.13.0, CPU): the grouped simulator reads it unstrided on every stride-th pixel
    model = _model("resnet18", 4, 16)
    meta = UpdateMetadata(batch_size=2)
    grouped = GroupedSimulator(model, meta)
    assert grouped.channels_last(instances)
    images, labels = torch.rand(instances, 2, 3, 16, 16), torch.randint(0, 5, (instances, 2))
    for _ in range(20):  # the corruption aborted within a few calls
        got = grouped(images, labels)
    _close(got, UpdateSimulator(model, meta)(images, labels), 1e-5)


@pytest.mark.parametrize("batch,precision", [(1, "fp32"), (2, "bf16")])
def test_one_output_channel_in_one_instance(batch, precision):
    # --width 1: torch 2.13 failed in slow_conv2d on the channels-last weight view of a single output channel
    model = _model("convnet", 1, 9)
    meta = UpdateMetadata(batch_size=batch)
    images, labels = torch.rand(1, batch, 3, 9, 9), torch.randint(0, 5, (1, batch))
    got, exact = GroupedSimulator(model, meta, precision)(images, labels), UpdateSimulator(model, meta)(images, labels)
    if precision == "fp32":
        _close(got, exact, 1e-5)
    else:  # bf16's rounding: the direction of the update (as test_bf16_replay_is_close_to_the_loop_in_bf16)
        dot = sum((a * b).sum() for a, b in zip(got, exact))
        norms = torch.sqrt(sum((a * a).sum() for a in got) * sum((b * b).sum() for b in exact))
        assert float((dot / norms).detach()) > 0.9


def test_instances_stay_independent():
    model = _model("convnet", 8, 16)
    meta = UpdateMetadata(batch_size=1)
    sim = GroupedSimulator(model, meta)
    images, labels = torch.rand(4, 1, 3, 16, 16), torch.randint(0, 5, (4, 1))
    together = sim(images, labels)
    alone = sim(images[2:3], labels[2:3])
    _close([t[2:3] for t in together], alone, 1e-5)


def test_bf16_replay_is_close_to_the_loop_in_bf16():
    model = _model("convnet", 16, 16)
    meta = UpdateMetadata(batch_size=2)
    images, labels = torch.rand(2, 2, 3, 16, 16), torch.randint(0, 5, (2, 2))
    exact = UpdateSimulator(model, meta)(images, labels)
    for sim in (UpdateSimulator(model, meta, "bf16"), GroupedSimulator(model, meta, "bf16")):
        got = sim(images, labels)
        dot = sum((a * b).sum() for a, b in zip(got, exact))
        cos = dot / torch.sqrt(sum((a * a).sum() for a in got) * sum((b * b).sum() for b in exact))
        assert float(cos.detach()) > 0.9 and all(t.dtype == torch.float32 for t in got)


def test_batch_norm_double_backward_is_exact_in_float64():
    torch.manual_seed(0)
    x = (torch.randn(2, 3, 4, 5, dtype=torch.float64) * 2 + 1).requires_grad_()
    gy = torch.randn(2, 3, 4, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, dtype=torch.float64)
    eps = 1e-5

    def reference(gy, x):
        m = x.mean((0, 2, 3), keepdim=True)
        r = (((x - m) ** 2).mean((0, 2, 3), keepdim=True) + eps).rsqrt()
        xh, n = (x - m) * r, x.numel() // 3
        gb, gw = gy.sum((0, 2, 3)), (gy * xh).sum((0, 2, 3))
        gx = w.view(1, -1, 1, 1) * r * (gy - gb.view(1, -1, 1, 1) / n - xh * gw.view(1, -1, 1, 1) / n)
        return gx, gw, gb

    _, mean, invstd = torch.ops.aten.native_batch_norm(x.detach(), w, None, None, None, True, 0.0, eps)
    ours = _BatchNormBackward.apply(gy, x, w, mean, invstd, eps)
    ref = reference(gy, x)
    _assert_same_double_backward(ours, ref, gy, x)


def test_eval_batch_norm_double_backward_is_exact_in_float64():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64, requires_grad=True)
    gy = torch.randn(2, 3, 4, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, dtype=torch.float64)
    mean, var, eps = torch.randn(3, dtype=torch.float64), torch.rand(3, dtype=torch.float64) + 0.5, 1e-5

    def reference(gy, x):
        r = (var + eps).rsqrt().view(1, -1, 1, 1)
        xh = (x - mean.view(1, -1, 1, 1)) * r
        return gy * w.view(1, -1, 1, 1) * r, (gy * xh).sum((0, 2, 3)), gy.sum((0, 2, 3))

    _, saved_mean, saved_invstd = torch.ops.aten.native_batch_norm(x.detach(), w, None, mean, var,
                                                                   False, 0.0, eps)
    ours = _FrozenBatchNormBackward.apply(gy, x, w, mean, var, saved_mean, saved_invstd, eps)
    ref = reference(gy, x)
    _assert_same_double_backward(ours, ref, gy, x)


def test_make_simulator_chooses_grouped_for_fedsgd_only():
    model = _model("convnet", 4, 16)
    assert supports(model)
    assert isinstance(make_simulator(model, UpdateMetadata(batch_size=1)), GroupedSimulator)
    fedavg = UpdateMetadata(kind="fedavg", batch_size=2, local_steps=2)
    assert isinstance(make_simulator(model, fedavg), UpdateSimulator)
    other = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 5))
    assert not supports(other)
    assert isinstance(make_simulator(other, UpdateMetadata(batch_size=1)), UpdateSimulator)


def test_allocator_tuning_is_idempotent():
    from leaklab.attacks.inversion.grouped import tune_cpu_allocator
    first = tune_cpu_allocator()
    assert isinstance(first, bool) and tune_cpu_allocator() == first


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_image_gradient_comes_back_contiguous(precision):
    """Channels-last inside, standard layout outside: L-BFGS views the gradient flat."""
    model = _model("convnet", 4, 16)
    sim = GroupedSimulator(model, UpdateMetadata(batch_size=1), precision)
    images = torch.rand(1, 1, 3, 16, 16, requires_grad=True)
    updates = sim(images, torch.zeros(1, 1, dtype=torch.long))
    grad = torch.autograd.grad(sum((u * u).sum() for u in updates), images)[0]
    assert grad.is_contiguous()
