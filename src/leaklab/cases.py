"""Case folders: what a server holds of one client round, and apart from it the client's truth
(docs/formats.md).

A *case* folder (written by ``leaklab capture``) holds what the server sees, ``view.json``,
``model.safetensors``, ``update.safetensors``, ``update.json``, and, apart from it, the client's truth
``truth.safetensors``. :func:`load_case` reads only the server's files; :func:`load_truth` reads the
truth, for evaluation only. :func:`read_case_files` is the reading an image case and a room case
(:mod:`leaklab.rl.cases`) share. Files are read and written by :mod:`leaklab.io`: never unpickled,
validated at the boundary.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from leaklab.errors import LeaklabError, ModelClassError, check_keys, validation_message
from leaklab.io import (FORMAT_VERSION, MODEL_FILE, PERCEPTION_MODEL_TYPE, TRUTH_FILE, UPDATE_FILE, UPDATE_JSON,
                        VIEW_FILE, VIEW_FORMAT, check_finite, check_format_version, dumps_json, load_tensors,
                        read_json, resolved, save_tensors, write_json)
from leaklab.models import ModelSpec, PerceptionSpec
from leaklab.threat import (FLOAT_DTYPES, Capabilities, ClientUpdate, ServerView, UpdateMetadata, make_view,
                            tensor_file_bound)
from leaklab.words import plural


@dataclass
class Case:
    """What the server holds for one capture: the view and the client updates (in capture order)."""

    view: ServerView
    updates: list[ClientUpdate]
    labels: list[torch.Tensor | None]  # per update: labels the view grants (knows_labels), else None
    folder: Path

    def view_for(self, index: int) -> ServerView:
        """The view of update ``index`` (carrying that update's labels when the view grants them)."""
        from dataclasses import replace

        return replace(self.view, labels=self.labels[index])


def write_case(folder: Path, spec: ModelSpec, state: dict[str, torch.Tensor],
               metadata: UpdateMetadata, capabilities: Capabilities, defense: str | None,
               updates: Sequence[ClientUpdate], labels: Sequence[torch.Tensor],
               truth_images: torch.Tensor | None = None, truth_labels: torch.Tensor | None = None,
               provenance: dict[str, Any] | None = None) -> None:
    """Write a case folder (see docs/formats.md). ``labels`` are the true labels of each update; they
    are written into ``update.json`` only when ``capabilities.knows_labels``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model_sha = save_tensors(folder / MODEL_FILE, state, {"format": "leaklab.model"})
    tensors: dict[str, torch.Tensor] = {}
    entries = []
    for i, (u, y) in enumerate(zip(updates, labels, strict=True)):
        if u.metadata != metadata:
            raise LeaklabError("every update of a case must carry the case's metadata")
        prefix = f"u{i}/"
        tensors.update({prefix + n: t for n, t in u.tensors.items()})
        entries.append({"prefix": prefix,
                        "labels": [int(v) for v in y] if capabilities.knows_labels else None})
    update_sha = save_tensors(folder / UPDATE_FILE, tensors, {"format": "leaklab.update"})
    write_json(folder / UPDATE_JSON, {
        "format": "leaklab.update", "format_version": FORMAT_VERSION,
        "metadata": metadata.model_dump(mode="json"),
        "defense": defense if capabilities.knows_defense else None,
        "tensor_file": UPDATE_FILE, "sha256": update_sha, "count": len(entries),
        "updates": entries,
    })
    write_json(folder / VIEW_FILE, {
        "format": VIEW_FORMAT, "format_version": FORMAT_VERSION,
        "model": spec.model_dump(mode="json"), "model_file": MODEL_FILE, "model_sha256": model_sha,
        "metadata": metadata.model_dump(mode="json"),
        "capabilities": capabilities.model_dump(mode="json"),
        "defense": defense if capabilities.knows_defense else None,
    })
    if truth_images is not None:
        save_tensors(folder / TRUTH_FILE,
                     {"images": truth_images.float(), "labels": truth_labels.long()},
                     {"format": "leaklab.truth",
                      "provenance": dumps_json(provenance or {})})


# every key a case's JSON files may hold (docs/formats.md); an unknown one is refused, so that a misspelt
# optional key (``"defence"``, ``"model_fle"``) is not read as absent
CASE_KEYS = {"view": {"format", "format_version", "model_type", "model", "model_file", "model_sha256", "metadata",
                      "capabilities", "defense"},
             "update": {"format", "format_version", "metadata", "defense", "tensor_file", "sha256", "count",
                        "updates"}}
UPDATE_ENTRY_KEYS = {"prefix", "labels"}
# the most values an image case's update may ask its attack to reconstruct (batch × channels × pixels): 256 photos
# of 3×224² are 38.5 million; a 232 KB case of 256 16-channel 512² images asked for 4 GiB at the first allocation
MAX_RECONSTRUCTED_VALUES = 1 << 26


def check_format(data: Any, path: Path, kind: str) -> dict:
    """``data`` (read from ``path``) if it is a leaklab ``kind`` file this version can read, with no key
    outside :data:`CASE_KEYS`."""
    if not isinstance(data, dict):
        raise LeaklabError(f"{path} is not a leaklab {kind} file (expected a JSON object)")
    fmt = data.get("format")
    if fmt != f"leaklab.{kind}":
        raise LeaklabError(f"{path} is not a leaklab {kind} file (format {fmt!r}, expected "
                           f"'leaklab.{kind}')")
    check_format_version(data, str(path), FORMAT_VERSION)
    check_keys(data, CASE_KEYS[kind], str(path))
    return data


def member_file(folder: Path, name: Any, default: str, where: Path) -> Path:
    """The file ``name`` (``default`` when absent) that ``where`` names inside the case ``folder``: a
    plain file name, and no link out of the folder, so a case never makes leaklab read outside it."""
    name = default if name is None else name
    if not isinstance(name, str) or not name or name in (".", "..") or any(c in name for c in "/\\\0"):
        raise LeaklabError(f"{where}: file names must be plain names inside the case folder, not {name!r}")
    path = Path(folder) / name
    if path.is_symlink() and resolved(folder) not in resolved(path).parents:
        raise LeaklabError(f"{where}: {name} is a link to a file outside the case folder; copy the file in")
    return path


def parse_model(model_cls, value: Any, what: str):
    """``model_cls`` validated from ``value``, read from a case's JSON, as JSON and strictly: taken as written
    (``"150"``, ``150.0`` or ``true`` is no size; a model spec took them); a validation error becomes one
    LeaklabError line."""
    try:
        return model_cls.model_validate_json(json.dumps(value), strict=True)
    except ValidationError as e:
        raise LeaklabError(validation_message(e, what)) from None


def view_parts(view_json: dict[str, Any], view_path: Path, spec_class) -> tuple[Any, UpdateMetadata,
                                                                                Capabilities, str | None]:
    """The validated ``(spec, metadata, capabilities, defense)`` of a case's ``view.json`` (image or
    room case; ``spec_class`` is the model spec's class); the defense chain's names are checked."""
    spec = parse_model(spec_class, view_json.get("model"), f"{view_path}: model")
    metadata = parse_model(UpdateMetadata, view_json.get("metadata"), f"{view_path}: metadata")
    capabilities = parse_model(Capabilities, view_json.get("capabilities", {}), f"{view_path}: capabilities")
    return spec, metadata, capabilities, defense_chain(view_json.get("defense"), view_path)


def defense_chain(defense: Any, path: Path) -> str | None:
    """A case file's ``defense``: null, or a chain whose names are checked, as its normal spec string."""
    if defense is not None and not isinstance(defense, str):
        raise LeaklabError(f"{path}: defense must be null or a string such as 'prune:0.5,gaussian:0.1'")
    if defense is None:
        return None
    from leaklab.defenses import parse_defense

    try:
        return parse_defense(defense).spec
    except LeaklabError as e:
        raise LeaklabError(f"{path}: {e}") from None


@dataclass
class CaseFiles:
    """What an image case and a room case share, read and validated by :func:`read_case_files`."""

    view: ServerView
    update_json: dict[str, Any]
    update_path: Path
    tensors: dict[str, torch.Tensor]  # the update file's, named as stored (``u0/<parameter>`` ...)
    tensor_file: Path
    defense: str | None  # the client's defense chain as the view declares it (granted to the attack or not)

    def update(self, tensors: dict[str, torch.Tensor], where: str) -> ClientUpdate:
        """One update of ``tensors`` (named by parameter), validated against the view's model
        (:meth:`ClientUpdate.validate_against`: names, shapes, dtypes, finite) and then in float32, as
        the attacks read it (an error names ``where``)."""
        # the defense as the server knows it: none where the view withholds it (the room attacks read the update's)
        known = self.defense if self.view.capabilities.knows_defense else None
        update = ClientUpdate(metadata=self.view.metadata, tensors=tensors, defense=known)
        try:
            update.validate_against(self.view.model)
        except LeaklabError as e:
            raise LeaklabError(f"{where}: {e}") from None
        read = {k: v.float() for k, v in tensors.items()}
        wide = next((k for k, v in read.items() if not torch.isfinite(v).all()), None)
        if wide is not None:  # a float64 entry over float32's range: the attack found it infinite, case by case
            raise LeaklabError(f"{where}: update tensor {wide!r} holds values beyond float32's range, in which the "
                               "attacks read it; rescale the update or save it as float32")
        return update.with_tensors(read, known)


def read_case_files(folder: Path, room: bool, model_class: str | None = None) -> CaseFiles:
    """The server's files of a case folder (never the truth): ``view.json`` of an image case (or, with
    ``room``, of a room case), the model file it names loaded into its network (``model_class``: a
    user's own perception network), and ``update.json`` (its metadata the view's) with its tensor file."""
    folder = Path(folder)
    kind, writer = ("room case", "env capture") if room else ("case", "capture")
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise LeaklabError(f"{kind} folder {folder} {what}; write one with `leaklab {writer}`")
    view_path = member_file(folder, None, VIEW_FILE, folder)
    view_json = check_format(read_json(view_path, "view"), view_path, "view")
    if (view_json.get("model_type") == PERCEPTION_MODEL_TYPE) != room:
        raise LeaklabError(f"{view_path} is an image-classification case, not a room case; attack it with "
                           f"`leaklab attack inversion --case {folder}`" if room else
                           f"{folder} is a room case (a perception network's RL update); attack it with "
                           f"`leaklab audit --cases {folder}`")
    spec, metadata, capabilities, defense = view_parts(view_json, view_path, PerceptionSpec if room else ModelSpec)
    losses = {"dqn_mse": "DQN", "reinforce": "REINFORCE"} if room else {"cross_entropy": "cross-entropy"}
    if metadata.loss not in losses:
        named = " or ".join(f"{what} ({loss!r})" for loss, what in losses.items())
        raise LeaklabError(f"{view_path}: a {'room' if room else 'image'} case's update comes from the {named} loss, "
                           f"not {metadata.loss!r}; re-capture the case")
    model_path = member_file(folder, view_json.get("model_file"), MODEL_FILE, view_path)
    # a file larger than leaklab's network of the view could fill is refused unread; a user's class is unbounded
    own_class = " (a case of your own network class: pass its --model-class)" if room else ""
    state, _ = load_tensors(model_path, "model", view_json.get("model_sha256"),
                            max_bytes=None if model_class else tensor_file_bound(spec),
                            too_large=f"write it again with the command that made it{own_class}")
    try:
        view = make_view(spec, state, metadata, capabilities, defense, model_class=model_class)
    except ModelClassError:  # the user's class, not this file
        raise
    except LeaklabError as e:
        raise LeaklabError(f"{model_path}: {e}") from None
    upd_path = member_file(folder, None, UPDATE_JSON, folder)
    upd_json = check_format(read_json(upd_path, "update metadata"), upd_path, "update")
    if parse_model(UpdateMetadata, upd_json.get("metadata"), f"{upd_path}: metadata") != metadata:
        raise LeaklabError(f"{upd_path} declares metadata that differs from {view_path}; re-capture the case")
    if defense_chain(upd_json.get("defense"), upd_path) != defense:  # formats.md: it repeats the view's (a
        # case whose view named noise and whose update named none was attacked as defended, reported undefended)
        raise LeaklabError(f"{upd_path} declares another defense than {view_path}; re-capture the case")
    tensor_file = member_file(folder, upd_json.get("tensor_file"), UPDATE_FILE, upd_path)
    listed = upd_json.get("updates")
    # as many copies as it lists: a case's declared work bounds what is read (update_entries checks the list next)
    copies = len(listed) if isinstance(listed, list) and listed else 1
    tensors, _ = load_tensors(tensor_file, "update", upd_json.get("sha256"),
                              max_bytes=None if model_class else tensor_file_bound(spec, copies, trainable=True))
    return CaseFiles(view, upd_json, upd_path, tensors, tensor_file, defense)


def load_case(folder: Path) -> Case:
    """Read and validate the server's files of an image case folder (never the truth)."""
    files = read_case_files(folder, room=False)
    view, upd_json, upd_path, tensors, tensor_file = (files.view, files.update_json, files.update_path,
                                                      files.tensors, files.tensor_file)
    metadata, spec = view.metadata, view.spec
    pixels = metadata.batch_size * spec.in_channels * spec.image_size ** 2
    if pixels > MAX_RECONSTRUCTED_VALUES:
        raise LeaklabError(f"{upd_path}: an update of {metadata.batch_size} images of "
                           f"{spec.in_channels}×{spec.image_size}² values is {pixels:,} values to reconstruct, "
                           "more than leaklab's attacks take "
                           f"({MAX_RECONSTRUCTED_VALUES:,})")
    entries = update_entries(upd_json, upd_path)
    prefixes = sorted(e["prefix"] for e in entries)  # a prefix of another sorts right before one that starts with it
    if any(b.startswith(a) for a, b in zip(prefixes, prefixes[1:])):
        raise LeaklabError(f"{upd_path}: two updates share tensors (a prefix repeats or starts another); "
                           "re-capture the case")

    updates, labels, used = [], [], set()
    for i, entry in enumerate(entries):
        prefix = entry["prefix"]
        own = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
        used.update(prefix + k for k in own)
        if not own:
            raise LeaklabError(f"{tensor_file} has no tensors named {prefix}*; the update file does not "
                               f"belong to {upd_path}")
        updates.append(files.update(own, f"{tensor_file} ({prefix})"))
        y = entry.get("labels")
        if y is not None and view.capabilities.knows_labels:
            if not isinstance(y, list) or len(y) != metadata.batch_size or \
                    not all(type(v) is int and 0 <= v < spec.num_classes for v in y):
                raise LeaklabError(f"{upd_path}: updates[{i}].labels must be {metadata.batch_size} class "
                                   f"indices in 0..{spec.num_classes - 1}")
            labels.append(torch.tensor(y, dtype=torch.long))
        else:
            if view.capabilities.knows_labels:
                raise LeaklabError(f"{upd_path}: the view grants knows_labels but updates[{i}] has no "
                                   "labels")
            if y is not None:  # labels the server is not granted would be dropped unread: the files disagree
                raise LeaklabError(f"{upd_path}: updates[{i}] lists labels the view does not grant "
                                   "(knows_labels false); write null, or grant knows_labels in view.json")
            labels.append(None)
    check_claimed(tensors, used, tensor_file)
    return Case(view=view, updates=updates, labels=labels, folder=Path(folder))


def update_entries(upd_json: dict[str, Any], upd_path: Path) -> list[dict[str, Any]]:
    """``update.json``'s ``updates``: a non-empty list of ``{prefix, labels}`` objects, each with a string
    prefix, as many as ``count`` says (when it says)."""
    entries = upd_json.get("updates")
    if not isinstance(entries, list) or not entries:
        raise LeaklabError(f"{upd_path}: 'updates' must be a non-empty list of {{prefix, labels}}")
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("prefix"), str):
            raise LeaklabError(f"{upd_path}: updates[{i}] needs a string 'prefix'")
        check_keys(entry, UPDATE_ENTRY_KEYS, f"{upd_path}: updates[{i}]")
    count = upd_json.get("count", len(entries))
    if type(count) is not int:
        raise LeaklabError(f"{upd_path}: 'count' must be an integer, not {count!r}")
    if count != len(entries):
        raise LeaklabError(f"{upd_path}: 'count' is {count} but {plural(len(entries), 'update')} "
                           f"{'is' if len(entries) == 1 else 'are'} listed")
    return entries


def check_claimed(tensors: dict[str, torch.Tensor], claimed: set[str], tensor_file: Path) -> None:
    """Refuse an update file holding tensors that no listed update claims."""
    unclaimed = sorted(set(tensors) - claimed)
    if unclaimed:
        raise LeaklabError(f"{tensor_file} holds tensors no update claims (first: {unclaimed[0]!r}); "
                           "re-capture the case")


def truth_provenance(metadata: dict[str, str], path: Path) -> dict[str, Any]:
    """The provenance a truth file records in its metadata (a JSON object; ``{}`` when absent)."""
    try:
        provenance = json.loads(metadata.get("provenance", "{}"))
    except (ValueError, RecursionError):  # not JSON, too deep, or a number past Python's digit limit
        raise LeaklabError(f"truth file {path}: provenance is not valid JSON; re-capture the case") from None
    if not isinstance(provenance, dict):
        raise LeaklabError(f"truth file {path}: provenance is not a JSON object; re-capture the case")
    return check_finite(provenance, f"truth file {path}: provenance")


def check_update_cosines(provenance: dict[str, Any], count: int, path: Path) -> None:
    """Refuse a truth whose record of what the client's defense left of its ``count`` updates
    (``update_cosine``: one cosine of the update sent with the true one per update; leaklab's captures
    write it) is anything but ``count`` numbers in [-1, 1]; a truth may leave it out."""
    kept = provenance.get("update_cosine")
    if kept is not None and (not isinstance(kept, list) or len(kept) != count or any(
            isinstance(k, bool) or not isinstance(k, (int, float)) or abs(k) > 1 + 1e-6 for k in kept)):
        raise LeaklabError(f"truth file {path}: provenance 'update_cosine' must list {count} number(s) in "
                           "[-1, 1], one per update (the cosine of the update sent with the true one); "
                           "re-capture the case or leave it out")


LABEL_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)  # what a truth's labels may hold


def load_truth(folder: Path, case: Case) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]] | None:
    """The client's truth of ``case`` (images, labels, provenance), or None when the file is absent;
    checked against the case: one image per batch slot of every update."""
    path = member_file(Path(folder), None, TRUTH_FILE, Path(folder))
    if not path.exists() and not path.is_symlink():  # a broken link is named by load_tensors, not taken for none
        return None
    tensors, meta = load_tensors(path, "truth")
    images, labels = tensors.get("images"), tensors.get("labels")
    extra = sorted(set(tensors) - {"images", "labels"})
    if images is None or labels is None or extra:  # as a room case's truth: a misnamed tensor was left unread
        raise LeaklabError(f"truth file {path} needs tensors 'images' and 'labels'"
                           + (f" alone (holds also {', '.join(map(repr, extra))})" if extra else ""))
    provenance = truth_provenance(meta, path)
    if images.dtype not in FLOAT_DTYPES or labels.dtype not in LABEL_DTYPES:  # float8 and uint16-64 passed and
        # then had no isfinite/min: a traceback after the attack
        raise LeaklabError(f"truth file {path} needs float16/bfloat16/float32/float64 images and uint8/int8/int16/"
                           f"int32/int64 labels (holds {images.dtype} and {labels.dtype})")
    spec = case.view.spec
    n = len(case.updates) * case.view.metadata.batch_size
    expected = (n, spec.in_channels, spec.image_size, spec.image_size)
    if tuple(images.shape) != expected or tuple(labels.shape) != (n,):
        raise LeaklabError(f"truth file {path} holds images {tuple(images.shape)} and labels "
                           f"{tuple(labels.shape)}; the case needs {expected} and ({n},)")
    if not torch.isfinite(images).all() or images.min() < 0 or images.max() > 1:
        raise LeaklabError(f"truth file {path} holds pixels outside [0, 1] (or NaN/Inf); re-capture the case")
    if len(labels) and (labels.min() < 0 or labels.max() >= spec.num_classes):
        raise LeaklabError(f"truth file {path} holds labels outside 0..{spec.num_classes - 1}")
    check_update_cosines(provenance, len(case.updates), path)
    return images.float(), labels.long(), provenance
