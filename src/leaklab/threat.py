"""The threat model as a data contract (ARCHITECTURE.md, "one idea holds it together").

* :class:`ServerView` is everything an honest-but-curious server holds at a round: the model (its
  architecture, parameters and buffers), the declared metadata of the update and what the
  :class:`Capabilities` of the attacker grant (labels, batch size, the defense in use).
* :class:`ClientUpdate` is what a client sends: per-parameter gradients (FedSGD) or a weight delta
  with its local learning rate, steps and batch size (FedAvg).

An attack is a function of ``(ServerView, ClientUpdate, config)`` only; ground truth never enters it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn

from leaklab.errors import LeaklabError
from leaklab.models import ModelSpec, PerceptionSpec, build_model, build_perception_net
from leaklab.models.layers import Normalize
from leaklab.models.perception import check_forward
from leaklab.fields import EntropyWeight
from leaklab.names import UPDATE_NAMES


class Capabilities(BaseModel):
    """What the attacker is granted beyond the model and the update (read from a case's view.json
    strictly: ``"yes"`` is not a boolean)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    knows_labels: bool = False
    knows_batch_size: bool = True
    knows_defense: bool = True


class UpdateMetadata(BaseModel):
    """What the client declares with its update (the server needs it to apply the update); read from a
    case's JSON strictly (``true`` or ``"1"`` is not a batch size)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    kind: Literal[UPDATE_NAMES] = "fedsgd"
    batch_size: int = Field(default=1, ge=1, le=4096)
    local_steps: int = Field(default=1, ge=1, le=1000)
    local_lr: float = Field(default=0.1, gt=0)
    local_batch_size: int | None = Field(default=None, ge=1)
    loss: Literal["cross_entropy", "dqn_mse", "reinforce"] = "cross_entropy"
    entropy_weight: EntropyWeight = 0.0  # REINFORCE's alpha (seed 000 eq. 4)
    train_mode: bool = True

    @model_validator(mode="after")
    def _fedavg_batches(self) -> "UpdateMetadata":
        if self.kind == "fedavg" and self.local_batch_size is not None and \
                self.local_batch_size > self.batch_size:
            raise ValueError("local_batch_size cannot exceed batch_size")
        if self.kind == "fedsgd" and (self.local_steps != 1 or self.local_batch_size is not None):
            raise ValueError("a FedSGD update is one gradient of the whole batch: local_steps 1 and no "
                             "local_batch_size (they are FedAvg's; a FedSGD case declaring them was read)")
        if self.loss != "reinforce" and self.entropy_weight != 0:
            raise ValueError("entropy_weight is REINFORCE's alpha (loss 'reinforce'); 0 for the other losses")
        return self

    @property
    def minibatch_size(self) -> int:
        """Images per local step (FedAvg); the whole batch for FedSGD."""
        return self.local_batch_size or self.batch_size


FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)  # what a model or update may hold


def _dtype_names(dtypes: tuple[torch.dtype, ...]) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


@dataclass
class ClientUpdate:
    """A client's message: ``tensors`` maps parameter names to gradients (FedSGD) or to the weight
    delta ``theta_after - theta_before`` (FedAvg)."""

    metadata: UpdateMetadata
    tensors: dict[str, torch.Tensor]
    defense: str | None = None  # the defense chain the client applied, as a spec string
    privacy: dict | None = None  # DP-SGD report of a private client (epsilon spent, settings; fl.fedavg_update)

    def validate_against(self, model: nn.Module) -> None:
        """Raise :class:`LeaklabError` unless every trainable parameter has a finite floating-point tensor
        (of :data:`FLOAT_DTYPES`) of its shape."""
        expected = {n: p.shape for n, p in model.named_parameters() if p.requires_grad}
        missing = sorted(set(expected) - set(self.tensors))
        extra = sorted(set(self.tensors) - set(expected))
        if missing or extra:
            raise LeaklabError(
                f"update does not match the model: missing {missing[:3]}, unexpected {extra[:3]}; "
                "capture the update with the network the case's view.json names (--model, --arch or --model-class)")
        for name, shape in expected.items():
            t = self.tensors[name]
            if tuple(t.shape) != tuple(shape):
                raise LeaklabError(f"update tensor {name!r} has shape {tuple(t.shape)}, the model "
                                   f"expects {tuple(shape)}; capture it with the same model")
            if t.dtype not in FLOAT_DTYPES:
                raise LeaklabError(f"update tensor {name!r} has dtype {t.dtype}; updates are tensors of "
                                   f"{_dtype_names(FLOAT_DTYPES)}")
            if not torch.isfinite(t).all():
                raise LeaklabError(f"update tensor {name!r} contains NaN or Inf values; "
                                   "the update is corrupt or the client diverged")

    def ordered(self, model: nn.Module) -> list[torch.Tensor]:
        """The update's tensors in the order of ``model.named_parameters()``."""
        return [self.tensors[n] for n, p in model.named_parameters() if p.requires_grad]

    def with_tensors(self, tensors: dict[str, torch.Tensor], defense: str | None) -> "ClientUpdate":
        return replace(self, tensors=tensors, defense=defense)


@dataclass
class ServerView:
    """What the server holds at the round the update belongs to."""

    spec: ModelSpec | PerceptionSpec
    model: nn.Module
    metadata: UpdateMetadata
    capabilities: Capabilities = field(default_factory=Capabilities)
    defense: str | None = None  # known to the attacker only with capabilities.knows_defense
    labels: torch.Tensor | None = None  # given only with capabilities.knows_labels

    def require(self, what: str, reason: str) -> None:
        """Refuse with a clear message when a capability the attack needs is not granted."""
        if not getattr(self.capabilities, what):
            raise LeaklabError(f"this attack needs the capability {what!r} ({reason}); "
                               "grant it in the view or choose another attack")

    @property
    def batch_size(self) -> int:
        self.require("knows_batch_size", "it reconstructs one image per batch slot")
        return self.metadata.batch_size

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return (self.spec.in_channels, self.spec.image_size, self.spec.image_size)

    def known_defense(self) -> str | None:
        self.require("knows_defense", "the Bayes objective is the defense's likelihood")
        return self.defense


def _check_state(own: dict[str, torch.Tensor], state: dict[str, torch.Tensor],
                 spec: ModelSpec | PerceptionSpec, model_class: str | None = None) -> None:
    """Raise :class:`LeaklabError` unless ``state`` has exactly the tensors of ``own`` (a model's state
    dict), of their shapes, finite, floating-point where the model's are (:data:`FLOAT_DTYPES`) and of
    the model's dtype otherwise (counters such as ``num_batches_tracked``)."""
    problems = [k for k in own if k not in state or tuple(state[k].shape) != tuple(own[k].shape)]
    problems += [k for k in state if k not in own]
    if problems:
        name = getattr(spec, "name", None) or model_class or f"perception-{spec.arch}"
        how = ("the same --model" if not isinstance(spec, PerceptionSpec) else
               "the same --model-class" if model_class else
               "the same --arch, or pass the --model-class the case was captured with")
        raise LeaklabError(f"model file does not fit a {name} model (first mismatch: "
                           f"{problems[0]!r}); re-capture with {how}")
    for k, v in state.items():
        allowed = FLOAT_DTYPES if own[k].is_floating_point() else (own[k].dtype,)
        if v.dtype not in allowed:
            raise LeaklabError(f"model tensor {k!r} has dtype {v.dtype}; it must be {_dtype_names(allowed)}")
        # finite as the model holds it: a float64 1e300 is infinite in float32
        if v.is_floating_point() and not torch.isfinite(v.to(own[k].dtype)).all():
            raise LeaklabError(f"model tensor {k!r} contains NaN or Inf values (as the model's {own[k].dtype})")


def _meta_model(spec: ModelSpec | PerceptionSpec) -> nn.Module:
    """Leaklab's network of ``spec`` on the meta device: shapes and dtypes alone, no memory, no draw."""
    with torch.device("meta"):
        return build_perception_net(spec) if isinstance(spec, PerceptionSpec) else build_model(spec)


def tensor_file_bound(spec: ModelSpec | PerceptionSpec, copies: int = 1, trainable: bool = False) -> int:
    """The most bytes a safetensors file of ``copies`` states of leaklab's network of ``spec`` can take (its
    parameters alone where ``trainable``: an update's): every value in float64, and room for a header naming each
    tensor of each copy."""
    tensors = [p for p in _meta_model(spec).parameters() if p.requires_grad] if trainable else \
        list(_meta_model(spec).state_dict().values())
    return copies * (8 * sum(t.numel() for t in tensors) + 512 * len(tensors)) + (1 << 20)


def model_with_state(spec: ModelSpec | PerceptionSpec, state: dict[str, torch.Tensor],
                     model_class: str | None = None) -> nn.Module:
    """The model of ``spec`` (``model_class``: a user's own perception class) holding ``state``, strictly:
    every tensor of its shape and kind, finite in the model's dtype (:func:`_check_state`), no negative variance
    or counter, the input normalisation the spec declares, and a
    user's class still computing what the room attacks invert with these weights (:func:`check_forward`: a
    trained parameter outside ``head(cat(conv, box))`` passed on the fresh network). Leaklab's
    networks are compared on the meta device before they are built, so that a spec cannot make leaklab
    allocate a model its file does not hold."""
    def build() -> nn.Module:
        return build_perception_net(spec, model_class=model_class) if isinstance(spec, PerceptionSpec) \
            else build_model(spec)

    if model_class is None:
        _check_state(_meta_model(spec).state_dict(), state, spec)
    model = build()
    own = model.state_dict()
    _check_state(own, state, spec, model_class)
    loaded = {k: v.to(own[k].dtype) for k, v in state.items()}
    for name, module in model.named_modules() if isinstance(spec, ModelSpec) else ():
        # the mean and std the view declares (the fresh model's, before loading), not other ones
        if isinstance(module, Normalize) and not all(torch.equal(loaded[f"{name}.{b}"], getattr(module, b))
                                                     for b in ("mean", "std")):
            raise LeaklabError(f"model tensors {name}.mean/std are not the mean and std the view declares "
                               f"({list(spec.mean)}, {list(spec.std)}); the file is damaged")
    model.load_state_dict(loaded)
    for k, v in model.named_buffers():
        if (k.endswith("running_var") or k.endswith("num_batches_tracked")) and (v < 0).any():
            raise LeaklabError(f"model tensor {k!r} holds negative values (a variance or a counter); "
                               "the file is damaged")
    if model_class is not None:
        check_forward(model, spec, f"--model-class {model_class} with the case's weights")
    return model


def make_view(spec: ModelSpec | PerceptionSpec, state: dict[str, torch.Tensor], metadata: UpdateMetadata,
              capabilities: Capabilities | None = None, defense: str | None = None,
              labels: torch.Tensor | None = None, model_class: str | None = None) -> ServerView:
    """Rebuild the model of ``spec`` (an image classifier or a perception network; ``model_class``:
    a user's own perception class, see :func:`leaklab.models.perception.perception_class`) and load
    ``state`` (parameters and buffers) into it, strictly (:func:`model_with_state`)."""
    model = model_with_state(spec, state, model_class)
    capabilities = capabilities or Capabilities()
    if labels is not None and (isinstance(spec, PerceptionSpec) or labels.ndim != 1
                               or labels.dtype.is_floating_point or labels.dtype == torch.bool
                               or len(labels) != metadata.batch_size
                               or labels.min() < 0 or labels.max() >= spec.num_classes):
        raise LeaklabError("labels must be a 1-d tensor of class indices, one per image")
    return ServerView(spec=spec, model=model, metadata=metadata, capabilities=capabilities,
                      defense=defense if capabilities.knows_defense else None,
                      labels=labels if capabilities.knows_labels else None)
