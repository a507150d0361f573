"""Gradient inversion as one call: ``invert(view, updates, config)`` (seed 001, Algorithm 1).

The attack reads only the server's view and the client updates. Labels come from the view when the
capability ``knows_labels`` grants them, otherwise from the last layer's update (iDLG for one image,
for a batch the classes whose last-layer row holds a negative entry: :mod:`.labels`). Several updates of the
same round are reconstructed together, each with ``config.restarts`` random starts; the start with the lowest
final loss is kept. The tensors ``config.drop`` names are left out of the comparison (seed 001's attack on Soteria).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from leaklab.attacks.inversion.config import InversionConfig
from leaklab.attacks.inversion.labels import recover_labels
from leaklab.attacks.inversion.objectives import Objective, layer_weights
from leaklab.attacks.inversion.optimize import InversionLoop, Progress
from leaklab.attacks.inversion.simulate import make_simulator
from leaklab.defenses import parse_defense
from leaklab.device import default_device, repeatable
from leaklab.errors import LeaklabError
from leaklab.threat import ClientUpdate, ServerView

MAX_BATCH = 256
TINY_NOISE = 1e-15  # a defense's noise scale under which a diverged Bayes attack is told its objective overflowed


@dataclass
class Reconstruction:
    """What an attack recovered for one client update."""

    images: torch.Tensor  # (B, C, H, W), pixels clipped to [0, 1]
    labels: torch.Tensor  # (B,)
    loss: float
    iterations: int
    evaluations: int
    seconds: float
    history: list[tuple[int, float]] = field(default_factory=list)


def _labels_for(view: ServerView, update: ClientUpdate, batch_size: int) -> torch.Tensor:
    if view.labels is not None:
        return view.labels.clone()
    return recover_labels(view.model, update, batch_size)


def _kept_tensors(names: list[str], drop: list[str]) -> list[int]:
    """The positions, among the update's tensors ``names``, of those the data term compares (all but ``drop``)."""
    unknown = [n for n in drop if n not in names]
    if unknown:
        raise LeaklabError(f"--drop {unknown[0]!r} names no parameter of this network; it has {', '.join(names)}")
    kept = [i for i, n in enumerate(names) if n not in drop]
    if not kept:
        raise LeaklabError("--drop leaves no parameter to compare: drop fewer")
    return kept


class _Kept:
    """A simulator whose updates hold only the tensors at positions ``kept`` (the others are dropped from the data
    term: :attr:`~leaklab.attacks.inversion.config.InversionConfig.drop`)."""

    def __init__(self, simulator: Callable[[torch.Tensor, torch.Tensor], list[torch.Tensor]], kept: list[int]):
        self.simulator, self.kept = simulator, kept

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
        updates = self.simulator(images, labels)
        return updates if len(self.kept) == len(updates) else [updates[i] for i in self.kept]


def invert(view: ServerView, updates: ClientUpdate | list[ClientUpdate], config: InversionConfig,
           progress: Progress | None = None, device: torch.device | None = None,
           on_step: Callable[[int, torch.Tensor], None] | None = None) -> list[Reconstruction]:
    """Reconstruct the private batch behind each update (all from the same round and model). ``on_step(iteration,
    images)``, if given, sees every instance's images (updates x restarts, restart-minor; (R, batch, C, H, W), in
    [0, 1]) after each Adam step (:meth:`InversionLoop.run`)."""
    updates = [updates] if isinstance(updates, ClientUpdate) else list(updates)
    if not updates:
        raise LeaklabError("no update to attack")
    meta = updates[0].metadata
    for u in updates:
        u.validate_against(view.model)
        if u.metadata != meta:
            raise LeaklabError("updates attacked together must share their metadata (kind, batch size, steps)")
    batch = view.batch_size
    if batch != meta.batch_size:
        raise LeaklabError(f"the view declares batch size {batch}, the update {meta.batch_size}")
    if not 1 <= batch <= MAX_BATCH:
        raise LeaklabError(f"batch size {batch} is outside what this attack handles (1..{MAX_BATCH})")
    if view.labels is not None and len(updates) > 1:
        raise LeaklabError("known labels belong to one update; attack updates with known labels one at a time")
    defense = parse_defense(view.known_defense() if config.objective == "bayes" else None)
    device = device or default_device()
    with repeatable(device):  # the same seed, the same numbers on CUDA too
        model = view.model.to(device)

        restarts = config.restarts
        labels = torch.stack([_labels_for(view, u, batch) for u in updates])
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        kept = _kept_tensors(names, config.drop)
        observed = [torch.stack([t for t in ts for _ in range(restarts)]).to(device)
                    for i, ts in enumerate(zip(*(u.ordered(model) for u in updates))) if i in kept]
        instance_labels = labels.repeat_interleave(restarts, 0)
        c, s = view.spec.in_channels, view.spec.image_size
        mean = torch.tensor(view.spec.mean).view(1, 1, c, 1, 1)
        std = torch.tensor(view.spec.std).view(1, 1, c, 1, 1)

        simulator = _Kept(make_simulator(model, meta, precision=config.precision), kept)
        weighting = config.layer_weighting if len(kept) == len(names) else \
            [w for i, w in enumerate(layer_weights(len(names), config.layer_weighting)) if i in kept]
        objective = Objective(config.objective, observed, defense, weighting)
        loop = InversionLoop(config, simulator, objective, instance_labels, (batch, c, s, s), mean, std, device)
        result = loop.run(progress, on_step)

    out = []
    for i in range(len(updates)):
        losses = result.losses[i * restarts:(i + 1) * restarts]
        best = i * restarts + int(torch.argmin(torch.nan_to_num(losses, nan=float("inf"))))
        if not torch.isfinite(result.images[best]).all():
            largest = max(float(t.abs().max()) for t in updates[i].tensors.values())
            scale = None if defense.noise is None else defense.noise.scale
            if scale is not None and scale < TINY_NOISE:  # the likelihood's 1/σ² overflows float32, whatever the lr
                # behind noise alone the Bayes objective is L2 (L1) up to its scale; behind prune, clip or topk not
                alone = "attack with --objective l2 (l1 behind Laplace noise), the same objective there up to its scale"
                chain = f"behind {defense.spec} no other objective is the same attack (l2 or cosine leave it out)"
                instead = alone if len(defense.steps) == 1 else chain
                raise LeaklabError(f"the attack diverged: behind noise of scale {scale:g} the Bayes objective "
                                   f"overflows float32; {instead}")
            raise LeaklabError(f"the attack diverged: its reconstruction is not finite (the update's largest entry "
                               f"is {largest:.3g}); lower --lr, or check how the update was made")
        out.append(Reconstruction(images=result.images[best].clamp(0, 1), labels=labels[i].cpu(),
                                  loss=float(result.losses[best]), iterations=result.iterations,
                                  evaluations=result.evaluations, seconds=result.seconds,
                                  history=result.history))
    return out
