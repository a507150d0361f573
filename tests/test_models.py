import pytest
import torch

from leaklab.models import MODEL_NAMES, ModelSpec, build_model


def spec(name, size=32, channels=3, **kw):
    return ModelSpec(name=name, num_classes=10, in_channels=channels, image_size=size,
                     mean=(0.5,) * channels, std=(0.25,) * channels, **kw)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_models_map_images_to_logits(name):
    model = build_model(spec(name, width=8 if name in ("convnet", "resnet18") else None), seed=0)
    out = model(torch.rand(2, 3, 32, 32))
    assert out.shape == (2, 10)
    assert torch.isfinite(out).all()


def test_same_seed_same_weights_and_different_seed_differs():
    a, b, c = (build_model(spec("convnet", width=4), seed=s) for s in (1, 1, 2))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.fc.weight, c.fc.weight)


def test_lenet_uses_dlg_uniform_init():
    model = build_model(spec("lenet"), seed=0)
    w = model.fc.weight
    assert w.min() >= -0.5 and w.max() <= 0.5 and w.std() > 0.25  # U(-0.5, 0.5) has std 0.289


def test_convnet_matches_seed_table4_shape():
    model = build_model(spec("convnet", width=64), seed=0)
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [64, 128, 128, 256, 256, 256, 256, 256, 256]
    assert model.fc.in_features == 36 * 64


def test_spec_rejects_mismatched_normalisation():
    with pytest.raises(ValueError):
        ModelSpec(name="mlp", num_classes=10, in_channels=3, image_size=32, mean=(0.5,), std=(0.2,))
