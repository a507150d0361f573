"""The multimodal active-perception network of seed 000 ("Your Room is not Private", section III).

"The images are first processed by convolution layers F_conv, while the coordinate vector is
processed by linear layers. Their features are concatenated and processed by linear layers." The
network predicts one value per discrete movement action: Q-values for DQN, logits of the policy for
REINFORCE.

Inputs (the contract every RL module of leaklab shares):

* ``images``: ``[B, C, 150, 150]`` floats in [0, 1]; setting S1 stacks RGB and depth (C = 4, channels
  R, G, B, depth), setting S2 has depth only (C = 1). Depth is the distance divided by the
  environment's maximum range (see :mod:`leaklab.rl.envs.active_perception`).
* ``box``: ``[B, 4]`` the target's bounding box ``(x1, y1, x2, y2)`` in [-1, 1] image coordinates.

Module names are part of the contract (attacks address layers by them): ``conv`` (the image
branch: a module from ``images`` to flat features ``[B, F]``), ``box`` (the coordinate branch;
``box.0`` is the Linear layer whose input is the box) and ``head`` (the fused linear layers;
``head.0`` takes ``cat(conv, box)`` and the last module is the output Linear with bias).

Architectures (``--arch``; the paper fixes none of them): ``small`` gives each modality its own stream
of three convolutions (RGB and depth are different signals; S2 has the depth stream only), ``nature``
is ``small`` at the widths of the Nature DQN's encoder (32, 64, 64 filters instead of 16, 32, 32; Mnih
et al. 2015), the image encoder most DQN agents use, ``wide-rgb`` (the default,
:data:`~leaklab.names.DEFAULT_ARCH`, since session 31) is ``small`` with its RGB stream 64, 64, 64 wide
(three colour channels get more filters; its depth stream, and so every S2 network, is ``small``'s to
the weight: the depth stream is drawn first), ``deep`` gives each stream
five convolutions and pooling, ``stacked`` feeds RGB-D as four channels to one small stream. For S2
``small`` and ``stacked`` compute the same function (one depth stream; only the parameter names
differ: ``conv.depth.0`` against ``conv.0``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
from collections.abc import Iterable, Iterator
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from torch.func import functional_call

from leaklab.errors import ModelClassError
from leaklab.names import ARCH_NAMES, DEFAULT_ARCH, SETTING_NAMES
from leaklab.words import plural

SETTING_CHANNELS = {"S1": 4, "S2": 1}
ArchName = Literal[ARCH_NAMES]


class PerceptionSpec(BaseModel):
    """Architecture of a perception network; enough for a server to rebuild it exactly."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    setting: Literal[SETTING_NAMES] = "S2"
    arch: ArchName = DEFAULT_ARCH
    num_actions: int = Field(default=7, gt=1, le=1024)
    image_size: int = Field(default=150, ge=36, le=512)  # small/nature/stacked: 36 -> 8 -> 3 -> 1
    box_dim: Literal[4] = 4  # the target box (x1, y1, x2, y2), scored by IoU (seed 000 V)

    @property
    def in_channels(self) -> int:
        return SETTING_CHANNELS[self.setting]


SMALL_WIDTHS = (16, 32, 32)
NATURE_WIDTHS = (32, 64, 64)
WIDE_RGB_WIDTHS = (64, 64, 64)  # ``wide-rgb``'s RGB stream: S1 RGB leaks at +15.6 dB over the baseline
# against small's +7.8 (README; docs/reproductions.md, "How wide the streams are decides the RGB line")


def three_conv_stream(c: int, widths: tuple[int, int, int] = SMALL_WIDTHS) -> nn.Sequential:
    """``small``'s stream of ``c`` image channels: three convolutions (8/4, 4/2, 3/1, as in the DQN
    family: 150 -> 36 -> 17 -> 15) ``widths`` filters wide, each followed by a ReLU, flattened."""
    a, b, d = widths
    return nn.Sequential(
        nn.Conv2d(c, a, 8, stride=4), nn.ReLU(),
        nn.Conv2d(a, b, 4, stride=2), nn.ReLU(),
        nn.Conv2d(b, d, 3, stride=1), nn.ReLU(),
        nn.Flatten(),
    )


def _wide_rgb_stream(c: int) -> nn.Sequential:
    """``wide-rgb``'s streams: :data:`WIDE_RGB_WIDTHS` for the three RGB channels, ``small``'s for depth."""
    return three_conv_stream(c, WIDE_RGB_WIDTHS if c == 3 else SMALL_WIDTHS)


def _conv_deep(c: int) -> nn.Sequential:
    # five 3x3/5x5 convolutions with max-pooling: 150 -> 75 -> 37 -> 18 -> 9
    return nn.Sequential(
        nn.Conv2d(c, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
        nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
    )


class ModalityStreams(nn.Module):
    """One convolution stream per image modality, flattened features concatenated (RGB first):
    ``depth`` always, ``rgb`` in setting S1 (the depth stream is built first, so an S2 network's
    weights do not depend on whether an RGB stream exists)."""

    def __init__(self, setting: str, stream):
        super().__init__()
        self.depth = stream(1)
        if setting == "S1":
            self.rgb = stream(3)

    def streams(self) -> list[tuple[str, nn.Module, slice]]:
        """``(name, stream, channels of images it reads)`` in the order of the features."""
        if not hasattr(self, "rgb"):
            return [("depth", self.depth, slice(0, 1))]
        return [("rgb", self.rgb, slice(0, 3)), ("depth", self.depth, slice(3, 4))]

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return torch.cat([stream(images[:, c]) for _, stream, c in self.streams()], dim=1)


def _flat_features(conv: nn.Module, channels: int, size: int) -> int:
    """How many features ``conv`` gives a ``channels x size x size`` image, by a forward pass of a zero image. A
    branch built on the meta device (the network's shapes alone: :func:`architecture_digest`, the threat model's
    checks) runs on uninitialised CPU tensors in place of its own: torch's meta kernels are Python that imports
    ``torch._dynamo`` and sympy, 1.8 s at a process's first meta forward on session 67's host (every attack
    worker paid it)."""
    with torch.no_grad():
        if not any(p.is_meta for p in conv.parameters()):
            return conv(torch.zeros(1, channels, size, size)).shape[1]
        empty = {name: torch.empty(t.shape, dtype=t.dtype, device="cpu") for name, t in conv.state_dict().items()}
        return functional_call(conv, empty, (torch.zeros(1, channels, size, size, device="cpu"),)).shape[1]


class PerceptionNet(nn.Module):
    """Conv branch for the images, linear branch for the box, fused linear head to the actions."""

    def __init__(self, spec: PerceptionSpec):
        super().__init__()
        self.spec = spec
        c = spec.in_channels
        if spec.arch in ("small", "nature", "wide-rgb", "stacked"):
            widths = NATURE_WIDTHS if spec.arch == "nature" else SMALL_WIDTHS
            self.conv = (three_conv_stream(c) if spec.arch == "stacked" else
                         ModalityStreams(spec.setting, _wide_rgb_stream) if spec.arch == "wide-rgb" else
                         ModalityStreams(spec.setting, functools.partial(three_conv_stream, widths=widths)))
            self.box = nn.Sequential(nn.Linear(spec.box_dim, 32), nn.ReLU())
            box_features = 32
        else:
            self.conv = ModalityStreams(spec.setting, _conv_deep)
            self.box = nn.Sequential(nn.Linear(spec.box_dim, 64), nn.ReLU(),
                                     nn.Linear(64, 64), nn.ReLU())
            box_features = 64
        conv_features = _flat_features(self.conv, c, spec.image_size)
        self.conv_features = conv_features
        self.head = nn.Sequential(nn.Linear(conv_features + box_features, 256), nn.ReLU(),
                                  nn.Linear(256, spec.num_actions))

    def forward(self, images: torch.Tensor, box: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.conv(images), self.box(box)], dim=1))


@functools.cache
def architecture_digest(spec: PerceptionSpec) -> str:
    """A short sha256 of the built-in network's module tree for ``spec`` (layers, sizes, order):
    results with equal digests attacked the same architecture, whatever leaklab version wrote them. Kept per
    spec (an audit's journal names every job by it: 60 ms a network on session 66's host)."""
    with torch.device("meta"):  # no weights, no draw from the random generator
        layout = repr(PerceptionNet(spec))
    return hashlib.sha256(layout.encode()).hexdigest()[:16]


def check_contract(net: nn.Module, where: str) -> nn.Module:
    """Raise :class:`~leaklab.errors.ModelClassError` unless ``net`` has the module layout this module's docstring
    describes (a ``conv`` module, ``box`` starting with a Linear layer with bias, ``head`` of Linear
    layers whose first and last have a bias): the layers the room attacks read."""
    def linear(m: nn.Module) -> bool:
        return isinstance(m, nn.Linear) and m.bias is not None

    ok = (isinstance(getattr(net, "conv", None), nn.Module)
          and isinstance(getattr(net, "box", None), nn.Sequential) and linear(net.box[0])
          and isinstance(getattr(net, "head", None), nn.Sequential) and linear(net.head[0])
          and linear(net.head[-1]))
    if not ok:
        raise ModelClassError(f"{where} does not follow the perception-network contract (modules conv "
                              "from images to flat features, box starting with a Linear with bias, head of "
                              "Linear layers whose first and last have a bias; see leaklab.models.perception)")
    frozen = [name for name, p in net.named_parameters() if not p.requires_grad]
    if frozen:
        raise ModelClassError(f"{where} has parameters that do not train ({frozen[0]}, requires_grad False): a "
                              "client's update leaves them out, and the room attacks read every layer's gradient; "
                              "let every parameter train")
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in net.parameters()} - {"float32"})
    if dtypes:
        raise ModelClassError(f"{where} has {dtypes[0]} parameters; the room attacks work in float32, so build "
                              "the network in float32 (a float64 model file is cast when it loads)")
    mixing = [name for branch in ("box", "head") for name, m in getattr(net, branch).named_modules(prefix=branch)
              if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if mixing:
        raise ModelClassError(f"{where} has BatchNorm in {mixing[0]}: batch statistics tie an update's transitions "
                              "together, which the attacks' closed forms for the linear layers do not model; "
                              "leave BatchNorm out of box and head (conv may have it)")
    return net


def plain_conv(conv: nn.Module) -> bool:
    """Whether ``conv`` is an ``nn.Conv2d`` (or a subclass) without padding, dilation or groups: its output
    at ``(i, j)`` reads every channel of the input's kernel-sized block at ``(i·stride, j·stride)`` and
    nothing else."""
    return (isinstance(conv, nn.Conv2d) and conv.padding == (0, 0) and conv.dilation == (1, 1)
            and conv.groups == 1)


def conv_feature_count(net: nn.Module) -> int:
    """How many of ``head.0``'s inputs are the flattened conv features (the rest: the box branch)."""
    box_out = [m for m in net.box if isinstance(m, nn.Linear)][-1].out_features
    return net.head[0].in_features - box_out


def user_modules(types: Iterable[type]) -> set[str]:
    """The modules of a user's network's code among ``types`` (its class's parents, its layers' types): all but
    leaklab's, torch's and Python's own."""
    return {t.__module__ for t in types if t.__module__.split(".")[0] not in ("leaklab", "torch", "builtins")}


def perception_class(path: str) -> type[nn.Module]:
    """A user's own perception network class from ``"package.module:Class"``; the class is called
    with the :class:`PerceptionSpec` and must follow the contract of :func:`check_contract`."""
    module_name, _, class_name = path.partition(":")
    if not module_name or not class_name:
        raise ModelClassError(f"--model-class {path!r} must look like package.module:Class")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ModelClassError(f"--model-class {path!r} cannot be imported ({e}); put its module on "
                              "PYTHONPATH") from None
    except (Exception, SystemExit) as e:  # the user's module fails importing (a syntax error, its own exception,
        # or sys.exit: a training script's argparse at import ended the command silently, exit code 0 even)
        raise ModelClassError(f"--model-class {path!r}: importing its module failed "
                              f"({type(e).__name__}: {e})") from None
    cls = getattr(module, class_name, None)
    if cls is None:
        raise ModelClassError(f"--model-class {path!r}: module {module_name} has no {class_name!r}")
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ModelClassError(f"--model-class {path!r} is not a torch.nn.Module class")
    return cls


def build_perception_net(spec: PerceptionSpec, seed: int | None = None,
                         model_class: str | None = None) -> nn.Module:
    """Instantiate the network of ``spec`` (PyTorch's default initialisation; ``seed`` fixes it),
    or ``model_class(spec)`` for a user's own class (:func:`perception_class`), given the attribute
    ``spec`` when it lacks one (as leaklab's network has it: the agents and the capture read it); one that sets
    another is refused."""
    if seed is not None:
        torch.manual_seed(seed)
    if model_class is None:
        return PerceptionNet(spec)
    cls = perception_class(model_class)
    try:
        net = cls(spec)
    except (Exception, SystemExit) as e:  # the user's class does not take a PerceptionSpec, or fails building
        raise ModelClassError(f"--model-class {model_class!r}: {cls.__name__}(spec) failed "
                              f"({type(e).__name__}: {e}); it must build from a PerceptionSpec") from None
    check_contract(net, model_class)
    check_forward(net, spec, f"{model_class} (for {spec.setting}, {plural(spec.in_channels, 'channel')} of "
                             f"{spec.image_size} px)")
    own = getattr(net, "spec", None)
    if own is not None and own != spec:  # the attacks read net.spec: 100 px images against 150 px truths
        raise ModelClassError(f"--model-class {model_class!r}: {cls.__name__}(spec) sets its own spec ({own!r}), not "
                              "the one it was built from; keep the spec it is given, or set none")
    net.spec = spec
    return net


@contextlib.contextmanager
def modes_kept(net: nn.Module) -> Iterator[nn.Module]:
    """Give every module of ``net`` back its train/eval mode on the way out, whatever ran inside."""
    modes = [(m, m.training) for m in net.modules()]
    try:
        yield net
    finally:
        for m, training in modes:
            m.training = training


def check_forward(net: nn.Module, spec: PerceptionSpec, where: str) -> None:
    """Raise :class:`~leaklab.errors.ModelClassError` unless ``net`` computes what the room attacks assume for ``spec``:
    ``box.0`` takes the box, ``conv`` gives ``[B, F]`` flat features with F the conv part of
    ``head.0``'s inputs, and the output, ``[B, num_actions]``, is ``head(cat(conv(images), box(box)))``.
    Checked on one batch of two random states in eval mode, and on one state in train mode (as a client
    computes its update), whose output must reach every parameter (a parameter the forward leaves out has no
    gradient for the update to hold) and have a non-zero gradient in the images and the box (which the attacks
    differentiate), without touching the global generator or the network's state and modes."""
    if net.box[0].in_features != spec.box_dim or net.head[-1].out_features != spec.num_actions:
        raise ModelClassError(f"{where}: box.0 must take the {spec.box_dim}-d box and the last head layer give "
                              f"{spec.num_actions} outputs (got {net.box[0].in_features} and "
                              f"{net.head[-1].out_features})")
    gen = torch.Generator().manual_seed(0)
    images = torch.rand(2, spec.in_channels, spec.image_size, spec.image_size, generator=gen)  # float32, as the
    box = torch.rand(2, spec.box_dim, generator=gen) * 2 - 1  # network is (check_contract)
    state = {k: v.clone() for k, v in net.state_dict().items()}  # BatchNorm's statistics, restored too
    what = "of two states of the spec's shapes"
    try:
        with modes_kept(net), torch.no_grad(), torch.random.fork_rng(devices=[]):
            net.eval()
            features = net.conv(images)
            out = net(images, box)
            if not isinstance(out, torch.Tensor):  # "'tuple' object has no attribute 'sum'" said it in train mode
                raise TypeError(f"forward returned a {type(out).__name__}; it must return one tensor, "
                                f"[B, {spec.num_actions}]")
            composed = net.head(torch.cat([features, net.box(box)], dim=1)) if features.ndim == 2 else None
            what = "of one state in train mode, as a client computes a single-sample update,"
            with torch.enable_grad():
                params = dict(net.named_parameters())
                inputs = {"images": images[:1].clone().requires_grad_(True),
                          "box": box[:1].clone().requires_grad_(True)}
                reached = torch.autograd.grad(net.train()(*inputs.values()).sum(),
                                              [*params.values(), *inputs.values()], allow_unused=True)
    except (Exception, SystemExit) as e:  # the user's forward fails on inputs of the spec's shapes
        raise ModelClassError(f"{where}: a forward pass {what} failed ({type(e).__name__}: {e})") from None
    finally:
        net.load_state_dict(state)
    unused = [name for name, g in zip(params, reached) if g is None]
    if unused:
        raise ModelClassError(f"{where}: the output does not depend on {unused[0]}: a parameter the forward leaves "
                              "out has no gradient for a client's update to hold; remove it from the class")
    unreached = [name for name, g in zip(inputs, reached[len(params):]) if g is None or not bool(g.any())]
    if unreached:  # a detach, numpy or no-grad step: the attacks would move the images by their prior alone
        raise ModelClassError(f"{where}: the output has no gradient in the {unreached[0]} (a detach, a no-grad or "
                              "numpy step in the forward?); the attacks differentiate the network in its images "
                              "and box")
    if tuple(features.shape) != (2, conv_feature_count(net)):
        raise ModelClassError(f"{where}: conv gives features of shape {tuple(features.shape)} for two states; "
                              f"head.0 expects (2, {conv_feature_count(net)})")
    if tuple(out.shape) != (2, spec.num_actions):
        raise ModelClassError(f"{where}: the network's output has shape {tuple(out.shape)} for two states, not "
                              f"(2, {spec.num_actions})")
    if not bool(torch.isfinite(out).all()):
        raise ModelClassError(f"{where}: the output holds NaN or Inf for two random states of the spec's shapes")
    if not torch.allclose(out, composed, rtol=1e-4, atol=1e-5):
        raise ModelClassError(f"{where}: the output is not head(cat(conv(images), box(box))), the computation "
                              "the room attacks invert")


def stack_images(rgb: torch.Tensor | None, depth: torch.Tensor, setting: str) -> torch.Tensor:
    """The network's ``images`` input from an observation's ``rgb`` ``[..., 3, H, W]`` and ``depth``
    ``[..., 1, H, W]`` (S1: RGB then depth; S2: depth only)."""
    if setting == "S2":
        return depth
    if rgb is None:
        raise ValueError("setting S1 needs the RGB image")
    return torch.cat([rgb, depth], dim=-3)
