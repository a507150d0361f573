"""Federated capture of a robot's private transitions as client updates (seed 000 sections III, V).

A client trains the perception network of :mod:`leaklab.models.perception` in its own room and
shares one FedSGD gradient per step. With batch size 1 this is the single-sample gradient that seed
000 inverts ("Gradients were calculated for individual data samples fed into an initialized
network", section V); batch 2 is the other size its rule-based action recovery covers (IV-C1).

* :func:`collect_transitions` runs the real environment in several layouts and keeps transitions
  spread over the rooms and over the time steps of the episodes.
* :func:`dqn_client_update` / :func:`reinforce_client_update` compute the shared gradient and the
  client's truth (state, action, supervision signal) that an attack should recover.
* :func:`write_room_case` / :func:`load_room_case` / :func:`load_room_truth` store a round in the
  case-folder format of :mod:`leaklab.io` (``view.json`` with ``"model_type": "perception"``,
  ``model.safetensors``, ``update.safetensors``, ``update.json``, and the truth apart in
  ``truth.safetensors``).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import ValidationError

from leaklab.errors import LeaklabError
from leaklab.io import (FORMAT_VERSION, MODEL_FILE, TRUTH_FILE, UPDATE_FILE, UPDATE_JSON, VIEW_FILE,
                        load_tensors, read_json, save_tensors, validation_message, write_json)
from leaklab.models import PerceptionNet, PerceptionSpec, build_perception_net
from leaklab.rl.agents import (DQNConfig, ReinforceConfig, epsilon_greedy, td_targets, train_dqn,
                               train_reinforce)
from leaklab.rl.agents.common import Rooms, check_layouts, observation_tensors
from leaklab.rl.agents.reinforce import discounted_returns
from leaklab.rl.losses import dqn_loss, reinforce_loss
from leaklab.threat import Capabilities, ClientUpdate, ServerView, UpdateMetadata, make_view

MODEL_TYPE = "perception"
TRUTH_FORMAT = "leaklab.room_truth"
MAX_BATCH = 256


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
                        warmup_steps: int = 0, gamma: float = 0.99,
                        max_episode_steps: int = 50) -> list[Transition]:
    """``samples`` private transitions, one per episode, layouts taken in turn (round robin).

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
    rooms = Rooms(check_layouts(tuple(layouts) if layouts is not None else None), spec.image_size,
                  max_episode_steps)
    out = []
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
    rooms.close()
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
    return {n: g.detach().clone() for (n, _), g in zip(named, grads)}


def _state_truth(spec: PerceptionSpec, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    keys = ("images", "rgb", "depth", "box", "action") if spec.setting == "S1" else \
        ("images", "depth", "box", "action")
    return {k: batch[k].clone() for k in keys}


def dqn_client_update(net: PerceptionNet, target_net: PerceptionNet, transitions: Sequence[Transition],
                      gamma: float = 0.99) -> tuple[ClientUpdate, dict[str, torch.Tensor]]:
    """The FedSGD gradient of :func:`dqn_loss` on ``transitions`` with the target
    ``Q = r + γ (1 − done) max_a' Q_target(s', a')``, and the truth: the state (``images``, ``rgb``
    in S1, ``depth``, ``box``), ``action``, ``reward``, ``q_pred`` ``Q̂(s, a)`` and ``q_target``."""
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
    if entropy_weight < 0:
        raise LeaklabError(f"entropy_weight must be >= 0 (got {entropy_weight})")
    logits = net(batch["images"], batch["box"])
    grads = _gradient(net, reinforce_loss(logits, batch["action"], returns, entropy_weight))
    meta = UpdateMetadata(kind="fedsgd", batch_size=len(transitions), loss="reinforce",
                          entropy_weight=entropy_weight, train_mode=True)
    truth = _state_truth(spec, batch)
    truth.update(reward=returns.clone(), probs=torch.softmax(logits.detach(), dim=1))
    return ClientUpdate(metadata=meta, tensors=grads), truth


def partly_trained_net(algorithm: Literal["dqn", "reinforce"], spec: PerceptionSpec, steps: int,
                       layouts: Sequence[str] | None = None, seed: int = 0) -> PerceptionNet:
    """The network a capture attacks: initialised with ``seed`` (``steps=0``), or partly trained by a
    short :func:`train_dqn` / :func:`train_reinforce` run of ``steps`` environment steps."""
    if steps < 0:
        raise LeaklabError(f"steps must be >= 0 (got {steps})")
    if steps == 0:
        return build_perception_net(spec, seed=seed)
    lay = tuple(layouts) if layouts is not None else None
    if algorithm == "dqn":
        config = DQNConfig(spec=spec, layouts=lay, steps=steps, seed=seed,
                           learning_starts=min(200, steps // 4), eps_decay_steps=max(1, steps // 2))
        return train_dqn(config)[0]
    if algorithm == "reinforce":
        return train_reinforce(ReinforceConfig(spec=spec, layouts=lay, steps=steps, seed=seed))[0]
    raise LeaklabError(f"unknown algorithm {algorithm!r}; choose dqn or reinforce")


def target_copy(net: PerceptionNet) -> PerceptionNet:
    """A frozen copy of ``net`` to serve as the target network of a freshly synchronised round."""
    return copy.deepcopy(net).requires_grad_(False)


# --------------------------------------------------------------------------------------------
# room case folders


@dataclass
class RoomCase:
    """What the server holds of one captured round: the view (perception network) and the update."""

    view: ServerView
    update: ClientUpdate
    folder: Path


def truth_shapes(spec: PerceptionSpec, metadata: UpdateMetadata) -> dict[str, tuple[int, ...]]:
    """The tensors (and their shapes) of the truth of an update with ``metadata``."""
    b, s = metadata.batch_size, spec.image_size
    shapes = {"images": (b, spec.in_channels, s, s), "depth": (b, 1, s, s), "box": (b, spec.box_dim),
              "action": (b,), "reward": (b,)}
    if spec.setting == "S1":
        shapes["rgb"] = (b, 3, s, s)
    if metadata.loss == "dqn_mse":
        shapes.update(q_pred=(b,), q_target=(b,))
    elif metadata.loss == "reinforce":
        shapes["probs"] = (b, spec.num_actions)
    return shapes


def check_room_truth(truth: dict[str, torch.Tensor], spec: PerceptionSpec, metadata: UpdateMetadata,
                     where: str = "truth") -> None:
    """Raise :class:`LeaklabError` unless ``truth`` has exactly the tensors of :func:`truth_shapes`,
    finite, with integer actions of the network's range."""
    shapes = truth_shapes(spec, metadata)
    missing, extra = sorted(set(shapes) - set(truth)), sorted(set(truth) - set(shapes))
    if missing or extra:
        raise LeaklabError(f"{where}: missing tensors {missing}, unexpected {extra}; capture the truth "
                           f"with the update's loss {metadata.loss!r}")
    for name, shape in shapes.items():
        t = truth[name]
        if tuple(t.shape) != shape:
            raise LeaklabError(f"{where}: tensor {name!r} has shape {tuple(t.shape)}, the case needs {shape}")
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise LeaklabError(f"{where}: tensor {name!r} holds NaN or Inf values")
    action = truth["action"]
    if action.is_floating_point() or action.min() < 0 or action.max() >= spec.num_actions:
        raise LeaklabError(f"{where}: actions must be integers in 0..{spec.num_actions - 1}")


def write_room_case(folder: Path, spec: PerceptionSpec, state: dict[str, torch.Tensor],
                    update: ClientUpdate, truth: dict[str, torch.Tensor],
                    provenance: dict[str, Any] | None = None) -> None:
    """Write one captured round as a case folder (not atomically: wrap it in
    :func:`leaklab.io.atomic_dir`). The update and the truth are validated against the network that
    ``spec`` and ``state`` rebuild before anything is written."""
    if update.metadata.loss not in ("dqn_mse", "reinforce"):
        raise LeaklabError(f"a room case holds a dqn_mse or reinforce update, not {update.metadata.loss!r}")
    update.validate_against(make_view(spec, state, update.metadata).model)
    check_room_truth(truth, spec, update.metadata)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    meta = update.metadata.model_dump(mode="json")
    model_sha = save_tensors(folder / MODEL_FILE, state, {"format": "leaklab.model"})
    update_sha = save_tensors(folder / UPDATE_FILE, {f"u0/{n}": t for n, t in update.tensors.items()},
                              {"format": "leaklab.update"})
    write_json(folder / UPDATE_JSON, {
        "format": "leaklab.update", "format_version": FORMAT_VERSION, "metadata": meta,
        "defense": update.defense, "tensor_file": UPDATE_FILE, "sha256": update_sha, "count": 1,
        "updates": [{"prefix": "u0/", "labels": None}]})
    write_json(folder / VIEW_FILE, {
        "format": "leaklab.view", "format_version": FORMAT_VERSION, "model_type": MODEL_TYPE,
        "model": spec.model_dump(mode="json"), "model_file": MODEL_FILE, "model_sha256": model_sha,
        "metadata": meta, "capabilities": Capabilities().model_dump(mode="json"),
        "defense": update.defense})
    save_tensors(folder / TRUTH_FILE, truth,
                 {"format": TRUTH_FORMAT, "provenance": json.dumps(provenance or {})})


def _json_file(path: Path, kind: str) -> dict:
    data = read_json(path, kind)
    if not isinstance(data, dict) or data.get("format") != f"leaklab.{kind}":
        raise LeaklabError(f"{path} is not a leaklab {kind} file; point at a folder written by "
                           "write_room_case")
    version = data.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise LeaklabError(f"{path} has format version {version!r}; this leaklab reads versions up to "
                           f"{FORMAT_VERSION}: upgrade leaklab")
    return data


def _parse(model_cls, value: Any, what: str):
    try:
        return model_cls.model_validate(value)
    except ValidationError as e:
        raise LeaklabError(validation_message(e, what)) from None


def load_room_case(folder: Path) -> RoomCase:
    """Read and validate the server's files of a room case (never the truth)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise LeaklabError(f"room case folder {folder} does not exist; write one with write_room_case")
    view_path, upd_path = folder / VIEW_FILE, folder / UPDATE_JSON
    view_json = _json_file(view_path, "view")
    if view_json.get("model_type") != MODEL_TYPE:
        raise LeaklabError(f"{view_path} is an image-classification case, not a room case; read it with "
                           "leaklab.io.load_case")
    spec = _parse(PerceptionSpec, view_json.get("model"), f"{view_path}: model")
    metadata = _parse(UpdateMetadata, view_json.get("metadata"), f"{view_path}: metadata")
    capabilities = _parse(Capabilities, view_json.get("capabilities", {}), f"{view_path}: capabilities")
    state, _ = load_tensors(folder / MODEL_FILE, "model", view_json.get("model_sha256"))
    view = make_view(spec, state, metadata, capabilities, view_json.get("defense"))
    upd_json = _json_file(upd_path, "update")
    if _parse(UpdateMetadata, upd_json.get("metadata"), f"{upd_path}: metadata") != metadata:
        raise LeaklabError(f"{upd_path} declares metadata that differs from {view_path}; re-capture the case")
    tensors, _ = load_tensors(folder / UPDATE_FILE, "update", upd_json.get("sha256"))
    if upd_json.get("count") != 1 or any(not k.startswith("u0/") for k in tensors):
        raise LeaklabError(f"{upd_path}: a room case holds exactly one update (prefix u0/); re-capture it")
    update = ClientUpdate(metadata=metadata, tensors={k[3:]: v for k, v in tensors.items()},
                          defense=upd_json.get("defense"))
    try:
        update.validate_against(view.model)
    except LeaklabError as e:
        raise LeaklabError(f"{folder / UPDATE_FILE}: {e}") from None
    return RoomCase(view=view, update=update, folder=folder)


def load_room_truth(folder: Path, case: RoomCase | None = None,
                    ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The client's truth of a room case and its provenance (evaluation only). With ``case`` the
    tensors are checked against the case's network and update."""
    path = Path(folder) / TRUTH_FILE
    tensors, meta = load_tensors(path, "truth")
    if meta.get("format") != TRUTH_FORMAT:
        raise LeaklabError(f"{path} is not the truth of a room case (format {meta.get('format')!r})")
    if case is not None:
        check_room_truth(tensors, case.view.spec, case.view.metadata, where=str(path))
    try:
        provenance = json.loads(meta.get("provenance", "{}"))
    except json.JSONDecodeError:
        raise LeaklabError(f"{path}: provenance is not valid JSON; re-capture the case") from None
    return tensors, provenance
