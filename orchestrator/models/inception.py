"""Inception-V3 (Szegedy et al. 2016, "Rethinking the Inception Architecture"), written
compactly after torchvision's `torchvision.models.inception_v3` (same modules, names,
channel counts, kernel sizes, BatchNorm eps 0.001, auxiliary head on Mixed_6e). We do not
import torchvision: the wheel on PyPI does not load beside this machine's torch 2.13.0,
and the matching pair is a 5.5 GB CUDA build. Dropout before the classifier is left out
so that a step is deterministic. The loss is cross-entropy of the main head plus 0.4 x
that of the auxiliary head (torchvision's training reference).

Every branch of a Mixed block is its own chain of ops meeting at one concat, so the
traced graph shows the blocks' parallel branches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True, kw_only=True)
class InceptionConfig:
    num_classes: int
    image_size: int
    """Height = width of the input images; 299 for the architecture as published (the
    auxiliary head needs 17x17 maps at Mixed_6e, which only 299 gives)."""
    width: float
    """Multiplier on every layer's channel count (1.0 as published)."""
    batch: int
    """Default images per step."""
    norm: str = "batch"
    """'batch': BatchNorm with batch statistics (as published); 'frozen': fixed
    statistics and a trainable affine (FrozenBatchNorm, as detection models fine-tune
    with), which makes a step independent of how its batch is split."""

    def __post_init__(self) -> None:
        if self.norm not in ("batch", "frozen"):
            raise ValueError(f"norm={self.norm!r}: choose 'batch' or 'frozen'")
        if self.num_classes < 1 or self.batch < 1 or not 0 < self.width <= 4:
            raise ValueError(f"Inception-V3 needs num_classes={self.num_classes} >= 1, "
                             f"batch={self.batch} >= 1, 0 < width={self.width} <= 4")
        if self.image_size < 299:
            raise ValueError(f"image_size={self.image_size}: Inception-V3 with its "
                             "auxiliary head needs 299x299 inputs or larger")


PRESETS = {
    # Szegedy et al. 2016: 299x299 ImageNet, 1000 classes; batch 32 per GPU there,
    # 64-256 per V100 in NVIDIA's benchmarks.
    "paper": InceptionConfig(num_classes=1000, image_size=299, width=1.0, batch=64),
    # Frozen statistics: with batch statistics every micro-batch and every data-parallel
    # worker normalises by its own samples (as in GPipe, or DDP without SyncBatchNorm),
    # so no split could reproduce a one-device step; the tiny preset is the one whose
    # hybrid runs are checked against one device to 1e-5.
    "tiny": InceptionConfig(num_classes=10, image_size=299, width=1 / 16, batch=2,
                            norm="frozen"),
}


class FrozenBatchNorm2d(nn.Module):
    """BatchNorm2d with fixed statistics (mean 0, variance 1, as a fresh BatchNorm's
    running ones) and a trainable per-channel scale and shift."""

    def __init__(self, channels: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.scale = 1.0 / (1.0 + eps) ** 0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * (self.weight * self.scale).view(1, -1, 1, 1) + self.bias.view(1, -1, 1, 1)


class BasicConv2d(nn.Module):
    """Conv (no bias) -> BatchNorm -> ReLU, torchvision's unit."""

    def __init__(self, cin: int, cout: int, **conv: object) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, bias=False, **conv)
        self.bn = nn.BatchNorm2d(cout, eps=0.001)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)), inplace=False)


class InceptionA(nn.Module):
    def __init__(self, cin: int, pool_features: int, c) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, c(64), kernel_size=1)
        self.branch5x5_1 = BasicConv2d(cin, c(48), kernel_size=1)
        self.branch5x5_2 = BasicConv2d(c(48), c(64), kernel_size=5, padding=2)
        self.branch3x3dbl_1 = BasicConv2d(cin, c(64), kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(c(64), c(96), kernel_size=3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(c(96), c(96), kernel_size=3, padding=1)
        self.branch_pool = BasicConv2d(cin, pool_features, kernel_size=1)
        self.out_channels = 2 * c(64) + c(96) + pool_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b1 = self.branch1x1(x)
        b5 = self.branch5x5_2(self.branch5x5_1(x))
        b3 = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        bp = self.branch_pool(F.avg_pool2d(x, kernel_size=3, stride=1, padding=1))
        return torch.cat([b1, b5, b3, bp], 1)


class InceptionB(nn.Module):
    def __init__(self, cin: int, c) -> None:
        super().__init__()
        self.branch3x3 = BasicConv2d(cin, c(384), kernel_size=3, stride=2)
        self.branch3x3dbl_1 = BasicConv2d(cin, c(64), kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(c(64), c(96), kernel_size=3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(c(96), c(96), kernel_size=3, stride=2)
        self.out_channels = c(384) + c(96) + cin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b3 = self.branch3x3(x)
        bd = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        bp = F.max_pool2d(x, kernel_size=3, stride=2)
        return torch.cat([b3, bd, bp], 1)


class InceptionC(nn.Module):
    def __init__(self, cin: int, channels_7x7: int, c) -> None:
        super().__init__()
        c7 = channels_7x7
        self.branch1x1 = BasicConv2d(cin, c(192), kernel_size=1)
        self.branch7x7_1 = BasicConv2d(cin, c7, kernel_size=1)
        self.branch7x7_2 = BasicConv2d(c7, c7, kernel_size=(1, 7), padding=(0, 3))
        self.branch7x7_3 = BasicConv2d(c7, c(192), kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7dbl_1 = BasicConv2d(cin, c7, kernel_size=1)
        self.branch7x7dbl_2 = BasicConv2d(c7, c7, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7dbl_3 = BasicConv2d(c7, c7, kernel_size=(1, 7), padding=(0, 3))
        self.branch7x7dbl_4 = BasicConv2d(c7, c7, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7dbl_5 = BasicConv2d(c7, c(192), kernel_size=(1, 7), padding=(0, 3))
        self.branch_pool = BasicConv2d(cin, c(192), kernel_size=1)
        self.out_channels = 4 * c(192)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b1 = self.branch1x1(x)
        b7 = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
        bd = self.branch7x7dbl_1(x)
        for conv in (self.branch7x7dbl_2, self.branch7x7dbl_3, self.branch7x7dbl_4,
                     self.branch7x7dbl_5):
            bd = conv(bd)
        bp = self.branch_pool(F.avg_pool2d(x, kernel_size=3, stride=1, padding=1))
        return torch.cat([b1, b7, bd, bp], 1)


class InceptionD(nn.Module):
    def __init__(self, cin: int, c) -> None:
        super().__init__()
        self.branch3x3_1 = BasicConv2d(cin, c(192), kernel_size=1)
        self.branch3x3_2 = BasicConv2d(c(192), c(320), kernel_size=3, stride=2)
        self.branch7x7x3_1 = BasicConv2d(cin, c(192), kernel_size=1)
        self.branch7x7x3_2 = BasicConv2d(c(192), c(192), kernel_size=(1, 7), padding=(0, 3))
        self.branch7x7x3_3 = BasicConv2d(c(192), c(192), kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7x3_4 = BasicConv2d(c(192), c(192), kernel_size=3, stride=2)
        self.out_channels = c(320) + c(192) + cin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b3 = self.branch3x3_2(self.branch3x3_1(x))
        b7 = self.branch7x7x3_4(self.branch7x7x3_3(self.branch7x7x3_2(
            self.branch7x7x3_1(x))))
        bp = F.max_pool2d(x, kernel_size=3, stride=2)
        return torch.cat([b3, b7, bp], 1)


class InceptionE(nn.Module):
    def __init__(self, cin: int, c) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, c(320), kernel_size=1)
        self.branch3x3_1 = BasicConv2d(cin, c(384), kernel_size=1)
        self.branch3x3_2a = BasicConv2d(c(384), c(384), kernel_size=(1, 3), padding=(0, 1))
        self.branch3x3_2b = BasicConv2d(c(384), c(384), kernel_size=(3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = BasicConv2d(cin, c(448), kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(c(448), c(384), kernel_size=3, padding=1)
        self.branch3x3dbl_3a = BasicConv2d(c(384), c(384), kernel_size=(1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = BasicConv2d(c(384), c(384), kernel_size=(3, 1), padding=(1, 0))
        self.branch_pool = BasicConv2d(cin, c(192), kernel_size=1)
        self.out_channels = c(320) + 4 * c(384) + c(192)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b1 = self.branch1x1(x)
        b3 = self.branch3x3_1(x)
        b3 = torch.cat([self.branch3x3_2a(b3), self.branch3x3_2b(b3)], 1)
        bd = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        bd = torch.cat([self.branch3x3dbl_3a(bd), self.branch3x3dbl_3b(bd)], 1)
        bp = self.branch_pool(F.avg_pool2d(x, kernel_size=3, stride=1, padding=1))
        return torch.cat([b1, b3, bd, bp], 1)


class InceptionAux(nn.Module):
    def __init__(self, cin: int, num_classes: int, c) -> None:
        super().__init__()
        self.conv0 = BasicConv2d(cin, c(128), kernel_size=1)
        self.conv1 = BasicConv2d(c(128), c(768), kernel_size=5)
        self.fc = nn.Linear(c(768), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(self.conv0(F.avg_pool2d(x, kernel_size=5, stride=3)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, (1, 1)), 1))


class InceptionV3(nn.Module):
    """forward(images, labels) -> CE(main) + 0.4 CE(aux), averaged over the batch."""

    def __init__(self, cfg: InceptionConfig) -> None:
        super().__init__()
        self.cfg = cfg

        def c(n: int) -> int:
            return max(1, round(n * cfg.width))

        self.Conv2d_1a_3x3 = BasicConv2d(3, c(32), kernel_size=3, stride=2)
        self.Conv2d_2a_3x3 = BasicConv2d(c(32), c(32), kernel_size=3)
        self.Conv2d_2b_3x3 = BasicConv2d(c(32), c(64), kernel_size=3, padding=1)
        self.Conv2d_3b_1x1 = BasicConv2d(c(64), c(80), kernel_size=1)
        self.Conv2d_4a_3x3 = BasicConv2d(c(80), c(192), kernel_size=3)
        self.Mixed_5b = InceptionA(c(192), c(32), c)
        self.Mixed_5c = InceptionA(self.Mixed_5b.out_channels, c(64), c)
        self.Mixed_5d = InceptionA(self.Mixed_5c.out_channels, c(64), c)
        self.Mixed_6a = InceptionB(self.Mixed_5d.out_channels, c)
        self.Mixed_6b = InceptionC(self.Mixed_6a.out_channels, c(128), c)
        self.Mixed_6c = InceptionC(self.Mixed_6b.out_channels, c(160), c)
        self.Mixed_6d = InceptionC(self.Mixed_6c.out_channels, c(160), c)
        self.Mixed_6e = InceptionC(self.Mixed_6d.out_channels, c(192), c)
        self.AuxLogits = InceptionAux(self.Mixed_6e.out_channels, cfg.num_classes, c)
        self.Mixed_7a = InceptionD(self.Mixed_6e.out_channels, c)
        self.Mixed_7b = InceptionE(self.Mixed_7a.out_channels, c)
        self.Mixed_7c = InceptionE(self.Mixed_7b.out_channels, c)
        self.fc = nn.Linear(self.Mixed_7c.out_channels, cfg.num_classes)
        if cfg.norm == "frozen":
            for unit in self.modules():
                if isinstance(unit, BasicConv2d):
                    unit.bn = FrozenBatchNorm2d(unit.bn.num_features, unit.bn.eps)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.Conv2d_2b_3x3(self.Conv2d_2a_3x3(self.Conv2d_1a_3x3(images)))
        x = F.max_pool2d(x, kernel_size=3, stride=2)
        x = self.Conv2d_4a_3x3(self.Conv2d_3b_1x1(x))
        x = F.max_pool2d(x, kernel_size=3, stride=2)
        x = self.Mixed_5d(self.Mixed_5c(self.Mixed_5b(x)))
        x = self.Mixed_6e(self.Mixed_6d(self.Mixed_6c(self.Mixed_6b(self.Mixed_6a(x)))))
        aux = self.AuxLogits(x)
        x = self.Mixed_7c(self.Mixed_7b(self.Mixed_7a(x)))
        logits = self.fc(torch.flatten(F.adaptive_avg_pool2d(x, (1, 1)), 1))
        return F.cross_entropy(logits, labels) + 0.4 * F.cross_entropy(aux, labels)


def make_batch(cfg: InceptionConfig, batch: int, *, device: str | torch.device = "cpu",
               seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    images = torch.randn(batch, 3, cfg.image_size, cfg.image_size, generator=gen)
    labels = torch.randint(0, cfg.num_classes, (batch,), generator=gen)
    return images.to(device), labels.to(device)
