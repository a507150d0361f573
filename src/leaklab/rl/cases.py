"""Room case folders: one captured round of the active-perception task as the server sees it, and,
apart from it, the client's truth (seed 000 sections III, V).

The format is the case-folder format of :mod:`leaklab.cases` (docs/formats.md) with one update:
``view.json`` (``"model_type": "perception"``, the :class:`PerceptionSpec` as ``model``, the update
metadata, capabilities, defense), ``model.safetensors``, ``update.safetensors`` (tensors ``u0/<param>``),
``update.json`` and ``truth.safetensors``, whose tensors are listed by :func:`truth_shapes`: the state
(``images``, ``rgb`` in S1, ``depth``, ``box``), ``action``, ``reward`` (DQN: the step's reward;
REINFORCE: the return ``R`` that weights ``log π(a|s)``) and ``q_pred``/``q_target`` (DQN) or
``probs`` (REINFORCE).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from leaklab.errors import LeaklabError
from leaklab.cases import (check_claimed, check_update_cosines, member_file, read_case_files,
                           truth_provenance, update_entries)
from leaklab.io import (FORMAT_VERSION, MODEL_FILE, PERCEPTION_MODEL_TYPE, TRUTH_FILE, UPDATE_FILE, UPDATE_JSON,
                        VIEW_FILE, VIEW_FORMAT, dumps_json, load_tensors, save_tensors, write_json)
from leaklab.models import PerceptionSpec
from leaklab.threat import Capabilities, ClientUpdate, ServerView, UpdateMetadata, make_view

TRUTH_FORMAT = "leaklab.room_truth"


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
    """Raise :class:`LeaklabError` unless ``truth`` has exactly the tensors of :func:`truth_shapes`:
    float32 or float64 and finite (an int64 action of the network's range), images in [0, 1], ``depth`` (and
    ``rgb``) the channels of ``images``, and the box in [-1, 1]."""
    shapes = truth_shapes(spec, metadata)
    missing, extra = sorted(set(shapes) - set(truth)), sorted(set(truth) - set(shapes))
    if missing or extra:
        found = [f"missing tensors {missing}"] * bool(missing) + [f"unexpected tensors {extra}"] * bool(extra)
        raise LeaklabError(f"{where}: {'; '.join(found)}; the truth of a {metadata.loss!r} update holds exactly "
                           f"{', '.join(shapes)} (docs/formats.md)")
    for name, shape in shapes.items():
        t = truth[name]
        if tuple(t.shape) != shape:
            raise LeaklabError(f"{where}: tensor {name!r} has shape {tuple(t.shape)}, the case needs {shape}")
        if name != "action" and t.dtype not in (torch.float32, torch.float64):
            raise LeaklabError(f"{where}: tensor {name!r} has dtype {t.dtype}; the truth is float32 or float64")
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise LeaklabError(f"{where}: tensor {name!r} holds NaN or Inf values")
    action = truth["action"]
    if action.dtype != torch.int64 or action.min() < 0 or action.max() >= spec.num_actions:
        raise LeaklabError(f"{where}: actions must be int64 in 0..{spec.num_actions - 1}")
    for name in ("images", "depth", "rgb"):  # pixels and normalised depth, as the environment gives them
        t = truth.get(name)
        if t is not None and (t.min() < 0 or t.max() > 1):
            raise LeaklabError(f"{where}: tensor {name!r} must hold values in [0, 1]")
    box = truth["box"]
    if box.min() < -1 or box.max() > 1:
        raise LeaklabError(f"{where}: the box must hold coordinates in [-1, 1]")
    images = truth["images"].double()  # the network's input: RGB then depth (S1), or depth (S2)
    for name, channels in (("rgb", images[:, :3]), ("depth", images[:, -1:])):
        if name in truth and not torch.allclose(channels, truth[name].double(), rtol=0, atol=1e-6):
            raise LeaklabError(f"{where}: tensor {name!r} is not the {name} channels of 'images' (the images the "
                               "network took, RGB then depth): the scores read both")


def write_room_case(folder: Path, spec: PerceptionSpec, state: dict[str, torch.Tensor],
                    update: ClientUpdate, truth: dict[str, torch.Tensor],
                    provenance: dict[str, Any] | None = None, model_class: str | None = None) -> None:
    """Write one captured round as a case folder (not atomically: wrap it in
    :func:`leaklab.io.atomic_dir`). The update and the truth are validated against the network that
    ``spec`` and ``state`` rebuild (``model_class``: the user's own class) before anything is written."""
    if update.metadata.loss not in ("dqn_mse", "reinforce"):
        raise LeaklabError(f"a room case holds a dqn_mse or reinforce update, not {update.metadata.loss!r}")
    update.validate_against(make_view(spec, state, update.metadata, model_class=model_class).model)
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
        "format": VIEW_FORMAT, "format_version": FORMAT_VERSION, "model_type": PERCEPTION_MODEL_TYPE,
        "model": spec.model_dump(mode="json"), "model_file": MODEL_FILE, "model_sha256": model_sha,
        "metadata": meta, "capabilities": Capabilities().model_dump(mode="json"),
        "defense": update.defense})
    save_tensors(folder / TRUTH_FILE, truth,
                 {"format": TRUTH_FORMAT, "provenance": dumps_json(provenance or {})})


def load_room_case(folder: Path, model_class: str | None = None) -> RoomCase:
    """Read and validate the server's files of a room case (never the truth); ``model_class``: the
    user's own perception network class the case was captured with ("module:Class")."""
    files = read_case_files(folder, room=True, model_class=model_class)
    entries = update_entries(files.update_json, files.update_path)
    if len(entries) != 1 or entries[0]["prefix"] != "u0/" or entries[0].get("labels") is not None:
        raise LeaklabError(f"{files.update_path}: a room case holds exactly one update, listed as "
                           '{"prefix": "u0/", "labels": null}; re-capture it')
    own = {k: v for k, v in files.tensors.items() if k.startswith("u0/")}
    check_claimed(files.tensors, set(own), files.tensor_file)
    update = files.update({k[3:]: v for k, v in own.items()}, str(files.tensor_file))
    return RoomCase(view=files.view, update=update, folder=Path(folder))


def load_room_truth(folder: Path, case: RoomCase | None = None,
                    ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The client's truth of a room case and its provenance (evaluation only). With ``case`` the
    tensors are checked against the case's network and update."""
    path = member_file(Path(folder), None, TRUTH_FILE, Path(folder))
    tensors, meta = load_tensors(path, "truth")
    if meta.get("format", TRUTH_FORMAT) != TRUTH_FORMAT:  # a file of its own exporter may name none
        raise LeaklabError(f"{path} is not the truth of a room case: its header names the format "
                           f"{meta['format']!r}, a room truth's is {TRUTH_FORMAT!r} (or none)")
    if case is not None:
        check_room_truth(tensors, case.view.spec, case.view.metadata, where=str(path))
    provenance = truth_provenance(meta, path)
    layouts = provenance.get("layouts", [])
    if not isinstance(layouts, list) or not all(isinstance(x, str) for x in layouts) or \
            (case is not None and layouts and len(layouts) != case.view.metadata.batch_size):
        raise LeaklabError(f"{path}: provenance 'layouts' must be a list of room names, one per transition; "
                           "re-capture the case")
    check_update_cosines(provenance, 1, path)
    return tensors, provenance
