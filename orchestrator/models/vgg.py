"""VGG-16 (Simonyan & Zisserman 2015, configuration D), after torchvision's `vgg16`:
thirteen 3x3 convolutions with ReLU in five max-pooled stages, adaptive 7x7 average
pooling, three fully-connected layers. Dropout is left out so a step is deterministic.
The layer-wise planner (OptCNN) compares its per-layer strategies on this model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

#: Output channels per convolution, "M" for a 2x2 max-pool (torchvision's cfg "D").
LAYERS = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
          512, 512, 512, "M")


@dataclass(frozen=True, kw_only=True)
class VGGConfig:
    num_classes: int
    image_size: int
    width: float
    """Multiplier on every layer's width (1.0 as published)."""
    batch: int
    lr: float
    """SGD-with-momentum learning rate at `batch`: without batch norm, VGG-16 diverges
    at the 0.05 other models train at; it learns at about 0.01 at batch 16 (Simonyan &
    Zisserman: 0.01 at 256), scaled linearly to the preset's batch."""

    def __post_init__(self) -> None:
        if self.num_classes < 1 or self.batch < 1 or self.image_size < 32 \
                or not 0 < self.width <= 4:
            raise ValueError(f"VGG-16 needs num_classes={self.num_classes} >= 1, "
                             f"batch={self.batch} >= 1, image_size={self.image_size} "
                             f">= 32 and 0 < width={self.width} <= 4")


PRESETS = {
    # Simonyan & Zisserman 2015: 224x224 ImageNet, 1000 classes; batch 64 per GPU.
    "paper": VGGConfig(num_classes=1000, image_size=224, width=1.0, batch=64,
                       lr=0.01 * 64 / 256),
    "tiny": VGGConfig(num_classes=10, image_size=32, width=1 / 8, batch=4, lr=0.01 * 4 / 16),
}


class VGG16(nn.Module):
    """forward(images, labels) -> mean cross-entropy."""

    def __init__(self, cfg: VGGConfig) -> None:
        super().__init__()
        self.cfg = cfg
        layers: list[nn.Module] = []
        cin = 3
        for v in LAYERS:
            if v == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                cout = max(1, round(v * cfg.width))
                layers += [nn.Conv2d(cin, cout, kernel_size=3, padding=1), nn.ReLU()]
                cin = cout
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        hidden = max(1, round(4096 * cfg.width))
        self.classifier = nn.Sequential(
            nn.Linear(cin * 7 * 7, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, cfg.num_classes))
        # He initialisation (as torchvision's vgg16 does for its convolutions): with
        # PyTorch's default (fan-in uniform, a=sqrt(5)) the signal of thirteen ReLU
        # convolutions without batch norm fades away and the tiny preset's loss stays
        # at log(10); torchvision's N(0, 0.01) for the linear layers stalls it for over
        # a hundred steps at this width.
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Linear):
                nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
                nn.init.zeros_(module.bias)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(self.avgpool(self.features(images)), 1)
        return F.cross_entropy(self.classifier(x), labels)


def make_batch(cfg: VGGConfig, batch: int, *, device: str | torch.device = "cpu",
               seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    images = torch.randn(batch, 3, cfg.image_size, cfg.image_size, generator=gen)
    labels = torch.randint(0, cfg.num_classes, (batch,), generator=gen)
    return images.to(device), labels.to(device)
