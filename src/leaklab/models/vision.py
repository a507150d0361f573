"""Image classifiers used in the gradient-leakage literature (seed 001 and the attacks it builds on)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from leaklab.models.layers import Normalize


class LeNetDLG(nn.Module):
    """The sigmoid LeNet of Deep Leakage from Gradients (Zhu et al., 2019).

    Three 5x5 convolutions with 12 channels (strides 2, 2, 1) and sigmoid activations, then one
    linear layer. Weights and biases are drawn uniformly from [-0.5, 0.5] as in DLG: the smooth,
    twice-differentiable network on which L-BFGS gradient matching is exact.
    """

    def __init__(self, num_classes: int, in_channels: int, image_size: int,
                 mean: Sequence[float], std: Sequence[float]):
        super().__init__()
        self.normalize = Normalize(mean, std)
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, 12, 5, padding=2, stride=2), nn.Sigmoid(),
            nn.Conv2d(12, 12, 5, padding=2, stride=2), nn.Sigmoid(),
            nn.Conv2d(12, 12, 5, padding=2, stride=1), nn.Sigmoid(),
            nn.Flatten(),
        )
        side = (image_size + 1) // 2
        side = (side + 1) // 2
        self.fc = nn.Linear(12 * side * side, num_classes)
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.uniform_(module.weight, -0.5, 0.5)
                nn.init.uniform_(module.bias, -0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(self.normalize(x)))


def _conv_bn_relu(cin: int, cout: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]


class ConvNet(nn.Module):
    """The ConvNet of Geiping et al. (2020), seed 001 Table 4: nine 3x3 conv+BN+ReLU blocks with
    widths (1, 2, 2, 4, 4, 4 | 4, 4, 4) x ``width``, two 3x3 max-pools, one linear layer."""

    def __init__(self, num_classes: int, in_channels: int, image_size: int,
                 mean: Sequence[float], std: Sequence[float], width: int = 64):
        super().__init__()
        self.normalize = Normalize(mean, std)
        w = width
        layers: list[nn.Module] = []
        layers += _conv_bn_relu(in_channels, w) + _conv_bn_relu(w, 2 * w) + _conv_bn_relu(2 * w, 2 * w)
        layers += _conv_bn_relu(2 * w, 4 * w) + _conv_bn_relu(4 * w, 4 * w) + _conv_bn_relu(4 * w, 4 * w)
        layers += [nn.MaxPool2d(3)]
        layers += _conv_bn_relu(4 * w, 4 * w) + _conv_bn_relu(4 * w, 4 * w) + _conv_bn_relu(4 * w, 4 * w)
        layers += [nn.MaxPool2d(3), nn.Flatten()]
        self.features = nn.Sequential(*layers)
        side = image_size // 3 // 3
        self.fc = nn.Linear(4 * w * side * side, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(self.normalize(x)))


class BasicBlock(nn.Module):
    """Residual block of ResNet-18: two 3x3 conv+BN, identity or 1x1 projection shortcut."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18 for small images (3x3 stem, no stem pooling), stage widths ``width`` x (1, 2, 4, 8)."""

    def __init__(self, num_classes: int, in_channels: int, image_size: int,
                 mean: Sequence[float], std: Sequence[float], width: int = 64):
        super().__init__()
        del image_size  # global average pooling makes the head size-independent
        self.normalize = Normalize(mean, std)
        self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU())
        blocks: list[nn.Module] = []
        cin = width
        for stage, mult in enumerate((1, 2, 4, 8)):
            cout = width * mult
            blocks += [BasicBlock(cin, cout, 1 if stage == 0 else 2), BasicBlock(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.blocks(self.stem(self.normalize(x)))
        return self.fc(torch.flatten(self.pool(out), 1))


class MLP(nn.Module):
    """Fully connected ReLU network on flattened images; ``depth`` hidden layers of ``width`` units.

    Its first layer is the one whose input the analytic attack of Phong et al. (2017) recovers
    exactly (the attack seed 001's section 5 breaks PRECODE with; its 5 layers of 500 are ``depth=5``).
    """

    def __init__(self, num_classes: int, in_channels: int, image_size: int,
                 mean: Sequence[float], std: Sequence[float], width: int = 500, depth: int = 2):
        super().__init__()
        self.normalize = Normalize(mean, std)
        layers: list[nn.Module] = [nn.Flatten()]
        cin = in_channels * image_size * image_size
        for _ in range(depth):
            layers += [nn.Linear(cin, width), nn.ReLU()]
            cin = width
        self.body = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(self.normalize(x)))


class CNN(nn.Module):
    """The small ReLU CNN of seed 001's Table 2 (the ``cnn`` network of the authors' code):
    3x3 conv (``width``) + ReLU + 2x2 average pool, 3x3 conv (``2 * width``) + ReLU + 2x2 average
    pool, a hidden linear layer of 100 ReLU units and a linear classifier. ``width`` 32 is the
    published network; weights are LeCun-normal (variance 1 / fan-in) and biases zero, as the
    defaults of the Flax layers it was written with."""

    def __init__(self, num_classes: int, in_channels: int, image_size: int,
                 mean: Sequence[float], std: Sequence[float], width: int = 32, hidden: int = 100):
        super().__init__()
        self.normalize = Normalize(mean, std)
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),
            nn.Flatten(),
        )
        side = image_size // 2 // 2
        self.classifier = nn.Sequential(nn.Linear(2 * width * side * side, hidden), nn.ReLU(),
                                        nn.Linear(hidden, num_classes))
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                fan_in = module.weight[0].numel()
                nn.init.normal_(module.weight, 0.0, fan_in ** -0.5)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(self.normalize(x)))
