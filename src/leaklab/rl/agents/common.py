"""What DQN and REINFORCE share: the configuration core, the rooms, observations as tensors, the
training history and progress reporting (seed 000 section III, "Active Perception Task").

A training run visits several room layouts: every episode draws its layout and its reset seed from
the run's ``numpy`` Generator, so the same seed gives the same episodes, actions and weights.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any

import numpy as np
import torch
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from leaklab.errors import LeaklabError
from leaklab.fields import EpisodeSteps, Seed
from leaklab.names import MAX_TRAIN_STEPS, ROOM_ACTION_NAMES
from leaklab.models import PerceptionNet, PerceptionSpec, stack_images
from leaklab.privacy.dpsgd import DPConfig
from leaklab.rl.envs.layouts import LAYOUTS, LayoutNames, check_layouts

# progress(done_steps, total_steps, stats) after every episode; stats has "episode", "return", "layout"
ProgressFn = Callable[[int, int, dict[str, Any]], None]


def _fits_the_rooms(spec: PerceptionSpec) -> PerceptionSpec:
    if spec.num_actions != len(ROOM_ACTION_NAMES):
        raise ValueError(f"the rooms take {len(ROOM_ACTION_NAMES)} actions; the network gives {spec.num_actions}")
    return spec


RoomSpec = Annotated[PerceptionSpec, AfterValidator(_fits_the_rooms)]  # a network that acts in the rooms


class AgentConfig(BaseModel):
    """Settings every agent shares: network, rooms, budget of environment steps, optimiser, seed, and
    optionally DP-SGD (``privacy``; :mod:`leaklab.rl.agents.private`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    spec: RoomSpec = PerceptionSpec()
    layouts: LayoutNames = Field(default=None, description="room layouts; None: all of them")
    steps: int = Field(default=2000, ge=1, le=MAX_TRAIN_STEPS, description="environment steps to train for")
    max_episode_steps: EpisodeSteps = 50
    lr: float = Field(default=1e-4, gt=0)
    gamma: float = Field(default=0.99, ge=0, le=1)
    seed: Seed = 0
    privacy: DPConfig | None = Field(default=None, description="DP-SGD settings; None: ordinary training")


def check_net(net: PerceptionNet, spec: PerceptionSpec) -> PerceptionNet:
    """``net`` when it was built for ``spec``; else a :class:`LeaklabError`."""
    if net.spec != spec:
        raise LeaklabError(f"the network was built for {net.spec!r}, the config names {spec!r}; "
                           "pass the network's spec in the config")
    return net


class Rooms:
    """One environment per layout, created on first use and kept for the run; ``with Rooms(...) as
    rooms`` closes their ViZDoom engines when the run ends, by an error too (a process killed before
    that leaves them to :mod:`leaklab.rl.envs.engine`'s launcher)."""

    def __init__(self, layouts: tuple[str, ...] | None, image_size: int, max_steps: int):
        self.layouts = check_layouts(layouts) or tuple(LAYOUTS)
        self.image_size, self.max_steps = image_size, max_steps
        self._envs: dict[str, Any] = {}

    def env(self, layout: str):
        if layout not in self._envs:
            from leaklab.rl.envs import ActivePerceptionEnv

            self._envs[layout] = ActivePerceptionEnv(layout=layout, image_size=self.image_size,
                                                     max_steps=self.max_steps)
        return self._envs[layout]

    def draw(self, rng: np.random.Generator) -> tuple[str, int]:
        """A layout and a reset seed for the next episode."""
        return self.layouts[int(rng.integers(len(self.layouts)))], int(rng.integers(2**31 - 1))

    def close(self) -> None:
        for env in self._envs.values():
            if hasattr(env, "close"):
                env.close()
        self._envs.clear()

    def __enter__(self) -> Rooms:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def observation_tensors(obs: dict[str, np.ndarray], setting: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The network's ``images`` ``[C, S, S]`` and ``box`` ``[4]`` of one observation."""
    rgb = torch.as_tensor(np.asarray(obs["rgb"], dtype=np.float32))
    depth = torch.as_tensor(np.asarray(obs["depth"], dtype=np.float32))
    box = torch.as_tensor(np.asarray(obs["box"], dtype=np.float32))
    return stack_images(rgb, depth, setting), box


@dataclass
class TrainHistory:
    """Per-episode returns (undiscounted sums of rewards), lengths and layouts; per-update losses; the
    DP-SGD report of a private run (epsilon spent and its settings, :mod:`leaklab.rl.agents.private`)."""

    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    layouts: list[str] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    env_steps: int = 0
    updates: int = 0
    seconds: float = 0.0
    privacy: dict | None = None

    def end_episode(self, ret: float, length: int, layout: str) -> None:
        self.returns.append(float(ret))
        self.lengths.append(int(length))
        self.layouts.append(layout)

    def summary(self, window: int = 5) -> dict[str, float | int]:
        """Mean return of the first and the last ``window`` episodes, the speed of the run and, when
        private, the epsilon spent at its delta."""
        n = min(window, len(self.returns))
        secs = max(self.seconds, 1e-9)
        spent = {"epsilon": self.privacy["epsilon"], "delta": self.privacy["delta"]} if self.privacy else {}
        return {"episodes": len(self.returns), "env_steps": self.env_steps, "updates": self.updates,
                "first_return": float(np.mean(self.returns[:n])) if n else float("nan"),
                "last_return": float(np.mean(self.returns[-n:])) if n else float("nan"),
                "env_steps_per_s": self.env_steps / secs, "updates_per_s": self.updates / secs, **spent}


@contextlib.contextmanager
def released(rooms: Rooms, private: Any | None) -> Iterator[None]:
    """Close ``rooms`` when the training ends; if it fails, also remove opacus' hooks from the
    network (``private``: the run's private agent or None), so a caller's ``net=`` comes back clean."""
    with rooms:
        try:
            yield
        except BaseException:
            if private is not None:
                private.model.remove_hooks()
            raise


@contextlib.contextmanager
def reporter(progress: bool | ProgressFn | None, total: int, label: str) -> Iterator[ProgressFn]:
    """A progress function: ``progress`` itself, a rich progress bar (``True``) or nothing."""
    if progress is None or progress is False:
        yield lambda done, total_, stats: None
        return
    if callable(progress):
        yield progress
        return
    from rich.progress import Progress

    with Progress(transient=True) as bar:
        task = bar.add_task(label, total=total)

        def update(done: int, total_: int, stats: dict[str, Any]) -> None:
            bar.update(task, completed=done,
                       description=f"{label} ep {stats['episode']} return {stats['return']:.2f}")

        yield update
