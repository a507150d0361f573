"""The networks the seeds attack, defined in project code (no torchvision).

Every model takes images with pixel values in [0, 1] and normalises them itself with the dataset
mean and standard deviation (a :class:`Normalize` first layer). Attacks therefore optimise images in
pixel space, where the total-variation and pixel-range priors make sense, while the network sees
normalised inputs as it does in training.
"""

from leaklab.models.factory import MODEL_NAMES, ModelSpec, build_model
from leaklab.models.layers import Normalize, batchnorm_layers
from leaklab.models.perception import (ARCH_NAMES, PerceptionNet, PerceptionSpec, build_perception_net,
                                       stack_images)

__all__ = ["ARCH_NAMES", "MODEL_NAMES", "ModelSpec", "Normalize", "PerceptionNet", "PerceptionSpec",
           "batchnorm_layers", "build_model", "build_perception_net", "stack_images"]
