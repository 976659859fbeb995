"""The chapter's experiment on hypercolumns (chapters/hypercolumns.ipynb).

Generated figure-ground data: a network is pretrained to name the one shape (a circle, square
or triangle) of a noisy window, then frozen; the segmentation windows hold two shapes of
different kinds, equally bright, on either side of the middle, and the window's category names
the one that is figure. Per-pixel classifiers over hypercolumns of its layers, alone or stacked,
are scored by IoU and by their accuracy in a band around the true boundaries.

The mechanism is `papernotes.hypercolumns`, called through the module so that a patched
mechanism (tests/mutants/hypercolumns.py) reaches every run of the paper's arms. The chapter's
nulls (the untrained network, raw pixels, the top layer alone) run on code of their own below
("the nulls' own code"), the same computation written out in plain torch, so that no mutant of
the mechanism reaches them; a unit test checks that the two agree on the unbroken mechanism.

Every arm's learning rate is chosen on one grid by its validation cross-entropy (the training
loss on pixels of the validation windows, `validation_cross_entropy`), which rises on either
side of each arm's best rate where the validation IoU can stay flat.

Arguments are checked at the entry points (`generate_shapes`, `ShapeNet`, `pretrain`,
`sample_pixels`, `train_pixel_classifiers`, `validation_cross_entropy`, `boundary_band`,
`segmentation_scores`, `predict_masks`, `segment`, `paired_difference`).
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
    train,
    train_classifier,
)

SHAPES = ("circle", "square", "triangle")
LAYERS = hypercolumns.LAYERS  # the names, bound once: the nulls' code reads them from here

# The random streams of the training runs, each drawn from generator(seed, stream).
PRETRAIN_BATCHES, PIXEL_BATCHES, VALIDATION_PIXELS = 1, 5, 6

# -- the data: shapes in a noisy window -----------------------------------------------------------


@dataclass(frozen=True)
class Shapes:
    """Images (N, 1, S, S), figure-ground masks (N, S, S) as int64 (1 = figure) and the
    figures' classes (N,) as indices into SHAPES: the category that names the figure."""

    images: torch.Tensor
    masks: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return self.labels.shape[0]


def generate_shapes(
    n: int,
    *,
    size: int = 24,
    noise: float = 0.25,
    pair: bool = True,
    generator: torch.Generator | None = None,
) -> Shapes:
    """`n` windows of `size` x `size` pixels.

    A shape (circle, square or triangle, equally likely) has a radius of 0.2 to 0.26 of the
    window and a brightness of 0.6 to 1.4 over a background of 0; pixel noise N(0, `noise`^2)
    is added everywhere. Without `pair` (the pretraining windows) a window holds one shape,
    centred anywhere in the middle half of the window, and its mask and label are that shape's.
    With `pair` (the segmentation windows) it holds two shapes of different kinds, as bright as
    each other, centred 0.27 of the window on either side of the middle along a random direction
    (each centre jittered by up to 0.04 of the window): the first is the figure, whose class is
    the window's label, the other is ground (where they touch, the figure's pixels stay figure).
    Neither brightness nor position tells figure from ground; only the kind of shape does.
    Everything random comes from `generator`.
    """
    n = checks.integer("n", n)
    size = checks.integer("size", size, 8)
    noise = checks.number("noise", noise, 0.0)
    checks.boolean("pair", pair)

    def uniform(low, high):
        return low + (high - low) * torch.rand(n, 1, 1, generator=generator)

    labels = torch.randint(len(SHAPES), (n,), generator=generator)
    brightness = uniform(0.6, 1.4)
    if not pair:
        radius = uniform(0.2, 0.26) * size
        cy, cx = uniform(0.25, 0.75) * size, uniform(0.25, 0.75) * size
        masks = _shape_masks(labels, radius, cy, cx, size)
        images = brightness * masks
    else:
        others = (labels + torch.randint(1, len(SHAPES), (n,), generator=generator)) % len(SHAPES)
        angle = uniform(0.0, 2 * math.pi)
        dy, dx = 0.27 * size * torch.sin(angle), 0.27 * size * torch.cos(angle)
        centres = [
            (
                size / 2 + sign * dy + uniform(-0.04, 0.04) * size,
                size / 2 + sign * dx + uniform(-0.04, 0.04) * size,
            )
            for sign in (1, -1)
        ]
        radii = uniform(0.2, 0.26) * size, uniform(0.2, 0.26) * size
        masks = _shape_masks(labels, radii[0], *centres[0], size)
        ground = _shape_masks(others, radii[1], *centres[1], size) & ~masks
        images = brightness * (masks | ground)
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
    null whose features were never trained to recognise anything."""
    with seeded(seed):
        model = ShapeNet(channels)
    return model.eval().requires_grad_(False)


class RawPixels(nn.Module):
    """The null without features: the window's own pixels at the resolutions of the network's
    maps, the image itself (stride 1, in conv1's place), its averages over 4 x 4 and 8 x 8
    blocks (strides 4 and 8, pool2's and pool3's places) and over the whole window (gap's)."""

    channels = (1, 1, 1)

    def feature_maps(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [x, F.avg_pool2d(x, 4), F.avg_pool2d(x, 8), x.mean((2, 3), keepdim=True)]


# -- the nulls' own code: the same computation in plain torch, out of the mutants' reach --------


def plain_select(maps: Sequence[torch.Tensor], layers: Sequence[str]) -> list[torch.Tensor]:
    """`hypercolumns.select`, written again."""
    return [m for name, m in zip(LAYERS, maps, strict=True) if name in layers]


def plain_hypercolumns(maps: Sequence[torch.Tensor], size: tuple[int, int]) -> torch.Tensor:
    """`hypercolumns.hypercolumns`, written again: bilinear upsampling, cells centred."""
    return torch.cat(
        [F.interpolate(m, size=size, mode="bilinear", align_corners=False) for m in maps], 1
    )


def plain_weights(grid: int, size: tuple[int, int]) -> torch.Tensor:
    """`hypercolumns.interpolation_weights`, written again: (K^2, H, W)."""
    one_hot = torch.eye(grid * grid, dtype=torch.float64).view(grid * grid, 1, grid, grid)
    return F.interpolate(one_hot, size=size, mode="bilinear", align_corners=False)[:, 0].float()


class PlainLocationClassifier(nn.Module):
    """`hypercolumns.LocationClassifier`, written again for the nulls: per category, K x K
    linear classifiers on standardised features, their softmax probabilities blended by the
    bilinear weights. The same parameters, in the same layout, as the mechanism's."""

    def __init__(self, n_features, standardizer, *, grid=1, n_outputs=2, n_categories=1):
        super().__init__()
        self.grid, self.n_categories = grid, n_categories
        self.register_buffer("feature_mean", standardizer.mean.clone())
        self.register_buffer("feature_std", standardizer.std.clone())
        shape = (n_categories, grid**2, n_outputs)
        self.weight = nn.Parameter(torch.zeros(*shape, n_features))
        self.bias = nn.Parameter(torch.zeros(*shape))

    def at_pixels(self, h, beta, categories=None):
        c = torch.zeros(len(h), dtype=torch.long) if categories is None else categories
        z = (h - self.feature_mean) / self.feature_std
        every = z @ self.weight.flatten(0, 2).T + self.bias.flatten()  # every category's cells
        scores = every.view(len(h), *self.bias.shape)[torch.arange(len(h)), c]
        # log sum_k beta_ik softmax(scores_ik), in log space so that a confident wrong answer
        # costs its full log-likelihood (a weight of 0 is log 0 = -inf, which drops the cell)
        return torch.logsumexp(beta.log().unsqueeze(-1) + scores.log_softmax(-1), dim=1)

    def forward(self, h, categories=None):
        c = torch.zeros(len(h), dtype=torch.long) if categories is None else categories
        z = (h - self.feature_mean.view(1, -1, 1, 1)) / self.feature_std.view(1, -1, 1, 1)
        scores = torch.einsum("bdhw,bkod->bkohw", z, self.weight[c])
        scores = scores + self.bias[c][..., None, None]
        beta = plain_weights(self.grid, tuple(h.shape[-2:])).to(h.dtype)
        return torch.einsum("khw,bkohw->bohw", beta, scores.softmax(2))


def plain_copy(classifier: hypercolumns.LocationClassifier) -> PlainLocationClassifier:
    """The nulls' own classifier holding a LocationClassifier's weights: the same classifiers,
    computed by the experiment's code (to check the mechanism's blend against)."""
    n_categories, k2, n_outputs, n_features = classifier.weight.shape
    standardizer = Standardizer(classifier.feature_mean, classifier.feature_std)
    plain = PlainLocationClassifier(
        n_features,
        standardizer,
        grid=round(k2**0.5),
        n_outputs=n_outputs,
        n_categories=n_categories,
    )
    plain.load_state_dict(classifier.state_dict())
    return plain.to(classifier.weight.dtype).eval().requires_grad_(False)


# -- training a classifier on sampled pixels ------------------------------------------------------


@dataclass(frozen=True)
class PixelSample:
    """Hypercolumns (N, D) of sampled pixels, their labels (N,), their positions (N, 2) as
    (row, column), the window size, and (optionally) the index of each pixel's image (N,) and
    its window's category, the figure's class (N,)."""

    features: torch.Tensor
    labels: torch.Tensor
    positions: torch.Tensor
    size: tuple[int, int]
    images: torch.Tensor | None = None
    categories: torch.Tensor | None = None


def _stacked(model, images, layers, size, reference: bool) -> torch.Tensor:
    """The hypercolumn maps (B, D, H, W) of `layers` of the frozen model on the images: through
    the mechanism, or through the nulls' own code (`reference`)."""
    maps = model.feature_maps(images)
    if reference:
        return plain_hypercolumns(plain_select(maps, layers), size)
    return hypercolumns.hypercolumns(hypercolumns.select(maps, layers), size)


def sample_pixels(
    model: nn.Module,
    data: Shapes,
    layers: Sequence[str],
    n_pixels: int,
    *,
    generator: torch.Generator | None = None,
    chunk: int = 64,
    reference: bool = False,
) -> PixelSample:
    """`n_pixels` pixels drawn uniformly (with replacement) from all pixels of `data`, with
    their hypercolumns over `layers` of the frozen `model` (a ShapeNet, or RawPixels);
    `reference`: stacked by the nulls' own code instead of the mechanism."""
    n_pixels = checks.integer("n_pixels", n_pixels)
    checks.boolean("reference", reference)
    if isinstance(layers, str) or not layers or any(name not in LAYERS for name in layers):
        raise ValueError(f"layers must be a non-empty list of names from {LAYERS}; got {layers!r}")
    size = tuple(data.masks.shape[-2:])
    n, h, w = len(data), *size
    flat = torch.randint(n * h * w, (n_pixels,), generator=generator)
    image, row, col = flat // (h * w), (flat // w) % h, flat % w
    parts = []
    with torch.no_grad():
        for start in range(0, n, chunk):
            stop = min(start + chunk, n)
            mine = (image >= start) & (image < stop)
            cols = _stacked(model, data.images[start:stop], layers, size, reference)
            parts.append((mine.nonzero()[:, 0], cols[image[mine] - start, :, row[mine], col[mine]]))
    features = torch.empty(n_pixels, parts[0][1].shape[1])
    for index, values in parts:
        features[index] = values
    positions = torch.stack([row, col], 1)
    labels = data.masks[image, row, col]
    return PixelSample(features, labels, positions, size, image, data.labels[image])


def train_pixel_classifiers(
    sample: PixelSample,
    lrs: Sequence[float],
    *,
    grid: int = 1,
    per_category: bool = False,
    interpolate: bool = True,
    seed: int,
    steps: int = 150,
    batch_size: int = 2048,
    weight_decay: float = 1e-4,
    decay: bool = False,
    reference: bool = False,
) -> tuple[list[nn.Module], History]:
    """Fit a LocationClassifier (standardiser from the sample) at each starting rate of `lrs`
    by Adam on the negative log-likelihood of its blended probabilities over minibatches of the
    sampled pixels; returns them in eval mode, gradients off, with the History of the summed loss.

    All rates train in one loop: one classifier a rate, each on the same minibatches, one Adam
    parameter group a rate. The loss of an update is the sum of the rates' losses, so each
    classifier gets exactly the gradient of its own, and the classifiers are those that separate
    runs (`lrs` of one rate each) would give: in one loop the grid costs one backward pass an
    update, not one a rate. A rate whose loss stops being finite stops updating there, as a
    separate run would; the others go on.

    `per_category`: one set of K x K classifiers per shape class, the window's class picking
    it (the sample's `categories`); otherwise one set for every window. `interpolate`: train
    through the bilinear mix of the classifiers, as the test does; otherwise train each cell's
    classifier on the pixels of its own cell (`hypercolumns.cell_membership`) and interpolate
    at test time only, as the paper's system without fine-tuning does. `reference`: the nulls'
    own classifier and weights (`PlainLocationClassifier`, `plain_weights`), interpolated.
    """
    d = checks.tensor("sample.features", sample.features, "(N, D)", dtype="floating")
    checks.tensor("sample.labels", sample.labels, "(N,)", N=d["N"])
    grid = checks.integer("grid", grid)
    checks.boolean("per_category", per_category)
    checks.boolean("interpolate", interpolate)
    checks.boolean("reference", reference)
    if reference and not interpolate:
        raise ValueError("the nulls' own code trains through the interpolation only")
    lrs = [checks.number("lr", lr, 0.0, low_open=True) for lr in lrs]
    if not lrs:
        raise ValueError("lrs must hold at least one learning rate")
    categories = None
    if per_category:
        if sample.categories is None:
            raise ValueError("per_category needs the sample's categories")
        checks.tensor("sample.categories", sample.categories, "(N,)", N=d["N"])
        categories = sample.categories
    standardizer = Standardizer.fit(sample.features)
    kind = PlainLocationClassifier if reference else hypercolumns.LocationClassifier
    classifiers = nn.ModuleList(
        kind(
            d["D"],
            standardizer,
            grid=grid,
            n_outputs=2,
            n_categories=len(SHAPES) if per_category else 1,
        )
        for _ in lrs
    )
    if reference:
        weights = plain_weights
    elif interpolate:
        weights = hypercolumns.interpolation_weights
    else:
        weights = hypercolumns.cell_membership
    beta_maps = weights(grid, sample.size)  # (K^2, H, W)
    beta = beta_maps[:, sample.positions[:, 0], sample.positions[:, 1]].T  # (N, K^2)
    batches = minibatches(d["N"], min(batch_size, d["N"]), generator(seed, stream=PIXEL_BATCHES))
    optimizer = torch.optim.Adam(
        [{"params": c.parameters(), "lr": lr} for c, lr in zip(classifiers, lrs, strict=True)],
        weight_decay=weight_decay,
    )
    stopped = [False] * len(lrs)

    def loss_of_update(i):
        for group, lr, stop in zip(optimizer.param_groups, lrs, stopped, strict=True):
            # the rate falls linearly from lr to lr / steps over the updates
            group["lr"] = 0.0 if stop else lr * (1 - i / steps) if decay else lr
        index = next(batches)
        features, labels, mix = sample.features[index], sample.labels[index], beta[index]
        c = None if categories is None else categories[index]
        total = 0.0
        for r, classifier in enumerate(classifiers):
            if stopped[r]:
                continue
            # the blended log-probabilities are normalised: their NLL is the cross-entropy
            loss = F.nll_loss(classifier.at_pixels(features, mix, c), labels)
            stopped[r] = not math.isfinite(loss.item())
            total = total if stopped[r] else total + loss
        # every rate stopped: a non-finite loss ends the loop as in a separate run
        return total if isinstance(total, torch.Tensor) else torch.tensor(math.nan)

    history = train(classifiers, optimizer, loss_of_update, steps, desc=f"classifiers K={grid}")
    classifiers.requires_grad_(False)
    return list(classifiers), history


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
    model: nn.Module,
    classifier: nn.Module,
    images: torch.Tensor,
    layers: Sequence[str],
    categories: torch.Tensor | None = None,
    chunk: int = 100,
    reference: bool = False,
) -> torch.Tensor:
    """Figure-ground masks (N, H, W) of the images: hypercolumns of the frozen network's
    `layers`, classified pixel by pixel by the classifiers of each window's category (N,), the
    more probable class at each pixel; `reference`: the nulls' own code throughout (with a
    PlainLocationClassifier)."""
    checks.tensor("images", images, "(N, 1, H, W)", dtype="floating")
    checks.boolean("reference", reference)
    if reference:
        if not isinstance(classifier, PlainLocationClassifier):
            raise TypeError("the nulls' own code needs a PlainLocationClassifier")
    else:
        categories = classifier.categories_of(categories, images.shape[0])
    masks = []
    with torch.no_grad():
        for start in range(0, images.shape[0], chunk):
            x = images[start : start + chunk]
            h = _stacked(model, x, layers, tuple(x.shape[-2:]), reference)
            c = None if categories is None else categories[start : start + chunk]
            masks.append(classifier(h, c).argmax(1))
    return torch.cat(masks)


def validation_cross_entropy(
    classifiers: Sequence[nn.Module], sample: PixelSample, *, reference: bool = False
) -> list[float]:
    """For each classifier of a list (a rate grid's): the mean negative log-likelihood of the
    sampled validation pixels' labels under its blended probabilities, the loss it was trained
    on. The cells' weights are the bilinear ones, as at test time, whether or not the classifier
    was trained through them; each pixel's window category picks its set where the classifiers
    hold one per category. `reference`: the nulls' own weights (`plain_weights`)."""
    d = checks.tensor("sample.features", sample.features, "(N, D)", dtype="floating")
    checks.tensor("sample.labels", sample.labels, "(N,)", N=d["N"])
    checks.boolean("reference", reference)
    weights = plain_weights if reference else hypercolumns.interpolation_weights
    scores = []
    with torch.no_grad():
        for classifier in classifiers:
            beta_maps = weights(classifier.grid, sample.size)  # (K^2, H, W)
            beta = beta_maps[:, sample.positions[:, 0], sample.positions[:, 1]].T  # (N, K^2)
            c = sample.categories if classifier.n_categories > 1 else None
            log_p = classifier.at_pixels(sample.features, beta, c)
            scores.append(F.nll_loss(log_p, sample.labels).item())
    return scores


@dataclass(frozen=True)
class Segmentation:
    """One segmentation arm: its classifier, for each split scored its predicted masks and its
    scores (`segmentation_scores`), its learning rate and the validation cross-entropy of every
    rate tried (`validation_cross_entropy`; the classifier is the one of the lowest; one rate:
    no tuning)."""

    classifier: nn.Module
    masks: dict[str, torch.Tensor]
    scores: dict[str, dict[str, float]]
    lr: float
    validation: dict[float, float]
    # With every_rate: each rate's scores on val and test, and its test masks.
    by_rate: dict[float, tuple[dict[str, dict[str, float]], torch.Tensor]] | None = None


def segment(
    model: nn.Module,
    layers: Sequence[str],
    train: Shapes,
    val: Shapes,
    test: Shapes,
    *,
    grid: int,
    seed: int,
    pixel_generator: torch.Generator | None = None,
    lrs: Sequence[float] = (0.05,),
    n_pixels: int = 20_000,
    per_category: bool = True,
    interpolate: bool = True,
    reference: bool = False,
    steps: int = 150,
    batch_size: int = 2048,
    decay: bool = False,
    sample: PixelSample | None = None,
    every_rate: bool = False,
) -> Segmentation:
    """Sample `n_pixels` training pixels of `train` (from `pixel_generator`; or take `sample`,
    drawn by `sample_pixels` for these `layers` of this `model`), fit the pixel classifiers
    over the hypercolumns of `layers` once per learning rate in `lrs`, keep the one with the
    lowest cross-entropy on `n_pixels` validation pixels of `val` (drawn from the stream
    VALIDATION_PIXELS of `seed`: the same pixels for every arm of a seed), and predict and
    score its masks on `val` and `test` (each window's category picking its classifiers where
    `per_category`). Every rate trains on the same pixels and batches: the arms of one grid
    differ in their rate alone. `every_rate`: score every rate's classifier too (`by_rate`), so
    that a row can print, or choose by, another measure than the cross-entropy."""
    checks.boolean("every_rate", every_rate)
    lrs = [checks.number("lrs", lr, 0.0, low_open=True) for lr in lrs]
    if not lrs:
        raise ValueError("lrs must hold at least one learning rate")
    if sample is None:
        if pixel_generator is None:
            raise ValueError("segment needs a pixel_generator or a sample")
        sample = sample_pixels(
            model, train, layers, n_pixels, generator=pixel_generator, reference=reference
        )
    classifiers, _ = train_pixel_classifiers(
        sample,
        lrs,
        grid=grid,
        per_category=per_category,
        interpolate=interpolate,
        seed=seed,
        steps=steps,
        batch_size=batch_size,
        decay=decay,
        reference=reference,
    )
    if len(lrs) > 1:
        val_sample = sample_pixels(
            model,
            val,
            layers,
            n_pixels,
            generator=generator(seed, stream=VALIDATION_PIXELS),
            reference=reference,
        )
        validation = dict(
            zip(
                lrs,
                validation_cross_entropy(classifiers, val_sample, reference=reference),
                strict=True,
            )
        )
    else:
        validation = {lrs[0]: math.nan}  # one rate: nothing to choose
    best = min(range(len(lrs)), key=lambda r: _finite_or_inf(validation[lrs[r]]))
    splits = (("val", val), ("test", test))

    def masks_and_scores(classifier):
        masks = {
            name: predict_masks(
                model,
                classifier,
                data.images,
                layers,
                data.labels if per_category else None,
                reference=reference,
            )
            for name, data in splits
        }
        scores = {
            name: segmentation_scores(masks[name], data.masks, boundary_band(data.masks))
            for name, data in splits
        }
        return masks, scores

    masks, scores = masks_and_scores(classifiers[best])
    by_rate = None
    if every_rate:
        by_rate = {}
        for lr, classifier in zip(lrs, classifiers, strict=True):
            rate_masks, rate_scores = masks_and_scores(classifier)
            by_rate[lr] = (rate_scores, rate_masks["test"])
    return Segmentation(classifiers[best], masks, scores, lrs[best], validation, by_rate)


def _finite_or_inf(x: float) -> float:
    """A score to minimise: a rate whose loss went non-finite is never chosen."""
    return x if math.isfinite(x) else math.inf


def paired_difference(
    first: torch.Tensor,
    second: torch.Tensor,
    truth: torch.Tensor,
    *,
    measure: str = "iou",
    resamples: int = 2000,
    generator: torch.Generator | None = None,
) -> tuple[float, float]:
    """measure(first) - measure(second) on the same windows (masks (N, H, W)), and its
    standard error by a paired bootstrap: the windows resampled with replacement, both
    measures recomputed on each resample from per-window counts. `measure` is "iou" (the
    figure's intersections over its unions) or "boundary_accuracy" (the right pixels in the
    boundary band over the band's pixels)."""
    shape = checks.tensor("first", first, "(N, H, W)")
    checks.tensor("second", second, "(N, H, W)", **shape)
    checks.tensor("truth", truth, "(N, H, W)", **shape)
    checks.one_of("measure", measure, ("iou", "boundary_accuracy"))
    resamples = checks.integer("resamples", resamples, 2)
    t = truth.bool()
    band = boundary_band(truth)

    def counts(p):
        p = p.bool()
        if measure == "iou":
            return (p & t).flatten(1).sum(1).double(), (p | t).flatten(1).sum(1).double()
        return ((p == t) & band).flatten(1).sum(1).double(), band.flatten(1).sum(1).double()

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
