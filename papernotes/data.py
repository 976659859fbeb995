"""The book's small MNIST: scikit-learn's bundled 8x8 digits, as torch tensors.

1797 grey-scale digits of 8x8 pixels with values 0..16 ship inside scikit-learn, so nothing is
downloaded at run time. We scale them to [0, 1] and split them once, stratified by class, with a
fixed seed: every chapter sees the same 1077 training, 270 validation and 450 test images.

Choices (learning rates, thresholds, architectures) are made on the validation split; the test
split is read only for the claims.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from papernotes import checks

TEST_FRACTION = 0.25
VALIDATION_FRACTION = 0.2  # of what is left after the test split
SPLIT_SEED = 0
IMAGE_SHAPE = (8, 8)
N_CLASSES = 10


@dataclass(frozen=True)
class Digits:
    """Flattened images (N, 64) in [0, 1] as float32 and labels (N,) as int64."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor

    @property
    def n_pixels(self) -> int:
        return self.train_x.shape[1]

    def images(self, x: torch.Tensor) -> torch.Tensor:
        """Reshape flattened images (N, 64) to (N, 8, 8)."""
        return x.reshape(-1, *IMAGE_SHAPE)


@lru_cache(maxsize=1)
def _split() -> tuple[np.ndarray, ...]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    x = (bunch.data / 16.0).astype(np.float32)
    y = bunch.target.astype(np.int64)
    rest_x, test_x, rest_y, test_y = train_test_split(
        x, y, test_size=TEST_FRACTION, random_state=SPLIT_SEED, stratify=y
    )
    train_x, val_x, train_y, val_y = train_test_split(
        rest_x, rest_y, test_size=VALIDATION_FRACTION, random_state=SPLIT_SEED, stratify=rest_y
    )
    return train_x, train_y, val_x, val_y, test_x, test_y


def load_digits_split() -> Digits:
    """The fixed train/validation/test split of the 8x8 digits (fresh tensors on every call)."""
    return Digits(*(torch.from_numpy(part.copy()) for part in _split()))


def binarize(x: torch.Tensor, threshold: float = 0.5) -> torch.Tensor:
    """Fixed binarisation: a pixel is on when its intensity exceeds the threshold."""
    checks.number("threshold", threshold, 0.0, 1.0, low_open=True, high_open=True)
    return (x > threshold).to(x.dtype)


def minibatches(n: int, batch_size: int, generator: torch.Generator | None = None):
    """Yield index tensors of minibatches forever, reshuffling each epoch; the last partial
    batch of an epoch is dropped so that every batch has the same size."""
    checks.integer("n", n)
    checks.integer("batch_size", batch_size)
    if batch_size > n:
        raise ValueError(f"batch_size must lie in [1, {n}]; got {batch_size}")
    while True:
        order = torch.randperm(n, generator=generator)
        for start in range(0, n - batch_size + 1, batch_size):
            yield order[start : start + batch_size]


@dataclass(frozen=True)
class Standardizer:
    r"""Per-feature standardisation fitted on a training set: $\hat x_d = (x_d - \mu_d) / \sigma_d$
    with each feature's mean and standard deviation over the training rows.

    `fit(train_x, eps=...)` adds `eps` to every deviation; a feature that is constant on the
    training rows (deviation under 1e-8) keeps scale 1 instead of blowing up elsewhere."""

    mean: torch.Tensor  # (D,)
    std: torch.Tensor  # (D,)

    @classmethod
    def fit(cls, train_x: torch.Tensor, *, eps: float = 0.0) -> Standardizer:
        checks.tensor("train_x", train_x, "(N, D)", dtype="floating")
        checks.number("eps", eps, 0.0)
        std = train_x.std(0)
        return cls(train_x.mean(0), torch.where(std > 1e-8, std + eps, torch.ones_like(std)))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        checks.tensor("x", x, "(N, D)", D=len(self.mean), dtype="floating")
        return (x - self.mean) / self.std
