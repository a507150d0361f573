"""Field types the configurations share, checked without loading torch (the command line checks its
options with them while it parses)."""

import math
from typing import Annotated, Optional

from pydantic import AfterValidator, Field

from leaklab.errors import LeaklabError
from leaklab.names import DEFENSE_NAMES

MAX_SEED = 2**32 - 1  # the widest range every generator leaklab seeds takes (ViZDoom's is 32-bit)
Seed = Annotated[int, Field(ge=0, le=MAX_SEED, description=f"0 to {MAX_SEED}")]
MAX_ENTROPY_WEIGHT = 1e6  # REINFORCE's α (eq. 4): 1e39 made a float32 update infinite, refused after the capture
EntropyWeight = Annotated[float, Field(ge=0, le=MAX_ENTROPY_WEIGHT)]
EpisodeSteps = Annotated[int, Field(ge=1, le=10_000)]  # an episode's most environment steps (training, capture)


def _epsilon_grid(v: list[float]) -> list[float]:
    if any(not 0 < e <= 1000 for e in v) or len(set(v)) != len(v):
        raise ValueError("epsilons are distinct values in (0, 1000]")
    return sorted(v)


EpsilonGrid = Annotated[list[float], AfterValidator(_epsilon_grid), Field(min_length=1)]  # an experiment's budgets


def _distinct_positive(v: list) -> list:
    if any(x <= 0 for x in v) or len(set(v)) != len(v):
        raise ValueError("values are distinct and positive")
    return sorted(v)


PositiveGrid = Annotated[list[float], AfterValidator(_distinct_positive)]  # an experiment's grid, sorted
PositiveCounts = Annotated[list[int], AfterValidator(_distinct_positive)]  # the same of whole numbers


NOISES = ("gaussian", "laplace")
MAX_NOISE_SCALE = 1e6  # per gradient entry; 1e39 made float32 updates infinite, caught only when attacked
MAX_DEFENSE_STEPS = 16  # a chain of 20,000 steps in a case's view.json took 80 s and 2 GB to attack (its title)


def defense_steps(spec: str | None) -> tuple[tuple[str, float], ...]:
    """The steps of a defense chain such as ``"prune:0.5,gaussian:0.1"``, as ``(name, value)`` pairs
    in order (none for None, ``""`` or ``"none"``); raises :class:`LeaklabError` naming the bad part.
    :func:`leaklab.defenses.parse_defense` builds the chain from them."""
    if spec is None or spec.strip().lower() in ("", "none"):
        return ()
    parts = spec.split(",")
    if len(parts) > MAX_DEFENSE_STEPS:
        raise LeaklabError(f"a defense chain of {len(parts):,} steps; leaklab applies at most {MAX_DEFENSE_STEPS}")
    steps = []
    for part in parts:
        name, _, value = part.strip().partition(":")
        name = name.lower()
        if name not in DEFENSE_NAMES:
            raise LeaklabError(f"unknown defense {name!r}; use a comma-separated chain of "
                               f"{', '.join(n + ':VALUE' for n in DEFENSE_NAMES)}")
        try:
            v = float(value)
        except ValueError:
            raise LeaklabError(f"defense {name!r} needs a number, as in {name}:0.1") from None
        if not math.isfinite(v) or v < 0 or (name in ("prune", "topk") and v >= 1) or \
                (name in ("gaussian", "laplace", "clip") and v == 0) or (name in NOISES and v > MAX_NOISE_SCALE):
            raise LeaklabError(f"defense parameter {part.strip()!r} is out of range (noise scales in (0, "
                               f"{MAX_NOISE_SCALE:g}], clip norms > 0, pruning fractions in [0, 1))")
        steps.append((name, v))
    return tuple(steps)


def checked_defense(spec: str | None) -> str | None:
    """A defense option as configs keep it: None for no defense, else the chain as given once it
    parses (a bad one raises with a message naming the bad part)."""
    return spec if defense_steps(spec) else None


# a config field holding a defense chain, e.g. ``defense: DefenseOption = None``
DefenseOption = Annotated[Optional[str], AfterValidator(checked_defense)]
