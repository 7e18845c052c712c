"""Synthetic data and model shared by the workload probes (workload/) and the bench worker (bench_worker.py).

JPEGs with a photo's decode cost, a dataset that decodes and augments them as an ImageNet loader does
(without torchvision), a small conv-net, the DataLoader worker rule and the size of /dev/shm.

Standard library only at import (torch and PIL are imported where they are used), Python >= 3.9, nothing of
hostcheck outside hostcheck.inside: both run in the training Python (hostcheck.child.launch.inside_argv).
"""

from __future__ import annotations

import math
import os
import random
import shutil

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def write_jpegs(
    folder: str, count: int, size=(484, 402), quality: int = 90, seed: int = 0, distinct: int = 16
):
    """Synthetic JPEGs with structure (gradients + noise), so decode costs like a photo's."""
    from PIL import Image, ImageFilter

    rnd = random.Random(seed)
    base = Image.merge(
        "RGB",
        [
            Image.linear_gradient("L").resize(size),
            Image.radial_gradient("L").resize(size),
            Image.effect_noise(size, 60).filter(ImageFilter.GaussianBlur(2)),
        ],
    )
    paths = []
    for i in range(count):
        p = os.path.join(folder, f"img_{i:05d}.jpg")
        if i < distinct:
            noise = Image.effect_noise(size, 30 + rnd.random() * 40)
            img = Image.blend(base, Image.merge("RGB", [noise, noise.rotate(90, expand=False), noise]), 0.5)
            img.rotate(rnd.random() * 360).save(p, "JPEG", quality=quality)
        else:  # decoding costs the same for a copy; copying is much faster than encoding
            shutil.copyfile(paths[i % distinct], p)
        paths.append(p)
    return paths


class JpegDataset:
    """decode (PIL) -> random resized crop -> horizontal flip -> float tensor -> normalise (no torchvision)."""

    def __init__(self, paths, crop: int = 224, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), seed=None):
        self.paths = list(paths)
        self.crop = crop
        self.scale = scale
        self.ratio = ratio
        # None: fresh random crops; an int: the same crops on every run (A/B benchmarks do the same work).
        self.seed = seed

    def __len__(self):
        return len(self.paths)

    def _box(self, w, h, rnd):
        area = w * h
        for _ in range(10):
            target = area * rnd.uniform(*self.scale)
            ar = math.exp(rnd.uniform(math.log(self.ratio[0]), math.log(self.ratio[1])))
            cw = round(math.sqrt(target * ar))
            ch = round(math.sqrt(target / ar))
            if 0 < cw <= w and 0 < ch <= h:
                x = rnd.randint(0, w - cw)
                y = rnd.randint(0, h - ch)
                return (x, y, x + cw, y + ch)
        s = min(w, h)
        return ((w - s) // 2, (h - s) // 2, (w - s) // 2 + s, (h - s) // 2 + s)

    def __getitem__(self, i):
        import torch
        from PIL import Image

        rnd = random.Random() if self.seed is None else random.Random(self.seed * 1_000_003 + i)
        with Image.open(self.paths[i]) as im:
            img = im.convert("RGB")
        bilinear = getattr(Image, "Resampling", Image).BILINEAR
        flip = getattr(Image, "Transpose", Image).FLIP_LEFT_RIGHT
        img = img.resize((self.crop, self.crop), bilinear, box=self._box(img.width, img.height, rnd))
        if rnd.random() < 0.5:
            img = img.transpose(flip)
        t = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8).view(self.crop, self.crop, 3)
        t = t.permute(2, 0, 1).float().div_(255.0)
        mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
        std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
        return t.sub_(mean).div_(std), i % 10


def small_cnn(nn, channels, classes=10):
    """Per entry of ``channels``: two 3x3 conv + batch-norm + ReLU and a 2x2 max-pool; then pool, linear."""
    layers = []
    c_in = 3
    for c in channels:
        layers += [
            nn.Conv2d(c_in, c, 3, padding=1, bias=False),
            nn.BatchNorm2d(c),
            nn.ReLU(inplace=True),
            nn.Conv2d(c, c, 3, padding=1, bias=False),
            nn.BatchNorm2d(c),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        ]
        c_in = c
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, classes)]
    return nn.Sequential(*layers)


def recommended_workers(cpus: int, gpus: int) -> int:
    """The usual rule: the CPUs per GPU, less one for the training process, at most 8, at least 1."""
    per_gpu = max(1, cpus // max(1, gpus))
    return max(1, min(8, per_gpu - 1))


def shm_bytes(path: str = "/dev/shm"):
    """The size of the /dev/shm this process sees (DataLoader workers pass batches through it), or None."""
    try:
        st = os.statvfs(path)
        return st.f_frsize * st.f_blocks
    except OSError:
        return None
