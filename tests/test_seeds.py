"""One seed, independent streams: the noise a defense or DP-SGD draws is not the model initialisation's stream."""

import numpy as np
import pytest
import torch
from torch import nn

from leaklab import seeds
from leaklab.defenses import parse_defense
from leaklab.experiments.capture import CaptureConfig, capture
from leaklab.fl import fedsgd_update
from leaklab.models import build_model

torch.set_num_threads(1)


def _flat(tensors: dict) -> torch.Tensor:
    return torch.cat([t.flatten().double() for t in tensors.values()])


def _correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(np.corrcoef(a.numpy(), b.numpy())[0, 1])


def test_streams_differ_by_purpose_and_index_and_repeat():
    assert seeds.stream_seed(0, seeds.DEFENSE) == seeds.stream_seed(0, "defense")
    drawn = {seeds.stream_seed(s, p, *i) for s in (0, 1) for p in (seeds.DEFENSE, seeds.DP_BATCHES, seeds.DP_NOISE)
             for i in ((), (0,), (1,))}
    assert len(drawn) == 18 and 0 not in drawn and 1 not in drawn
    a, b = (torch.randn(5, generator=seeds.generator(3, seeds.DP_NOISE)) for _ in range(2))
    assert torch.equal(a, b)


@pytest.mark.parametrize("seed", [0, 7])
def test_a_captured_defense_noise_cannot_be_regenerated_from_the_initialisation_stream(seed):
    """With one stream the server replayed the chain on the seed the weights came from and got the clean
    gradient back to 1.5e-8; prune kept exactly the entries whose initial weight was not negative."""
    config = CaptureConfig(model="mlp", width=64, data="digits", num_images=1, image_size=16,
                           defense="gaussian:0.1", seed=seed)
    cap = capture(config)
    model = build_model(cap.spec, seed=seed)
    clean = fedsgd_update(model, cap.images[:1], cap.truth_labels[:1])
    noise = _flat(cap.updates[0].tensors) - _flat(clean.tensors)
    zero = clean.with_tensors({k: torch.zeros_like(v) for k, v in clean.tensors.items()}, None)
    replayed = _flat(parse_defense("gaussian:0.1").apply(zero, torch.Generator().manual_seed(seed)).tensors)
    assert abs(_correlation(noise, replayed)) < 0.05
    assert float(noise.std()) == pytest.approx(0.1, rel=0.05)

    pruned = capture(config.model_copy(update={"defense": "prune:0.5"}))
    kept = pruned.updates[0].tensors["body.1.weight"] != 0
    nonnegative = model.state_dict()["body.1.weight"] >= 0
    touched = clean.tensors["body.1.weight"] != 0
    agree = float((kept == nonnegative)[touched].double().mean())
    assert 0.45 < agree < 0.55


def test_a_room_updates_defense_noise_is_not_the_networks_initialisation_stream():
    from leaklab.rl.capture import defended
    from leaklab.threat import ClientUpdate, UpdateMetadata

    zero = ClientUpdate(tensors={"w": torch.zeros(20_000)}, metadata=UpdateMetadata(kind="fedsgd", batch_size=1),
                        defense=None)
    for seed in (0, 3):
        noise = defended(zero, "gaussian:1", seed, 0).tensors["w"].double()
        init_stream = torch.randn(20_000, generator=torch.Generator().manual_seed(seed)).double()
        assert abs(_correlation(noise, init_stream)) < 0.05
    # an update's index and the seed no longer trade places (seed 1's first update drew seed 0's 100,004th)
    assert not torch.equal(defended(zero, "gaussian:1", 1, 0).tensors["w"],
                           defended(zero, "gaussian:1", 0, 100_003).tensors["w"])


def test_dp_sgd_noise_is_not_a_replay_of_the_stream_that_drew_its_batches():
    """train_private drew its Poisson batches and its noise from one seed's stream: the noise replayed the very
    draws that chose the batch, and a sample's membership correlated with the noise at another coordinate (0.63
    at one pair of 10 samples at rate 1/3 over 5,000 seeds, about 0.4 at rate 0.1, reviews measured). Two trainings with the same seed, one without noise, separate
    the batch from the noise."""
    from leaklab.privacy.dpsgd import DPSGDConfig, train_private

    n, q = 1000, 0.1
    images = 3 * torch.eye(n).reshape(n, 1, 1, n)  # each sample's gradient lives in its own columns
    labels = torch.zeros(n, dtype=torch.long)
    for seed in (0, 5):
        weights = []
        for sigma in (0.0, 1.0):
            model = nn.Sequential(nn.Flatten(), nn.Linear(n, 2, bias=False))
            nn.init.zeros_(model[1].weight)
            train_private(model, images, labels, DPSGDConfig(noise_multiplier=sigma, clip=1.0, batch_size=int(n * q),
                                                             steps=1, lr=1.0, seed=seed))
            weights.append(model[1].weight.detach().double())
        assert 0.05 < float((weights[0][0] != 0).double().mean()) < 0.15  # Poisson batches at q
        noise = (-(weights[1] - weights[0]) * n * q).flatten()  # N(0, 1) per entry: sigma * clip on the sum
        assert float(noise.std()) == pytest.approx(1.0, rel=0.1)
        for stream in (seeds.generator(seed, seeds.DP_BATCHES), torch.Generator().manual_seed(seed)):
            replayed = torch.normal(0.0, 1.0, (2, n), generator=stream).flatten().double()
            assert abs(_correlation(noise, replayed)) < 0.1


def test_without_a_seed_dp_noise_is_fresh_and_not_the_global_stream():
    """fedavg_update's privacy took seed 0 by default: every client sent the same noise, and the server cancelled it
    by subtracting two clients' updates (to 1.5e-8); make_private without a seed drew it from torch's global stream,
    which continues from the model's initialisation."""
    from leaklab.fl import fedavg_update
    from leaklab.models import ModelSpec
    from leaklab.privacy.dpsgd import DPConfig

    a, b = (seeds.generator(None, seeds.DP_NOISE) for _ in range(2))
    assert not torch.equal(torch.randn(8, generator=a), torch.randn(8, generator=b))
    spec = ModelSpec(name="lenet", num_classes=4, in_channels=1, image_size=16, mean=(0.5,), std=(0.25,))
    images, labels = torch.rand(4, 1, 16, 16), torch.tensor([0, 1, 2, 3])
    privacy = DPConfig(clip=1.0, noise_multiplier=1.0)
    sent = []
    for _ in range(2):
        torch.manual_seed(0)  # the same global stream each time: the noise must not come from it
        model = build_model(spec, seed=0)
        sent.append(_flat(fedavg_update(model, images, labels, local_lr=0.1, local_steps=1, privacy=privacy).tensors))
    assert abs(_correlation(sent[0], sent[1])) < 0.1
    given = [_flat(fedavg_update(build_model(spec, seed=0), images, labels, local_lr=0.1, local_steps=1,
                                 privacy=privacy, seed=4).tensors) for _ in range(2)]
    assert torch.equal(*given)  # a seed makes it repeatable
