"""The attacker's copy of a perception network, whose convolutions on the full-resolution images run
by space-to-depth (leaklab's; the attacks compute the same functions as the client's network).

A convolution with stride ``s`` and a kernel of ``m·s`` (no padding) equals, on the image cut into
``s × s`` blocks stacked as ``C·s²`` channels, a stride-1 convolution with an ``m × m`` kernel whose
weights are the original's regrouped the same way. The image stages of QGI and RGI run the image branch
forward and back to the images thousands of times per attack, and torch's CPU backward to a strided
convolution's few-channel, full-resolution input is slow: on one core (AVX-512 host, session 33),
forward plus the gradient to the images of ``wide-rgb``'s RGB stream's first convolution (3→64, 8×8,
stride 4, 150×150) took 2.69 ms directly and 1.35 ms by space-to-depth, the depth stream's (1→16)
0.78 and 0.43 ms; the whole S1 image branch 6.3 ms against 4.5. Deeper strided convolutions, on fewer
positions and more channels, came out slower by space-to-depth (``wide-rgb``'s 64→64, 4×4, stride 2:
the whole branch 5.1 ms), so only the convolutions that read the images are rearranged. The results
differ from the direct convolution's by float32 rounding only (1e-7 of the features' scale).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from leaklab.models.perception import PerceptionNet, modes_kept, plain_conv


class SpaceToDepthConv2d(nn.Conv2d):
    """An ``nn.Conv2d`` (stride ``s``, kernel a multiple of ``s``, no padding) computed as a stride-1
    convolution of the input's ``s × s`` blocks; the same parameters, names and attributes."""

    @staticmethod
    def fits(conv: nn.Module) -> bool:
        """Whether ``conv`` is a plain convolution that space-to-depth can compute."""
        return (type(conv) is nn.Conv2d and plain_conv(conv)
                and all(s > 1 and k % s == 0 for k, s in zip(conv.kernel_size, conv.stride)))

    @classmethod
    def of(cls, conv: nn.Conv2d) -> SpaceToDepthConv2d:
        """A space-to-depth convolution holding ``conv``'s own parameters (built on the meta device: no
        initialisation, no draw from torch's generator)."""
        fast = cls(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, bias=conv.bias is not None,
                   device="meta")
        fast.weight, fast.bias = conv.weight, conv.bias
        return fast

    def _conv_forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        (sh, sw), (kh, kw) = self.stride, self.kernel_size
        b, c, h, w = x.shape
        mh, mw = kh // sh, kw // sw
        bh, bw = (h - kh) // sh + mh, (w - kw) // sw + mw  # blocks the output reads
        blocks = (x[:, :, :bh * sh, :bw * sw].reshape(b, c, bh, sh, bw, sw)
                  .permute(0, 1, 3, 5, 2, 4).reshape(b, c * sh * sw, bh, bw))
        kernel = (weight.reshape(-1, c, mh, sh, mw, sw).permute(0, 1, 3, 5, 2, 4)
                  .reshape(-1, c * sh * sw, mh, mw))
        return F.conv2d(blocks, kernel, bias)


def attack_network(net: PerceptionNet) -> PerceptionNet:
    """A copy of ``net`` (sharing nothing with it, in its modes and state) whose convolutions that receive
    the images at full resolution are :class:`SpaceToDepthConv2d` s where they fit, and whose in-place
    activations (a user's ``nn.ReLU(inplace=True)``) compute out of place: the attacks keep the Linear layers'
    outputs (:func:`~leaklab.attacks.rl.network.trace`), which they would overwrite; the rest as they are."""
    fast = copy.deepcopy(net)
    for module in fast.modules():
        if getattr(module, "inplace", None) is True:
            module.inplace = False
    spec = fast.spec
    reading: set[int] = set()

    def note(module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        if tuple(args[0].shape[-2:]) == (spec.image_size, spec.image_size):
            reading.add(id(module))

    convs = [m for m in fast.modules() if SpaceToDepthConv2d.fits(m)]
    hooks = [m.register_forward_pre_hook(note) for m in convs]
    try:  # in eval mode: a user's BatchNorm keeps its statistics, a Dropout draws nothing
        with modes_kept(fast), torch.no_grad():
            fast.eval().conv(torch.zeros(1, spec.in_channels, spec.image_size, spec.image_size,
                                         device=next(fast.parameters()).device))
    finally:
        for hook in hooks:
            hook.remove()
    for parent in list(fast.modules()):
        for name, child in list(parent.named_children()):
            if id(child) in reading:
                setattr(parent, name, SpaceToDepthConv2d.of(child))
    return fast
