"""DQN and REINFORCE agents (seed 000 section III) on the real active-perception rooms."""

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from leaklab.errors import LeaklabError
from leaklab.models import PerceptionSpec, build_perception_net
from leaklab.rl.agents import (DQNConfig, ReinforceConfig, ReplayBuffer, discounted_returns, evaluate,
                               load_agent, save_agent, td_targets, train_dqn, train_reinforce)
from leaklab.rl.capture import collect_transitions, dqn_client_update, reinforce_client_update, target_copy
from leaklab.rl.envs import LAYOUTS
from leaklab.rl.losses import dqn_loss

SPEC = PerceptionSpec(setting="S2", image_size=64)
ROOMS = tuple(LAYOUTS)[:2]


def _same_state(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.fixture(scope="module")
def transitions():
    return collect_transitions(ROOMS, 4, PerceptionSpec(setting="S1", image_size=64), seed=11,
                               warmup_steps=3)


def test_dqn_bias_gradient_is_the_error_at_the_action(transitions):
    spec = PerceptionSpec(setting="S1", image_size=64)
    net = build_perception_net(spec, seed=0)
    update, truth = dqn_client_update(net, target_copy(net), transitions[:1], gamma=0.9)
    error = truth["q_pred"][0] - truth["q_target"][0]
    expected = torch.zeros(spec.num_actions)
    expected[truth["action"][0]] = 2 * error  # (7): 2 (Q̂ − Q) at a, 0 elsewhere, B = 1
    torch.testing.assert_close(update.tensors["head.2.bias"], expected, rtol=1e-5, atol=1e-7)
    assert torch.count_nonzero(update.tensors["head.2.bias"]) == 1
    # batch 2: each sample's error at its own action, divided by B
    update, truth = dqn_client_update(net, target_copy(net), transitions[:2], gamma=0.9)
    expected = torch.zeros(spec.num_actions)
    for a, e in zip(truth["action"], truth["q_pred"] - truth["q_target"]):
        expected[a] += 2 * e / 2
    torch.testing.assert_close(update.tensors["head.2.bias"], expected, rtol=1e-5, atol=1e-7)


def test_dqn_target_is_the_bellman_backup(transitions):
    net = build_perception_net(PerceptionSpec(setting="S1", image_size=64), seed=1)
    _, truth = dqn_client_update(net, target_copy(net), transitions[:1], gamma=0.5)
    tr = transitions[0]
    with torch.no_grad():
        q_next = net(torch.cat([tr.next_rgb, tr.next_depth])[None], tr.next_box[None]).max()
        q_pred = net(torch.cat([tr.rgb, tr.depth])[None], tr.box[None])[0, tr.action]
    torch.testing.assert_close(truth["q_target"][0], tr.reward + 0.5 * (1 - tr.done) * q_next)
    torch.testing.assert_close(truth["q_pred"][0], q_pred)


def test_client_updates_refuse_a_discount_or_entropy_weight_out_of_range(transitions):
    """γ = NaN gave an update of NaN gradients, γ = 5 was taken; α = NaN failed after the gradient, in pydantic."""
    net = build_perception_net(PerceptionSpec(setting="S1", image_size=64), seed=0)
    for gamma in (float("nan"), 5.0, -0.1):
        with pytest.raises(LeaklabError, match="gamma must lie in"):
            dqn_client_update(net, target_copy(net), transitions[:1], gamma=gamma)
    for alpha in (float("nan"), float("inf"), -1.0):
        with pytest.raises(LeaklabError, match="entropy_weight must be a finite number"):
            reinforce_client_update(net, transitions[:1], entropy_weight=alpha)


@pytest.mark.parametrize("alpha", [0.0, 0.3])
def test_reinforce_bias_gradient_is_analytic(transitions, alpha):
    net = build_perception_net(PerceptionSpec(setting="S1", image_size=64), seed=2)
    returns = torch.tensor([1.7, -0.4])
    update, truth = reinforce_client_update(net, transitions[:2], returns, entropy_weight=alpha)
    expected = torch.zeros(7)
    for a, r, p in zip(truth["action"], returns, truth["probs"]):
        onehot = torch.nn.functional.one_hot(a, 7).float()
        entropy = -(p * p.log()).sum()
        # −R (e_a − π) from the policy term, α π (log π + H) from −α H, each divided by B = 2
        expected += (-r * (onehot - p) + alpha * p * (p.log() + entropy)) / 2
    torch.testing.assert_close(update.tensors["head.2.bias"], expected, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(truth["reward"], returns)


def test_discounted_returns_and_epsilon_schedule():
    torch.testing.assert_close(discounted_returns([1.0, 0.0, 2.0], 0.5), torch.tensor([1.5, 1.0, 2.0]))
    c = DQNConfig(eps_start=1.0, eps_end=0.1, eps_decay_steps=10)
    assert [round(c.epsilon(s), 6) for s in (0, 5, 10, 50)] == [1.0, 0.55, 0.1, 0.1]
    with pytest.raises(ValidationError):
        DQNConfig(eps_start=0.1, eps_end=0.5)
    with pytest.raises(ValidationError):
        DQNConfig(layouts=())


def test_replay_buffer_wraps_and_keeps_8_bit_levels():
    buf = ReplayBuffer(3, (1, 4, 4), 4)
    for i in range(5):
        img = torch.full((1, 4, 4), i / 10)
        buf.add(img, torch.full((4,), float(i)), i % 7, i / 2, img, torch.zeros(4), i == 4)
    assert len(buf) == 3
    batch = buf.sample(64, np.random.default_rng(0))
    assert set(batch["action"].tolist()) == {2, 3, 4}  # the two oldest were overwritten
    torch.testing.assert_close(batch["images"][:, 0, 0, 0] * 255, (batch["box"][:, 0] / 10 * 255).round())
    assert batch["done"][batch["action"] == 4].eq(1).all()


def test_unknown_layout_is_refused():
    with pytest.raises(ValueError, match="unknown room layout 'no-such-room'"):  # by the config, before training
        DQNConfig(spec=SPEC, layouts=("no-such-room",), steps=1)


def _short_dqn(seed: int):
    return train_dqn(DQNConfig(spec=SPEC, layouts=ROOMS, steps=110, learning_starts=20, batch_size=8,
                               target_sync=10**6, lr=1e-3, eps_decay_steps=50, seed=seed))


def test_dqn_run_is_deterministic_and_learns_the_td_targets():
    net, history = _short_dqn(3)
    again, history2 = _short_dqn(3)
    assert _same_state(net, again) and history.losses == history2.losses
    assert history.returns == history2.returns and history.layouts == history2.layouts
    assert history.updates == 90 and history.env_steps == 110 and len(history.returns) == 2
    assert all(np.isfinite(history.losses))
    other, _ = _short_dqn(4)
    assert not _same_state(net, other)
    # the target network stays the initial one (no sync): training regresses on fixed targets, so the
    # trained network fits them better on transitions it never saw
    init = build_perception_net(SPEC, seed=3)
    held = collect_transitions(ROOMS, 12, SPEC, seed=99)
    loss = {}
    for name, model in (("init", init), ("trained", net)):
        _, truth = dqn_client_update(model, init, held, gamma=0.99)
        loss[name] = float(((truth["q_pred"] - truth["q_target"]) ** 2).mean())
    assert loss["trained"] < 0.8 * loss["init"], loss


def test_reinforce_run_is_deterministic_and_moves_the_policy():
    config = ReinforceConfig(spec=SPEC, layouts=ROOMS, steps=60, max_episode_steps=30, lr=1e-3, seed=5)
    calls = []
    net, history = train_reinforce(config, progress=lambda done, total, stats: calls.append(done))
    again, history2 = train_reinforce(config)
    assert _same_state(net, again) and history.returns == history2.returns
    assert history.updates == 2 and history.lengths == [30, 30] and calls == [30, 60]
    assert not _same_state(net, build_perception_net(SPEC, seed=5))
    scores = evaluate(net, ROOMS, episodes=2, seed=1, max_episode_steps=10)
    assert len(scores) == 2 and scores == evaluate(again, ROOMS, episodes=2, seed=1, max_episode_steps=10)
    assert all(0 <= s <= 10 for s in scores)


def test_evaluation_leaves_a_networks_state_and_modes():
    """A user's BatchNorm statistics moved with every state evaluate acted on."""
    net = build_perception_net(PerceptionSpec(setting="S2"), seed=0, model_class="tests.plugins.narrow_net:Normed")
    before = {k: v.clone() for k, v in net.state_dict().items()}
    evaluate(net, ROOMS[:1], episodes=1, seed=1, max_episode_steps=3)
    assert net.training and all(torch.equal(before[k], v) for k, v in net.state_dict().items())


def test_agent_checkpoint_round_trip(tmp_path):
    spec = PerceptionSpec(setting="S1", arch="deep", image_size=64)
    net = build_perception_net(spec, seed=7)
    save_agent(tmp_path / "agent.safetensors", spec, net, algorithm="dqn")
    spec2, net2 = load_agent(tmp_path / "agent.safetensors")
    assert spec2 == spec and _same_state(net, net2)
    x, box = torch.rand(2, 4, 64, 64), torch.rand(2, 4) * 2 - 1
    assert torch.equal(net(x, box), net2(x, box))
    from leaklab.io import save_tensors

    save_tensors(tmp_path / "other.safetensors", net.state_dict(), {"format": "leaklab.model"})
    with pytest.raises(LeaklabError, match="not a leaklab agent"):
        load_agent(tmp_path / "other.safetensors")
    save_tensors(tmp_path / "bad.safetensors", net.state_dict(),
                 {"format": "leaklab.agent", "spec": PerceptionSpec(setting="S2").model_dump_json()})
    with pytest.raises(LeaklabError, match="does not fit.*save the agent again") as info:
        load_agent(tmp_path / "bad.safetensors")
    assert "re-capture" not in str(info.value)  # a case's advice
    # saved only what loads as saved: another spec's shapes failed on load (or, equal, loaded as the other spec);
    # a user's own class never loaded
    with pytest.raises(LeaklabError, match="pass net.spec"):
        save_agent(tmp_path / "s2.safetensors", PerceptionSpec(setting="S1", arch="deep", image_size=65), net)
    own = build_perception_net(PerceptionSpec(setting="S2"), seed=0, model_class="tests.plugins.narrow_net:NarrowNet")
    with pytest.raises(LeaklabError, match="not a NarrowNet"):
        save_agent(tmp_path / "own.safetensors", own.spec, own)
    assert not (tmp_path / "s2.safetensors").exists() and not (tmp_path / "own.safetensors").exists()
    save_tensors(tmp_path / "deep.safetensors", net.state_dict(),
                 {"format": "leaklab.agent", "spec": "[" * 100_000 + "]" * 100_000})
    with pytest.raises(LeaklabError, match="not valid JSON"):
        load_agent(tmp_path / "deep.safetensors")
    save_tensors(tmp_path / "long.safetensors", net.state_dict(),  # an integer past Python's digit limit
                 {"format": "leaklab.agent", "spec": '{"image_size": ' + "9" * 5000 + "}"})
    with pytest.raises(LeaklabError, match="not valid JSON"):
        load_agent(tmp_path / "long.safetensors")
    (tmp_path / "cut.safetensors").write_bytes((tmp_path / "agent.safetensors").read_bytes()[:500])
    with pytest.raises(LeaklabError, match="corrupt"):
        load_agent(tmp_path / "cut.safetensors")


def test_td_targets_do_not_bootstrap_after_termination():
    net = build_perception_net(SPEC, seed=0)
    y = td_targets(net, torch.tensor([0.3, 0.3]), torch.rand(2, 1, 64, 64), torch.zeros(2, 4),
                   torch.tensor([1.0, 0.0]), gamma=0.9)
    assert y[0] == pytest.approx(0.3) and y[1] != pytest.approx(0.3)
    loss = dqn_loss(torch.zeros(1, 7), torch.tensor([2]), torch.tensor([0.5]))
    assert float(loss) == pytest.approx(0.25)
