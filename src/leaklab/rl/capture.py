"""Federated capture of a robot's private transitions as client updates (seed 000 sections III, V).

A client trains the perception network of :mod:`leaklab.models.perception` in its own room and
shares one FedSGD gradient per step. With batch size 1 this is the single-sample gradient that seed
000 inverts ("Gradients were calculated for individual data samples fed into an initialized
network", section V); batch 2 is the other size its rule-based action recovery covers (IV-C1).

* :func:`collect_transitions` runs the real environment in several layouts and keeps transitions
  spread over the rooms and over the time steps of the episodes.
* :func:`dqn_client_update` / :func:`reinforce_client_update` compute the shared gradient and the
  client's truth (state, action, supervision signal) that an attack should recover.
* :func:`client_rounds` does all of it for a :class:`RoomCaptureConfig`, and :func:`capture_rooms`
  writes its rounds as case folders (``leaklab env capture``).
* :func:`write_room_case` / :func:`load_room_case` / :func:`load_room_truth` (from
  :mod:`leaklab.rl.cases`) store a round in the case-folder format of :mod:`leaklab.cases`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from leaklab import seeds
from leaklab.defenses import parse_defense
from leaklab.device import one_thread
from leaklab.errors import LeaklabError
from leaklab.fields import DefenseOption, EntropyWeight, EpisodeSteps, Seed
from leaklab.io import CAPTURE_JSON, ROOM_CAPTURE_FORMAT, ROOM_CAPTURE_VERSION, atomic_dir, check_out, write_json
from leaklab.metrics.vectors import update_cosine
from leaklab.models import PerceptionNet, PerceptionSpec, build_perception_net
from leaklab.models.perception import check_forward
from leaklab.names import MAX_TRAIN_STEPS, POLICY_NAMES, RL_ALGORITHM_NAMES
from leaklab.rl.agents import (DQNConfig, ReinforceConfig, epsilon_greedy, td_targets, train_dqn,
                               train_reinforce)
from leaklab.rl.agents.common import Rooms, RoomSpec, observation_tensors
from leaklab.rl.agents.reinforce import discounted_returns
from leaklab.rl.cases import RoomCase, load_room_case, load_room_truth, write_room_case
from leaklab.rl.envs.contact_sheet import Frame, frame_sheet
from leaklab.rl.envs.layouts import LayoutNames
from leaklab.rl.losses import dqn_loss, reinforce_loss
from leaklab.threat import ClientUpdate, UpdateMetadata

MAX_BATCH = 256
CAPTURE_PNG = "capture.png"  # the first SHEET_FRAMES private states of a capture
SHEET_FRAMES = 16

__all__ = ["ClientRound", "RoomCaptureConfig", "RoomCase", "Transition", "capture_rooms", "client_rounds",
           "collect_transitions", "defended", "dqn_client_update", "load_room_case", "load_room_truth",
           "partly_trained_net", "reinforce_client_update", "target_copy", "write_room_case"]


@dataclass(frozen=True)
class Transition:
    """One step ``(s_t, a_t, r_t, s_{t+1})`` of a private episode, as float32 tensors from the
    environment: ``rgb`` ``[3, S, S]``, ``depth`` ``[1, S, S]``, ``box`` ``[4]``. ``done`` is True
    when the episode terminated at this step (no bootstrap); ``ret`` is the discounted return
    ``R_t`` from this step to the end of the episode; ``step`` is ``t``."""

    rgb: torch.Tensor
    depth: torch.Tensor
    box: torch.Tensor
    action: int
    reward: float
    next_rgb: torch.Tensor
    next_depth: torch.Tensor
    next_box: torch.Tensor
    done: bool
    layout: str
    step: int
    ret: float


def _state(obs: dict[str, np.ndarray]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return tuple(torch.as_tensor(np.array(obs[k], dtype=np.float32)) for k in ("rgb", "depth", "box"))


def collect_transitions(layouts: Sequence[str] | None = None, samples: int = 1,
                        spec: PerceptionSpec | None = None, seed: int = 0,
                        policy: PerceptionNet | None = None, epsilon: float = 0.1,
                        warmup_steps: int = 0, gamma: float = 0.99, max_episode_steps: int = 50,
                        on_episode: Callable[[int], None] | None = None) -> list[Transition]:
    """``samples`` private transitions, one per episode, layouts taken in turn (round robin);
    ``on_episode(n)`` hears how many episodes are done (0 at the start).

    Each episode starts from a reset seed drawn from ``seed`` and runs to its end with a uniformly
    random policy (``policy=None``) or ε-greedy on ``policy``'s outputs; its transition is drawn
    uniformly from steps ``warmup_steps .. T−1`` (the last step when the episode is shorter), so the
    samples spread over the time steps of the episodes, not only the reset views.
    """
    spec = spec or PerceptionSpec()
    if samples < 1:
        raise LeaklabError(f"samples must be at least 1 (got {samples})")
    if warmup_steps < 0 or warmup_steps >= max_episode_steps:
        raise LeaklabError(f"warmup_steps {warmup_steps} must lie in 0..{max_episode_steps - 1} "
                           "(max_episode_steps)")
    if policy is not None and policy.spec != spec:
        raise LeaklabError("the policy network's spec differs from spec; pass the network's own spec")
    rng = np.random.default_rng(seed)
    out = []
    if on_episode:
        on_episode(0)
    with Rooms(tuple(layouts) if layouts is not None else None, spec.image_size,
               max_episode_steps) as rooms:
        for i in range(samples):
            layout = rooms.layouts[i % len(rooms.layouts)]
            env = rooms.env(layout)
            raw, _ = env.reset(seed=int(rng.integers(2**31 - 1)))
            episode, done = [], False
            while not done:
                state = _state(raw)
                if policy is None:
                    action = int(rng.integers(spec.num_actions))
                else:
                    action = epsilon_greedy(policy, *observation_tensors(raw, spec.setting), epsilon, rng)
                raw, reward, terminated, truncated, _ = env.step(action)
                episode.append((state, action, float(reward), _state(raw), bool(terminated)))
                done = terminated or truncated
            returns = discounted_returns([e[2] for e in episode], gamma)
            t = int(rng.integers(min(warmup_steps, len(episode) - 1), len(episode)))
            (rgb, depth, box), action, reward, (n_rgb, n_depth, n_box), terminated = episode[t]
            out.append(Transition(rgb=rgb, depth=depth, box=box, action=action, reward=reward,
                                  next_rgb=n_rgb, next_depth=n_depth, next_box=n_box, done=terminated,
                                  layout=layout, step=t, ret=float(returns[t])))
            if on_episode:
                on_episode(i + 1)
    return out


def _batch(spec: PerceptionSpec, transitions: Sequence[Transition]) -> dict[str, torch.Tensor]:
    if not 1 <= len(transitions) <= MAX_BATCH:
        raise LeaklabError(f"a client update covers 1..{MAX_BATCH} transitions (got {len(transitions)})")
    s = spec.image_size
    for tr in transitions:
        if tuple(tr.depth.shape) != (1, s, s) or tuple(tr.rgb.shape) != (3, s, s) or \
                tuple(tr.box.shape) != (spec.box_dim,):
            raise LeaklabError(f"transition images are {tuple(tr.rgb.shape)}/{tuple(tr.depth.shape)}, the "
                               f"network expects {s}x{s}; collect them with the network's spec")
        if not 0 <= tr.action < spec.num_actions:
            raise LeaklabError(f"action {tr.action} is outside 0..{spec.num_actions - 1}")

    def stack(name: str) -> torch.Tensor:
        return torch.stack([getattr(tr, name) for tr in transitions])

    rgb, depth, next_rgb, next_depth = stack("rgb"), stack("depth"), stack("next_rgb"), stack("next_depth")
    two = spec.setting == "S1"
    return {"images": torch.cat([rgb, depth], dim=1) if two else depth, "rgb": rgb, "depth": depth,
            "box": stack("box"),
            "next_images": torch.cat([next_rgb, next_depth], dim=1) if two else next_depth,
            "next_box": stack("next_box"),
            "action": torch.tensor([tr.action for tr in transitions], dtype=torch.long),
            "reward": torch.tensor([tr.reward for tr in transitions], dtype=torch.float32),
            "done": torch.tensor([float(tr.done) for tr in transitions], dtype=torch.float32)}


def _gradient(net: PerceptionNet, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    named = [(n, p) for n, p in net.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [p for _, p in named])
    return {n: g.detach() for (n, _), g in zip(named, grads)}  # fresh tensors: no copy needed


def _state_truth(spec: PerceptionSpec, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    keys = ("images", "rgb", "depth", "box", "action") if spec.setting == "S1" else \
        ("images", "depth", "box", "action")
    return {k: batch[k].clone() for k in keys}


def dqn_client_update(net: PerceptionNet, target_net: PerceptionNet, transitions: Sequence[Transition],
                      gamma: float = 0.99) -> tuple[ClientUpdate, dict[str, torch.Tensor]]:
    """The FedSGD gradient of :func:`dqn_loss` on ``transitions`` with the target
    ``Q = r + γ (1 − done) max_a' Q_target(s', a')``, and the truth: the state (``images``, ``rgb``
    in S1, ``depth``, ``box``), ``action``, ``reward``, ``q_pred`` ``Q̂(s, a)`` and ``q_target``."""
    if not 0 <= gamma <= 1:  # NaN too: an update of NaN gradients
        raise LeaklabError(f"gamma must lie in [0, 1] (got {gamma})")
    spec = net.spec
    batch = _batch(spec, transitions)
    q_target = td_targets(target_net, batch["reward"], batch["next_images"], batch["next_box"],
                          batch["done"], gamma)
    q_values = net(batch["images"], batch["box"])
    grads = _gradient(net, dqn_loss(q_values, batch["action"], q_target))
    meta = UpdateMetadata(kind="fedsgd", batch_size=len(transitions), loss="dqn_mse", train_mode=True)
    truth = _state_truth(spec, batch)
    truth.update(reward=batch["reward"].clone(), q_target=q_target.clone(),
                 q_pred=q_values.detach().gather(1, batch["action"].view(-1, 1)).squeeze(1))
    return ClientUpdate(metadata=meta, tensors=grads), truth


def reinforce_client_update(net: PerceptionNet, transitions: Sequence[Transition],
                            returns: torch.Tensor | Sequence[float] | None = None,
                            entropy_weight: float = 0.01) -> tuple[ClientUpdate, dict[str, torch.Tensor]]:
    """The FedSGD gradient of :func:`reinforce_loss` (eq. 4) on ``transitions`` weighted by
    ``returns`` (default: each transition's discounted return ``R_t``), and the truth: the state,
    ``action``, ``reward`` (the return ``R`` that weights ``log π(a|s)``) and ``probs`` ``π(·|s)``."""
    spec = net.spec
    batch = _batch(spec, transitions)
    if returns is None:
        returns = [tr.ret for tr in transitions]
    returns = torch.as_tensor(returns, dtype=torch.float32).reshape(-1)
    if len(returns) != len(transitions) or not torch.isfinite(returns).all():
        raise LeaklabError(f"returns must hold one finite value per transition ({len(transitions)})")
    if not (entropy_weight >= 0 and math.isfinite(entropy_weight)):  # NaN failed after the gradient, in pydantic
        raise LeaklabError(f"entropy_weight must be a finite number >= 0 (got {entropy_weight})")
    logits = net(batch["images"], batch["box"])
    grads = _gradient(net, reinforce_loss(logits, batch["action"], returns, entropy_weight))
    meta = UpdateMetadata(kind="fedsgd", batch_size=len(transitions), loss="reinforce",
                          entropy_weight=entropy_weight, train_mode=True)
    truth = _state_truth(spec, batch)
    truth.update(reward=returns.clone(), probs=torch.softmax(logits.detach(), dim=1))
    return ClientUpdate(metadata=meta, tensors=grads), truth


def partly_trained_net(algorithm: Literal[RL_ALGORITHM_NAMES], spec: PerceptionSpec, steps: int,
                       layouts: Sequence[str] | None = None, seed: int = 0,
                       model_class: str | None = None,
                       on_step: Callable[[int], None] | None = None, *,
                       gamma: float = ReinforceConfig.model_fields["gamma"].default,
                       max_episode_steps: int = ReinforceConfig.model_fields["max_episode_steps"].default,
                       entropy_weight: float = ReinforceConfig.model_fields["entropy_weight"].default,
                       ) -> PerceptionNet:
    """The network a capture attacks: initialised with ``seed`` (``steps=0``), or partly trained by a
    short :func:`train_dqn` / :func:`train_reinforce` run of ``steps`` environment steps (``on_step(n)``
    hears how many are done) with the round's discount ``gamma``, episode length and (REINFORCE) entropy weight
    (until session 52 the agents' defaults, whatever the capture's); ``model_class`` ("module:Class"): a user's
    own perception network instead of leaklab's. DQN's batch is at most ``steps`` transitions: with its 32 the
    first update came after 32 steps, and 1 to 31 steps left the network as initialised."""
    if steps < 0:
        raise LeaklabError(f"steps must be >= 0 (got {steps})")
    if algorithm not in RL_ALGORITHM_NAMES:
        raise LeaklabError(f"unknown algorithm {algorithm!r}; choose dqn or reinforce")
    if steps == 0:
        return build_perception_net(spec, seed=seed, model_class=model_class)
    # the agents build leaklab's network themselves (from the same seed); a user's class is built here
    own = build_perception_net(spec, seed=seed, model_class=model_class) if model_class else None
    common = dict(spec=spec, layouts=tuple(layouts) if layouts is not None else None, steps=steps, seed=seed,
                  gamma=gamma, max_episode_steps=max_episode_steps)
    progress = (lambda done, total, stats: on_step(done)) if on_step else None  # noqa: E731
    if algorithm == "dqn":
        config = DQNConfig(**common, batch_size=min(DQNConfig.model_fields["batch_size"].default, steps),
                           learning_starts=min(200, steps // 4), eps_decay_steps=max(1, steps // 2))
        net = train_dqn(config, progress, net=own)[0]
    else:
        net = train_reinforce(ReinforceConfig(**common, entropy_weight=entropy_weight), progress, net=own)[0]
    if on_step:  # the agents report at the ends of episodes; the last one may end after the budget
        on_step(steps)
    if model_class:  # what the class computes may have moved with its weights (a trained output scale)
        check_forward(net, spec, f"--model-class {model_class} after {steps} training steps")
    return net


def target_copy(net: PerceptionNet) -> PerceptionNet:
    """A frozen copy of ``net`` to serve as the target network of a freshly synchronised round."""
    return copy.deepcopy(net).requires_grad_(False)



class RoomCaptureConfig(BaseModel):
    """A capture of ``samples`` client updates of ``batch_size`` private transitions each (seed 000
    section V: single-sample gradients of an initialised network, ``train_steps=0``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    algorithm: Literal[RL_ALGORITHM_NAMES] = "dqn"
    spec: RoomSpec = PerceptionSpec(setting="S1")
    layouts: LayoutNames = Field(default=None, description="room layouts; None: all of them")
    samples: int = Field(default=4, ge=1, le=10_000, description="client updates, one case folder each")
    batch_size: int = Field(default=1, ge=1, le=MAX_BATCH)
    train_steps: int = Field(default=0, ge=0, le=MAX_TRAIN_STEPS,
                             description="0: initialised network; else partly trained")
    policy: Literal[POLICY_NAMES] = Field(default="random", description="who acts in the private "
                                                                           "episodes (agent: ε-greedy)")
    epsilon: float = Field(default=0.1, ge=0, le=1)
    warmup_steps: int = Field(default=0, ge=0)
    max_episode_steps: EpisodeSteps = 50
    gamma: float = Field(default=0.99, ge=0, le=1)
    entropy_weight: EntropyWeight = Field(default=0.01, description="α of eq. 4 (REINFORCE)")
    defense: DefenseOption = Field(default=None, description="defense chain the clients apply")
    model_class: str | None = Field(default=None, description="a user's own perception network "
                                                              "(package.module:Class); None: leaklab's")
    seed: Seed = 0

    @model_validator(mode="after")
    def _warmup_in_the_episode(self) -> "RoomCaptureConfig":
        if self.warmup_steps >= self.max_episode_steps:
            raise ValueError(f"warmup_steps {self.warmup_steps} must be under max_episode_steps "
                             f"{self.max_episode_steps}")
        return self


@dataclass(frozen=True)
class ClientRound:
    """One client update of a capture: the transitions it covers, the update the server receives
    and the client's truth (as :func:`dqn_client_update` / :func:`reinforce_client_update` give it)."""

    transitions: tuple[Transition, ...]
    update: ClientUpdate
    truth: dict[str, torch.Tensor]
    kept: float  # the cosine of ``update`` with the client's true one (below 1 behind a defense)

    @property
    def layouts(self) -> list[str]:
        return [t.layout for t in self.transitions]


@one_thread()
def defended(update: ClientUpdate, defense: str | None, seed: int, index: int) -> ClientUpdate:
    """``update`` behind the client's ``defense`` chain (None: as it is), its noise drawn from
    ``seed``'s defense stream for the update's ``index`` (:mod:`leaklab.seeds`), so that every defense level of an experiment sees the same
    draws for an update; on one torch thread (:func:`leaklab.device.one_thread`: a clipping norm's
    rounding does not depend on the caller's thread count)."""
    if not defense:
        return update
    return parse_defense(defense).apply(update, seeds.generator(seed, seeds.DEFENSE, index))


@one_thread()
def client_rounds(config: RoomCaptureConfig, on_episode: Callable[[int], None] | None = None,
                  on_train_step: Callable[[int], None] | None = None,
                  ) -> tuple[dict[str, torch.Tensor], list[ClientRound]]:
    """The state of the network the clients share (:func:`partly_trained_net` of ``config.seed``;
    DQN's target network is its copy; ``on_train_step(n)`` hears how many of its training steps are
    done) and ``config.samples`` rounds of ``config.batch_size`` private transitions each, the updates
    behind ``config.defense``; ``on_episode(n)`` hears how many of the private episodes are done. It
    runs on one torch thread (:func:`leaklab.device.one_thread`), as the command line does: the same
    config gives the same updates bit for bit whatever thread count the caller set. A network with state besides
    its weights (a user's BatchNorm statistics) is sent as training left it: the forwards of the clients' acting
    and updates move it, so each round starts again from the state sent (until session 54 every case's model
    file held the statistics of every round's private states)."""
    spec = config.spec
    net = partly_trained_net(config.algorithm, spec, config.train_steps, config.layouts, config.seed,
                             config.model_class, on_train_step, gamma=config.gamma,
                             max_episode_steps=config.max_episode_steps, entropy_weight=config.entropy_weight)
    sent = {k: v.detach().clone() for k, v in net.state_dict().items()}
    transitions = collect_transitions(config.layouts, config.samples * config.batch_size, spec,
                                      seed=config.seed, policy=net if config.policy == "agent" else None,
                                      epsilon=config.epsilon, warmup_steps=config.warmup_steps,
                                      gamma=config.gamma, max_episode_steps=config.max_episode_steps,
                                      on_episode=on_episode)
    net.load_state_dict(sent)
    target = target_copy(net) if config.algorithm == "dqn" else None
    rounds = []
    for i in range(config.samples):
        batch = tuple(transitions[i * config.batch_size:(i + 1) * config.batch_size])
        if target is not None:
            update, truth = dqn_client_update(net, target, batch, config.gamma)
        else:
            update, truth = reinforce_client_update(net, batch, entropy_weight=config.entropy_weight)
        net.load_state_dict(sent)
        behind = defended(update, config.defense, config.seed, i)
        rounds.append(ClientRound(batch, behind, truth, update_cosine(update.tensors, behind.tensors)))
    return sent, rounds


def capture_rooms(config: RoomCaptureConfig, out: Path, on_episode: Callable[[int], None] | None = None,
                  on_train_step: Callable[[int], None] | None = None) -> list[Path]:
    """Write :func:`client_rounds` as one room case per update under ``out`` (``out/0000``,
    ``out/0001``, ...), ``out/capture.json`` with the config and ``out/capture.png`` with the first
    private states (what the state holds: RGB in S1, depth, the box); returns the case folders. The
    folder is written atomically: an earlier capture there is replaced whole (no stale cases), a
    folder leaklab did not write is refused."""
    out = Path(out)
    check_out(out, ROOM_CAPTURE_FORMAT)  # before the minutes of capture
    state, rounds = client_rounds(config, on_episode, on_train_step)
    names = [f"{i:04d}" for i in range(len(rounds))]
    with atomic_dir(out, ROOM_CAPTURE_FORMAT) as tmp:
        for i, (name, r) in enumerate(zip(names, rounds)):
            provenance = {"capture": config.model_dump(mode="json"), "index": i, "layouts": r.layouts,
                          "steps": [t.step for t in r.transitions], "update_cosine": [r.kept]}
            write_room_case(tmp / name, config.spec, state, r.update, r.truth, provenance, config.model_class)
        write_json(tmp / CAPTURE_JSON, {"format": ROOM_CAPTURE_FORMAT, "format_version": ROOM_CAPTURE_VERSION,
                                        "config": config.model_dump(mode="json"),
                                        "cases": names})
        frame_sheet(tmp / CAPTURE_PNG, _sheet_frames(names, rounds, config.spec.setting,
                                                     config.algorithm == "reinforce"))
    return [out / name for name in names]


def _sheet_frames(names: Sequence[str], rounds: Sequence[ClientRound], setting: str, reinforce: bool) -> list[Frame]:
    """The first :data:`SHEET_FRAMES` private states as the network sees them (RGB in S1 only; the
    box where the target is in view, an all-zero box where it is not), titled with the action and the
    truth's ``reward``: the step's reward for DQN, the discounted return that weights ``log π`` for
    REINFORCE (``reinforce``)."""
    frames = []
    for name, r in zip(names, rounds):
        for k, t in enumerate(r.transitions):
            label = f"{name}/{k}" if len(r.transitions) > 1 else name
            reward = f"return {t.ret:.2f}" if reinforce else f"reward {t.reward:.2f}"
            frames.append(Frame(f"{label} {t.layout}\naction {t.action}, {reward}",
                                t.rgb.numpy() if setting == "S1" else None, t.depth.numpy(),
                                t.box.numpy()))
    return frames[:SHEET_FRAMES]
