"""Files a user can exchange: tensors in safetensors, metadata and results in JSON (docs/formats.md).

Three rules hold for everything in this module:

* **Never unpickle.** Tensors are read with safetensors only, metadata with :func:`json.loads`.
* **Validate at the boundary.** A missing, truncated or corrupt file, a JSON syntax error, a tensor
  that does not fit the model or holds NaN/Inf raises :class:`~leaklab.errors.LeaklabError` with one
  line naming the file and the fix.
* **Nothing half written.** :func:`atomic_dir` builds an output folder under a temporary name beside
  its destination and renames it into place only when everything succeeded.

The case folders built on these files are read and written by :mod:`leaklab.cases` (image cases) and
:mod:`leaklab.rl.cases` (room cases).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import math
import os
import re
import shutil
import stat
import struct
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as _st_load
from safetensors.torch import save as _st_save

from leaklab.errors import LeaklabError
from leaklab.processes import process_gone, process_scope
from leaklab.words import listing

FORMAT_VERSION = 1
MAX_TENSOR_FILE_BYTES = 16 << 30  # a model or update file larger than this is refused, never read
MAX_MARKER_BYTES = 256 << 20  # a JSON file larger than this is never read (nor taken as leaklab's output)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

VIEW_FILE = "view.json"
MODEL_FILE = "model.safetensors"
UPDATE_FILE = "update.safetensors"
UPDATE_JSON = "update.json"
TRUTH_FILE = "truth.safetensors"
RESULTS_FILE = "results.json"
REPORT_FILE = "report.html"  # the audits' self-contained HTML report
RECONSTRUCTIONS_FILE = "reconstructions.safetensors"
PERCEPTION_MODEL_TYPE = "perception"  # view.json's model_type of a room case (leaklab.rl.cases)
CASE_SUBDIR = "case"  # where a one-shot attack (capture and attack in one command) keeps its case

CAPTURE_JSON = "capture.json"
# what an output folder written whole (:func:`atomic_dir`) holds, listed in it: a rerun replaces it only when it holds
# nothing else (a user's note or nested run in it went with it)
ENTRIES_FILE = ".leaklab-entries.json"
ENTRIES_FORMAT = "leaklab.entries"

# The JSON files whose ``format`` says which command wrote a folder (a case's view, a results file, a
# room capture's index), and the folder of an interrupted reproduction's finished cells: a command
# replaces (or resumes) only a folder it wrote itself (:func:`check_out`).
CELLS_DIR = "cells"
_OUTPUT_MARKERS = (VIEW_FILE, RESULTS_FILE, CAPTURE_JSON)
# the ``format`` of each command's marker file, which names the command that wrote a folder
AUDIT_FORMAT = "leaklab.audit"
REPRODUCTION_FORMAT = "leaklab.reproduction"  # reproduce room-table1|room-table2
BAYES_TABLE2_FORMAT = "leaklab.bayes_table2"
BAYES_CELL_FORMAT = "leaklab.bayes_table2_cell"
ROOM_ATTACK_FORMAT = "leaklab.room_attack"
ROOM_CAPTURE_FORMAT = "leaklab.room_capture"
ROOM_CAPTURE_VERSION = 1  # capture.json's format_version (`audit --cases` reads up to it)
IMAGE_ATTACK_FORMAT = "leaklab.results"
VIEW_FORMAT = "leaklab.view"
DP_VS_INVERSION_FORMAT = "leaklab.dp-vs-inversion"
INVERSION_CHECKS_FORMAT = "leaklab.inversion_checks"
AT_FEATURES_FORMAT = "leaklab.at-features"
BREAKING_DEFENSES_FORMAT = "leaklab.breaking-defenses"
OPD_TABLE_FORMAT = "leaklab.opd-table"
DP_DRL_TABLE_FORMAT = "leaklab.dp-drl"
POLICY_SYNTHESIS_FORMAT = "leaklab.policy-synthesis"
PRIVATE_PLAN_FORMAT = "leaklab.private-plan"
DP_ADVISING_FORMAT = "leaklab.dp-advising"
RNN_MEMBERSHIP_FORMAT = "leaklab.rnn-membership"
PE_MARL_FORMAT = "leaklab.pe-marl"
DP_PLANNING_FORMAT = "leaklab.dp-planning"
BAYES_ABLATION_FORMAT = "leaklab.bayes-ablation"
MC_ABLATION_FORMAT = "leaklab.mc-ablation"
RANGE_PRIOR_FORMAT = "leaklab.range-prior"
RL_MEMBERSHIP_FORMAT = "leaklab.rl-membership"
CANDIDATE_INFERENCE_FORMAT = "leaklab.candidate-inference"
_WRITTEN_BY = {AUDIT_FORMAT: "leaklab audit", REPRODUCTION_FORMAT: "leaklab reproduce room-table1|room-table2",
               BAYES_TABLE2_FORMAT: "leaklab reproduce bayes-table2",
               ROOM_ATTACK_FORMAT: "leaklab attack qgi|rgi", ROOM_CAPTURE_FORMAT: "leaklab env capture",
               IMAGE_ATTACK_FORMAT: "leaklab attack inversion|analytic|features",
               VIEW_FORMAT: "leaklab capture|env capture",  # a case folder: an image model's or a room's
               DP_VS_INVERSION_FORMAT: "leaklab reproduce dp-vs-inversion",
               INVERSION_CHECKS_FORMAT: "leaklab reproduce inversion-checks",
               AT_FEATURES_FORMAT: "leaklab reproduce at-features",
               BREAKING_DEFENSES_FORMAT: "leaklab reproduce breaking-defenses",
               OPD_TABLE_FORMAT: "leaklab reproduce opd-table", DP_DRL_TABLE_FORMAT: "leaklab reproduce dp-drl",
               POLICY_SYNTHESIS_FORMAT: "leaklab reproduce policy-synthesis",
               PRIVATE_PLAN_FORMAT: "leaklab plan private",
               DP_ADVISING_FORMAT: "leaklab reproduce dp-advising",
               RNN_MEMBERSHIP_FORMAT: "leaklab reproduce rnn-membership",
               PE_MARL_FORMAT: "leaklab reproduce pe-marl",
               DP_PLANNING_FORMAT: "leaklab reproduce dp-planning",
               BAYES_ABLATION_FORMAT: "leaklab reproduce bayes-ablation",
               MC_ABLATION_FORMAT: "leaklab reproduce mc-ablation",
               RANGE_PRIOR_FORMAT: "leaklab reproduce range-prior",
               RL_MEMBERSHIP_FORMAT: "leaklab reproduce rl-membership",
               CANDIDATE_INFERENCE_FORMAT: "leaklab reproduce candidate-inference"}
# the commands that write into their --out in place (finished cells, checks) instead of replacing it whole
_IN_PLACE = frozenset({REPRODUCTION_FORMAT, BAYES_TABLE2_FORMAT, INVERSION_CHECKS_FORMAT})


# --------------------------------------------------------------------------------------------
# JSON


def _clean(value: Any) -> Any:
    """JSON-safe copy: tensors and numpy scalars to Python numbers, non-finite floats to None."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, torch.Tensor):
        return _clean(value.tolist())
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and callable(value.item) and not isinstance(value, (str, bytes)):
        try:
            value = value.item()
        except (TypeError, ValueError):
            pass
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def dumps_json(data: Any) -> str:
    return json.dumps(_clean(data), indent=2, allow_nan=False) + "\n"


def json_line(data: Any) -> str:
    """``data`` as one line of JSON (NaN/Inf become null), for the files that grow a line per result."""
    return json.dumps(_clean(data), allow_nan=False) + "\n"


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON (NaN/Inf become null); the file appears complete or not at all."""
    write_bytes(Path(path), dumps_json(data).encode())


def read_json(path: Path, what: str | None = None) -> Any:
    """Parse a JSON file; a missing file, anything but a regular file (a FIFO, a device), one over
    :data:`MAX_MARKER_BYTES` or a syntax error is a :class:`LeaklabError`."""
    path = Path(path)
    what = what or path.name
    text = _read_text(path, what)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise LeaklabError(f"{what} file {path} is not valid JSON (line {e.lineno}, column {e.colno}: "
                           f"{e.msg}); re-create it") from None
    except RecursionError:
        raise LeaklabError(f"{what} file {path} nests too deeply to be a leaklab file; re-create it") from None
    except ValueError as e:  # a number past Python's digit limit for integers
        raise LeaklabError(f"{what} file {path} is not a leaklab file ({_first_line(e)}); re-create it") from None
    return check_finite(data, f"{what} file {path}")


def _read_text(path: Path, what: str) -> str:
    """The UTF-8 text of a file leaklab parses; a missing file, anything but a regular file (a FIFO, a
    device) or one over :data:`MAX_MARKER_BYTES` is a :class:`LeaklabError`."""
    try:
        if path.exists() and (not path.is_file() or path.stat().st_size > MAX_MARKER_BYTES):
            raise LeaklabError(f"{what} file {path} is not a regular file of at most {MAX_MARKER_BYTES >> 20} MiB; "
                               f"{_missing_hint(path)}")
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise _missing(what, path) from None
    except (OSError, UnicodeDecodeError) as e:
        raise LeaklabError(f"{what} file {path} cannot be read ({_first_line(e)})") from None


def check_finite(data: Any, where: str) -> Any:
    """``data`` if no number in it is NaN or infinite (JSON's ``NaN``/``Infinity``, ``1e999``, YAML's
    ``.inf``), else a :class:`LeaklabError`; walked without recursion."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise LeaklabError(f"{where} holds a non-finite number ({item}); give finite values")
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return data


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _missing(what: str, path: Path) -> LeaklabError:
    """The error for a file that is not there: a link whose target is gone says so and names the target."""
    if path.is_symlink():
        return LeaklabError(f"{what} file {path} is a link to {os.readlink(path)}, which does not exist; "
                            f"{_missing_hint(path)}")
    return LeaklabError(f"{what} file {path} is missing; {_missing_hint(path)}")


def _missing_hint(path: Path) -> str:
    if path.name in (VIEW_FILE, MODEL_FILE, UPDATE_FILE, UPDATE_JSON):
        inner = path.parent / CASE_SUBDIR  # a one-shot attack's output keeps its case there
        if (inner / VIEW_FILE).is_file():
            return f"{path.parent} is an attack's output; its case is {inner}"
        return "give a case folder as `leaklab capture` (images) or `leaklab env capture` (rooms) writes it"
    return "check the path"


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _umask()


def write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file beside ``path`` and rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp creates 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# --------------------------------------------------------------------------------------------
# safetensors


def save_tensors(path: Path, tensors: dict[str, torch.Tensor],
                 metadata: dict[str, str] | None = None) -> str:
    """Save ``tensors`` (contiguous CPU copies) to a safetensors file; returns its SHA-256. The same tensors and
    metadata give the same bytes: the header's keys are written sorted (safetensors writes the metadata in a hash
    map's order, which changes from one process to the next, so that a rerun's truth file differed)."""
    plain = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    data = _st_save(plain, metadata={k: str(v) for k, v in (metadata or {}).items()} or None)
    (n,) = struct.unpack("<Q", data[:8])
    header = json.dumps(json.loads(data[8:8 + n]), sort_keys=True, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)  # the data stays 8-byte aligned, as safetensors pads it
    data = struct.pack("<Q", len(header)) + header + data[8 + n:]
    write_bytes(Path(path), data)
    return hashlib.sha256(data).hexdigest()


def _header_metadata(data: bytes) -> dict[str, str]:
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    return dict(header.get("__metadata__") or {})


def tensor_file_metadata(path: Path) -> dict[str, str]:
    """The string metadata of a safetensors file, read from its header alone (no tensor is read);
    raises OSError, or ValueError for a file that is no safetensors file."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{path} is no safetensors file")
        (n,) = struct.unpack("<Q", head)
        if n > 100 * 2**20:  # the header of a file leaklab wrote is a few KB
            raise ValueError(f"{path} is no safetensors file")
        try:
            return _header_metadata(head + f.read(n))
        except (ValueError, UnicodeDecodeError, AttributeError) as e:
            raise ValueError(f"{path} is no safetensors file") from e


def _pickled(data: bytes) -> bool:
    """Whether ``data`` looks like torch.save's zip archive or a pickle (protocol 2 and up) rather than a damaged
    safetensors file, whose JSON header starts at byte 8."""
    return data[8:9] != b"{" and (data.startswith(b"PK\x03\x04") or (data[:1] == b"\x80" and data[1:2] in
                                                                      (b"\x02", b"\x03", b"\x04", b"\x05")))


def load_tensors(path: Path, what: str, sha256: str | None = None, max_bytes: int | None = None,
                 too_large: str = "write it again with the command that made it",
                 ) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Read a safetensors file (tensors and its string metadata) without unpickling anything.

    ``sha256``, when given, must match the file's digest: a flipped byte anywhere is detected. It is 64 hexadecimal
    digits, of either case (another value read as a corrupt file, an uppercase digest of an intact one too).
    ``max_bytes``: the most the tensors it should hold can fill; a larger file is refused before it is read (a
    sparse 1 GiB file of 4 KB on disk held 2.4 GB of memory for 27 s before its names were compared), with
    ``too_large`` as the advice.
    """
    path = Path(path)
    if sha256 is not None and not (isinstance(sha256, str) and re.fullmatch(r"[0-9a-fA-F]{64}", sha256)):
        raise LeaklabError(f"the SHA-256 recorded for {what} file {path} is not 64 hexadecimal digits "
                           f"({str(sha256)[:80]!r}); record the file's digest, or none")
    try:
        if path.exists():  # a missing file is the FileNotFoundError below
            if not path.is_file():
                raise LeaklabError(f"{what} file {path} is not a regular file; {_missing_hint(path)}")
            size = path.stat().st_size
            if size > MAX_TENSOR_FILE_BYTES:
                raise LeaklabError(f"{what} file {path} is larger than leaklab reads "
                                   f"({MAX_TENSOR_FILE_BYTES >> 30} GiB)")
            if max_bytes is not None and size > max_bytes:
                raise LeaklabError(f"{what} file {path} holds {size:,} bytes, more than the tensors it should hold "
                                   f"fill ({max_bytes:,} at most); {too_large}")
        data = path.read_bytes()
    except FileNotFoundError:
        raise _missing(what, path) from None
    except OSError as e:
        raise LeaklabError(f"{what} file {path} cannot be read ({_first_line(e)})") from None
    fix = "write it again with the command that made it (or copy it again)"  # a case, a model, an agent
    try:
        tensors = _st_load(data)
        metadata = _header_metadata(data)
    except (SafetensorError, ValueError, struct.error, UnicodeDecodeError, RuntimeError) as e:
        if _pickled(data):
            raise LeaklabError(f"{what} file {path} is a pickle or torch.save file, not safetensors (leaklab never "
                               "unpickles a file it is handed); save the tensors with safetensors.torch.save_file"
                               ) from None
        raise LeaklabError(f"{what} file {path} is truncated or corrupt ({_first_line(e)}); "
                           f"{fix}") from None
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256.lower():
        raise LeaklabError(f"{what} file {path} is truncated or corrupt (its SHA-256 differs from "
                           f"the one recorded beside it); {fix}")
    return tensors, metadata


# --------------------------------------------------------------------------------------------
# output folders


def _leaklab_format(path: Path) -> str | None:
    """The ``format`` of a JSON file leaklab wrote (``leaklab.…``); None for anything else (anything
    :func:`read_json` refuses included)."""
    try:
        data = read_json(path)
    except LeaklabError:
        return None
    fmt = data.get("format") if isinstance(data, dict) else None
    return fmt if isinstance(fmt, str) and fmt.startswith("leaklab.") else None


def _cell_format(entry: Path) -> str | None:
    """The reproduction an entry of an interrupted run's ``cells/`` belongs to: a finished room-table
    cell (``NAME/results.json``), the room attacks' resume journal or a partial cell, a Bayes-table
    cell (``NAME.json``) or tuning journal (``NAME.tune.jsonl``); None for anything else."""
    if _leaklab_format(entry / RESULTS_FILE) == ROOM_ATTACK_FORMAT or entry.name == ".leaklab-resume" \
            or (entry.name.startswith(".") and entry.name.endswith(".partial")):
        return REPRODUCTION_FORMAT
    if _leaklab_format(entry) == BAYES_CELL_FORMAT or (entry.is_file() and entry.name.endswith(".tune.jsonl")):
        return BAYES_TABLE2_FORMAT
    return None


def output_formats(out: Path) -> set[str]:
    """The formats of the leaklab output in folder ``out``: its marker files' (a file named like one but
    not written by leaklab does not count), and a reproduction's for a ``cells/`` folder that holds
    only what an interrupted run of it leaves (:func:`_cell_format`)."""
    found = {fmt for m in _OUTPUT_MARKERS if (fmt := _leaklab_format(out / m))}
    try:
        kinds = [_cell_format(p) for p in (out / CELLS_DIR).iterdir()] if (out / CELLS_DIR).is_dir() else []
    except OSError:  # unreadable: not taken as leaklab's
        kinds = [None]
    if kinds and None not in kinds:
        found.update(kinds)
    return found


def resolved(path: Path) -> Path:
    """``path`` with its links followed (``Path.resolve``); a link that loops is a one-line error (Python's
    ``RuntimeError`` was a traceback)."""
    try:
        return Path(path).resolve()
    except RuntimeError:
        raise LeaklabError(f"{path} is a symbolic link that loops; point it at a file or folder") from None


def check_out(out: Path, writes: str, inputs: Sequence[Path] = ()) -> Path:
    """Refuse an ``--out`` that exists and is not the earlier output of the same kind of command (its
    marker's format is ``writes``): never clobber a user's files, nor another command's output; one
    that is or holds one of the command's ``inputs`` (replacing it would delete them); and one inside an
    input folder (replacing that input, e.g. capturing the cases again, deleted the audit kept inside it)."""
    out = Path(out)
    if out.is_symlink() and not out.exists():  # a run to its end, then its output lost on the link
        raise LeaklabError(f"--out {out} is a link to {os.readlink(out)}, which does not exist (or loops); create "
                           "it or choose another folder")
    for given in inputs:  # resolved: `a/../b` and symlinks name the same folders
        given = resolved(given)
        if given == resolved(out) or resolved(out) in given.parents:
            raise LeaklabError(f"--out {out} would replace the input {given}; choose another folder")
        if given in resolved(out).parents:
            raise LeaklabError(f"--out {out} is inside the input {given}, which a new run writing there (a capture "
                               "again, say) would replace with all it holds; choose a folder outside it")
    if not out.exists():
        ancestor = out.absolute().parent
        while not ancestor.exists() and not ancestor.is_symlink():
            ancestor = ancestor.parent
        if not ancestor.is_dir():  # found now, not after the run's work
            raise LeaklabError(f"--out {out}: cannot create the folder {out.parent}: {ancestor} is "
                               f"{'a file' if ancestor.is_file() else 'not a folder'}; choose another folder")
        return out
    if not out.is_dir():
        raise LeaklabError(f"--out {out} is a file; choose a new folder (leaklab replaces only its own earlier output)")
    entries = list(out.iterdir())
    if not entries or (entries == [out / CELLS_DIR] and not any((out / CELLS_DIR).iterdir())):
        return out  # empty, or a reproduction stopped before its first cell: nothing to lose
    formats = output_formats(out)
    if not formats:
        raise LeaklabError(f"--out {out} is a folder that leaklab did not write; choose a new folder (leaklab "
                           "replaces only its own earlier output)")
    if writes not in formats:
        held = listing(sorted(f"`{_WRITTEN_BY.get(f, f)}`" for f in formats))
        raise LeaklabError(f"--out {out} holds another command's output (of {held}); choose a new folder or "
                           "remove that one first")
    if writes not in _IN_PLACE:
        _check_only_ours(out)
    return out


def check_format_version(data: dict, where: str, newest: int) -> None:
    """Refuse a leaklab file (``data``, read from ``where``) whose ``format_version`` is no whole number from 1 or
    newer than ``newest``, the last this leaklab writes (a reader refuses newer versions: docs/formats.md)."""
    version = data.get("format_version")
    if type(version) is not int or version < 1:
        raise LeaklabError(f"{where} has format version {version!r}; it must be a whole number from 1")
    if version > newest:
        raise LeaklabError(f"{where} has format version {version!r}; this leaklab reads versions up to {newest}: "
                           "upgrade leaklab")


def check_audit_kind(out: Path, kind: str) -> None:
    """Refuse an ``--out`` that holds an audit of another ``kind`` (``rooms``, ``room-cases``, ``image``): the kinds
    share their format, so :func:`check_out` let one replace the other (an image audit replaced a room audit)."""
    path = Path(out) / RESULTS_FILE
    if not path.is_file():
        return
    held = read_json(path)
    if isinstance(held, dict) and held.get("format") == AUDIT_FORMAT and held.get("kind") != kind:
        raise LeaklabError(f"--out {out} holds an audit of another kind ({held.get('kind')!r}), which this one "
                           f"({kind!r}) would replace; choose a new folder or remove that one first")


def _entries(folder: Path) -> list[str]:
    """Every file and folder under ``folder`` (links not followed), as sorted relative POSIX paths."""
    found = []
    for root, dirs, files in os.walk(folder, onerror=_raise):
        rel = Path(root).relative_to(folder)
        found += [(rel / name).as_posix() for name in (*dirs, *files)]
    return sorted(found)


def _raise(error: OSError) -> None:
    raise error


def _check_only_ours(out: Path) -> None:
    """Refuse to replace an earlier output whole when it holds anything its :data:`ENTRIES_FILE` does not list
    (a user's note, a nested run) or lists nothing (written before leaklab listed its outputs' entries)."""
    data = read_json(out / ENTRIES_FILE, "output entries") if (out / ENTRIES_FILE).is_file() else None
    listed = data.get("entries") if isinstance(data, dict) and data.get("format") == ENTRIES_FORMAT else None
    if not isinstance(listed, list):
        raise LeaklabError(f"--out {out} is an earlier output that does not list what it holds (leaklab replaces "
                           "only what it wrote); move out what you keep there and remove it, or choose a new folder")
    ours = {*map(str, listed), ENTRIES_FILE}
    try:
        foreign = [e for e in _entries(out) if e not in ours]
    except OSError as e:
        raise LeaklabError(f"--out {out} cannot be read ({e.strerror or _first_line(e)}); choose another "
                           "folder") from None
    if foreign:
        shown = listing(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise LeaklabError(f"--out {out} holds what leaklab did not write there ({shown}), which replacing it "
                           "would delete; move that out or choose a new folder")


def make_out_parent(out: Path) -> None:
    """Create ``out``'s parent folders; a path that cannot be created is a one-line error."""
    _make_dir(out.parent, out)


def make_out_dir(out: Path) -> None:
    """Create folder ``out`` (and its parents) for a command that writes in place; one-line errors."""
    _make_dir(out, out)


def _make_dir(folder: Path, out: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
        why = f"{blocker} is a file" if blocker is not None else e.strerror or _first_line(e)
        raise LeaklabError(f"--out {out}: cannot create the folder {folder} ({why})") from None


def check_png_out(out: Path) -> Path:
    """Refuse a PNG ``--out`` that is not named ``*.png``, is a folder, is an existing file that is not a
    PNG (leaklab overwrites an image, never a user's other file) or lies in a folder that takes no files;
    its folder is created."""
    out = Path(out)
    if out.suffix.lower() != ".png":
        raise LeaklabError(f"--out {out}: leaklab writes a PNG image here; name the file *.png")
    if out.is_dir():
        raise LeaklabError(f"--out {out} is a folder; name a *.png file")
    if out.exists():
        try:
            with out.open("rb") as f:
                head = f.read(len(PNG_MAGIC))
        except OSError as e:
            raise LeaklabError(f"--out {out} cannot be read ({e.strerror or _first_line(e)})") from None
        if head != PNG_MAGIC:
            raise LeaklabError(f"--out {out} exists and is not a PNG image; choose a new file name")
    make_out_parent(out)
    try:  # before the work: a folder that exists but takes no files (read-only, /proc) fails here
        with tempfile.NamedTemporaryFile(prefix=f".{out.name}.", suffix=".probe", dir=out.parent):
            pass
    except OSError as e:
        raise _cannot_write(out, e) from None
    return out


def _cannot_write(out: Path, e: OSError) -> LeaklabError:
    return LeaklabError(f"--out {out}: cannot write in {out.parent} ({e.strerror or _first_line(e)})")


@contextlib.contextmanager
def atomic_dir(out: Path, writes: str, inputs: Sequence[Path] = ()) -> Iterator[Path]:
    """Yield a fresh temporary folder inside ``out``'s parent; on success it becomes ``out``.

    On any error (or Ctrl-C) the temporary folder is removed and ``out`` is left as it was. An
    existing ``out`` is replaced only when it is empty or holds the earlier output of the same kind
    (``writes``, the format of the results this command writes) and nothing that output's
    :data:`ENTRIES_FILE` (written here, last) does not list, and never when it is or holds one
    of ``inputs`` (:func:`check_out`).
    """
    out = check_out(Path(out), writes, inputs)
    # a link to an earlier output: that output is replaced and the link kept (a folder replaced the link, the
    # old results left in its target)
    out = (resolved(out) if out.is_symlink() else out).absolute()
    make_out_parent(out)
    if out.exists():  # before any work: an --out that cannot be moved aside (a mount point, immutable)
        _replace_aside(out, lambda aside: os.replace(aside, out))
    try:
        _remove_orphans(out)
        tmp = Path(tempfile.mkdtemp(prefix=_partial_prefix(out), suffix=".partial", dir=out.parent))
    except OSError as e:
        raise _cannot_write(out, e) from None
    os.chmod(tmp, 0o777 & ~_UMASK)
    try:
        yield tmp
        write_json(tmp / ENTRIES_FILE, {"format": ENTRIES_FORMAT, "format_version": FORMAT_VERSION,
                                        "entries": _entries(tmp)})
        check_out(out, writes)
        if out.exists():
            _replace_aside(out, lambda aside: os.replace(tmp, out))
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _partial_prefix(out: Path) -> str:
    """The start of the name of a run's temporary folder beside ``out``: the process that writes it, named
    within its scope (:func:`~leaklab.processes.process_scope`: a folder may be shared by machines or containers,
    whose process ids are not this one's)."""
    return f".{out.name}.{process_scope()}.{os.getpid()}."


def _remove_orphans(out: Path) -> None:
    """Remove this user's temporary folders beside ``out`` (:func:`_partial_prefix`) whose process, of this scope,
    is gone: runs killed outright (SIGKILL, the OOM killer) left them there for good (leaklab's own ones: their
    names end in ``.partial``, a random part before it)."""
    scope = f".{out.name}.{process_scope()}."
    for entry in out.parent.glob(f"{glob.escape(scope)}*.partial"):
        pid = entry.name[len(scope):].split(".")[0]
        with contextlib.suppress(OSError):
            info = entry.lstat()
            if pid.isdigit() and stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() \
                    and process_gone(int(pid)):
                shutil.rmtree(entry, ignore_errors=True)


def _replace_aside(out: Path, then: Callable[[Path], None]) -> None:
    """Move the folder ``out`` into a temporary one beside it, call ``then`` with where it went, and remove
    what is left there; an ``out`` that cannot be moved is a :class:`LeaklabError` with nothing left behind."""
    try:
        trash = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
    except OSError as e:
        raise _cannot_write(out, e) from None
    try:
        os.replace(out, trash / "old")
    except OSError as e:
        shutil.rmtree(trash, ignore_errors=True)
        raise LeaklabError(f"--out {out} cannot be replaced ({e.strerror or _first_line(e)}); choose another "
                           "folder") from None
    then(trash / "old")
    shutil.rmtree(trash, ignore_errors=True)


def new_run_dir(kind: str, root: Path = Path("runs")) -> Path:
    """``runs/<YYYYmmdd-HHMMSS>-<kind>`` (a suffix keeps it unique); the folder is not created."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", kind).strip("-") or "run"
    path = Path(root) / f"{stamp}-{safe}"
    n = 2
    while path.exists():
        path = Path(root) / f"{stamp}-{safe}-{n}"
        n += 1
    return path


def _yaml_int(text: str) -> int:
    """A whole number of a configuration: decimal (leading zeros and ``_`` too), ``0o`` octal or ``0x`` hexadecimal."""
    return int(text, 0) if text[:2] in ("0o", "0x") else int(text.replace("_", ""), 10)


def _yaml_loader() -> type:
    """YAML's safe loader without aliases (``*name``): a configuration needs none, and a few hundred bytes of
    aliases to aliases expand to billions of values when read. Numbers read as YAML 1.2 reads them, with ``_``
    between digits as YAML 1.1 allows: 1.1, PyYAML's, reads ``1e-3`` (no dot) and ``1.0e3`` (no sign) as text,
    which the options then refused as no number, and ``010`` as 8, ``1:05`` as 65 (base 60) and ``0b11`` as 3,
    where 1.2 reads 10, text and text."""
    import yaml

    class NoAliases(yaml.SafeLoader):
        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                raise yaml.composer.ComposerError(None, None, "aliases (*name) are not read in a configuration",
                                                  self.peek_event().start_mark)
            return super().compose_node(parent, index)

    int_tag, float_tag = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
    NoAliases.yaml_implicit_resolvers = {first: [(tag, regexp) for tag, regexp in resolvers
                                                 if tag not in (int_tag, float_tag)]
                                         for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    digits = r"[0-9](?:_*[0-9])*"  # underscores between digits only
    NoAliases.add_implicit_resolver(int_tag, re.compile(rf"^(?:[-+]?{digits}|0o[0-7]+|0x[0-9a-fA-F]+)$"),
                                    list("-+0123456789"))
    NoAliases.add_constructor(int_tag, lambda loader, node: _yaml_int(loader.construct_scalar(node)))
    # a dot or an exponent makes a float; .inf and .nan are read (and then refused)
    NoAliases.add_implicit_resolver(float_tag, re.compile(
        rf"^(?:[-+]?(?:{digits}\.(?:{digits})?|\.{digits})(?:[eE][-+]?[0-9]+)?|[-+]?{digits}[eE][-+]?[0-9]+"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"), list("-+0123456789."))
    return NoAliases


def read_config(path: Path) -> dict[str, Any]:
    """A configuration mapping from a YAML (``.yaml``/``.yml``, safe loader) or JSON file."""
    path = Path(path)
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        text = _read_text(path, "config")
        try:
            data = check_finite(yaml.load(text, _yaml_loader()), f"config file {path}")
        except yaml.YAMLError as e:
            raise LeaklabError(f"config file {path} is not valid YAML ({_first_line(e)})") from None
        except RecursionError:
            raise LeaklabError(f"config file {path} nests too deeply to be a configuration") from None
        except LeaklabError:  # check_finite's own words (a ValueError too: wrapped in these once more)
            raise
        except ValueError as e:  # a number past Python's digit limit for integers
            raise LeaklabError(f"config file {path} is not a configuration ({_first_line(e)})") from None
    else:
        data = read_json(path, "config")
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise LeaklabError(f"config file {path} must hold a mapping of option names to values")
    return data
