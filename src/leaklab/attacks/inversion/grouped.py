"""Instance-batched replay of FedSGD updates: R independent instances in one pass.

The loop simulator (:class:`~leaklab.attacks.inversion.simulate.UpdateSimulator`) differentiates the
model once per instance with the layers' stock autograd formulas. Here the ``R`` instances are laid
side by side in the channel dimension, ``(B, R*C, H, W)``, and every layer is rewritten so that
instances never mix:

* ``Normalize``: its per-channel mean and std repeated ``R`` times;
* ``Conv2d``: a grouped convolution (``groups = R * groups``) whose weight is the per-instance
  parameter stacked as ``(R*cout, cin/groups, k, k)``;
* ``BatchNorm2d``: batch norm over ``R*C`` channels with per-instance affine parameters, which is
  exactly per-instance batch norm (train mode: per-instance batch statistics; eval: running ones);
* ``Linear``: a batched matrix product with per-instance weights ``(R, out, in)`` on features laid
  out instance-major, ``(B, R*F)`` -- which is what ``Flatten`` of ``(B, R*C, H, W)`` gives;
* element-wise activations, max/average pooling, ``Flatten`` and ``Identity`` act per channel and
  are kept as they are.

The per-instance parameters are leaves of shape ``(R, *param.shape)`` holding ``R`` copies of the
shared parameter; the gradient of the summed per-instance losses with respect to them *is* the stack
of per-instance gradients, obtained in one backward pass that stays differentiable in the images.

Convolution and batch norm use their own autograd functions whose backward is written with
differentiable operations that never need the second derivative with respect to the parameters: an
attack differentiates the simulated update with respect to the images only. Stock autograd computes
``d(grad_input)/d(weight)`` anyway (a slow transposed convolution per layer) and batch norm's stock
double backward runs some forty reductions per layer; both are avoided. The outer gradient must be
taken with ``torch.autograd.grad(loss, images)`` (not ``.backward()``): parameter gradients are
produced only while the update itself is computed.

``precision="bf16"`` runs convolutions and linear layers in bfloat16 (parameters cast once, not at
every call), batch-norm statistics in float32; updates are returned in float32.

On the CPU the first call raises glibc's mmap/trim thresholds (:func:`tune_cpu_allocator`, once per
process): without it, replaying many instances at once spends a fifth of its time in page faults.

Only models built from these layers are supported (:func:`supports`); FedAvg updates (unrolled local
steps) and other models use the loop simulator (:func:`~leaklab.attacks.inversion.simulate.make_simulator`
chooses).
"""

from __future__ import annotations

import copy
import ctypes
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

from leaklab.errors import LeaklabError
from leaklab.models.layers import Normalize
from leaklab.models.vision import MLP, BasicBlock, ConvBig, ConvNet, LeNetDLG, ResNet18
from leaklab.threat import UpdateMetadata

# Models whose forward only combines their layers with per-channel operations (residual sums,
# flatten from dim 1, activations), so that swapping the layers below keeps instances apart.
SUPPORTED_MODELS = (LeNetDLG, ConvNet, ResNet18, MLP, ConvBig)
_CONTAINERS = (nn.Sequential, BasicBlock) + SUPPORTED_MODELS
_PER_CHANNEL = (nn.ReLU, nn.Sigmoid, nn.Tanh, nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d,
                nn.AdaptiveMaxPool2d, nn.Identity)
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _layer_supported(module: nn.Module) -> bool:
    if type(module) is nn.Conv2d:
        return module.padding_mode == "zeros" and not isinstance(module.padding, str)
    if isinstance(module, nn.Flatten):
        return module.start_dim == 1 and module.end_dim == -1
    return type(module) in (nn.Linear, nn.BatchNorm2d, Normalize) + _PER_CHANNEL or \
        type(module) in _CONTAINERS


def supports(model: nn.Module, metadata: UpdateMetadata | None = None) -> bool:
    """Whether :class:`GroupedSimulator` can replay updates of ``model`` (and of ``metadata``)."""
    if metadata is not None and metadata.kind != "fedsgd":
        return False
    if type(model) not in SUPPORTED_MODELS:
        return False
    return all(_layer_supported(m) for m in model.modules())


_ALLOCATOR = {"tuned": None}


def tune_cpu_allocator() -> bool:
    """Keep large CPU tensors on glibc's heap instead of fresh ``mmap`` pages (once per process).

    Replaying R instances at once allocates and frees hundreds of megabytes per step; by default
    glibc maps each large block anew and unmaps it on free, so every step pays millions of page
    faults (measured: 4.8 million and a fifth of the time for R=16 on ConvNet-64). Raising the mmap
    and trim thresholds keeps that memory in the heap for reuse. Linux/glibc only; left alone when
    the user set ``MALLOC_*`` variables. Returns whether the thresholds are in effect.
    """
    if _ALLOCATOR["tuned"] is not None:
        return _ALLOCATOR["tuned"]
    _ALLOCATOR["tuned"] = False
    if not sys.platform.startswith("linux") or any(k.startswith("MALLOC_") for k in os.environ):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
    ok = all(mallopt(option, value) == 1 for option, value in
             ((m_mmap_threshold, 1 << 30), (m_trim_threshold, 1 << 30), (m_top_pad, 64 << 20)))
    _ALLOCATOR["tuned"] = ok
    return ok


class _State:
    """What the grouped layers read during one call: the instance count, the per-instance tensors
    and whether parameter gradients are wanted (only while the update itself is computed)."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.instances = 1
        self.tensors: dict[str, torch.Tensor] = {}
        self.param_grads = False
        self.dtype = dtype


class _Conv2d(torch.autograd.Function):
    """``conv2d`` whose backward is differentiable in the input and the output gradient only."""

    @staticmethod
    def forward(ctx, x, weight, bias, stride, padding, dilation, groups, state):
        ctx.save_for_backward(x, weight)
        ctx.conf = (stride, padding, dilation, groups, bias is not None, state)
        return F.conv2d(x, weight, bias, stride, padding, dilation, groups)

    @staticmethod
    def backward(ctx, gy):
        x, weight = ctx.saved_tensors
        stride, padding, dilation, groups, has_bias, state = ctx.conf
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            k = weight.shape[2:]
            extra = [x.shape[2 + i] - ((gy.shape[2 + i] - 1) * stride[i] - 2 * padding[i]
                                       + dilation[i] * (k[i] - 1) + 1) for i in range(2)]
            gx = F.conv_transpose2d(gy, weight.detach(), None, stride, padding, extra, groups, dilation)
        if state.param_grads:
            w = weight.detach()
            if w.shape[0] == 1 and not x.is_contiguous():
                # one output channel: the channels-last view of the per-instance weights has an odd stride in that
                # dimension, and torch 2.13 on the CPU then fails in slow_conv2d (--width 1, one instance)
                w = torch.empty_like(w, memory_format=torch.channels_last).copy_(w)
            if weight.shape[2:] == (1, 1) and tuple(padding) == (0, 0) and tuple(stride) != (1, 1):
                # a 1x1 convolution reads only every stride-th pixel: its weight gradient is the unstrided one's on
                # them, exactly. oneDNN's strided form corrupts the heap on channels-last tensors with 2 to 7 input
                # channels per group and 2 or more images (torch 2.13.0 on the CPU: a ResNet shortcut at --width 4)
                x, stride = x[:, :, ::stride[0], ::stride[1]], (1, 1)
            gw = torch.ops.aten.convolution_backward(gy, x, w, None, stride, padding, dilation,
                                                     False, [0, 0], groups, (False, True, False))[1]
            if has_bias:
                gb = gy.sum((0, 2, 3))
        return gx, gw, gb, None, None, None, None, None


_CHANNEL = (0, 2, 3)  # the dimensions batch norm reduces over


def _per_channel(t: torch.Tensor) -> torch.Tensor:
    return t.view(1, -1, 1, 1)


class _BatchNorm(torch.autograd.Function):
    """Train-mode batch norm (batch statistics), stock kernels forward and backward; the backward
    that builds an update (under ``create_graph``) goes through :class:`_BatchNormBackward`."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, state):
        y, mean, invstd = torch.ops.aten.native_batch_norm(x, weight, bias, None, None, True, 0.0, eps)
        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.conf = (eps, state)
        return y

    @staticmethod
    def backward(ctx, gy):
        x, weight, mean, invstd = ctx.saved_tensors
        eps, state = ctx.conf
        if torch.is_grad_enabled():
            gx, gw, gb = _BatchNormBackward.apply(gy, x, weight.detach(), mean, invstd, eps)
        else:
            mask = [ctx.needs_input_grad[0], state.param_grads, state.param_grads]
            gx, gw, gb = torch.ops.aten.native_batch_norm_backward(
                gy, x, weight.detach(), None, None, mean, invstd, True, eps, mask)
        if not state.param_grads:
            gw = gb = None
        return gx, gw, gb, None, None


class _BatchNormBackward(torch.autograd.Function):
    """Batch norm's backward ``(gy, x) -> (gx, gw, gb)`` with a hand-derived derivative in ``gy``
    and ``x`` (the weight is a constant here): a few fused passes instead of autograd's dozens.

    Per channel, with ``r = 1/sigma``, ``xh = (x - mean) r``, ``n`` elements and incoming ``A``
    (for gx), ``a`` (gw), ``b`` (gb): ``d gy = w r A + xh (a - w r <A, xh>/n) + b - w r sum(A)/n``;
    ``d x`` follows from ``L(xh, sigma)`` through ``xh`` and ``sigma`` (see the code).
    """

    @staticmethod
    def forward(ctx, gy, x, weight, mean, invstd, eps):
        gx, gw, gb = torch.ops.aten.native_batch_norm_backward(
            gy, x, weight, None, None, mean, invstd, True, eps, [True, True, True])
        ctx.save_for_backward(gy, x, weight, mean, invstd, gw, gb)
        return gx, gw, gb

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, ggx, ggw, ggb):
        gy, x, weight, mean, invstd, gw, gb = ctx.saved_tensors
        n = x.numel() // x.shape[1]
        dtype = invstd.dtype  # float32 (or float64): bfloat16 tensors are cast once, here
        r, w1 = invstd, weight.to(dtype) * invstd
        xf, gf = x.to(dtype), gy.to(dtype)
        alpha = ggw if ggw is not None else torch.zeros_like(r)
        beta = ggb if ggb is not None else torch.zeros_like(r)
        if ggx is not None:
            af = ggx.to(dtype)
            s_a = af.sum(_CHANNEL)
            s_ax = r * ((af * xf).sum(_CHANNEL) - mean * s_a)  # <A, xh>
            s_ag = (af * gf).sum(_CHANNEL)
        else:
            s_a = s_ax = s_ag = torch.zeros_like(r)
        # d gy = w1 A + xh c1 + c0
        c1 = alpha - w1 * s_ax / n
        c0 = beta - w1 * s_a / n
        d_gy = torch.addcmul(_per_channel(c0 - mean * r * c1), xf, _per_channel(r * c1))
        # d x: G = dL/dxh at fixed sigma = k1 gy + k2 A; dL/dsigma = -T1 r
        k1, k2 = c1, -w1 * gw / n
        mean_g = (k1 * gb + k2 * s_a) / n
        mean_gx = (k1 * gw + k2 * s_ax) / n
        t1 = w1 * (s_ag - gb * s_a / n - gw * s_ax / n)
        cx = -r * mean_gx - t1 * r / n  # coefficient of xh
        d_x = torch.addcmul(_per_channel(-r * mean_g - mean * r * cx), xf, _per_channel(r * cx))
        d_x.addcmul_(gf, _per_channel(r * k1))
        if ggx is not None:
            d_gy.addcmul_(af, _per_channel(w1))
            d_x.addcmul_(af, _per_channel(r * k2))
        return d_gy.to(gy.dtype), d_x.to(x.dtype), None, None, None, None


class _FrozenBatchNorm(torch.autograd.Function):
    """Eval-mode batch norm (fixed running statistics, a per-channel affine map); stock kernels,
    with :class:`_FrozenBatchNormBackward` for the differentiable backward."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, state):
        # the kernel's saved statistics (empty in eval mode) go to its backward: CUDA's requires them
        y, saved_mean, saved_invstd = torch.ops.aten.native_batch_norm(
            x, weight, bias, running_mean, running_var, False, 0.0, eps)
        ctx.save_for_backward(x, weight, running_mean, running_var, saved_mean, saved_invstd)
        ctx.conf = (eps, state)
        return y

    @staticmethod
    def backward(ctx, gy):
        x, weight, running_mean, running_var, saved_mean, saved_invstd = ctx.saved_tensors
        eps, state = ctx.conf
        if torch.is_grad_enabled():
            gx, gw, gb = _FrozenBatchNormBackward.apply(gy, x, weight.detach(), running_mean,
                                                        running_var, saved_mean, saved_invstd, eps)
        else:
            mask = [ctx.needs_input_grad[0], state.param_grads, state.param_grads]
            gx, gw, gb = torch.ops.aten.native_batch_norm_backward(
                gy, x, weight.detach(), running_mean, running_var, saved_mean, saved_invstd, False,
                eps, mask)
        if not state.param_grads:
            gw = gb = None
        return gx, gw, gb, None, None, None, None


class _FrozenBatchNormBackward(torch.autograd.Function):
    """``(gy, x) -> (gx, gw, gb)`` of eval-mode batch norm; with ``r = 1/sqrt(var + eps)``,
    ``xh = (x - mean) r``: ``d gy = w r A + xh a + b``, ``d x = gy r a``."""

    @staticmethod
    def forward(ctx, gy, x, weight, running_mean, running_var, saved_mean, saved_invstd, eps):
        ctx.save_for_backward(gy, x, weight, running_mean, running_var)
        ctx.eps = eps
        return torch.ops.aten.native_batch_norm_backward(
            gy, x, weight, running_mean, running_var, saved_mean, saved_invstd, False, eps,
            [True, True, True])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, ggx, ggw, ggb):
        gy, x, weight, mean, var = ctx.saved_tensors
        dtype = var.dtype
        r = torch.rsqrt(var + ctx.eps)
        alpha = ggw * r if ggw is not None else torch.zeros_like(r)
        beta = ggb if ggb is not None else torch.zeros_like(r)
        d_gy = torch.addcmul(_per_channel(beta - mean * alpha), x.to(dtype), _per_channel(alpha))
        if ggx is not None:
            d_gy.addcmul_(ggx.to(dtype), _per_channel(weight.to(dtype) * r))
        d_x = gy.to(dtype) * _per_channel(alpha) if ggw is not None else None
        return (d_gy.to(gy.dtype), d_x.to(x.dtype) if d_x is not None else None,
                None, None, None, None, None, None)


class _Float32(torch.autograd.Function):
    """``t`` in float32, in ``t``'s memory layout (the objectives reduce over any layout); the
    gradient goes back in ``t``'s dtype and layout, so a channels-last weight gradient stays
    channels-last for the convolutions that consume it in the double backward."""

    @staticmethod
    def forward(ctx, t):
        ctx.meta = (t.shape, t.stride(), t.dtype)
        return t.to(torch.float32)

    @staticmethod
    def backward(ctx, grad):
        shape, stride, dtype = ctx.meta
        return torch.empty_strided(shape, stride, dtype=dtype, device=grad.device).copy_(grad)


class _ChannelsLast(torch.autograd.Function):
    """Images to channels-last; their gradient comes back in the standard layout (optimisers such
    as L-BFGS ``view`` it flat)."""

    @staticmethod
    def forward(ctx, x):
        return x.contiguous(memory_format=torch.channels_last)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


class _GroupedLayer(nn.Module):
    def __init__(self, prefix: str, state: _State):
        super().__init__()
        self.prefix = prefix
        self._state = [state]  # a list keeps it out of the module tree

    @property
    def state(self) -> _State:
        return self._state[0]

    def tensor(self, name: str) -> torch.Tensor | None:
        return self.state.tensors.get(f"{self.prefix}{name}")


class _GroupedNormalize(_GroupedLayer):
    def __init__(self, layer: Normalize, prefix: str, state: _State):
        super().__init__(prefix, state)
        self.register_buffer("mean", layer.mean.detach().clone())
        self.register_buffer("std", layer.std.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = self.state.instances
        return (x - self.mean.repeat(1, r, 1, 1)) / self.std.repeat(1, r, 1, 1)


class _GroupedConv2d(_GroupedLayer):
    def __init__(self, layer: nn.Conv2d, prefix: str, state: _State):
        super().__init__(prefix, state)
        self.stride, self.padding, self.dilation = layer.stride, layer.padding, layer.dilation
        self.groups = layer.groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        state = self.state
        weight, bias = self.tensor("weight"), self.tensor("bias")
        weight = weight.reshape(-1, *weight.shape[2:])
        bias = bias.reshape(-1) if bias is not None else None
        return _Conv2d.apply(x.to(state.dtype), weight, bias, self.stride, self.padding,
                             self.dilation, self.groups * state.instances, state)


class _GroupedBatchNorm2d(_GroupedLayer):
    def __init__(self, layer: nn.BatchNorm2d, prefix: str, state: _State, batch_stats: bool):
        super().__init__(prefix, state)
        self.eps = layer.eps
        self.batch_stats = batch_stats or layer.running_mean is None
        self.affine = layer.affine
        if not self.batch_stats:
            self.register_buffer("running_mean", layer.running_mean.detach().clone())
            self.register_buffer("running_var", layer.running_var.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = self.state.instances
        weight, bias = self.tensor("weight"), self.tensor("bias")
        weight = weight.reshape(-1) if weight is not None else None
        bias = bias.reshape(-1) if bias is not None else None
        if self.batch_stats and self.affine:
            return _BatchNorm.apply(x, weight, bias, self.eps, self.state)
        if self.batch_stats:
            return F.batch_norm(x, None, None, weight, bias, True, 0.0, self.eps)
        if self.affine:
            return _FrozenBatchNorm.apply(x, weight, bias, self.running_mean.repeat(r),
                                          self.running_var.repeat(r), self.eps, self.state)
        return F.batch_norm(x, self.running_mean.repeat(r), self.running_var.repeat(r), weight, bias,
                            False, 0.0, self.eps)


class _GroupedLinear(_GroupedLayer):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = self.state.instances
        weight, bias = self.tensor("weight"), self.tensor("bias")  # (R, out, in), (R, out)
        b = x.shape[0]
        h = x.to(self.state.dtype).reshape(b, r, -1).transpose(0, 1)  # (R, B, in)
        if bias is None:
            out = torch.bmm(h, weight.transpose(1, 2))
        else:
            out = torch.baddbmm(bias.unsqueeze(1), h, weight.transpose(1, 2))
        return out.transpose(0, 1).reshape(b, -1)  # (B, R*out), instance-major


def _grouped_replica(model: nn.Module, state: _State, train_mode: bool) -> tuple[nn.Module, set[str]]:
    """A copy of ``model`` whose layers act on instance-grouped tensors and own no parameters, and
    the names of the parameters that run in the compute dtype (those of convolutions and linears)."""
    replica = copy.deepcopy(model)
    replica.train(train_mode)
    compute = set()
    for name, module in list(replica.named_modules()):
        prefix = f"{name}." if name else ""
        if isinstance(module, Normalize):
            new: nn.Module = _GroupedNormalize(module, prefix, state)
        elif isinstance(module, nn.Conv2d):
            new = _GroupedConv2d(module, prefix, state)
        elif isinstance(module, nn.BatchNorm2d):
            new = _GroupedBatchNorm2d(module, prefix, state, train_mode)
        elif isinstance(module, nn.Linear):
            new = _GroupedLinear(prefix, state)
        else:
            continue
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            compute.update(f"{prefix}{n}" for n, _ in module.named_parameters())
        parent = replica.get_submodule(name.rpartition(".")[0]) if "." in name else replica
        setattr(parent, name.rpartition(".")[2], new)
    for p in replica.parameters():
        p.requires_grad_(False)
    return replica, compute


class GroupedSimulator:
    """Per-instance FedSGD updates of ``R`` instances in one differentiable pass (see module doc).

    Same interface as :class:`~leaklab.attacks.inversion.simulate.UpdateSimulator`: called with
    candidate images (R, B, C, H, W) and labels (R, B), it returns for every trainable parameter the
    stacked per-instance gradient (R, *shape), float32, in parameter order; ``names`` lists them.
    Activations and convolution weights are channels-last (oneDNN's fast layout) in bfloat16, and in
    float32 for up to four instances per call (measured on ConvNet-64: +7% for one instance, -2..-9%
    for sixteen); convolution weight updates are then returned channels-last strided: use
    ``reshape``, not ``view``, on them.
    """

    def __init__(self, model: nn.Module, metadata: UpdateMetadata, precision: str = "fp32"):
        if not supports(model, metadata):
            raise LeaklabError(f"the grouped simulator does not handle {type(model).__name__} with "
                               f"{metadata.kind} updates; use UpdateSimulator")
        if precision not in _DTYPES:
            raise LeaklabError(f"unknown precision {precision!r}; choose fp32 or bf16")
        self.metadata = metadata
        self.precision = precision
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        self.params = {n: p.detach().clone() for n, p in model.named_parameters()}
        self._state = _State(_DTYPES[precision])
        self.model, self._compute = _grouped_replica(model, self._state, metadata.train_mode)
        self._leaves: dict[tuple, dict[str, torch.Tensor]] = {}

    def channels_last(self, instances: int) -> bool:
        """Whether a call with ``instances`` instances runs channels-last (see the class doc)."""
        return self._state.dtype == torch.bfloat16 or instances <= 4

    def _per_instance(self, instances: int, device: torch.device) -> dict[str, torch.Tensor]:
        """``R`` copies of every parameter (convolution and linear ones in the compute dtype), made
        once per (R, device) and reused: the trainable ones are leaves whose gradients are the
        per-instance updates."""
        key = (instances, device)
        channels_last = self.channels_last(instances)
        if key not in self._leaves:
            if device.type == "cpu":
                tune_cpu_allocator()
            tensors = {}
            for n, p in self.params.items():
                dtype = self._state.dtype if n in self._compute else torch.float32
                p = p.to(device, dtype)
                if channels_last and p.ndim == 4:
                    # (R, cout, cin, k, k) whose (R*cout, cin, k, k) view is channels-last
                    t = p.permute(0, 2, 3, 1).unsqueeze(0).repeat(instances, 1, 1, 1, 1)
                    t = t.permute(0, 1, 4, 2, 3)
                else:
                    t = p.unsqueeze(0).repeat(instances, *[1] * p.ndim)
                tensors[n] = t.requires_grad_() if n in self.names else t
            self._leaves = {key: tensors}  # keep one set: R rarely changes within an attack
        return self._leaves[key]

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
        """Stacked per-instance updates for ``images`` (R, B, C, H, W) and ``labels`` (R, B)."""
        r, b = images.shape[:2]
        tensors = self._per_instance(r, images.device)
        x = images.transpose(0, 1).reshape(b, r * images.shape[2], *images.shape[3:])
        if self.channels_last(r):
            x = _ChannelsLast.apply(x)
        state = self._state
        state.instances, state.tensors = r, tensors
        try:
            logits = self.model(x)
            logits = logits.float().reshape(b, r, -1).transpose(0, 1).reshape(r * b, -1)
            loss = F.cross_entropy(logits, labels.reshape(-1), reduction="sum") / b
            state.param_grads = True
            grads = torch.autograd.grad(loss, [tensors[n] for n in self.names], create_graph=True)
        finally:
            state.tensors, state.param_grads = {}, False
        return [g if g.dtype == torch.float32 else _Float32.apply(g) for g in grads]
