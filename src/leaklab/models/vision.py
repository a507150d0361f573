"""Image classifiers used in the gradient-leakage literature (seed 001 and the attacks it builds on)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from leaklab.errors import LeaklabError
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
    exactly (the attack seed 001's section 5 breaks PRECODE with: :class:`PrecodeMLP`).
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


class ConvBig(nn.Module):
    """ConvBig of seed 001's Table 3 (appendix A.1), the network its attack on Soteria is measured on: a 3x3 conv
    (``width``) + ReLU + 2x2 average pool, a 1x1 conv with padding 1 (``2 * width``) + ReLU + 2x2 average pool, then
    linear layers of 2,000 and 1,000 ReLU units and a linear classifier. With ``width`` 32 and 32x32 images the first
    linear layer (5,184 -> 2,000) holds about 80% of the weights and the second 20%: the layers Soteria defends."""

    def __init__(self, num_classes: int, in_channels: int, image_size: int,
                 mean: Sequence[float], std: Sequence[float], width: int = 32):
        super().__init__()
        self.normalize = Normalize(mean, std)
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),
            nn.Conv2d(width, 2 * width, 1, padding=1), nn.ReLU(), nn.AvgPool2d(2),
            nn.Flatten(),
        )
        side = (image_size // 2 + 2) // 2
        self.classifier = nn.Sequential(nn.Linear(2 * width * side * side, 2000), nn.ReLU(),
                                        nn.Linear(2000, 1000), nn.ReLU(),
                                        nn.Linear(1000, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(self.normalize(x)))


class PrecodeMLP(nn.Module):
    """The MLP of seed 001's PRECODE experiment (section 6) with PRECODE's variational bottleneck (Scheliga et
    al., 2021) before its last layers: five linear layers of ``width`` ReLU units and one of ``bottleneck`` units
    encode the image into ``z``; the bottleneck draws ``b = mu(z) + exp(log_var(z) / 2) * eps`` with fresh
    standard-normal ``eps`` at every forward pass (training and inference alike, as the seed's code), and a
    ``width`` ReLU layer and the classifier decode ``b``. The client's loss adds ``kl_weight`` (0.003, the seed's
    code) times the mean KL divergence of ``N(mu, exp(log_var))`` from ``N(0, I)`` (:meth:`extra_loss`; the seed's
    code puts ``log_var`` in the place of ``mu`` there, a slip leaklab does not copy).
    Weights and biases are uniform in [-0.05, 0.05], the seed's initialisation."""

    kl_weight = 0.003

    def __init__(self, num_classes: int, in_channels: int, image_size: int,
                 mean: Sequence[float], std: Sequence[float], width: int = 500, depth: int = 5,
                 bottleneck: int = 256):
        super().__init__()
        self.normalize = Normalize(mean, std)
        layers: list[nn.Module] = [nn.Flatten()]
        cin = in_channels * image_size * image_size
        for size in [width] * depth + [bottleneck]:
            layers += [nn.Linear(cin, size), nn.ReLU()]
            cin = size
        self.encoder = nn.Sequential(*layers)
        self.mu = nn.Linear(bottleneck, bottleneck)
        self.log_var = nn.Linear(bottleneck, bottleneck)
        self.decoder = nn.Sequential(nn.Linear(bottleneck, width), nn.ReLU(), nn.Linear(width, num_classes))
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.uniform_(module.weight, -0.05, 0.05)
                nn.init.uniform_(module.bias, -0.05, 0.05)
        self._kl: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.encoder(self.normalize(x))
        mu, log_var = self.mu(z), self.log_var(z)
        self._kl = (-0.5 * (1 + log_var - mu * mu - log_var.exp()).sum(1)).mean()
        b = mu + torch.exp(0.5 * log_var) * torch.randn_like(mu)
        return self.decoder(b)

    def extra_loss(self) -> torch.Tensor:
        """``kl_weight`` times the KL term of the last forward pass (added to the client's cross-entropy)."""
        if self._kl is None:
            raise LeaklabError("PrecodeMLP.extra_loss needs a forward pass first")
        return self.kl_weight * self._kl


class InferenceTargetCNN(nn.Module):
    """The deployed classifier of seed 002, chapter 6 (section 6.5.1, after Yang et al., 2019) that membership
    inference and model inversion query: three blocks of a 3x3 convolution, BatchNorm, 2x2 max-pool and ReLU
    (``width``, ``2 * width``, ``4 * width`` channels; the thesis gives no widths: Yang et al.'s code uses 128), then
    a linear layer of 50 units, dropout 0.5 and the classifier."""

    def __init__(self, num_classes: int, in_channels: int, image_size: int,
                 mean: Sequence[float], std: Sequence[float], width: int = 32):
        super().__init__()
        self.normalize = Normalize(mean, std)
        blocks: list[nn.Module] = []
        cin = in_channels
        for cout in (width, 2 * width, 4 * width):
            blocks += [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.MaxPool2d(2), nn.ReLU()]
            cin = cout
        self.features = nn.Sequential(*blocks, nn.Flatten())
        side = image_size // 8
        self.classifier = nn.Sequential(nn.Linear(cin * side * side, 50), nn.ReLU(), nn.Dropout(0.5),
                                        nn.Linear(50, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(self.normalize(x)))


class RowLSTM(nn.Module):
    """A recurrent image classifier: the image's rows read top to bottom as a sequence (each row's pixels of every
    channel one input vector) by a one-layer LSTM of ``hidden`` units, its last hidden state classified by a linear
    layer. Seed 003 chapter 3 compares an RNN with an FFNN of nearly as many parameters (:class:`MLP` with width 64
    and depth 2 on 16x16 grey images has 21,258; this with hidden 64, 21,642)."""

    def __init__(self, num_classes: int, in_channels: int, image_size: int,
                 mean: Sequence[float], std: Sequence[float], hidden: int = 64):
        super().__init__()
        self.normalize = Normalize(mean, std)
        self.lstm = nn.LSTM(in_channels * image_size, hidden, batch_first=True)
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.normalize(x)  # (N, C, H, W) -> rows (N, H, C * W)
        rows = x.permute(0, 2, 1, 3).reshape(x.shape[0], x.shape[2], -1)
        _, (h, _) = self.lstm(rows)
        return self.fc(h[-1])
