import pytest
import torch

from leaklab.errors import LeaklabError
from leaklab.fl import fedavg_update, fedsgd_update
from leaklab.models import ModelSpec, build_model
from leaklab.threat import Capabilities, make_view

SPEC = ModelSpec(name="convnet", num_classes=10, in_channels=3, image_size=16, width=4,
                 mean=(0.5,) * 3, std=(0.25,) * 3)


def test_fedsgd_update_is_the_gradient_and_leaves_bn_stats_alone():
    model = build_model(SPEC, seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = torch.rand(2, 3, 16, 16), torch.tensor([1, 2])
    upd = fedsgd_update(model, x, y)
    upd.validate_against(model)
    assert upd.metadata.batch_size == 2
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    loss = torch.nn.functional.cross_entropy(model(x), y)
    assert torch.allclose(torch.autograd.grad(loss, model.fc.weight)[0], upd.tensors["fc.weight"])


def test_fedavg_one_step_is_minus_lr_times_gradient():
    model = build_model(SPEC, seed=0)
    x, y = torch.rand(2, 3, 16, 16), torch.tensor([1, 2])
    g = fedsgd_update(model, x, y)
    d = fedavg_update(model, x, y, local_lr=0.5, local_steps=1)
    assert torch.allclose(d.tensors["fc.weight"], -0.5 * g.tensors["fc.weight"], atol=1e-6)


@pytest.mark.parametrize("client", ["fedsgd", "fedavg"])
@pytest.mark.parametrize("train_mode", [True, False])
def test_a_client_gives_the_model_back_in_its_mode_and_works_under_no_grad(client, train_mode):
    model = build_model(SPEC, seed=0).eval()
    x, y = torch.rand(2, 3, 16, 16), torch.tensor([1, 2])
    run = {"fedsgd": lambda: fedsgd_update(model, x, y, train_mode=train_mode),
           "fedavg": lambda: fedavg_update(model, x, y, 0.1, 2, train_mode=train_mode)}[client]
    with torch.no_grad():  # e.g. a caller evaluating the model around the client's round
        update = run()
    assert not model.training  # the caller's eval mode: its forward passes keep the running statistics
    assert update.tensors["fc.weight"].abs().sum() > 0


def test_validation_names_the_problem():
    model = build_model(SPEC, seed=0)
    upd = fedsgd_update(model, torch.rand(1, 3, 16, 16), torch.tensor([0]))
    upd.tensors["fc.weight"] = torch.zeros(3, 3)
    with pytest.raises(LeaklabError, match="fc.weight.*shape"):
        upd.validate_against(model)
    upd.tensors["fc.weight"] = torch.full(tuple(model.fc.weight.shape), float("nan"))
    with pytest.raises(LeaklabError, match="NaN or Inf"):
        upd.validate_against(model)


def test_view_rejects_a_model_state_of_another_architecture():
    other = build_model(SPEC.model_copy(update={"width": 8}), seed=0)
    upd = fedsgd_update(other, torch.rand(1, 3, 16, 16), torch.tensor([0]))
    with pytest.raises(LeaklabError, match="does not fit"):
        make_view(SPEC, other.state_dict(), upd.metadata)


def test_capabilities_gate_what_the_attack_may_read():
    model = build_model(SPEC, seed=0)
    upd = fedsgd_update(model, torch.rand(1, 3, 16, 16), torch.tensor([3]))
    view = make_view(SPEC, model.state_dict(), upd.metadata,
                     Capabilities(knows_defense=False, knows_labels=False), defense="gaussian:0.1",
                     labels=torch.tensor([3]))
    assert view.labels is None and view.defense is None
    with pytest.raises(LeaklabError, match="knows_defense"):
        view.known_defense()


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.complex64, torch.int64])
def test_update_and_model_tensors_of_other_dtypes_are_refused(dtype):
    """float8 was a traceback (isfinite is not implemented for it), complex lost its imaginary part and
    integer weights were cast silently."""
    model = build_model(SPEC, seed=0)
    upd = fedsgd_update(model, torch.rand(1, 3, 16, 16), torch.tensor([0]))
    upd.tensors["fc.weight"] = upd.tensors["fc.weight"].to(dtype)
    with pytest.raises(LeaklabError, match=r"'fc.weight' has dtype .*float16, bfloat16, float32, float64"):
        upd.validate_against(model)
    state = {**model.state_dict(), "fc.weight": model.fc.weight.detach().to(dtype)}
    with pytest.raises(LeaklabError, match=r"model tensor 'fc.weight' has dtype"):
        make_view(SPEC, state, upd.metadata)


def test_model_buffers_must_hold_counters_and_variances():
    """A negative running variance gave NaN PSNRs and exit code 0; a float counter of 1e30 became a
    negative integer."""
    model = build_model(SPEC, seed=0)
    meta = fedsgd_update(model, torch.rand(1, 3, 16, 16), torch.tensor([0])).metadata
    var = next(k for k in model.state_dict() if k.endswith("running_var"))
    count = var.replace("running_var", "num_batches_tracked")
    with pytest.raises(LeaklabError, match=f"'{var}' holds negative values"):
        make_view(SPEC, {**model.state_dict(), var: -model.state_dict()[var]}, meta)
    with pytest.raises(LeaklabError, match=f"'{count}' has dtype torch.float64; it must be int64"):
        make_view(SPEC, {**model.state_dict(), count: torch.tensor(1e30, dtype=torch.float64)}, meta)
    assert make_view(SPEC, {k: v.half() if v.is_floating_point() else v for k, v in model.state_dict().items()},
                     meta).model.fc.weight.dtype == torch.float32


def test_a_spec_larger_than_its_model_file_is_refused_before_it_is_built(monkeypatch):
    """A view.json may declare a model of up to 16 GiB: it was built before its file was compared."""
    import leaklab.threat as threat

    built = []
    real = threat.build_model
    monkeypatch.setattr(threat, "build_model", lambda spec: built.append(torch.empty(0).device) or real(spec))
    model = build_model(SPEC, seed=0)
    meta = fedsgd_update(model, torch.rand(1, 3, 16, 16), torch.tensor([0])).metadata
    huge = SPEC.model_copy(update={"image_size": 512, "width": 1024, "num_classes": 100_000})
    with pytest.raises(LeaklabError, match="does not fit a convnet model"):
        make_view(huge, model.state_dict(), meta)
    assert built == [torch.device("meta")]
    make_view(SPEC, model.state_dict(), meta)
    assert built[1:] == [torch.device("meta"), torch.device("cpu")]


def test_a_model_file_is_checked_in_the_models_dtype_and_against_the_views_normalisation():
    """A negative std from a damaged file was attacked (4.81 dB); a float64 1e300 passed as finite and became
    inf in the float32 model (the attack then said to lower --lr)."""
    from leaklab.threat import model_with_state

    spec = ModelSpec(name="mlp", num_classes=3, in_channels=1, image_size=8, width=16, mean=(0.5,), std=(0.25,))
    state = build_model(spec).state_dict()
    assert model_with_state(spec, state) is not None
    with pytest.raises(LeaklabError, match="not the mean and std the view declares"):
        model_with_state(spec, {**state, "normalize.std": -state["normalize.std"]})
    with pytest.raises(LeaklabError, match=r"'fc.bias' contains NaN or Inf values \(as the model's torch.float32\)"):
        model_with_state(spec, {**state, "fc.bias": state["fc.bias"].double() + 1e300})


def test_metadata_that_does_not_fit_its_update_kind_or_loss_is_refused():
    """A FedSGD case declaring local steps and a local batch, or an entropy weight on a DQN loss, was read."""
    from pydantic import ValidationError

    from leaklab.threat import UpdateMetadata

    for fields in ({"local_steps": 5}, {"local_batch_size": 1}, {"loss": "dqn_mse", "entropy_weight": 0.5},
                   {"entropy_weight": 0.5}):
        with pytest.raises(ValidationError, match="FedSGD update is one gradient|entropy_weight is REINFORCE"):
            UpdateMetadata(batch_size=2, **fields)
    assert UpdateMetadata(kind="fedavg", batch_size=2, local_steps=5, local_batch_size=1).minibatch_size == 1
    assert UpdateMetadata(loss="reinforce", entropy_weight=0.5).entropy_weight == 0.5


def test_a_view_refuses_labels_that_are_no_class_indices():
    """Float labels passed and the attack failed on them (expected target dtype Long)."""
    model = build_model(SPEC, seed=0)
    upd = fedsgd_update(model, torch.rand(2, 3, 16, 16), torch.tensor([0, 1]))
    for labels in (torch.tensor([1.5, 2.0]), torch.tensor([True, False])):
        with pytest.raises(LeaklabError, match="class indices"):
            make_view(SPEC, model.state_dict(), upd.metadata, Capabilities(knows_labels=True), labels=labels)


def test_a_private_fedavg_client_takes_a_whole_dp_sgd_config():
    """A DPSGDConfig (a DPConfig with training fields) clashed with the update's own: a TypeError."""
    from leaklab.privacy.dpsgd import DPSGDConfig

    model = build_model(SPEC.model_copy(update={"name": "lenet", "width": None}), seed=0)  # opacus takes no BatchNorm
    upd = fedavg_update(model, torch.rand(4, 3, 16, 16), torch.tensor([0, 1, 2, 3]), local_lr=0.1, local_steps=2,
                        privacy=DPSGDConfig(clip=1.0, noise_multiplier=1.0, batch_size=2, steps=9, lr=0.5))
    assert upd.privacy is not None and all(torch.isfinite(t).all() for t in upd.tensors.values())
