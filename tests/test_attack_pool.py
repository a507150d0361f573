"""The room attacks' process pool and journal: progress, resuming an interrupted run, errors and
Ctrl-C in a pool, a dying worker, memory, and what names a saved attack."""

from __future__ import annotations

import math
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cli_helpers import Interrupt, interrupt_after
from leaklab.errors import LeaklabError
from leaklab.io import load_tensors, save_tensors
from leaklab.models import PerceptionSpec
from leaklab.rl.envs.layouts import layouts_arg


def test_attacks_in_this_process_leave_its_torch_thread_count_alone():
    from leaklab.attacks.rl import RoomAttackConfig
    from leaklab.experiments import attack_pool, room_attack

    attack = RoomAttackConfig(mode="exact", iterations=2)
    config = room_attack.RoomRunConfig(algorithm="qgi", setting="S2", samples=1, layouts=("e1m1-stalactite",),
                                       attack=attack)
    state, clean = room_attack.capture_samples(config)
    jobs = [attack_pool.Job("qgi", config.spec, state, clean[0].update, attack)]
    results = []
    torch.set_num_threads(2)
    try:
        attack_pool.run_jobs(jobs, 1, lambda i, rec: results.append(rec))  # one worker: in this process
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)
    assert len(results) == 1 and results[0].iterations == 2


@pytest.mark.parametrize("workers", [1, 2])
def test_progress_counts_the_share_of_each_running_attack(workers):
    """A long sample moves the bar while it runs, in this process and from worker processes."""
    from leaklab.attacks.rl import RoomAttackConfig
    from leaklab.experiments import attack_pool, room_attack

    attack = RoomAttackConfig(mode="exact", iterations=200)
    config = room_attack.RoomRunConfig(algorithm="qgi", setting="S2", samples=2,
                                       layouts=("e1m1-stalactite",), attack=attack)
    state, clean = room_attack.capture_samples(config)
    jobs = [attack_pool.Job("qgi", config.spec, state, s.update, attack) for s in clean]
    results, seen = [], []
    attack_pool.run_jobs(jobs, workers, lambda i, rec: results.append((i, len(seen))), seen.append)
    assert [i for i, _ in results] == [0, 1]
    assert seen == sorted(seen) and seen[0] == 0 and seen[-1] == 2
    # at the start, every 50 of the 200 image steps of each sample, and once per result
    assert len(seen) == 1 + 2 * 4 + 2 and {0.25, 0.5, 0.75} <= set(seen)


def test_an_interrupted_attack_resumes_from_its_finished_samples(tmp_path):
    """Ctrl-C keeps the finished attacks beside --out; the same run attacks only the rest and gives
    the rows of an uninterrupted run; a finished run leaves no journal behind."""
    from leaklab.attacks.rl import RoomAttackConfig
    from leaklab.experiments import room_attack
    from leaklab.experiments.attack_journal import RESUME_DIR

    config = room_attack.RoomRunConfig(algorithm="qgi", setting="S2", samples=3, layouts=layouts_arg("3"),
                                       attack=RoomAttackConfig(iterations=3), workers=1)
    (tmp_path / "a").mkdir()
    out = tmp_path / "a" / "run"
    with pytest.raises(Interrupt):
        room_attack.run(config, out, progress=interrupt_after(2))
    assert not out.exists()
    saved = sorted((tmp_path / "a" / RESUME_DIR).iterdir())
    assert len(saved) == 2 and all(p.suffix == ".safetensors" for p in saved)
    calls = []
    resumed = room_attack.run(config, out, progress=lambda task, done, total: calls.append((task, done, total)))
    assert resumed["summary"]["resumed_samples"] == 2
    # the client episodes are captured (and counted) first; the saved samples count as done from the
    # attacks' start (so the time a progress line estimates is the new attacks'), then the third is attacked
    assert calls[:4] == [("capture qgi S2", n, 3) for n in (0, 1, 2, 3)]
    assert calls[4] == ("qgi S2", 2, 3) and calls[-1] == ("qgi S2", 3, 3)
    assert all(done >= 2 for _, done, _ in calls[4:])
    assert not (tmp_path / "a" / RESUME_DIR).exists()
    fresh = room_attack.run(config, tmp_path / "b" / "run")
    assert fresh["summary"]["resumed_samples"] == 0
    assert [r["metrics"] for r in resumed["samples"]] == [r["metrics"] for r in fresh["samples"]]
    assert [r["index"] for r in resumed["samples"]] == [0, 1, 2]


@pytest.mark.parametrize("workers", [1, 2])
def test_run_jobs_takes_what_the_journal_holds_and_attacks_the_rest(tmp_path, workers):
    from leaklab.attacks.rl import RoomAttackConfig
    from leaklab.experiments import attack_pool, room_attack
    from leaklab.experiments.attack_journal import AttackJournal
    from leaklab.rl.capture import defended

    attack = RoomAttackConfig(iterations=2)
    config = room_attack.RoomRunConfig(algorithm="rgi", setting="S2", samples=3, layouts=layouts_arg("3"),
                                       attack=attack)
    state, clean = room_attack.capture_samples(config)
    jobs = [attack_pool.Job("rgi", config.spec, state, s.update, attack) for s in clean]
    journal = AttackJournal(tmp_path, jobs)
    assert len(set(journal.digests)) == 3
    first = []
    assert attack_pool.run_jobs(jobs, 1, lambda i, rec: first.append(rec), journal=journal) == 0
    # a lost entry is attacked again, a corrupt one too; the others come back as saved
    (tmp_path / ".leaklab-resume" / f"{journal.digests[0]}.safetensors").unlink()
    (tmp_path / ".leaklab-resume" / f"{journal.digests[2]}.safetensors").write_bytes(b"\0" * 16)
    second = []
    assert attack_pool.run_jobs(jobs, workers, lambda i, rec: second.append((i, rec)),
                                journal=AttackJournal(tmp_path, jobs)) == 1
    assert [i for i, _ in second] == [0, 1, 2]
    for a, (_, b) in zip(first, second):
        assert torch.equal(a.images, b.images) and torch.equal(a.reward, b.reward)
        assert torch.equal(a.probs, b.probs) and torch.equal(a.action_identified, b.action_identified)
        assert (a.iterations, a.exact, a.no_signal, a.stage1_starts, a.feature_cosine) == \
            (b.iterations, b.exact, b.no_signal, b.stage1_starts, b.feature_cosine)
    assert second[1][1].seconds == first[1].seconds  # the saved attack's own time, not a new one
    from dataclasses import replace

    journal.add(0, replace(first[0], stage1_starts=3))  # paper mode's count of stage 1's starts is kept
    assert AttackJournal(tmp_path, jobs).load(0).stage1_starts == 3
    journal.add(0, replace(first[0], feature_cosine=0.123456789012))  # exact mode's estimate, to the digit
    assert AttackJournal(tmp_path, jobs).load(0).feature_cosine == 0.123456789012
    journal.add(0, replace(first[0], feature_cosine=None))  # none read (a batch of two behind a defense)
    assert AttackJournal(tmp_path, jobs).load(0).feature_cosine is None
    journal.add(0, replace(first[0], no_signal=True, read=torch.zeros(1, dtype=torch.bool)))  # nothing read
    assert AttackJournal(tmp_path, jobs).load(0).read.tolist() == [False]
    journal.add(0, replace(first[0], no_signal=True))  # saved before `read`: nothing read all the same
    assert AttackJournal(tmp_path, jobs).load(0).read.tolist() == [False]
    journal.add(0, first[0])
    assert AttackJournal(tmp_path, jobs).load(0).read is None  # all read
    # an entry that reads back but not in the job's shapes is not taken either

    journal.add(1, replace(first[1], box=first[1].box[:, :3]))
    reread = AttackJournal(tmp_path, jobs)
    assert reread.held() == {0, 1, 2} and reread.load(1) is None and reread.load(0) is not None
    # nor one whose other tensors, actions or closed forms' names are not the job's (a tampered folder)
    for wrong in (dict(probs=first[1].probs[:, :3]), dict(reward=torch.zeros(5)), dict(action=torch.tensor([7])),
                  dict(action=torch.tensor([2.5])), dict(exact=(["box"],)), dict(exact=([[[]]],)),
                  # an entry edited by hand that keeps its job went into the results as it was
                  dict(images=(first[1].images * 255).long()), dict(images=first[1].images + 2),
                  dict(read=torch.ones(1)), dict(seconds=-1e308), dict(seconds=math.nan), dict(iterations=-5)):
        journal.add(1, replace(first[1], **wrong))
        assert AttackJournal(tmp_path, jobs).load(1) is None, wrong
    path = tmp_path / ".leaklab-resume" / f"{journal.digests[1]}.safetensors"
    tensors, meta = load_tensors(path, "saved attack")
    save_tensors(path, tensors, {**meta, "exact": "[" * 100_000 + "]" * 100_000})  # nested past the recursion limit
    assert AttackJournal(tmp_path, jobs).load(1) is None
    journal.add(1, replace(first[1], box=first[1].box[:, :3]))
    # it is attacked in its turn, by a pool too (entries are read as their turn comes, not up front)
    for k in (0, 2):
        (tmp_path / ".leaklab-resume" / f"{journal.digests[k]}.safetensors").unlink()
    third = []
    assert attack_pool.run_jobs(jobs, workers, lambda i, rec: third.append((i, rec)),
                                journal=AttackJournal(tmp_path, jobs)) == 0
    assert [i for i, _ in third] == [0, 1, 2]
    assert all(torch.equal(a.images, b.images) and torch.equal(a.box, b.box) for a, (_, b) in zip(first, third))
    # another attack configuration, defense or network state names other jobs
    other = [attack_pool.Job("rgi", config.spec, state, s.update, RoomAttackConfig(iterations=3)) for s in clean]
    noisy = [attack_pool.Job("rgi", config.spec, state, defended(s.update, "gaussian:1e-3", 0, s.index), attack)
             for s in clean]
    moved = {k: v + 1e-3 if k.endswith("bias") else v for k, v in state.items()}
    shifted = [attack_pool.Job("rgi", config.spec, moved, s.update, attack) for s in clean]
    for jobs_b in (other, noisy, shifted):
        assert not set(AttackJournal(tmp_path, jobs_b).digests) & set(journal.digests)
    # a run that ends says what other runs left behind, and keeps it
    AttackJournal(tmp_path, other).add(0, first[0])
    with pytest.warns(UserWarning, match="still holds 1 finished attack"):
        journal.discard()
    assert len(list((tmp_path / ".leaklab-resume").iterdir())) == 1



def test_a_saved_attack_is_named_by_its_method_version_and_device_too(monkeypatch):
    """A rerun after a method version's change, or on another device, attacks afresh (job_digest)."""
    from dataclasses import replace

    from leaklab.attacks.rl import RoomAttackConfig
    from leaklab.attacks.rl.config import METHOD_VERSION
    from leaklab.experiments import attack_pool, room_attack
    from leaklab.experiments.attack_journal import job_digest

    attack = RoomAttackConfig(mode="exact", iterations=2)
    config = room_attack.RoomRunConfig(algorithm="qgi", setting="S2", samples=1, layouts=("e1m1-stalactite",),
                                       attack=attack)
    state, clean = room_attack.capture_samples(config)
    job = attack_pool.Job("qgi", config.spec, state, clean[0].update, attack)
    digest = job_digest(job)
    assert job_digest(replace(job, device="cuda")) != digest
    monkeypatch.setitem(METHOD_VERSION, "exact", METHOD_VERSION["exact"] + 1)
    assert job_digest(job) != digest
    monkeypatch.setitem(METHOD_VERSION, "exact", METHOD_VERSION["exact"] - 1)
    assert job_digest(job) == digest

def test_a_pool_that_meets_an_error_drops_its_queue_and_keeps_the_running_attacks(tmp_path):
    from leaklab.attacks.rl import RoomAttackConfig
    from leaklab.experiments import attack_pool, room_attack
    from leaklab.experiments.attack_journal import RESUME_DIR, AttackJournal

    attack = RoomAttackConfig(iterations=100)
    config = room_attack.RoomRunConfig(algorithm="qgi", setting="S2", samples=12, layouts=layouts_arg("4"),
                                       attack=attack)
    state, clean = room_attack.capture_samples(config)
    jobs = [attack_pool.Job("qgi", config.spec, state, s.update, attack) for s in clean]

    def stop(i, rec):
        raise OSError("no space left on device")

    with pytest.raises(OSError):
        attack_pool.run_jobs(jobs, 2, stop, journal=AttackJournal(tmp_path, jobs))
    # the first result and the one running beside it are kept; the queue is dropped (only the few
    # jobs the pool had already handed its workers' call queue still run, and are kept)
    kept = len(list((tmp_path / RESUME_DIR).iterdir()))
    assert 2 <= kept < len(jobs), kept


def test_ctrl_c_stops_a_pools_workers_at_once(tmp_path):
    """Not after the running and the queued attacks have run (a terminal's Ctrl-C interrupts the
    workers' running attacks too, so waiting kept only the queued ones, which nobody asked for)."""
    import multiprocessing

    from leaklab.attacks.rl import RoomAttackConfig
    from leaklab.experiments import attack_pool, room_attack
    from leaklab.experiments.attack_journal import RESUME_DIR, AttackJournal

    config = room_attack.RoomRunConfig(algorithm="qgi", setting="S2", samples=4, layouts=layouts_arg("4"),
                                       attack=RoomAttackConfig(iterations=2))
    state, clean = room_attack.capture_samples(config)
    # the first attack is over in a second, the others would take minutes
    jobs = [attack_pool.Job("qgi", config.spec, state, s.update,
                            RoomAttackConfig(iterations=2 if s.index == 0 else 20000)) for s in clean]

    def stop(i, rec):
        raise Interrupt

    with pytest.raises(Interrupt):
        attack_pool.run_jobs(jobs, 2, stop, journal=AttackJournal(tmp_path, jobs))
    assert len(list((tmp_path / RESUME_DIR).iterdir())) == 1  # the finished attack is kept
    assert not multiprocessing.active_children()


def test_workers_started_before_their_jobs_take_them_and_stop_at_once_on_an_error():
    """An audit starts its attack processes before its captures, whose imports then run beside them: they
    attack the jobs handed to them later, and an error before the jobs exist (Ctrl-C in a capture) stops them
    at once."""
    import multiprocessing

    from leaklab.attacks.rl import RoomAttackConfig
    from leaklab.experiments import attack_pool, room_attack

    with pytest.raises(Interrupt):
        with attack_pool.workers_for(2, 3) as workers:
            started = multiprocessing.active_children()
            assert workers.count == 2 and len(started) == 2
            raise Interrupt
    assert not multiprocessing.active_children()
    assert [p.exitcode for p in started] == [-signal.SIGTERM] * 2  # terminated, not left to finish importing
    for requested, jobs in ((1, 3), (4, 1)):
        with attack_pool.workers_for(requested, jobs) as workers:
            assert workers == 1 and not multiprocessing.active_children()  # the attacks run in this process
    attack = RoomAttackConfig(iterations=2)
    config = room_attack.RoomRunConfig(algorithm="qgi", setting="S2", samples=2, layouts=("e1m1-stalactite",),
                                       attack=attack)
    results = []
    with attack_pool.workers_for(2, 2) as workers:
        state, clean = room_attack.capture_samples(config)
        jobs = [attack_pool.Job("qgi", config.spec, state, s.update, attack) for s in clean]
        attack_pool.run_jobs(jobs, workers, lambda i, rec: results.append((i, rec.iterations)))
        assert not multiprocessing.active_children()  # run_jobs shut them down
    assert results == [(0, 2), (1, 2)]


def test_an_attack_whose_images_overflow_is_told():
    """Finite but extreme values (a network's weights times 1e30) pass every check and overflow the attack's
    float32 arithmetic: the images came out NaN and scored nothing, and nothing said why."""
    from leaklab.attacks.rl import RoomAttackConfig
    from leaklab.experiments import attack_pool, room_attack

    attack = RoomAttackConfig(iterations=2)
    config = room_attack.RoomRunConfig(algorithm="qgi", setting="S2", samples=1, layouts=("e1m1-stalactite",),
                                       attack=attack)
    state, clean = room_attack.capture_samples(config)
    huge = {k: v * 1e30 for k, v in state.items()}
    with pytest.warns(UserWarning, match="attack 1 of 1: its images came out NaN or infinite"):
        attack_pool.run_jobs([attack_pool.Job("qgi", config.spec, huge, clean[0].update, attack)], 1,
                             lambda i, rec: None)


_WITHOUT_SHARED_MEMORY = """
import torch
from leaklab.attacks.rl import RoomAttackConfig
from leaklab.experiments import attack_pool, room_attack

attack = RoomAttackConfig(iterations=2)
config = room_attack.RoomRunConfig(algorithm="qgi", setting="S2", samples=2, layouts=("e1m1-stalactite",),
                                   attack=attack)
state, clean = room_attack.capture_samples(config)
jobs = [attack_pool.Job("qgi", config.spec, state, s.update, attack) for s in clean]

def no_shared_memory(*args, **kwargs):
    raise RuntimeError("a tensor passed through shared memory")

torch.UntypedStorage._share_fd_cpu_ = torch.UntypedStorage._share_filename_cpu_ = no_shared_memory
results = []
attack_pool.run_jobs(jobs, 2, lambda i, rec: results.append((i, rec.iterations)))
print(results)
"""


def test_the_pool_passes_jobs_and_results_without_shared_memory():
    """Docker caps /dev/shm at 64 MB by default and an S1 job is 30 MB: with 25 MB, a 2-worker S1 attack
    waited forever while torch passed the jobs' tensors through shared memory (so did this check: it
    runs in a process of its own, with a time limit)."""
    run = subprocess.run([sys.executable, "-c", _WITHOUT_SHARED_MEMORY], capture_output=True, text=True, timeout=180)
    assert run.returncode == 0 and run.stdout.strip() == "[(0, 2), (1, 2)]", run.stderr[-2000:]


@pytest.mark.parametrize("model_class,printed", [("Dies", ""), ("Crashes", "Segmentation fault")])
def test_a_worker_process_that_dies_is_a_one_line_error(model_class, printed, capfd):
    """A worker killed for memory (or crashed) broke the pool with a traceback; one that crashes in native
    code prints where, as the command's own process does (the pool passes on its fault handler)."""
    from leaklab.attacks.rl import RoomAttackConfig
    from leaklab.experiments import attack_pool, room_attack

    attack = RoomAttackConfig(iterations=2)
    config = room_attack.RoomRunConfig(algorithm="qgi", setting="S2", samples=2, layouts=layouts_arg("2"),
                                       attack=attack)
    state, clean = room_attack.capture_samples(config)
    jobs = [attack_pool.Job("qgi", config.spec, state, s.update, attack,
                            model_class=f"tests.plugins.narrow_net:{model_class}") for s in clean]
    with pytest.raises(LeaklabError, match="an attack worker process ended abruptly"):
        attack_pool.run_jobs(jobs, 2, lambda i, rec: None)
    err = capfd.readouterr().err
    assert printed in err and (not printed or "narrow_net.py" in err)


def test_run_jobs_builds_a_job_list_as_the_pool_needs_it():
    """The paper-scale audit's 1,920 defended updates (15 MB each in S1) must not all be held at once."""
    import weakref

    from leaklab.attacks.rl import RoomAttackConfig
    from leaklab.experiments import attack_pool, room_attack

    attack = RoomAttackConfig(iterations=2)
    config = room_attack.RoomRunConfig(algorithm="qgi", setting="S2", samples=12, layouts=layouts_arg("4"),
                                       attack=attack)
    state, clean = room_attack.capture_samples(config)
    built, delivered, alive, most = [], [], set(), [0]

    def make(i):
        job = attack_pool.Job("qgi", config.spec, state, clean[i].update, attack)
        built.append(i)
        alive.add(i)
        weakref.finalize(job, alive.discard, i)  # once the pool lets go of it
        most[0] = max(most[0], len(alive))
        return job

    attack_pool.run_jobs(attack_pool.JobList(12, make), 2, lambda i, rec: delivered.append(i))
    assert delivered == list(range(12)) and sorted(built) == list(range(12))
    # two running and QUEUED_PER_WORKER more per worker queued (one more while a result comes back)
    assert most[0] <= 2 * (1 + attack_pool.QUEUED_PER_WORKER) + 1, most[0]
    with pytest.raises(IndexError):
        attack_pool.JobList(12, make)[12]


def test_a_users_network_class_is_known_by_its_module_source(tmp_path, monkeypatch):
    """An edited class is another network: attacks saved for the old one are not taken for it."""
    import os
    from leaklab.experiments.attack_journal import network_identity

    source = (Path(__file__).parent / "plugins" / "narrow_net.py").read_text()
    module = tmp_path / "my_rooms_net.py"
    module.write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = PerceptionSpec(setting="S2")
    first = network_identity(spec, "my_rooms_net:NarrowNet")
    assert first == network_identity(spec, "my_rooms_net:NarrowNet") != network_identity(spec, None)
    module.write_text(source.replace("nn.Linear(64, spec.num_actions)", "nn.Linear(64, spec.num_actions)  # v2"))
    os.utime(module, (1, 1))  # another modification time, whatever the clock's resolution
    assert network_identity(spec, "my_rooms_net:NarrowNet") != first
    # a subclass in another module: its parent's edit (a ReLU made leaky, the same parameters) was not seen
    (tmp_path / "my_sub_net.py").write_text("from my_rooms_net import NarrowNet\n\n\nclass Sub(NarrowNet):\n"
                                            "    pass\n")
    sub = network_identity(spec, "my_sub_net:Sub")
    module.write_text(source.replace("nn.ReLU()", "nn.LeakyReLU(0.2)"))
    os.utime(module, (2, 2))
    assert network_identity(spec, "my_sub_net:Sub") != sub


def test_a_journal_that_cannot_be_written_warns_once_and_the_run_goes_on(tmp_path):
    from leaklab.attacks.rl import RoomAttackConfig
    from leaklab.experiments import room_attack
    from leaklab.experiments.attack_journal import RESUME_DIR

    config = room_attack.RoomRunConfig(algorithm="qgi", setting="S2", samples=2, layouts=layouts_arg("2"),
                                       attack=RoomAttackConfig(iterations=2), workers=1)
    blocker = tmp_path / RESUME_DIR
    blocker.write_text("a file where the journal's folder goes")
    with pytest.warns(RuntimeWarning, match="will not resume") as caught:
        results = room_attack.run(config, tmp_path / "run")
    assert results["summary"]["samples"] == 2 and len(caught) == 1
    assert blocker.read_text() == "a file where the journal's folder goes"


def test_a_finished_run_leaves_the_entries_it_took_from_another_run(tmp_path):
    """A default audit finished beside an interrupted ``--full`` took some of its saved attacks (the same
    computation) and removed them: the interrupted run would have attacked them again."""
    from leaklab.attacks.rl import RoomAttackConfig
    from leaklab.experiments import attack_pool, room_attack
    from leaklab.experiments.attack_journal import RESUME_DIR, AttackJournal

    attack = RoomAttackConfig(iterations=2)
    config = room_attack.RoomRunConfig(algorithm="qgi", setting="S2", samples=3, layouts=layouts_arg("3"),
                                       attack=attack)
    state, clean = room_attack.capture_samples(config)
    jobs = [attack_pool.Job("qgi", config.spec, state, s.update, attack) for s in clean]
    interrupted = AttackJournal(tmp_path, jobs[:2])  # its two attacks done, then stopped before it ended
    attack_pool.run_jobs(jobs[:2], 1, lambda i, rec: None, journal=interrupted)
    other = AttackJournal(tmp_path, jobs)  # another run with those two jobs and one more, which finishes
    assert attack_pool.run_jobs(jobs, 1, lambda i, rec: None, journal=other) == 2
    with pytest.warns(UserWarning, match="still holds 2 finished attacks of other runs"):
        other.discard()
    # the interrupted run, rerun, takes both and, finished, leaves nothing behind
    again = AttackJournal(tmp_path, jobs[:2])
    assert again.run == interrupted.run != other.run
    assert attack_pool.run_jobs(jobs[:2], 1, lambda i, rec: None, journal=again) == 2
    again.discard()
    assert not (tmp_path / RESUME_DIR).exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_a_worker_ignores_ctrl_c_and_ends_with_its_parent():
    """A parent killed outright (SIGKILL, the OOM killer) left its workers running on, 400 MB each; a Ctrl-C to
    the process group printed an idle worker's traceback before the parent's one line."""
    code = ("import ctypes, os, signal\n"
            "from leaklab.experiments.attack_pool import start_worker\n"
            "start_worker(None, False, os.getppid())\n"
            "got = ctypes.c_int()\n"
            "ctypes.CDLL(None).prctl(2, ctypes.byref(got))  # PR_GET_PDEATHSIG\n"
            "print(signal.getsignal(signal.SIGINT) == signal.SIG_IGN, got.value == signal.SIGTERM)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["True", "True"], out.stderr
