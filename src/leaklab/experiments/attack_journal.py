"""Finished room attacks kept across an interrupted run, so that rerunning the command resumes.

A room attack takes 10 s to minutes; an audit with ``--full`` or a 48-sample table cell runs for
hours. Their output folders are written atomically (nothing half-written under ``--out``), so
without this an interruption lost every finished attack. :class:`AttackJournal` keeps each
finished attack's reconstruction in ``.leaklab-resume/`` beside ``--out`` (one safetensors file
named by the digest of the job: what the server held, the attack's configuration and method
version, the device; a user's own network class by its module's source), and a later run hands a
job whose digest it finds the saved reconstruction, read in the job's turn, instead of attacking
again. The digest names the computation, not the run: a rerun under another ``--out`` in the same
parent folder (``leaklab audit`` picks a new ``runs/<id>`` each time) resumes too, and a changed
option, network or capture misses and attacks afresh. A run that finishes removes its own entries,
those it or an earlier try of the same run (the same jobs) wrote, and the folder once empty; the entries
of another run that it took stay for that run, if interrupted, to resume (a default audit finished beside
an interrupted ``--full`` took some of its attacks and removed them). A saved entry that does not read back
as a reconstruction of the job's shape is attacked again in its turn. Nothing is unpickled.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import math
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch

from leaklab.attacks.rl import RoomReconstruction
from leaklab.attacks.rl.config import METHOD_VERSION
from leaklab.errors import LeaklabError
from leaklab.io import load_tensors, save_tensors, tensor_file_metadata
from leaklab.models.perception import architecture_digest, perception_class, user_modules
from leaklab.words import plural

RESUME_DIR = ".leaklab-resume"
_TENSORS = tuple(f.name for f in fields(RoomReconstruction) if f.name not in
                 ("iterations", "seconds", "exact", "no_signal", "stage1_starts", "feature_cosine"))
_FLAGS = ("action_identified", "read")  # the bool tensors of a saved reconstruction


def _hash_tensors(h: Any, tensors: dict[str, torch.Tensor]) -> None:
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())


def network_identity(spec: Any, model_class: str | None) -> str:
    """The built-in architecture's digest, or a user's class named with the sha256 of its modules' source: its
    own and its parent classes' (an edited class is another network; until session 54 a parent's module was not
    read, and an attack of the class before its parent's edit was resumed; a module without source files never
    matches)."""
    if model_class is None:
        return architecture_digest(spec)
    h = hashlib.sha256()
    for name in sorted(user_modules(perception_class(model_class).__mro__)):
        try:
            h.update(f"{name}|".encode() + inspect.getsource(sys.modules[name]).encode())
        except (OSError, TypeError):
            h.update(os.urandom(16))
    return f"{model_class}@{h.hexdigest()}"


def job_digest(job: Any, state_digest: str | None = None) -> str:
    """sha256 of everything an attack's result depends on: ``job``'s algorithm, network spec and
    :func:`network_identity`, attack configuration and the mode's method version, device, the
    network's state and the update (metadata, defense, tensors)."""
    h = hashlib.sha256()
    network = network_identity(job.spec, job.model_class)
    h.update(json.dumps({"algorithm": job.algorithm, "spec": job.spec.model_dump(mode="json"),
                         "network": network, "attack": job.attack.model_dump(mode="json"),
                         "method_version": METHOD_VERSION[job.attack.mode], "device": job.device,
                         "update": job.update.metadata.model_dump(mode="json"),
                         "defense": job.update.defense, "state": state_digest or state_hash(job.state)},
                        sort_keys=True).encode())
    _hash_tensors(h, job.update.tensors)
    return h.hexdigest()


def state_hash(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    _hash_tensors(h, state)
    return h.hexdigest()


class AttackJournal:
    """The saved reconstructions of ``jobs`` in ``parent/.leaklab-resume`` (see the module docstring);
    ``on_job(n)`` hears how many jobs have been named so far (a paper-scale audit builds and hashes
    1,920 defended updates, about a minute)."""

    def __init__(self, parent: Path, jobs: Sequence[Any], on_job: Callable[[int], None] | None = None):
        self.folder = Path(parent) / RESUME_DIR
        self._unwritable = False
        states: dict[int, str] = {}  # jobs of a run share one state dict: hash it once
        self.digests: list[str] = []
        self._shapes: list[dict[str, tuple[int, ...]]] = []  # each job's tensors' shapes, as its attack returns them
        self._actions: list[int] = []  # each job's number of actions
        for job in jobs:  # one at a time: a JobList builds each job (its defended update) when asked
            key = id(job.state)
            if key not in states:
                states[key] = state_hash(job.state)
            self.digests.append(job_digest(job, states[key]))
            batch, spec = job.update.metadata.batch_size, job.spec
            self._shapes.append({"images": (batch, spec.in_channels, spec.image_size, spec.image_size),
                                 "box": (batch, spec.box_dim), "action": (batch,), "q_pred": (batch,),
                                 "q_target": (batch,), "probs": (batch, spec.num_actions), "reward": (batch,),
                                 "action_identified": (batch,), "read": (batch,)})
            self._actions.append(spec.num_actions)
            if on_job:
                on_job(len(self.digests))
        self.run = hashlib.sha256("".join(self.digests).encode()).hexdigest()  # the same jobs, the same run

    def _path(self, index: int) -> Path:
        return self.folder / f"{self.digests[index]}.safetensors"

    def held(self) -> set[int]:
        """The jobs (by index) that have an entry; whether it reads back is known when :meth:`load`
        reads it in the job's turn (a paper-scale audit's entries are not all held in memory at once)."""
        return {i for i in range(len(self.digests)) if self._path(i).is_file()}

    def load(self, index: int) -> RoomReconstruction | None:
        """Job ``index``'s saved reconstruction, or None when there is none or it does not read back
        whole (corrupt, another job's, not of the job's shapes)."""
        try:
            tensors, meta = load_tensors(self._path(index), "saved attack")
            if meta.get("no_signal") == "true" and "read" not in tensors:  # saved before `read`: nothing read
                tensors["read"] = torch.zeros(len(tensors["action"]), dtype=torch.bool)
            rec = RoomReconstruction(**tensors, iterations=int(meta["iterations"]),
                                     seconds=float(meta["seconds"]), exact=tuple(json.loads(meta["exact"])),
                                     no_signal=meta["no_signal"] == "true",
                                     stage1_starts=int(meta.get("stage1_starts", "0")),
                                     feature_cosine=float(meta["feature_cosine"]) if meta.get("feature_cosine")
                                     else None)
        except (LeaklabError, KeyError, TypeError, ValueError, RecursionError):
            return None
        return rec if meta.get("job") == self.digests[index] and self._whole(index, tensors, rec) else None

    def _whole(self, index: int, tensors: dict[str, torch.Tensor], rec: RoomReconstruction) -> bool:
        """Whether a saved reconstruction is one of job ``index``'s: every tensor of its shape (a field
        RoomReconstruction lacks, or a missing one, failed before) and kind (numbers floating-point, flags
        bool), its pixels in [0, 1] (NaN where an attack returned it), its actions among the network's, its
        iterations and seconds not negative, the names of what it read in closed form strings. An entry edited
        by hand but keeping its job went into the results as it was (images of int64, seconds of -1e308)."""
        actions, pixels = rec.action, rec.images[~torch.isnan(rec.images)]
        return (all(tuple(t.shape) == self._shapes[index][name] for name, t in tensors.items())
                and all(t.dtype == torch.bool if name in _FLAGS else name == "action" or t.is_floating_point()
                        for name, t in tensors.items())
                and bool(((pixels >= 0) & (pixels <= 1)).all())
                and actions.dtype == torch.int64 and bool(((actions >= 0) & (actions < self._actions[index])).all())
                and rec.iterations >= 0 and math.isfinite(rec.seconds) and rec.seconds >= 0
                and all(isinstance(name, str) for name in rec.exact))

    def add(self, index: int, rec: RoomReconstruction) -> None:
        """Save job ``index``'s reconstruction (atomically: a killed write leaves no entry). When the
        folder cannot be written (a file in its place, no space, no permission) the run goes on
        unsaved, after one warning."""
        if self._unwritable:
            return
        tensors = {name: getattr(rec, name) for name in _TENSORS if getattr(rec, name) is not None}
        try:
            save_tensors(self._path(index), tensors,
                         {"format": "leaklab.saved_attack", "job": self.digests[index],
                          "iterations": rec.iterations, "seconds": repr(rec.seconds),
                          "exact": json.dumps(list(rec.exact)), "no_signal": "true" if rec.no_signal else "false",
                          "stage1_starts": rec.stage1_starts, "run": self.run,
                          "feature_cosine": "" if rec.feature_cosine is None else repr(rec.feature_cosine)})
        except OSError as e:
            self._unwritable = True
            warnings.warn(f"cannot keep finished attacks in {self.folder} ({e.strerror or e}); an interrupted run "
                          "will not resume", RuntimeWarning, stacklevel=2)

    def _written_by_another_run(self, index: int) -> bool:
        """Whether job ``index``'s entry names another run as its writer (entries written before leaklab
        named their run count as this run's; an entry that cannot be read is nobody's)."""
        try:
            return tensor_file_metadata(self._path(index)).get("run", self.run) != self.run
        except (OSError, ValueError):
            return False

    def discard(self) -> None:
        """Remove this run's entries (not those another run wrote and this one took), and the folder when
        no other run's entries are left; when some are, say how many and how large (an interrupted run
        that is never rerun leaves them)."""
        for i in range(len(self.digests)):
            if not self._written_by_another_run(i):
                with contextlib.suppress(OSError):  # not there (or no folder to hold it)
                    self._path(i).unlink()
        try:
            self.folder.rmdir()
        except FileNotFoundError:
            return
        except OSError:  # not empty: the attacks of another run, interrupted (or running now)
            with contextlib.suppress(OSError):
                others = [p.stat().st_size for p in self.folder.iterdir() if p.suffix == ".safetensors"]
                if others:
                    size = sum(others)
                    held = f"{size / 2**20:.0f} MB" if size >= 2**20 else f"{max(1, round(size / 2**10))} KB"
                    warnings.warn(f"{self.folder} still holds {plural(len(others), 'finished attack')} of other "
                                  f"runs ({held}), kept for when those are rerun; remove the folder if they will "
                                  "not be", UserWarning, stacklevel=2)


@contextlib.contextmanager
def journal_beside(out: Path, jobs: Sequence[Any], on_job: Callable[[int], None] | None = None,
                   ) -> Iterator[AttackJournal]:
    """The journal of ``jobs`` in ``out``'s parent folder (``on_job``: as :class:`AttackJournal`'s); this
    run's entries are removed when the block ends without an error (enter it before
    ``atomic_dir(out, ...)``, so that ``out`` is in place first)."""
    journal = AttackJournal(Path(out).absolute().parent, jobs, on_job)
    yield journal
    journal.discard()
