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


def test_unknown_dataset_is_a_clear_error():
    with pytest.raises(LeaklabError, match="unknown dataset"):
        load_images("cifar10", 1)


def test_asking_for_more_images_than_exist_is_an_error():
    with pytest.raises(LeaklabError, match="has 200 images"):
        load_images("faces", 201)
