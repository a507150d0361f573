"""Seed 004's two-step attack: features restored from the last layer's batch gradient (eq. 4), images from
features (eq. 6), and `leaklab reproduce at-features --quick`."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from leaklab.attacks.inversion.config import FeatureInversionConfig
from leaklab.attacks.inversion.features import feature_attack, feature_map, invert_features, restore_features
from leaklab.cli import app
from leaklab.data import load_images
from leaklab.errors import LeaklabError
from leaklab.experiments import at_features
from leaklab.fl import fedavg_update, fedsgd_update
from leaklab.models import ModelSpec, build_model
from leaklab.threat import Capabilities, make_view


def _setup(n: int, name: str = "cnn"):
    data = load_images("digits", 200, 8, seed=0)
    picks = [int((data.labels == c).nonzero()[0]) for c in range(n)]  # distinct labels
    spec = ModelSpec(name=name, num_classes=10, in_channels=1, image_size=8, width=8, mean=data.mean, std=data.std)
    return spec, build_model(spec, seed=0).eval(), data.images[picks], data.labels[picks]


def test_one_sample_feature_is_restored_exactly_from_fedsgd_and_fedavg():
    spec, model, x, y = _setup(1)
    with torch.no_grad():
        truth = feature_map(model)(x).double()
    for update in (fedsgd_update(model, x, y, train_mode=False),
                   fedavg_update(model, x, y, local_lr=0.1, local_steps=1, train_mode=False)):
        restored = restore_features(model, update, y)
        assert F.cosine_similarity(restored, truth).item() == pytest.approx(1, abs=1e-6)


def test_batch_rows_are_eq4_mixtures_of_the_batch_features():
    spec, model, x, y = _setup(4)
    update = fedsgd_update(model, x, y, train_mode=False)
    with torch.no_grad():
        r = feature_map(model)(x).double()
        p = torch.softmax(model(x).double(), 1)
    restored = restore_features(model, update, y)
    onehot = F.one_hot(y, 10).double()
    expected = -((p - onehot)[:, y].T @ r) / len(y)  # -(1/N) sum_j (p_j,y_i - [y_j = y_i]) r_j
    assert torch.allclose(restored, expected, rtol=1e-4, atol=1e-7)
    cos = F.cosine_similarity(restored, r)
    assert (cos > 0).all() and (cos < 1 - 1e-4).any()  # close to the sample's feature, mixed with the others


def test_attack_reads_labels_and_inverts_features():
    spec, model, x, y = _setup(3)
    update = fedsgd_update(model, x, y, train_mode=False)
    view = make_view(spec, model.state_dict(), update.metadata, Capabilities())
    config = FeatureInversionConfig(iterations=150, restarts=2, tv=0.0)
    first = feature_attack(view, update, config)
    assert sorted(first.labels.tolist()) == sorted(y.tolist())
    assert first.images.shape == x.shape and first.images.min() >= 0 and first.images.max() <= 1
    from leaklab.attacks.inversion.features import nonnegative_part

    assert torch.equal(first.targets, nonnegative_part(first.features))
    with torch.no_grad():
        reached = F.cosine_similarity(feature_map(view.model)(first.images).double(), first.targets)
    assert (reached > 0.99).all(), reached  # the optimisation finds images of the restored features
    assert torch.allclose(first.loss.double(), 1 - reached, atol=1e-4)
    second = feature_attack(view, update, config)
    assert torch.equal(first.images, second.images)


def test_the_nonnegative_part_drops_other_samples_share():
    from leaklab.attacks.inversion.features import nonnegative_part

    rows = torch.tensor([[1.0, -2.0, 3.0], [-1.0, -1.0, 0.0]], dtype=torch.float64)
    assert torch.equal(nonnegative_part(rows), torch.tensor([[1.0, 0.0, 3.0], [-1.0, -1.0, 0.0]], dtype=torch.float64))
    spec, model, x, y = _setup(4)
    update = fedsgd_update(model, x, y, train_mode=False)
    with torch.no_grad():
        r = feature_map(model)(x).double()
    restored = restore_features(model, update, y)
    assert (r >= 0).all()  # a ReLU network's features, the premise
    assert (F.cosine_similarity(nonnegative_part(restored), r) >= F.cosine_similarity(restored, r) - 1e-12).all()


def test_more_iterations_lower_the_loss_and_the_trainable_flags_come_back():
    spec, model, x, y = _setup(2)
    with torch.no_grad():
        goal = feature_map(model)(x)
    next(model.parameters()).requires_grad_(False)
    short = invert_features(model, goal, (1, 8, 8), FeatureInversionConfig(iterations=3, restarts=1))[1]
    long = invert_features(model, goal, (1, 8, 8), FeatureInversionConfig(iterations=100, restarts=1))[1]
    assert (long < short).all()
    flags = [p.requires_grad for p in model.parameters()]
    assert flags[0] is False and all(flags[1:])


def test_bad_labels_and_batch_sizes_are_refused():
    spec, model, x, y = _setup(2)
    update = fedsgd_update(model, x, y)
    with pytest.raises(LeaklabError, match="class indices"):
        restore_features(model, update, torch.tensor([10]))
    other = fedsgd_update(model, x[:1], y[:1])
    view = make_view(spec, model.state_dict(), update.metadata, Capabilities())
    with pytest.raises(LeaklabError, match="batch size 2, the update 1"):
        feature_attack(view, other, FeatureInversionConfig(iterations=1))


def test_quick_reproduction_writes_results_and_pictures(tmp_path):
    out = tmp_path / "at"
    result = CliRunner().invoke(app, ["reproduce", "at-features", "--quick", "--out", str(out)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "vanilla" in result.stdout and "AT eps 1" in result.stdout
    data = json.loads((out / "results.json").read_text())
    assert (out / at_features.PLOT_FILE).stat().st_size > 1000 and (out / at_features.IMAGES_FILE).stat().st_size > 1000
    assert [r["eps"] for r in data["rows"]] == [0.0, 1.0]
    for row in data["rows"]:
        rest = row["restoration"][0]
        assert len(rest["cosines"]) == 4 and -1 <= rest["cosine_mean"] <= 1 and rest["label_read"] == 1.0
        assert 0 <= row["clean_accuracy"] <= 1 and row["images"]["labels_correct"] == 1.0
    again = at_features.run(tmp_path / "again", at_features.AtFeaturesConfig.quick())
    assert again["rows"][0]["restoration"] == data["rows"][0]["restoration"]


def test_reproduction_refuses_batches_beyond_the_classes(tmp_path):
    config = at_features.AtFeaturesConfig.quick().model_copy(update={"batch_sizes": [11]})
    with pytest.raises(LeaklabError, match="10 classes"):
        at_features.run(tmp_path / "x", config)
    assert not (tmp_path / "x").exists()


def test_cli_attacks_a_case_of_an_adversarially_training_client(tmp_path):
    runner = CliRunner()
    case, out = tmp_path / "case", tmp_path / "out"
    capture = ["capture", "--model", "cnn", "--data", "digits", "--image-size", "8", "--width", "8",
               "--batch-size", "3", "--num-images", "6", "--image-seed", "1", "--train-steps", "10", "--out"]
    assert runner.invoke(app, capture + [str(case), "--adversarial-eps", "0.5"], catch_exceptions=False).exit_code == 0
    plain = tmp_path / "plain"
    assert runner.invoke(app, capture + [str(plain)], catch_exceptions=False).exit_code == 0
    from safetensors.torch import load_file

    adv_update, plain_update = load_file(case / "update.safetensors"), load_file(plain / "update.safetensors")
    assert not all(torch.equal(adv_update[k], plain_update[k]) for k in adv_update)  # trained and sent adversarially
    result = runner.invoke(app, ["attack", "features", "--case", str(case), "--iterations", "60", "--restarts", "1",
                                 "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "labels 100%" in result.stdout
    data = json.loads((out / "results.json").read_text())
    assert data["attack"] == "features" and data["config"]["features"]["iterations"] == 60
    assert data["config"]["capture"]["adversarial_eps"] == 0.5
    assert data["summary"]["images"] == 6 and data["summary"]["label_accuracy"] == 1.0
    assert (out / "reconstructions.png").stat().st_size > 1000
    bad = runner.invoke(app, ["attack", "features", "--case", str(case), "--restarts", "0", "--out",
                              str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "--restarts" in bad.output and not (tmp_path / "bad").exists()


def test_reproduction_keeps_test_images_beside_the_anchors(tmp_path):
    config = at_features.AtFeaturesConfig.quick().model_copy(update={"train_images": 1787, "anchors": 4})
    with pytest.raises(LeaklabError, match="4 anchors and 10 test images"):
        at_features.run(tmp_path / "x", config)
    assert not (tmp_path / "x").exists()


def test_batch_statistics_updates_of_a_batchnorm_network_are_refused():
    spec, model, x, y = _setup(2, name="resnet18")
    update = fedsgd_update(model, x, y, train_mode=True)
    view = make_view(spec, model.state_dict(), update.metadata, Capabilities())
    with pytest.raises(LeaklabError, match="--bn-stats running"):
        feature_attack(view, update, FeatureInversionConfig(iterations=1))
    running = fedsgd_update(model, x, y, train_mode=False)
    assert feature_attack(view, running, FeatureInversionConfig(iterations=1, restarts=1)).images.shape == x.shape


def test_one_shot_defaults_to_running_statistics_and_refuses_batch_ones_before_capturing(tmp_path):
    runner = CliRunner()
    common = ["attack", "features", "--model", "resnet18", "--width", "4", "--data", "digits", "--image-size", "8",
              "--batch-size", "2", "--num-images", "2", "--iterations", "3", "--restarts", "1"]
    result = runner.invoke(app, common + ["--out", str(tmp_path / "ok")], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "ok" / "results.json").read_text())
    assert data["config"]["capture"]["bn_stats"] == "running"
    bad = runner.invoke(app, common + ["--bn-stats", "batch", "--train-steps", "300", "--out", str(tmp_path / "b")])
    assert bad.exit_code == 2 and "--bn-stats running" in bad.output and not (tmp_path / "b").exists()
    many = runner.invoke(app, [*common[:10], "--batch-size", "12", "--num-images", "12", "--train-steps", "300",
                               "--out", str(tmp_path / "m")])
    assert many.exit_code == 2 and "at most 10 images" in many.output and not (tmp_path / "m").exists()


def test_restoration_summary_is_the_mean_and_median_of_the_anchors():
    import statistics

    spec, model, x, y = _setup(2)
    config = at_features.AtFeaturesConfig.quick().model_copy(update={"anchors": 4})
    data = load_images("digits", 200, 8, seed=0)
    row = at_features.restoration(model.train(), config, 0.0, data.images, data.labels, 3)
    assert row["cosine_median"] == statistics.median(row["cosines"])
    assert row["cosine_mean"] == pytest.approx(statistics.fmean(row["cosines"]), abs=1e-12)


def test_distinct_labels_are_the_rows_of_smallest_entries():
    from leaklab.attacks.inversion.features import distinct_labels

    spec, model, x, y = _setup(10)
    update = fedsgd_update(model, x, y, train_mode=False)
    assert distinct_labels(model, update, 10).tolist() == list(range(10))  # every class present, each read
    few = fedsgd_update(model, x[[2, 7, 9]], y[[2, 7, 9]], train_mode=False)
    assert distinct_labels(model, few, 3).tolist() == [2, 7, 9]
    with pytest.raises(LeaklabError, match="1 to 10 images"):
        distinct_labels(model, update, 11)
    # a present class whose row holds no negative entry (a confident sample's) is still read, where the rule that
    # allows a class twice repeats the one negative row instead
    from leaklab.attacks.inversion import recover_labels
    from leaklab.threat import ClientUpdate

    rows = torch.full((10, 100), 5.0)
    rows[3, 0], rows[6] = -1.0, 0.01
    tensors = {k: torch.zeros_like(v) for k, v in update.tensors.items()}
    tensors["classifier.2.weight"] = rows
    crafted = ClientUpdate(metadata=update.metadata.model_copy(update={"batch_size": 2}), tensors=tensors)
    assert distinct_labels(model, crafted, 2).tolist() == [3, 6]
    assert recover_labels(model, crafted, 2).tolist() == [3, 3]
    view = make_view(spec, model.state_dict(), crafted.metadata, Capabilities())
    assert feature_attack(view, crafted, FeatureInversionConfig(iterations=1, restarts=1)).labels.tolist() == [3, 6]


def test_each_private_image_is_scored_on_a_reconstruction_of_the_attack():
    # a misread label's reconstruction stands for the label missed (the fill was a black image, which scores a
    # constant image's PSNR on dark digits)
    assert at_features._pairing(torch.tensor([1, 4, 7]), torch.tensor([7, 2, 1])) == [2, 1, 0]
    assert at_features._pairing(torch.tensor([0, 3]), torch.tensor([3, 0])) == [1, 0]
