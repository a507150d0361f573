"""Federated capture of private room transitions as client updates and room case folders (seed 000)."""

import json

import matplotlib.image
import pytest
import torch
from pydantic import ValidationError

from leaklab.errors import LeaklabError
from leaklab.io import VIEW_FORMAT, atomic_dir, load_tensors, read_json, save_tensors, write_json
from leaklab.models import PerceptionSpec, build_perception_net
from leaklab.rl.capture import (RoomCaptureConfig, collect_transitions, dqn_client_update, load_room_case,
                                load_room_truth, partly_trained_net, reinforce_client_update, target_copy,
                                write_room_case)
from leaklab.rl.envs import LAYOUTS

ROOMS = tuple(LAYOUTS)[:3]


def test_transitions_spread_over_rooms_and_time():
    spec = PerceptionSpec(setting="S1", image_size=64)
    trs = collect_transitions(ROOMS, 6, spec, seed=4, warmup_steps=5, max_episode_steps=20)
    assert [t.layout for t in trs] == list(ROOMS) * 2
    assert all(5 <= t.step < 20 for t in trs) and len({t.step for t in trs}) > 2
    for t in trs:
        assert t.rgb.shape == (3, 64, 64) and t.depth.shape == (1, 64, 64) and t.box.shape == (4,)
        assert t.rgb.dtype == torch.float32 and 0 <= t.rgb.min() and t.rgb.max() <= 1
        assert -1 <= t.box.min() and t.box.max() <= 1 and 0 <= t.reward <= 1 and 0 <= t.action < 7
        assert t.ret >= t.reward - 1e-6  # R_t = r_t + γ R_{t+1}, rewards >= 0 (float32)
    again = collect_transitions(ROOMS, 6, spec, seed=4, warmup_steps=5, max_episode_steps=20)
    assert all(torch.equal(a.rgb, b.rgb) and a.action == b.action for a, b in zip(trs, again))
    # with a network as policy (greedy), the actions are its argmax
    net = build_perception_net(spec, seed=0)
    greedy = collect_transitions(ROOMS[:1], 2, spec, seed=4, policy=net, epsilon=0.0, max_episode_steps=10)
    for t in greedy:
        assert t.action == int(net(torch.cat([t.rgb, t.depth])[None], t.box[None]).argmax())
    with pytest.raises(LeaklabError, match="warmup_steps"):
        collect_transitions(ROOMS, 1, spec, warmup_steps=50)
    with pytest.raises(LeaklabError, match="unknown room layout"):
        collect_transitions(("attic",), 1, spec)
    # the capture's config refuses both before its network trains
    with pytest.raises(ValidationError, match="warmup_steps 50 must be under max_episode_steps 50"):
        RoomCaptureConfig(spec=spec, train_steps=300, warmup_steps=50)
    with pytest.raises(ValidationError, match="unknown room layout"):
        RoomCaptureConfig(spec=spec, layouts=("attic",))
    with pytest.raises(ValidationError, match="entropy_weight"):
        RoomCaptureConfig(spec=spec, algorithm="reinforce", entropy_weight=1e39)


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)


def test_a_capture_that_fails_closes_its_rooms_engines(monkeypatch):
    """A ViZDoom engine outlives the Python process that started it unless it is closed."""
    from leaklab.rl.envs import active_perception

    games = []
    new_game = active_perception._new_game
    monkeypatch.setattr(active_perception, "_new_game", lambda *a, **k: games.append(new_game(*a, **k)) or games[-1])

    def fail_after(n):
        if n == 2:
            raise RuntimeError("stopped by the caller")

    with pytest.raises(RuntimeError, match="stopped by the caller"):
        collect_transitions(ROOMS, 3, PerceptionSpec(image_size=64), max_episode_steps=5, on_episode=fail_after)
    assert games and not any(g.is_running() for g in games)  # the two rooms and their map readers


@pytest.mark.parametrize("setting,algorithm,batch", [("S1", "dqn", 1), ("S2", "dqn", 2),
                                                      ("S1", "reinforce", 2), ("S2", "reinforce", 1)])
def test_room_case_round_trip(tmp_path, setting, algorithm, batch):
    spec = PerceptionSpec(setting=setting, image_size=64)
    net = build_perception_net(spec, seed=1)
    trs = collect_transitions(ROOMS, batch, spec, seed=2, warmup_steps=2, max_episode_steps=12)
    if algorithm == "dqn":
        update, truth = dqn_client_update(net, target_copy(net), trs, gamma=0.99)
        assert update.metadata.loss == "dqn_mse"
        assert set(truth) >= {"q_pred", "q_target", "reward", "action"}
    else:
        update, truth = reinforce_client_update(net, trs, entropy_weight=0.05)
        assert update.metadata.loss == "reinforce" and update.metadata.entropy_weight == 0.05
        torch.testing.assert_close(truth["reward"], torch.tensor([t.ret for t in trs]))
    assert update.metadata.batch_size == batch and ("rgb" in truth) == (setting == "S1")
    state = net.state_dict()
    with atomic_dir(tmp_path / "case", VIEW_FORMAT) as tmp:
        write_room_case(tmp, spec, state, update, truth, provenance={"layouts": [t.layout for t in trs]})
    case = load_room_case(tmp_path / "case")
    assert case.view.spec == spec and case.view.metadata == update.metadata
    assert _same(case.update.tensors, update.tensors) and _same(case.view.model.state_dict(), state)
    case.update.validate_against(case.view.model)
    loaded, provenance = load_room_truth(tmp_path / "case", case)
    assert _same(loaded, truth) and provenance == {"layouts": [t.layout for t in trs]}
    assert "truth" not in json.dumps(read_json(tmp_path / "case" / "view.json"))
    # a truth written by a user's own exporter may carry no header; one naming another format is refused
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in truth.items()}, str(tmp_path / "case" / "truth.safetensors"))
    assert _same(load_room_truth(tmp_path / "case", case)[0], truth)
    save_file({k: v.contiguous() for k, v in truth.items()}, str(tmp_path / "case" / "truth.safetensors"),
              metadata={"format": "leaklab.results"})
    with pytest.raises(LeaklabError, match="names the format 'leaklab.results'"):
        load_room_truth(tmp_path / "case", case)


def test_room_case_refuses_bad_input(tmp_path):
    spec = PerceptionSpec(setting="S2", image_size=64)
    net = build_perception_net(spec, seed=0)
    trs = collect_transitions(ROOMS[:1], 1, spec, seed=0, max_episode_steps=8)
    update, truth = dqn_client_update(net, target_copy(net), trs)
    with pytest.raises(LeaklabError, match=r"missing tensors \['q_target'\]; the truth of a 'dqn_mse' update"):
        write_room_case(tmp_path / "a", spec, net.state_dict(), update, {k: v for k, v in truth.items()
                                                                           if k != "q_target"})
    with pytest.raises(LeaklabError, match=r": unexpected tensors \['note'\]; .* holds exactly images, depth"):
        write_room_case(tmp_path / "a", spec, net.state_dict(), update, {**truth, "note": torch.zeros(1)})
    with pytest.raises(LeaklabError, match="shape"):
        write_room_case(tmp_path / "a", spec, net.state_dict(), update, {**truth, "box": torch.zeros(2, 4)})
    other = PerceptionSpec(setting="S1", image_size=64)
    with pytest.raises(LeaklabError, match="does not fit"):
        write_room_case(tmp_path / "a", other, net.state_dict(), update, truth)
    write_room_case(tmp_path / "ok", spec, net.state_dict(), update, truth)
    view = read_json(tmp_path / "ok" / "view.json")
    write_json(tmp_path / "ok" / "view.json", {**view, "model_type": None})
    with pytest.raises(LeaklabError, match="image-classification case"):
        load_room_case(tmp_path / "ok")
    write_json(tmp_path / "ok" / "view.json", {**view, "model": {**view["model"], "setting": "S3"}})
    with pytest.raises(LeaklabError, match="setting"):
        load_room_case(tmp_path / "ok")
    write_json(tmp_path / "ok" / "view.json", {**view, "defense": "shuffle:0.5"})
    with pytest.raises(LeaklabError, match="ok/view.json: unknown defense"):
        load_room_case(tmp_path / "ok")
    write_json(tmp_path / "ok" / "view.json", {**view, "model_file": "../ok2/model.safetensors"})
    with pytest.raises(LeaklabError, match="plain names inside the case folder"):
        load_room_case(tmp_path / "ok")
    write_json(tmp_path / "ok" / "view.json", view)
    meta = read_json(tmp_path / "ok" / "update.json")
    for change, message in [({"updates": []}, "'updates' must be a non-empty list"),
                            ({"updates": 5}, "'updates' must be a non-empty list"),
                            ({"updates": {"prefix": "u0/"}}, "'updates' must be a non-empty list"),
                            ({"updates": [{"labels": None}]}, r"updates\[0\] needs a string 'prefix'"),
                            ({"updates": [{"prefix": "zz/", "labels": None}]}, "exactly one update, listed as"),
                            ({"updates": [{"prefix": "u0/", "labels": "x"}]}, "exactly one update, listed as"),
                            ({"count": "1"}, "'count' must be an integer, not '1'"),
                            ({"count": 2}, "'count' is 2 but 1 update is listed")]:
        write_json(tmp_path / "ok" / "update.json", {**meta, **change})
        with pytest.raises(LeaklabError, match=message):  # each was read as the one update before
            load_room_case(tmp_path / "ok")
    write_json(tmp_path / "ok" / "update.json", {k: v for k, v in meta.items() if k != "count"})
    assert load_room_case(tmp_path / "ok").update.tensors  # as formats.md's own writer leaves it out
    stray = {**load_tensors(tmp_path / "ok" / "update.safetensors", "update")[0], "u1/head.0.bias": torch.zeros(1)}
    write_json(tmp_path / "ok" / "update.json", {**meta, "sha256": save_tensors(tmp_path / "ok" / "update.safetensors",
                                                                                stray)})
    with pytest.raises(LeaklabError, match=r"update.safetensors holds tensors no update claims \(first: 'u1/"):
        load_room_case(tmp_path / "ok")
    write_json(tmp_path / "ok" / "update.json", {**meta, "sha256": save_tensors(
        tmp_path / "ok" / "update.safetensors", {k: v for k, v in stray.items() if not k.startswith("u1/")})})
    data = bytearray((tmp_path / "ok" / "update.safetensors").read_bytes())
    data[-3] ^= 0xFF
    (tmp_path / "ok" / "update.safetensors").write_bytes(bytes(data))
    with pytest.raises(LeaklabError, match="corrupt"):
        load_room_case(tmp_path / "ok")
    with pytest.raises(LeaklabError, match="1..256"):
        dqn_client_update(net, net, [])


def test_initialised_and_partly_trained_networks():
    spec = PerceptionSpec(setting="S2", image_size=64)
    init = partly_trained_net("dqn", spec, 0, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(init.state_dict().values(),
                                                 build_perception_net(spec, seed=3).state_dict().values()))
    trained = partly_trained_net("reinforce", spec, 20, layouts=ROOMS[:1], seed=3)
    assert any(not torch.equal(a, b) for a, b in zip(init.state_dict().values(),
                                                     trained.state_dict().values()))
    with pytest.raises(LeaklabError, match="unknown algorithm"):
        partly_trained_net("ppo", spec, 5)


def test_a_few_training_steps_train_with_the_rounds_settings():
    """DQN's batch of 32 took its first update after 32 steps: 5 steps left the network as initialised; and
    REINFORCE trained with its default α whatever the capture's."""
    spec = PerceptionSpec(setting="S2", image_size=64)
    init = build_perception_net(spec, seed=3).state_dict()
    few = partly_trained_net("dqn", spec, 5, layouts=ROOMS[:1], seed=3).state_dict()
    assert any(not torch.equal(init[k], few[k]) for k in init)
    default = partly_trained_net("reinforce", spec, 20, layouts=ROOMS[:1], seed=3).state_dict()
    strong = partly_trained_net("reinforce", spec, 20, layouts=ROOMS[:1], seed=3, entropy_weight=5.0).state_dict()
    assert any(not torch.equal(default[k], strong[k]) for k in default)


def test_a_capture_refuses_a_network_the_rooms_cannot_drive():
    """The rooms take 7 actions: a network of 9 failed only after its training, on an action the rooms lack."""
    from pydantic import ValidationError

    from leaklab.rl.agents import DQNConfig
    from leaklab.rl.capture import RoomCaptureConfig

    for config in (RoomCaptureConfig, DQNConfig):
        with pytest.raises(ValidationError, match="the rooms take 7 actions"):
            config(spec=PerceptionSpec(num_actions=9))


def test_capture_rooms_writes_one_case_per_update(tmp_path, monkeypatch):
    from leaklab.rl import capture as capture_module
    from leaklab.rl.capture import RoomCaptureConfig, capture_rooms

    titles, draw = [], capture_module.frame_sheet
    monkeypatch.setattr(capture_module, "frame_sheet", lambda path, frames: (titles.extend(f.title for f in frames),
                                                                             draw(path, frames))[1])

    config = RoomCaptureConfig(algorithm="reinforce", spec=PerceptionSpec(setting="S2", image_size=64),
                               layouts=ROOMS[:2], samples=2, batch_size=2, max_episode_steps=10,
                               entropy_weight=0.1, seed=6)
    folders = capture_rooms(config, tmp_path / "cap")
    assert [f.name for f in folders] == ["0000", "0001"]
    sheet = matplotlib.image.imread(tmp_path / "cap" / "capture.png")  # 4 depth panels (S2), one row
    assert sheet.ndim == 3 and sheet.shape[1] > 2 * sheet.shape[0]
    for folder in folders:
        case = load_room_case(folder)
        truth, provenance = load_room_truth(folder, case)
        assert case.view.metadata.batch_size == 2 and case.view.metadata.entropy_weight == 0.1
        assert provenance["layouts"] == list(ROOMS[:2]) and truth["probs"].shape == (2, 7)
        # the sheet names the truth's reward as what it is for REINFORCE: the return weighting log pi
        for k, value in enumerate(truth["reward"].tolist()):
            title = titles[2 * int(folder.name) + k]
            assert title.startswith(f"{folder.name}/{k} ") and title.endswith(f", return {value:.2f}"), title
    assert len(titles) == 4
    again = capture_rooms(config.model_copy(update={"samples": 1}), tmp_path / "cap")
    assert _same(load_room_case(again[0]).update.tensors, load_room_case(folders[0]).update.tensors)
    # an earlier capture is replaced whole: no stale case of it is left to be attacked
    assert sorted(p.name for p in (tmp_path / "cap").iterdir()) == [".leaklab-entries.json", "0000", "capture.json",
                                                                      "capture.png"]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("x")
    with pytest.raises(LeaklabError, match="leaklab did not write"):
        capture_rooms(config, tmp_path / "mine")
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]


def test_a_capture_behind_a_defense_holds_the_clients_defended_updates(tmp_path):
    from leaklab.metrics.vectors import update_cosine
    from leaklab.rl.capture import RoomCaptureConfig, capture_rooms, client_rounds, defended

    config = RoomCaptureConfig(spec=PerceptionSpec(setting="S2", image_size=64), layouts=ROOMS[:1], samples=2,
                               max_episode_steps=5, seed=2)
    _, clean = client_rounds(config)
    chain = "clip:1,gaussian:0.1"
    folders = capture_rooms(RoomCaptureConfig(**{**config.model_dump(), "defense": chain}), tmp_path / "cap")
    for i, (folder, r) in enumerate(zip(folders, clean)):
        update = load_room_case(folder).update
        assert update.defense == "clip:1.0,gaussian:0.1"
        assert _same(update.tensors, defended(r.update, chain, 2, i).tensors)
        assert not _same(update.tensors, r.update.tensors)
        # the truth records what the defense left of the update: its cosine with the true one
        kept = load_room_truth(folder)[1]["update_cosine"]  # one per update; a room case holds one
        assert kept == pytest.approx([update_cosine(r.update.tensors, update.tensors)], rel=1e-9)
        assert abs(kept[0]) < 0.5
        assert r.kept == 1.0  # the capture without a defense
    assert not torch.equal(*(load_room_case(f).update.tensors["head.2.bias"] - r.update.tensors["head.2.bias"]
                             for f, r in zip(folders, clean)))  # each update draws its own noise
    with pytest.raises(ValueError, match="unknown defense .blur."):
        RoomCaptureConfig(defense="blur:1")


@pytest.mark.parametrize("policy", ["random", "agent"])
def test_a_capture_sends_the_state_training_left_not_the_private_rounds(policy):
    """A user's BatchNorm statistics moved with every private state the clients acted on and sent: each case's
    model file held them all."""
    from leaklab.rl.capture import RoomCaptureConfig, client_rounds

    config = RoomCaptureConfig(spec=PerceptionSpec(setting="S2"), layouts=ROOMS[:1], samples=2, max_episode_steps=5,
                               model_class="tests.plugins.narrow_net:Normed", policy=policy, seed=1)
    state, rounds = client_rounds(config)
    fresh = partly_trained_net("dqn", config.spec, 0, seed=1, model_class="tests.plugins.narrow_net:Normed")
    assert _same(state, fresh.state_dict()) and int(state["conv.1.num_batches_tracked"]) == 0
    assert len(rounds) == 2


def test_a_capture_gives_the_same_updates_whatever_threads_its_caller_runs():
    # torch's CPU convolutions round by thread count: a library caller's threads must not move the updates
    from leaklab.rl.capture import RoomCaptureConfig, client_rounds

    config = RoomCaptureConfig(spec=PerceptionSpec(setting="S1"), layouts=ROOMS[:1], samples=1, max_episode_steps=5,
                               defense="clip:1,gaussian:0.01")
    before = torch.get_num_threads()
    try:
        updates = []
        for threads in (1, 3):
            torch.set_num_threads(threads)
            _, (r,) = client_rounds(config)
            assert torch.get_num_threads() == threads  # the caller's count comes back
            updates.append(r.update.tensors)
    finally:
        torch.set_num_threads(before)
    assert _same(*updates)


def test_a_users_own_network_is_captured_initialised_or_partly_trained():
    spec = PerceptionSpec(setting="S2")
    init = partly_trained_net("reinforce", spec, 0, seed=3, model_class="tests.plugins.narrow_net:Bare")
    assert type(init).__name__ == "Bare" and init.spec == spec  # leaklab gives it the spec it was built for
    trained = partly_trained_net("reinforce", spec, 20, layouts=ROOMS[:1], seed=3,
                                 model_class="tests.plugins.narrow_net:Bare")
    assert type(trained).__name__ == "Bare"
    assert any(not torch.equal(a, b) for a, b in zip(init.state_dict().values(), trained.state_dict().values()))
    again = partly_trained_net("dqn", spec, 0, seed=3, model_class="tests.plugins.narrow_net:Bare")
    assert all(torch.equal(a, b) for a, b in zip(init.state_dict().values(), again.state_dict().values()))  # same seed
