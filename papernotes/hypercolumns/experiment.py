"""The chapter's experiment on hypercolumns (chapters/hypercolumns.ipynb).

Generated figure-ground data (a circle, square or triangle near the middle of a noisy window,
with a smaller shape cut by a corner as clutter); a small CNN trained on the *image* label and
frozen; per-pixel classifiers over hypercolumns of its top (gap) alone, top and middle (pool2),
all three (with conv1), or the fine layer alone; their IoU and their accuracy in a band around
the true boundaries. The mechanism is `papernotes.hypercolumns`, called through the module so
that a patched mechanism (tests/mutants/hypercolumns.py) reaches every experiment.

Arguments are checked at the entry points (`generate_shapes`, `ShapeNet`, `pretrain`,
`sample_pixels`, `train_pixel_classifier`, `boundary_band`, `segmentation_scores`,
`predict_masks`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from papernotes import checks, hypercolumns
from papernotes.data import Standardizer, minibatches
from papernotes.training import (
    History,
    accuracy_of,
    generator,
    seeded,
    train_classifier,
)

SHAPES = ("circle", "square", "triangle")

# The random streams of the training runs, each drawn from generator(seed, stream).
PRETRAIN_BATCHES, PIXEL_BATCHES = 1, 5

# -- the data: shapes in a noisy window -----------------------------------------------------------


@dataclass(frozen=True)
class Shapes:
    """Images (N, 1, S, S), figure-ground masks (N, S, S) as int64 (1 = shape) and the shapes'
    classes (N,) as indices into SHAPES."""

    images: torch.Tensor
    masks: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return self.labels.shape[0]


def generate_shapes(
    n: int,
    *,
    size: int = 24,
    noise: float = 0.3,
    clutter: bool = True,
    generator: torch.Generator | None = None,
) -> Shapes:
    """`n` windows of `size` x `size` pixels, each holding one shape near its middle.

    The shape (circle, square or triangle, equally likely) has a radius of 0.2 to 0.35 of the
    window, its centre within 0.1 of the window from the middle, and a brightness of 0.6 to 1.4
    over a background of 0; pixel noise N(0, `noise`^2) is added everywhere. The mask marks the
    pixels whose centres fall inside the shape. With `clutter`, a second, smaller shape of any
    kind (radius 0.15 to 0.25) sits near a random corner, cut by the window's border as a
    neighbouring object in a detection box would be: it is as bright, and it is ground.
    Everything random comes from `generator`.
    """
    n = checks.integer("n", n)
    size = checks.integer("size", size, 8)
    noise = checks.number("noise", noise, 0.0)
    checks.boolean("clutter", clutter)

    def uniform(low, high):
        return low + (high - low) * torch.rand(n, 1, 1, generator=generator)

    labels = torch.randint(len(SHAPES), (n,), generator=generator)
    radius = uniform(0.2, 0.35) * size
    cy = size / 2 + uniform(-0.1, 0.1) * size
    cx = size / 2 + uniform(-0.1, 0.1) * size
    brightness = uniform(0.6, 1.4)
    masks = _shape_masks(labels, radius, cy, cx, size)
    images = brightness * masks
    if clutter:
        kinds = torch.randint(len(SHAPES), (n,), generator=generator)
        corner = torch.randint(2, (n, 2, 1, 1), generator=generator).float()
        small = uniform(0.15, 0.25) * size
        oy = (0.08 + 0.84 * corner[:, 0]) * size + uniform(-0.05, 0.05) * size
        ox = (0.08 + 0.84 * corner[:, 1]) * size + uniform(-0.05, 0.05) * size
        other = _shape_masks(kinds, small, oy, ox, size) & ~masks
        images = images + uniform(0.6, 1.4) * other
    images = images + noise * torch.randn(n, size, size, generator=generator)
    return Shapes(images.unsqueeze(1), masks.long(), labels)


def _shape_masks(kinds, radius, cy, cx, size) -> torch.Tensor:
    """(N, S, S) bool: pixels whose centres fall inside each shape (kind, radius, centre)."""
    coords = torch.arange(size, dtype=torch.float32) + 0.5  # pixel centres
    dy, dx = coords.view(1, -1, 1) - cy, coords.view(1, 1, -1) - cx
    circle = dy**2 + dx**2 <= radius**2
    square = (dy.abs() <= 0.8 * radius) & (dx.abs() <= 0.8 * radius)
    # An upright triangle: apex at -radius, base at +radius/2, half-width growing downwards.
    depth = dy + radius
    triangle = (depth >= 0) & (dy <= radius / 2) & (dx.abs() <= depth / math.sqrt(3))
    kind = kinds.view(-1, 1, 1)
    return torch.where(kind == 0, circle, torch.where(kind == 1, square, triangle))


# -- the network that is pretrained on the image label and then frozen ----------------------------


class ShapeNet(nn.Module):
    """Three 3x3 convolutions, each followed by ReLU and 2x2 max-pooling, then global average
    pooling and a linear layer over the shape classes.

    `feature_maps(x)` returns the maps named in `hypercolumns.LAYERS`: conv1 (the first
    convolution after its ReLU, stride 1), pool2 (the second convolution's pooled output,
    stride 4), pool3 (the third's, stride 8) and gap (pool3 averaged over the window, the vector
    the classifier reads, as a 1 x 1 map): on a 24-pixel window 24 x 24, 6 x 6, 3 x 3 and 1 x 1
    cells.
    """

    def __init__(self, channels: Sequence[int] = (8, 16, 32), n_classes: int = len(SHAPES)):
        super().__init__()
        channels = [checks.integer(f"channels[{i}]", c) for i, c in enumerate(channels)]
        if len(channels) != 3:
            raise ValueError(f"channels must name 3 widths, one per convolution; got {channels}")
        n_classes = checks.integer("n_classes", n_classes, 2)
        widths = [1, *channels]
        self.convs = nn.ModuleList(
            nn.Conv2d(a, b, 3, padding=1) for a, b in zip(widths, widths[1:], strict=False)
        )
        self.head = nn.Linear(channels[-1], n_classes)
        self.channels = tuple(channels)

    def feature_maps(self, x: torch.Tensor) -> list[torch.Tensor]:
        conv1 = F.relu(self.convs[0](x))
        pool2 = F.max_pool2d(F.relu(self.convs[1](F.max_pool2d(conv1, 2))), 2)
        pool3 = F.max_pool2d(F.relu(self.convs[2](pool2)), 2)
        return [conv1, pool2, pool3, pool3.mean((2, 3), keepdim=True)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.feature_maps(x)[-1].flatten(1))


def pretrain(
    data: Shapes,
    *,
    seed: int,
    steps: int = 200,
    batch_size: int = 32,
    lr: float = 1e-2,
    channels: Sequence[int] = (8, 16, 32),
    val: Shapes | None = None,
) -> tuple[ShapeNet, History]:
    """Train a ShapeNet on the image label (which shape), Adam on cross-entropy; return it
    frozen (eval mode, no gradients) with the History of its validation accuracy."""
    checks.tensor("data.images", data.images, "(N, 1, S, S)", dtype="floating")
    lr = checks.number("lr", lr, 0.0, low_open=True)
    with seeded(seed):
        model = ShapeNet(channels)
    batches = minibatches(len(data), batch_size, generator(seed, stream=PRETRAIN_BATCHES))

    def evaluate():
        if val is None:
            return {}
        return {"val_accuracy": accuracy_of(model, val.images, val.labels)}

    history = train_classifier(
        model,
        data.labels,
        torch.optim.Adam(model.parameters(), lr=lr),
        steps,
        batches=batches,
        logits_of=lambda index: model(data.images[index]),
        evaluate=evaluate,
        eval_every=max(steps // 4, 1),
        desc="pretraining",
    )
    model.requires_grad_(False)
    return model, history


def untrained(seed: int, channels: Sequence[int] = (8, 16, 32)) -> ShapeNet:
    """The ShapeNet that `pretrain(..., seed=seed)` starts from, frozen before any update: the
    control whose features were never trained to recognise anything."""
    with seeded(seed):
        model = ShapeNet(channels)
    return model.eval().requires_grad_(False)


# -- training a classifier on sampled pixels ------------------------------------------------------


@dataclass(frozen=True)
class PixelSample:
    """Hypercolumns (N, D) of sampled pixels, their labels (N,), their positions (N, 2) as
    (row, column), the window size, and (optionally) the index of each pixel's image (N,) and
    its window's category, the shape class (N,)."""

    features: torch.Tensor
    labels: torch.Tensor
    positions: torch.Tensor
    size: tuple[int, int]
    images: torch.Tensor | None = None
    categories: torch.Tensor | None = None


def sample_pixels(
    model: ShapeNet,
    data: Shapes,
    layers: Sequence[str],
    n_pixels: int,
    *,
    generator: torch.Generator | None = None,
    chunk: int = 64,
) -> PixelSample:
    """`n_pixels` pixels drawn uniformly (with replacement) from all pixels of `data`, with
    their hypercolumns over `layers` of the frozen `model`."""
    n_pixels = checks.integer("n_pixels", n_pixels)
    size = tuple(data.masks.shape[-2:])
    n, h, w = len(data), *size
    flat = torch.randint(n * h * w, (n_pixels,), generator=generator)
    image, row, col = flat // (h * w), (flat // w) % h, flat % w
    parts = []
    with torch.no_grad():
        for start in range(0, n, chunk):
            stop = min(start + chunk, n)
            mine = (image >= start) & (image < stop)
            maps = hypercolumns.select(model.feature_maps(data.images[start:stop]), layers)
            cols = hypercolumns.hypercolumns(maps, size)
            parts.append((mine.nonzero()[:, 0], cols[image[mine] - start, :, row[mine], col[mine]]))
    features = torch.empty(n_pixels, parts[0][1].shape[1])
    for index, values in parts:
        features[index] = values
    positions = torch.stack([row, col], 1)
    labels = data.masks[image, row, col]
    return PixelSample(features, labels, positions, size, image, data.labels[image])


def train_pixel_classifier(
    sample: PixelSample,
    *,
    grid: int = 1,
    per_category: bool = False,
    interpolate: bool = True,
    seed: int,
    steps: int = 150,
    batch_size: int = 2048,
    lr: float = 0.05,
    weight_decay: float = 1e-4,
) -> tuple[hypercolumns.LocationClassifier, History]:
    """Fit a LocationClassifier (standardiser from the sample) by Adam on cross-entropy over
    minibatches of the sampled pixels; returns it in eval mode, gradients off.

    `per_category`: one set of K x K classifiers per shape class, the window's class picking
    it (the sample's `categories`); otherwise one set for every window. `interpolate`: train
    through the bilinear mix of the classifiers, as the test does; otherwise train each cell's
    classifier on the pixels of its own cell (`hypercolumns.cell_membership`) and interpolate
    at test time only, as the paper's system without fine-tuning does.
    """
    d = checks.tensor("sample.features", sample.features, "(N, D)", dtype="floating")
    checks.tensor("sample.labels", sample.labels, "(N,)", N=d["N"])
    grid = checks.integer("grid", grid)
    checks.boolean("per_category", per_category)
    checks.boolean("interpolate", interpolate)
    lr = checks.number("lr", lr, 0.0, low_open=True)
    categories = None
    if per_category:
        if sample.categories is None:
            raise ValueError("per_category needs the sample's categories")
        checks.tensor("sample.categories", sample.categories, "(N,)", N=d["N"])
        categories = sample.categories
    standardizer = Standardizer.fit(sample.features)
    classifier = hypercolumns.LocationClassifier(
        d["D"],
        standardizer,
        grid=grid,
        n_outputs=2,
        n_categories=len(SHAPES) if per_category else 1,
    )
    weights = hypercolumns.interpolation_weights if interpolate else hypercolumns.cell_membership
    beta_maps = weights(grid, sample.size)  # (K^2, H, W)
    beta = beta_maps[:, sample.positions[:, 0], sample.positions[:, 1]].T  # (N, K^2)
    batches = minibatches(d["N"], min(batch_size, d["N"]), generator(seed, stream=PIXEL_BATCHES))
    optimizer = torch.optim.Adam(classifier.parameters(), lr=lr, weight_decay=weight_decay)
    history = train_classifier(
        classifier,
        sample.labels,
        optimizer,
        steps,
        batches=batches,
        logits_of=lambda index: classifier.at_pixels(
            sample.features[index], beta[index], None if categories is None else categories[index]
        ),
        desc=f"classifier K={grid}",
    )
    classifier.requires_grad_(False)
    return classifier, history


# -- measuring a segmentation ---------------------------------------------------------------------


def boundary_band(masks: torch.Tensor, width: int = 1) -> torch.Tensor:
    """(N, H, W) bool: the pixels within `width` pixels (in the max-norm) of the boundary
    between figure and ground, on either side: where the mask's dilation and erosion by a
    (2 width + 1)-square differ."""
    checks.tensor("masks", masks, "(N, H, W)")
    width = checks.integer("width", width)
    x = masks.float().unsqueeze(1)
    k = 2 * width + 1
    dilated = F.max_pool2d(x, k, stride=1, padding=width)
    eroded = -F.max_pool2d(-x, k, stride=1, padding=width)
    return (dilated != eroded)[:, 0]


def segmentation_scores(
    predicted: torch.Tensor, truth: torch.Tensor, band: torch.Tensor
) -> dict[str, float]:
    """IoU of the figure (|P ∩ T| / |P ∪ T| over all pixels of all images), pixel accuracy,
    and pixel accuracy inside the boundary band; masks (N, H, W)."""
    shape = checks.tensor("predicted", predicted, "(N, H, W)")
    checks.tensor("truth", truth, "(N, H, W)", **shape)
    checks.tensor("band", band, "(N, H, W)", **shape)
    p, t = predicted.bool(), truth.bool()
    correct = p == t
    return {
        "iou": ((p & t).sum() / (p | t).sum()).item(),
        "accuracy": correct.float().mean().item(),
        "boundary_accuracy": correct[band].float().mean().item(),
    }


def predict_masks(
    model: ShapeNet,
    classifier: hypercolumns.LocationClassifier,
    images: torch.Tensor,
    layers: Sequence[str],
    categories: torch.Tensor | None = None,
    chunk: int = 100,
) -> torch.Tensor:
    """Figure-ground masks (N, H, W) of the images: hypercolumns of the frozen network's
    `layers`, classified pixel by pixel by the classifiers of each window's category (N,), the
    larger logit at each pixel."""
    checks.tensor("images", images, "(N, 1, H, W)", dtype="floating")
    categories = classifier.categories_of(categories, images.shape[0])
    masks = []
    with torch.no_grad():
        for start in range(0, images.shape[0], chunk):
            x = images[start : start + chunk]
            maps = hypercolumns.select(model.feature_maps(x), layers)
            h = hypercolumns.hypercolumns(maps, tuple(x.shape[-2:]))
            masks.append(classifier(h, categories[start : start + chunk]).argmax(1))
    return torch.cat(masks)


def paired_iou_difference(
    first: torch.Tensor,
    second: torch.Tensor,
    truth: torch.Tensor,
    *,
    resamples: int = 2000,
    generator: torch.Generator | None = None,
) -> tuple[float, float]:
    """IoU(first) - IoU(second) on the same windows (masks (N, H, W)), and its standard error
    by a paired bootstrap: the windows resampled with replacement, both IoUs recomputed on each
    resample from the windows' intersections and unions."""
    shape = checks.tensor("first", first, "(N, H, W)")
    checks.tensor("second", second, "(N, H, W)", **shape)
    checks.tensor("truth", truth, "(N, H, W)", **shape)
    resamples = checks.integer("resamples", resamples, 2)
    t = truth.bool()

    def counts(p):
        p = p.bool()
        return (p & t).flatten(1).sum(1).double(), (p | t).flatten(1).sum(1).double()

    (i1, u1), (i2, u2) = counts(first), counts(second)
    difference = (i1.sum() / u1.sum() - i2.sum() / u2.sum()).item()
    draws = torch.randint(shape["N"], (resamples, shape["N"]), generator=generator)
    boot = i1[draws].sum(1) / u1[draws].sum(1) - i2[draws].sum(1) / u2[draws].sum(1)
    return difference, boot.std().item()


def most_correlated_channel(layer_map: torch.Tensor, masks: torch.Tensor) -> int:
    """The channel of a layer's maps (N, C, h, w) whose upsampled values correlate most (in
    absolute value, over every pixel of every image) with the figure-ground masks (N, H, W):
    the channel worth drawing for that layer."""
    shape = checks.tensor("masks", masks, "(N, H, W)")
    checks.tensor("layer_map", layer_map, "(N, C, h, w)", N=shape["N"], dtype="floating")
    up = hypercolumns.upsample(layer_map, tuple(masks.shape[-2:])).transpose(0, 1).flatten(1)
    mask = masks.flatten().float()
    up = up - up.mean(1, keepdim=True)
    # Pearson's correlation of each channel (C, pixels) with the mask
    corr = (up @ (mask - mask.mean())) / (up.norm(dim=1) * (mask - mask.mean()).norm() + 1e-12)
    return int(corr.abs().argmax())
