"""Capture what an honest-but-curious server sees of a client's round, and the client's truth.

``capture(CaptureConfig(...))`` builds the model (initialised by ``seed``, optionally trained for
``train_steps`` on other images of the same dataset), loads the client's private images, computes one
update per group of ``batch_size`` images (FedSGD gradient, or FedAvg weight delta; with ``adversarial_eps`` the
training and the client's update are Madry's adversarial training, seed 004), and applies the client's
defenses: ATS's augmentation of the training and the private images (``ats``), Soteria's pruning of one layer's
gradient (``soteria_layer``; both seed 001 section 5), then the defense chain with ``seed``'s defense stream
(:mod:`leaklab.seeds`). :func:`run` writes the result as a case
folder (``leaklab capture``); the format is in docs/formats.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from leaklab import seeds
from leaklab.data import DATASET_NAMES, among, load_images
from leaklab.data.augment import augment, parse_policy
from leaklab.defenses import parse_defense
from leaklab.defenses.soteria import apply_soteria, linear_layer
from leaklab.errors import LeaklabError
from leaklab.experiments import ProgressFn
from leaklab.fields import DefenseOption, Seed
from leaklab.fl import AdversarialConfig, fedavg_update, fedsgd_update, train_steps
from leaklab.cases import write_case
from leaklab.io import VIEW_FORMAT, atomic_dir
from leaklab.metrics.vectors import update_cosine
from leaklab.models import MODEL_NAMES, ModelSpec, batchnorm_layers, build_model
from leaklab.names import BN_STATS_NAMES, UPDATE_NAMES
from leaklab.threat import Capabilities, ClientUpdate, UpdateMetadata

# Sizes of the finite image pools (leaklab.data): the training images of ``train_steps`` are drawn
# from what the client's images leave.
_POOL_SIZES = {"faces": 200, "digits": 1797, "mnist": 5000}
_TRAIN_POOL = 256


class CaptureConfig(BaseModel):
    """One client round: model, private data, update kind, defense, and what the server is granted."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: Literal[MODEL_NAMES] = "convnet"
    data: Literal[DATASET_NAMES] = "photos"
    batch_size: int = Field(default=1, ge=1, le=256)
    num_images: int = Field(default=1, ge=1, le=4096)
    image_seed: Seed = 0
    image_offset: int = Field(default=0, ge=0, description="skip the first images of the seed's order")
    image_size: int = Field(default=32, ge=8, le=256)
    width: int | None = Field(default=None, ge=1, le=1024)
    defense: DefenseOption = None
    seed: Seed = 0
    train_steps: int = Field(default=0, ge=0, le=100_000)
    knows_labels: bool = False
    update: Literal[UPDATE_NAMES] = "fedsgd"
    local_steps: int = Field(default=1, ge=1, le=1000)
    local_lr: float = Field(default=0.1, gt=0)
    bn_stats: Literal[BN_STATS_NAMES] = Field(
        default="batch", description="BatchNorm statistics on the client: the batch's (training mode) or "
                                     "the running ones sent by the server (breaching's public-buffer default)")
    adversarial_eps: float | None = Field(
        default=None, gt=0, le=1000, description="the client trains adversarially (Madry's L2 PGD, 7 steps, of this "
                                                 "radius, pixels in [0, 1]): the --train-steps and the update")
    ats: str | None = Field(
        default=None, max_length=200, description="ATS (seed 001 section 5): the client augments its training and "
                                                  "private images with this policy, e.g. 7-4-15 or 21-13-3+7-4-15")
    soteria_layer: str | None = Field(
        default=None, max_length=200, description="Soteria (seed 001 section 5) prunes this fully connected "
                                                  "layer's weight gradient, e.g. classifier.0")
    soteria_rate: float = Field(default=0.8, gt=0, lt=1, description="the fraction of its columns Soteria prunes")

    @field_validator("ats")
    @classmethod
    def _known_policy(cls, value: str | None) -> str | None:
        if value is not None:
            parse_policy(value)
        return value

    @model_validator(mode="after")
    def _defenses_that_apply(self) -> "CaptureConfig":
        # a rate other than the default (a config dumped from results.json sets every field, as it was)
        if self.soteria_rate != type(self).model_fields["soteria_rate"].default and self.soteria_layer is None:
            raise ValueError("soteria_rate (--soteria-rate) applies with soteria_layer (--soteria-layer)")
        if self.soteria_layer is not None and self.update != "fedsgd":
            raise ValueError("Soteria prunes a gradient: use update fedsgd (--update fedsgd)")
        if self.adversarial_eps is not None and (self.soteria_layer is not None or self.ats is not None):
            raise ValueError("an adversarially training client (adversarial_eps, --adversarial-eps) takes no Soteria "
                             "(--soteria-layer) or ATS (--ats) here")
        return self

    @property
    def adversarial(self) -> AdversarialConfig | None:
        return None if self.adversarial_eps is None else AdversarialConfig(eps=self.adversarial_eps)


@dataclass
class Capture:
    """The captured round: the server's side (spec, state, metadata, capabilities, defense, updates)
    and the client's truth (images, labels; ``labels[i]`` belongs to ``updates[i]``; an ATS client's images are
    the augmented ones its updates were computed on)."""

    config: CaptureConfig
    spec: ModelSpec
    state: dict[str, torch.Tensor]
    metadata: UpdateMetadata
    capabilities: Capabilities
    defense: str | None
    updates: list[ClientUpdate]
    labels: list[torch.Tensor]
    images: torch.Tensor  # (num_images, C, S, S) in [0, 1]
    truth_labels: torch.Tensor  # (num_images,)
    kept: list[float]  # each update's cosine with the client's true one (1 without a defense)

    @property
    def provenance(self) -> dict:
        return {"capture": self.config.model_dump(mode="json"), "dataset": self.config.data,
                "update_cosine": self.kept}


def defenses_text(config: dict) -> str | None:
    """The client's defenses in a capture config (as results.json records it), for a title: the chain, ATS's
    policy, Soteria's layer and rate; None without any."""
    parts = [config.get("defense")]
    if config.get("ats"):
        parts.append(f"ATS {config['ats']}")
    if config.get("soteria_layer"):
        parts.append(f"Soteria {config['soteria_layer']} {config.get('soteria_rate', 0.8):g}")
    return ", ".join(p for p in parts if p) or None


def has_batchnorm(config: CaptureConfig) -> bool:
    """Whether ``config``'s network normalises with BatchNorm (built on the meta device: no memory, no draw)."""
    spec = ModelSpec(name=config.model, num_classes=2, in_channels=1, image_size=config.image_size,
                     width=config.width, mean=(0.0,), std=(1.0,))
    with torch.device("meta"):
        return bool(batchnorm_layers(build_model(spec)))


def capture(config: CaptureConfig, progress: ProgressFn | None = None) -> Capture:
    """Compute the (defended) client updates of ``config``; same config, same tensors. ``progress`` is told of
    the ``train_steps``."""
    if config.num_images % config.batch_size:
        raise LeaklabError(f"--num-images {config.num_images} is not a multiple of --batch-size "
                           f"{config.batch_size}; each update covers one batch")
    chain = parse_defense(config.defense)
    if config.update == "fedsgd" and config.local_steps != 1:
        raise LeaklabError("--local-steps applies to FedAvg updates; add --update fedavg")
    batch = load_images(config.data, config.num_images, config.image_size, seed=config.image_seed,
                        offset=config.image_offset)
    spec = ModelSpec(name=config.model, num_classes=batch.num_classes,
                     in_channels=batch.images.shape[1], image_size=config.image_size,
                     width=config.width, mean=batch.mean, std=batch.std)
    model = build_model(spec, seed=config.seed)
    if config.soteria_layer is not None:
        linear_layer(model, config.soteria_layer)  # a layer the network lacks: refused before any training
    ats = private_ats = None
    if config.ats is not None:  # the client's own draws: neither the server's initialisation nor the defense's;
        policy = parse_policy(config.ats)  # the private images' own stream, the same whatever the training drew
        training_draws, private_draws = (seeds.generator(config.seed, seeds.AUGMENT, i) for i in (0, 1))
        ats = lambda images: augment(images, policy, training_draws)  # noqa: E731
        private_ats = lambda images: augment(images, policy, private_draws)  # noqa: E731
    if config.train_steps:
        used = config.image_offset + config.num_images
        available = _POOL_SIZES.get(config.data, 10**9) - used
        if available < 1:
            raise LeaklabError(f"{config.data} has no images left to train on beside the client's "
                               f"{used}; lower --num-images or use --train-steps 0")
        pool = load_images(config.data, min(_TRAIN_POOL, available), config.image_size,
                           seed=config.image_seed, offset=used)
        apart = ~among(pool.images, batch.images)  # photos' draws may share a client's image: never trained on
        train_steps(model, pool.images[apart], pool.labels[apart], config.train_steps, seed=config.seed,
                    adversarial=config.adversarial, progress=progress, augment=ats)
    model.eval()
    # an ATS client's update is of its augmented images
    private = batch.images if private_ats is None else private_ats(batch.images)

    generator = seeds.generator(config.seed, seeds.DEFENSE)
    b = config.batch_size
    updates, labels, kept = [], [], []
    for start in range(0, config.num_images, b):
        x, y = private[start:start + b], batch.labels[start:start + b]
        if config.update == "fedsgd":
            clean = fedsgd_update(model, x, y, train_mode=config.bn_stats == "batch", adversarial=config.adversarial)
        else:
            clean = fedavg_update(model, x, y, local_lr=config.local_lr, local_steps=config.local_steps,
                                  train_mode=config.bn_stats == "batch", adversarial=config.adversarial)
        if not all(bool(torch.isfinite(t).all()) for t in clean.tensors.values()):  # written, then refused on load
            if config.update == "fedsgd":
                raise LeaklabError("the client's gradient is not finite (NaN or Inf): the network diverged in its "
                                   "--train-steps; capture with fewer")
            raise LeaklabError(f"the client's update is not finite (NaN or Inf): its {config.local_steps} local "
                               f"steps at --local-lr {config.local_lr:g} diverged; lower --local-lr")
        sent = clean if config.soteria_layer is None else apply_soteria(clean, model, config.soteria_layer, x,
                                                                           config.soteria_rate)
        updates.append(chain.apply(sent, generator))
        kept.append(update_cosine(clean.tensors, updates[-1].tensors))
        labels.append(y.clone())
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return Capture(config=config, spec=spec, state=state, metadata=updates[0].metadata,
                   capabilities=Capabilities(knows_labels=config.knows_labels), defense=chain.spec,
                   updates=updates, labels=labels, images=private, truth_labels=batch.labels, kept=kept)


def write(result: Capture, folder: Path) -> None:
    """Write ``result`` as a case folder (not atomically: see :func:`run`)."""
    write_case(folder, result.spec, result.state, result.metadata, result.capabilities,
               result.defense, result.updates, result.labels, result.images, result.truth_labels,
               provenance=result.provenance)


def run(config: CaptureConfig, out: Path, progress: ProgressFn | None = None) -> Capture:
    """``leaklab capture``: capture and write the case folder ``out`` atomically."""
    with atomic_dir(out, VIEW_FORMAT) as tmp:
        result = capture(config, progress)
        write(result, tmp)
    return result
