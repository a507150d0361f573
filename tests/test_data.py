import pytest
import torch

from leaklab.data import DATASET_NAMES, load_images
from leaklab.errors import LeaklabError


@pytest.mark.parametrize("name", DATASET_NAMES)
def test_datasets_give_real_images_in_unit_range(name):
    batch = load_images(name, 5, image_size=16, seed=3)
    assert batch.images.shape[0] == 5 and batch.images.shape[-2:] == (16, 16)
    assert batch.images.min() >= 0 and batch.images.max() <= 1
    assert batch.images.std() > 0.05  # real content, not a constant
    assert batch.labels.min() >= 0 and batch.labels.max() < batch.num_classes
    assert len(batch.mean) == batch.images.shape[1]


def test_same_seed_same_images_other_seed_other_images():
    a, b, c = (load_images("photos", 4, seed=s) for s in (7, 7, 8))
    assert torch.equal(a.images, b.images)
    assert not torch.equal(a.images, c.images)


def test_photos_drawn_in_other_counts_can_share_an_image_which_among_finds():
    """numpy draws another set without replacement for another count: offsets alone keep photos' draws apart
    only by chance (the datasets' draws are one permutation's slices)."""
    from leaklab.data import among

    tune, reported = load_images("photos", 2, seed=27), load_images("photos", 12, seed=27, offset=8)
    assert among(tune.images, reported.images).tolist() == [False, True]
    digits = [load_images("digits", n, seed=27, offset=o).images for n, o in ((2, 0), (12, 8))]
    assert not among(*digits).any() and among(reported.images, reported.images).all()


def test_unknown_dataset_is_a_clear_error():
    with pytest.raises(LeaklabError, match="unknown dataset"):
        load_images("cifar10", 1)


def test_asking_for_more_images_than_exist_is_an_error():
    with pytest.raises(LeaklabError, match="has 200 images"):
        load_images("faces", 201)


def test_a_capture_never_trains_on_a_clients_photo(monkeypatch):
    """Seed 80's 4 client photos and its next 256 (the network's training pool) share one crop."""
    from leaklab.data import among
    from leaklab.experiments import capture as capture_module

    trained_on = []
    monkeypatch.setattr(capture_module, "train_steps",
                        lambda model, images, labels, steps, seed, **_: trained_on.append(images))
    config = capture_module.CaptureConfig(model="mlp", width=8, num_images=4, image_seed=80, image_size=16,
                                          train_steps=1)
    capture_module.capture(config)
    client = load_images("photos", 4, image_size=16, seed=80).images
    pool = load_images("photos", 256, image_size=16, seed=80, offset=4).images
    assert among(pool, client).sum() == 1 and len(trained_on[0]) == 255 and not among(trained_on[0], client).any()
