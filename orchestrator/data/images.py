"""Image folders in the ImageNet layout: `<root>/train/<class>/<image>`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from orchestrator.data.common import DataError

IMAGE_SUFFIXES = {".jpeg", ".jpg", ".png"}
# ImageNet channel statistics (the usual normalisation for Inception-style models).
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


class ImageFolderDataset(torch.utils.data.Dataset):
    """Sample i = the i-th image file (classes and files sorted by name), resized on its
    shorter side and centre-cropped to `image_size`: (image [3, S, S], label)."""

    def __init__(self, root: str | Path, image_size: int, split: str = "train"):
        folder = Path(root) / split
        if not folder.is_dir():
            raise DataError(f"{folder}: missing; an image dataset needs "
                            f"{folder}/<class>/<image> (the ImageNet layout)")
        self.classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
        if not self.classes:
            raise DataError(f"{folder}: no class directories")
        self.files = [(path, label) for label, name in enumerate(self.classes)
                      for path in sorted((folder / name).iterdir())
                      if path.suffix.lower() in IMAGE_SUFFIXES]
        if not self.files:
            raise DataError(f"{folder}: no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
        self.image_size = image_size

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path, label = self.files[i]
        try:
            with Image.open(path) as img:
                img = img.convert("RGB")
                scale = self.image_size / min(img.size)
                img = img.resize((max(self.image_size, round(img.width * scale)),
                                  max(self.image_size, round(img.height * scale))),
                                 Image.BILINEAR)
                left = (img.width - self.image_size) // 2
                top = (img.height - self.image_size) // 2
                img = img.crop((left, top, left + self.image_size, top + self.image_size))
                pixels = np.asarray(img, dtype=np.float32) / 255.0
        except (UnidentifiedImageError, OSError) as err:
            raise DataError(f"{path}: not a readable image ({err}): remove or replace "
                            "it") from None
        pixels = (pixels - MEAN) / STD
        return torch.from_numpy(pixels.transpose(2, 0, 1).copy()), label
