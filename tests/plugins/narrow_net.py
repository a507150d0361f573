"""A user's own perception network: other widths than leaklab's, the same module contract."""

import os
import signal

import torch
from torch import nn


class NarrowNet(nn.Module):
    def __init__(self, spec):
        super().__init__()
        self.spec = spec
        self.conv = nn.Sequential(nn.Conv2d(spec.in_channels, 8, 8, stride=4), nn.ReLU(),
                                  nn.Conv2d(8, 8, 4, stride=2), nn.ReLU(), nn.Flatten())
        self.box = nn.Sequential(nn.Linear(spec.box_dim, 16), nn.ReLU())
        features = 8 * 17 * 17
        self.head = nn.Sequential(nn.Linear(features + 16, 64), nn.ReLU(), nn.Linear(64, spec.num_actions))

    def forward(self, images, box):
        return self.head(torch.cat([self.conv(images), self.box(box)], dim=1))


class SamePad(NarrowNet):
    """NarrowNet whose last convolution pads "same" (a string, which conv2d_weight does not take)."""

    def __init__(self, spec):
        super().__init__(spec)
        self.conv = nn.Sequential(nn.Conv2d(spec.in_channels, 8, 8, stride=4), nn.ReLU(),
                                  nn.Conv2d(8, 8, 3, padding="same"), nn.ReLU(), nn.Flatten())
        self.head[0] = nn.Linear(8 * 36 * 36 + 16, 64)


class Reflect(NarrowNet):
    """NarrowNet whose last convolution pads by reflection (no zeros at the border)."""

    def __init__(self, spec):
        super().__init__(spec)
        self.conv = nn.Sequential(nn.Conv2d(spec.in_channels, 8, 8, stride=4), nn.ReLU(),
                                  nn.Conv2d(8, 8, 4, stride=2, padding=1, padding_mode="reflect"), nn.ReLU(),
                                  nn.Flatten())
        self.head[0] = nn.Linear(8 * 18 * 18 + 16, 64)


class Bare(NarrowNet):
    """NarrowNet without a ``spec`` attribute (the contract does not ask for one)."""

    def __init__(self, spec):
        super().__init__(spec)
        del self.spec


class NoHead(nn.Module):
    def __init__(self, spec):
        super().__init__()
        self.conv = nn.Sequential(nn.Flatten())


class TanhHead(NarrowNet):
    """NarrowNet with Tanh between its head layers: exact mode cannot separate a batch through it."""

    def __init__(self, spec):
        super().__init__(spec)
        self.head[1] = nn.Tanh()


class Dies(NarrowNet):
    """A class whose process dies while it is built (as one killed for memory would)."""

    def __init__(self, spec):
        os._exit(9)


class Crashes(NarrowNet):
    """A class whose process crashes in native code while it is built (a segmentation fault)."""

    def __init__(self, spec):
        os.kill(os.getpid(), signal.SIGSEGV)


class DeepHead(NarrowNet):
    """A deeper head (two hidden Linear layers), a box branch whose second Linear layer has no bias, and
    in-place ReLUs, as DQN code has them."""

    def __init__(self, spec):
        super().__init__(spec)
        self.box = nn.Sequential(nn.Linear(spec.box_dim, 16), nn.ReLU(inplace=True),
                                 nn.Linear(16, 16, bias=False), nn.ReLU(inplace=True))
        self.head = nn.Sequential(nn.Linear(8 * 17 * 17 + 16, 128), nn.ReLU(inplace=True),
                                  nn.Linear(128, 64), nn.ReLU(inplace=True), nn.Linear(64, spec.num_actions))


class SpecLie(NarrowNet):
    """NarrowNet that keeps a spec of its own: the attacks read net.spec (100 px images against 150 px truths)."""

    def __init__(self, spec):
        super().__init__(spec)
        self.spec = spec.model_copy(update={"image_size": 100})


class Pair(NarrowNet):
    """NarrowNet whose forward returns its output with its features, a tuple."""

    def forward(self, images, box):
        return super().forward(images, box), self.conv(images)


class Frozen(NarrowNet):
    """NarrowNet whose box branch does not train: a client's update leaves its gradients out."""

    def __init__(self, spec):
        super().__init__(spec)
        self.box.requires_grad_(False)


class Unused(NarrowNet):
    """NarrowNet with a layer its forward never uses (a leftover value head)."""

    def __init__(self, spec):
        super().__init__(spec)
        self.aux = nn.Linear(64, 1)


class Normalized(NarrowNet):
    """NarrowNet whose conv stream starts with leaklab's Normalize layer."""

    def __init__(self, spec):
        super().__init__(spec)
        from leaklab.models.layers import Normalize

        self.conv = nn.Sequential(Normalize([0.5] * spec.in_channels, [0.25] * spec.in_channels), *self.conv)


class OutScale(NarrowNet):
    """NarrowNet times a trained scale: head(cat(conv, box)) at its start (scale 1), not once it moves."""

    def __init__(self, spec):
        super().__init__(spec)
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, images, box):
        return super().forward(images, box) * self.scale


class Normed(NarrowNet):
    """NarrowNet with BatchNorm after its first convolution: its running statistics are state the server sends."""

    def __init__(self, spec):
        super().__init__(spec)
        self.conv = nn.Sequential(nn.Conv2d(spec.in_channels, 8, 8, stride=4), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.Conv2d(8, 8, 4, stride=2), nn.ReLU(), nn.Flatten())


class NumpyConv(NarrowNet):
    """NarrowNet whose conv stream passes through numpy: a forward without gradients works, the attacks' not."""

    def __init__(self, spec):
        super().__init__(spec)
        self.conv = _NumpyRound(self.conv)


class _NumpyRound(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(torch.from_numpy(x.numpy().copy()))


class NaNOut(NarrowNet):
    """NarrowNet whose output is NaN: the contract named a composition it computes as the fault."""

    def forward(self, images, box):
        return super().forward(images, box) * float("nan")


class Detached(NarrowNet):
    """NarrowNet whose forward detaches the images: it runs with gradients, none reaching the images."""

    def forward(self, images, box):
        return super().forward(images.detach(), box)


class Float32Box(NarrowNet):
    """NarrowNet whose box layer takes float32 alone (a kernel of one precision): a client's update and the contract's
    checks run, and exact mode's box fit behind noise, in float64, fails in it."""

    def __init__(self, spec):
        super().__init__(spec)
        self.box[0] = _Float32Linear(spec.box_dim, 16)


class _Float32Linear(nn.Linear):
    def forward(self, x):
        if x.dtype != torch.float32:
            raise TypeError(f"this layer's kernel takes float32, not {x.dtype}")
        return super().forward(x)
