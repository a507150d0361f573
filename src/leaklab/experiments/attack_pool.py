"""Attacks run in parallel: one room attack per worker process (one torch thread each), every result
handed on in job order as soon as it is ready, and finished attacks kept in an
:class:`~leaklab.experiments.attack_journal.AttackJournal` so that an interrupted run resumes.

A :class:`Job` holds everything the server has of one update (network spec and state, the update,
the attack's configuration), nothing of the truth; :class:`JobList` builds jobs only when the pool
asks for them, so a paper-scale audit's 1,920 defended updates are never in memory at once.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import functools
import importlib
import multiprocessing
import os
import pickle
import signal
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import torch

from leaklab.attacks.rl import RoomAttackConfig, RoomReconstruction, qgi, rgi
from leaklab.device import crash_tracebacks, one_thread, repeatable
from leaklab.errors import LeaklabError, ModelClassError
from leaklab.experiments import ProgressFn
from leaklab.experiments.attack_journal import AttackJournal
from leaklab.models import PerceptionSpec
from leaklab.models.perception import user_modules
from leaklab.threat import ClientUpdate, make_view


@dataclass(frozen=True)
class Job:
    """One attack for a worker process: everything the server holds, nothing of the truth."""

    algorithm: str
    spec: PerceptionSpec
    state: dict[str, torch.Tensor]
    update: ClientUpdate
    attack: RoomAttackConfig
    model_class: str | None = None  # a user's own perception network class ("module:Class")
    device: str = "cpu"


class JobList(Sequence[Job]):
    """``count`` jobs, job ``i`` built by ``make(i)`` when it is asked for. :func:`run_jobs` and the
    attack journal take one at a time, so only the queued and running attacks' updates are in memory
    (a defended S1 update is 15 MB; the paper-scale audit attacks 1,920 of them)."""

    def __init__(self, count: int, make: Callable[[int], Job]):
        self._count, self._make = count, make

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index: int) -> Job:  # type: ignore[override]
        if not isinstance(index, int) or not 0 <= index < self._count:
            raise IndexError(index)
        return self._make(index)


# In a worker process: where its attacks report how far they are (set by the pool's initializer).
_progress_queue: Any = None


def start_worker(queue: Any, fault_handler: bool, parent: int) -> None:
    """A worker's set-up: the queue its attacks report progress to, and the parent's fault handler (a crash
    in native code prints the worker's Python traceback before the pool reports that a worker died). Ctrl-C is
    the parent's to handle (it stops the workers; an idle worker printed a traceback of its own), and on Linux a
    worker ends with its parent (:data:`PR_SET_PDEATHSIG`): a parent killed outright (SIGKILL, the OOM killer)
    left its workers, 400 MB each, running on. The signal comes when the thread that started the worker ends: the
    pool is started, fed and shut down by one thread (:func:`start_workers`, :func:`run_jobs`)."""
    global _progress_queue
    _progress_queue = queue
    if fault_handler:
        crash_tracebacks()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the call above
            os._exit(1)


PR_SET_PDEATHSIG = 1  # Linux prctl: the signal a process gets when the thread that started it ends


def _report_to_queue(index: int, fraction: float) -> None:
    _progress_queue.put((index, fraction))


def _attack_one(job: Job, index: int = 0,
                report: Callable[[int, float], None] | None = None) -> RoomReconstruction:
    """Attack one update from the server's view (runs in a worker process, one torch thread) on
    ``job.device``, repeatably on CUDA too (:func:`leaklab.device.repeatable`); the reconstruction
    comes back on the CPU. ``report(index, fraction)`` hears how much of the image stage is done
    (every 50 steps; in a pool's worker, through the pool's queue). The caller's thread count is
    restored on return (:func:`leaklab.device.one_thread`)."""
    report = report or (_report_to_queue if _progress_queue is not None else None)
    steps = job.attack.iterations
    progress = (lambda it, _: report(index, it / steps)) if report else None
    with one_thread(), repeatable(job.device):
        view = make_view(job.spec, job.state, job.update.metadata, model_class=job.model_class)
        view.model.to(job.device)
        try:
            return (qgi if job.algorithm == "qgi" else rgi)(view, job.update, job.attack, progress).to("cpu")
        except (Exception, SystemExit) as e:  # a user's network calling sys.exit too
            if isinstance(e, (LeaklabError, MemoryError, torch.OutOfMemoryError)) or not _raised_in(
                    e, user_modules({*type(view.model).__mro__, *(type(m) for m in view.model.modules())})):
                raise
            first = (str(e).strip().splitlines() or [""])[0]  # a numpy step's failure: the contract's (check_forward)
            raise ModelClassError(f"--model-class {job.model_class}: its code failed in the attack "
                                  f"({type(e).__name__}: {first}); the attacks differentiate it in the images and "
                                  "the box") from e


def _raised_in(error: BaseException, modules: set[str]) -> bool:
    """Whether ``error`` passed through code of one of ``modules`` (a user's network's)."""
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_globals.get("__name__") in modules:
            return True
        tb = tb.tb_next
    return False


def _attack_in_worker(job: bytes, index: int) -> bytes:
    """:func:`_attack_one` in a pool's worker, the job and its reconstruction passed as pickled bytes
    through the pool's pipes: the pool's own pickler would pass their tensors through shared memory,
    which Docker caps at 64 MB by default (with 25 MB there a 2-worker S1 attack waited forever; an S1
    job is 30 MB). The bytes only ever come from this pool's parent and workers (what the pool's own
    pickler would carry), never from a file: a user's update was read from safetensors before."""
    return pickle.dumps(_attack_one(pickle.loads(job), index))


def worker_count(requested: int, jobs: int) -> int:
    """Processes for ``jobs`` attacks: ``requested``, or one per usable CPU core when 0."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(requested or cores, jobs))


@dataclass(frozen=True)
class Workers:
    """Attack processes started by :func:`start_workers`, for one :func:`run_jobs`."""

    pool: ProcessPoolExecutor
    queue: Any  # where their attacks report how far they are
    count: int


def _warm_up() -> None:
    """A started worker's first task: unpickling it imports this module and so the attacks, and it imports
    ``torch._dynamo``, which torch.optim imports at an optimiser's first step (2.5 s on session 67's host)."""
    importlib.import_module("torch._dynamo")


def start_workers(count: int) -> Workers:
    """Spawn ``count`` worker processes now, each importing the attack code at once (:func:`_warm_up`): their
    start-up, 5 s a process on session 67's host before its first attack's first step, then runs while the caller
    prepares the jobs (an audit's captures) on a core that would idle. The thread that calls this must be the one
    that runs :func:`run_jobs` (:func:`start_worker`)."""
    context = multiprocessing.get_context("spawn")
    queue = context.SimpleQueue()
    pool = ProcessPoolExecutor(max_workers=count, mp_context=context, initializer=start_worker,
                               initargs=(queue, faulthandler.is_enabled(), os.getpid()))
    for _ in range(count):  # a submit finding no idle worker spawns one: every worker starts now
        pool.submit(_warm_up)
    return Workers(pool, queue, count)


@contextlib.contextmanager
def workers_for(requested: int, jobs: int) -> Iterator[Workers | int]:
    """The workers :func:`run_jobs` takes for ``jobs`` attacks (:func:`worker_count` of ``requested``), started
    on entering when there are several (:func:`start_workers`), else 1 (the attacks run in this process).
    Leaving stops them: at once on an exception (Ctrl-C in a capture), else after the jobs handed to them."""
    count = worker_count(requested, jobs)
    if count == 1:
        yield 1
        return
    workers = start_workers(count)
    try:
        yield workers
    except BaseException:
        stop_workers(workers.pool)
        raise
    finally:
        workers.pool.shutdown(wait=True, cancel_futures=True)


POLL_SECONDS = 0.5  # how often the parent reads its workers' progress while it waits for a result
QUEUED_PER_WORKER = 1  # jobs handed to the pool beyond one per worker (built only when they are)


def task_progress(progress: ProgressFn | None, task: str, total: int) -> Callable[[float], None] | None:
    """:func:`run_jobs`' ``on_progress`` that reports to ``progress(task, done, total)``."""
    return (lambda done: progress(task, done, total)) if progress else None


def run_jobs(jobs: Sequence[Job], workers: int | Workers, on_result: Callable[[int, RoomReconstruction], None],
             on_progress: Callable[[float], None] | None = None, journal: AttackJournal | None = None) -> int:
    """Run every job (in ``workers`` spawned processes when there are several, 0 = one per core, or in workers
    started before by :func:`workers_for`, which this shuts down) and hand each result to
    ``on_result(index, reconstruction)`` as soon as it is ready, in order.
    ``on_progress(done)`` hears how many jobs are done, a running job counting the share of its image
    stage it has run and a job the journal holds counting from the start: at the start, after each result
    and whenever a running attack reports. With a ``journal`` (of these jobs), a job it holds is not
    attacked again: its saved reconstruction is read and handed on in its turn (an entry that does not
    read back is attacked then); every new result is saved to it as soon as it is ready (on an error the
    queued jobs are dropped and the running ones saved when they finish; on Ctrl-C or SIGTERM the workers
    are stopped at once, their running attacks lost, as a terminal's Ctrl-C interrupts them anyway). A
    pool is handed ``QUEUED_PER_WORKER`` jobs beyond one per worker, the next as one finishes, so a
    :class:`JobList` builds its jobs as they are needed. Returns how many saved attacks were taken."""
    held = journal.held() if journal else set()
    resumed = 0
    todo = [i for i in range(len(jobs)) if i not in held]
    started = workers if isinstance(workers, Workers) else None
    # a held entry may not read back and be attacked after all: workers for every job
    count = started.count if started else worker_count(workers, len(jobs))
    running: dict[int, float] = {}
    finished: set[int] = set()
    # a held job counts as done from the start (until its entry fails to read back), so the time left that a
    # progress line estimates is the new attacks' (resumed ones counted as they came made 7 h read as 50 min)
    unread = set(held)

    def progress() -> None:
        if on_progress:
            on_progress(len(finished) + len(unread) + sum(running.values()))

    progress()  # the task shows from its start, not from its first attack's first report

    def report(index: int, fraction: float) -> None:
        if index not in finished:
            running[index] = fraction
            progress()

    def deliver(index: int, rec: RoomReconstruction) -> None:
        if not torch.isfinite(rec.images).all():  # the images scored nothing, and nothing else said why
            warnings.warn(f"attack {index + 1} of {len(jobs)}: its images came out NaN or infinite (values of the "
                          "update or the network overflow the attack's float32 arithmetic); they score nothing",
                          UserWarning, stacklevel=2)
        on_result(index, rec)
        finished.add(index)
        running.pop(index, None)
        progress()

    def resume(index: int) -> RoomReconstruction | None:
        nonlocal resumed
        unread.discard(index)
        rec = journal.load(index) if index in held else None
        resumed += rec is not None
        return rec

    if count == 1:
        for i in range(len(jobs)):
            rec = resume(i)
            if rec is None:
                rec = _attack_one(jobs[i], i, report if on_progress else None)
                if journal:
                    journal.add(i, rec)
            deliver(i, rec)
        return resumed
    waiting = iter(todo)  # in index order: the job to deliver next is always handed over first
    futures: dict[int, Future] = {}

    handed = False

    def submit(i: int) -> None:
        nonlocal started, handed
        started = started or start_workers(count)  # not before a job needs them: a resumed run may need none
        handed = True
        futures[i] = started.pool.submit(_attack_in_worker, pickle.dumps(jobs[i]), i)
        if journal:
            futures[i].add_done_callback(functools.partial(_keep, journal, i))

    def hand_over() -> None:
        while sum(not f.done() for f in futures.values()) < count * (1 + QUEUED_PER_WORKER):
            i = next(waiting, None)
            if i is None:
                return
            submit(i)

    def read_reports() -> None:
        while started is not None and not started.queue.empty():
            report(*started.queue.get())

    try:
        for i in range(len(jobs)):
            rec = resume(i)
            if rec is not None:
                deliver(i, rec)
                continue
            if i in held:  # its entry did not read back
                submit(i)
            hand_over()
            while not futures[i].done():
                wait([f for f in futures.values() if not f.done()], timeout=POLL_SECONDS,
                     return_when=FIRST_COMPLETED)
                read_reports()
                hand_over()
            read_reports()
            deliver(i, pickle.loads(futures.pop(i).result()))
    except (KeyboardInterrupt, SystemExit):  # asked to stop: not after the queued attacks have run
        if started:
            stop_workers(started.pool)
        raise
    except BrokenProcessPool:
        raise LeaklabError("an attack worker process ended abruptly (killed, for memory say, or crashed); the "
                           "attacks finished before it are kept where the command keeps them, and fewer "
                           "--workers need less memory") from None
    finally:
        if started:
            if not handed:  # started before (workers_for) and no job needed them: not waiting for their warm-up
                stop_workers(started.pool)
            started.pool.shutdown(wait=True, cancel_futures=True)
    return resumed


def stop_workers(pool: ProcessPoolExecutor) -> None:
    """Terminate a pool's worker processes now (Python 3.11 has no public call for it; 3.14's
    ``terminate_workers`` does the same from the same process table)."""
    for process in list((pool._processes or {}).values()):
        process.terminate()


def _keep(journal: AttackJournal, index: int, future: Future) -> None:
    """Save a finished attack to the journal (a pool's done-callback: also while the pool shuts down)."""
    if not future.cancelled() and future.exception() is None:
        journal.add(index, pickle.loads(future.result()))
