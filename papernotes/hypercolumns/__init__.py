r"""Hypercolumns: every layer's activations at a pixel, stacked into one vector, classified.

Hariharan, Arbeláez, Girshick & Malik 2015, *Hypercolumns for Object Segmentation and
Fine-grained Localization*, CVPR (arXiv:1411.5752). The module follows the paper in order.

1. **The hypercolumn.** A CNN's layer $l$ gives a map $F^{(l)}$ of $C_l$ channels on a grid
   as fine as the image or coarser (stride $s_l$; a fully connected layer is a 1 x 1 map).
   Upsample each map to the image's size by bilinear interpolation: the value at pixel $i$ is
   a weighted sum of the map's nearest cells $k$,

   $$f^{(l)}_i = \sum_k \alpha_{ik} F^{(l)}_k,$$

   with $\alpha_{ik}$ the bilinear weights of pixel $i$'s position between the centres of the
   cells (a cell of a stride-$s$ map is centred on the middle of the $s \times s$ pixels it
   pools, which is torch's `align_corners=False`). The hypercolumn at pixel $i$ is the
   concatenation over the chosen layers,

   $$h_i = \big[f^{(1)}_i;\ f^{(2)}_i;\ \dots;\ f^{(L)}_i\big] \in \mathbb R^{\sum_l C_l}.$$

   Deep layers know *what* is in the image but their cells are large; shallow layers know
   *where* edges are but little else. The hypercolumn gives a per-pixel classifier both.

2. **Feature scales.** Layers can differ in scale by orders of magnitude, and then an
   unnormalised classifier is dominated by the largest. We standardise every channel with the mean
   $\mu_c$ and standard deviation $\sigma_c$ of its values at the training pixels,
   $\hat h_{ic} = (h_{ic} - \mu_c) / \sigma_c$ (a per-channel affine map, so it commutes
   with the upsampling).

3. **Location-specific classifiers.** What a feature means for figure versus ground depends on
   where the pixel lies in the window (a head is at the top of a person's box). The paper
   divides the window into a $K \times K$ grid, gives each cell $k$ its own linear classifier
   $g_k(h) = W_k h + b_k$, and interpolates their outputs bilinearly by the pixel's position
   between the cell centres:

   $$y_i = \sum_{k=1}^{K^2} \beta_{ik}\, (W_k \hat h_i + b_k),$$

   with $\beta_{ik}$ the bilinear weights of pixel $i$ among the $K \times K$ cell centres
   (clamped at the border: a pixel outside the outer centres takes the nearest ones). A pixel
   at a cell's centre gets exactly that cell's classifier; $K = 1$ is one classifier for every
   pixel, a $1 \times 1$ convolution.

4. **Classify, then upsample.** Upsampling and a linear classifier are both linear, so they
   commute: $W \sum_k \alpha_{ik} F_k = \sum_k \alpha_{ik} (W F_k)$. Instead of building the
   long vector at every pixel, apply each layer's block of the classifier to that layer's
   coarse map as a $1 \times 1$ convolution, upsample the few output channels and add them
   up. The paper uses this to run the classifiers over whole images cheaply;
   `classify_then_upsample` does it here and must agree with the explicit route.

5. **Experiment.** Generated figure-ground data (a circle, square or triangle near the middle
   of a noisy window, with a smaller shape cut by a corner as clutter); a small CNN trained on
   the *image* label and frozen; per-pixel classifiers over hypercolumns of its top (gap)
   alone, top and middle (pool2), all three (with conv1), or the fine layer alone; their IoU
   and their accuracy in a band around the true boundaries.

Every function reads `select`, `upsample`, `hypercolumns` and `interpolation_weights` from this
module when called, so a patched module (tests/mutants/hypercolumns.py) is seen everywhere.
Arguments are checked at the entry points (`generate_shapes`, `ShapeNet`, `pretrain`,
`hypercolumns`, `select`, `Standardizer.fit`, `LocationClassifier`, `sample_pixels`,
`train_pixel_classifier`, `classify_then_upsample`, `boundary_band`, `segmentation_scores`,
`predict_masks`); the helpers below them trust their input.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from papernotes import checks
from papernotes.data import minibatches
from papernotes.training import History, generator, seeded, train

SHAPES = ("circle", "square", "triangle")
LAYERS = ("conv1", "pool2", "gap")  # fine (stride 1), middle (stride 4), top (one cell)

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

    `feature_maps(x)` returns, like the paper's pool2, conv4 and fc7, a fine map, a coarse one
    and a single vector: conv1 (the first convolution after its ReLU, stride 1), pool2 (the
    second convolution's pooled output, stride 4) and gap (the third's pooled output averaged
    over the window, the vector the classifier reads, as a 1 x 1 map): on a 24-pixel window
    24 x 24, 6 x 6 and 1 x 1 cells.
    """

    def __init__(self, channels: Sequence[int] = (8, 16, 32), n_classes: int = len(SHAPES)):
        super().__init__()
        channels = [checks.integer(f"channels[{i}]", c) for i, c in enumerate(channels)]
        if len(channels) != len(LAYERS):
            raise ValueError(f"channels must name {len(LAYERS)} widths; got {channels}")
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
        return [conv1, pool2, pool3.mean((2, 3), keepdim=True)]

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
    batches = minibatches(len(data), batch_size, generator(seed, stream=1))

    def loss_of_update(_):
        index = next(batches)
        return F.cross_entropy(model(data.images[index]), data.labels[index])

    def evaluate():
        if val is None:
            return {}
        return {"val_accuracy": (model(val.images).argmax(1) == val.labels).float().mean().item()}

    history = train(
        model,
        torch.optim.Adam(model.parameters(), lr=lr),
        loss_of_update,
        steps,
        evaluate=evaluate,
        eval_every=max(steps // 4, 1),
        desc="pretraining",
    )
    model.requires_grad_(False)
    return model, history


# -- 1. the hypercolumn ---------------------------------------------------------------------------


def upsample(x: torch.Tensor, size: int | tuple[int, int], align_corners: bool = False):
    r"""Bilinear interpolation of (B, C, h, w) maps to `size`: $f_i = \sum_k \alpha_{ik} F_k$.

    With `align_corners=False` a cell is centred on the middle of the pixels it covers, which
    is where a stride-$s$ pooled cell sits; `True` pins the corner cells to the corner pixels.
    """
    return F.interpolate(x, size=size, mode="bilinear", align_corners=align_corners)


def hypercolumns(
    feature_maps: Sequence[torch.Tensor],
    size: int | tuple[int, int],
    align_corners: bool = False,
) -> torch.Tensor:
    r"""Every map upsampled to `size` and concatenated in order along the channels:
    (B, C_i, H_i, W_i) maps in, (B, sum C_i, H, W) out; $h_i = [f^{(1)}_i; \dots; f^{(L)}_i]$."""
    size = _size(size)
    maps = _check_maps(feature_maps)
    checks.boolean("align_corners", align_corners)
    return torch.cat([upsample(m, size, align_corners) for m in maps], dim=1)


def _size(size) -> tuple[int, int]:
    if isinstance(size, (tuple, list)):
        if len(size) != 2:
            raise ValueError(f"size must be an integer or a pair (H, W); got {size!r}")
        return checks.integer("size[0]", size[0]), checks.integer("size[1]", size[1])
    side = checks.integer("size", size)
    return side, side


def _check_maps(feature_maps) -> list[torch.Tensor]:
    if isinstance(feature_maps, torch.Tensor) or not isinstance(feature_maps, Sequence):
        raise TypeError("feature_maps must be a list of (B, C, H, W) tensors")
    if not feature_maps:
        raise ValueError("feature_maps must hold at least one map")
    batch = checks.tensor("feature_maps[0]", feature_maps[0], "(B, C, H, W)", dtype="floating")
    for i, m in enumerate(feature_maps[1:], start=1):
        checks.tensor(f"feature_maps[{i}]", m, "(B, C, H, W)", B=batch["B"], dtype="floating")
    return list(feature_maps)


def select(maps: Sequence[torch.Tensor], layers: Sequence[str]) -> list[torch.Tensor]:
    """The maps of the named layers (names from LAYERS), in the network's order."""
    if isinstance(layers, str) or not layers:
        raise ValueError(f"layers must be a non-empty list of names from {LAYERS}; got {layers!r}")
    for name in layers:
        checks.one_of("layers", name, LAYERS)
    return [m for name, m in zip(LAYERS, maps, strict=True) if name in layers]


# -- 2. feature scales: per-channel standardisation from the training pixels ----------------------


@dataclass(frozen=True)
class Standardizer:
    r"""$\hat h_c = (h_c - \mu_c) / \sigma_c$ with each channel's mean and standard deviation
    over the training pixels."""

    mean: torch.Tensor  # (D,)
    std: torch.Tensor  # (D,)

    @classmethod
    def fit(cls, pixels: torch.Tensor) -> Standardizer:
        """From hypercolumns of training pixels (N, D); a constant channel keeps scale 1."""
        checks.tensor("pixels", pixels, "(N, D)", dtype="floating")
        std = pixels.std(0)
        return cls(pixels.mean(0), torch.where(std > 1e-8, std, torch.ones_like(std)))


# -- 3. location-specific classifiers -------------------------------------------------------------


def interpolation_weights(grid: int, size: int | tuple[int, int]) -> torch.Tensor:
    r"""(K^2, H, W): $\beta_{ik}$, the bilinear weight of grid cell k (row-major) at pixel i.

    Cell k's weight map is the K x K one-hot map of k upsampled bilinearly with cells centred on
    their pixels (`align_corners=False`): weight 1 at the cell's centre, falling linearly to 0 at
    the neighbouring centres, clamped at the border. The weights at a pixel sum to 1.
    """
    one_hot = torch.eye(grid * grid, dtype=torch.float64).view(grid * grid, 1, grid, grid)
    beta = F.interpolate(one_hot, size=size, mode="bilinear", align_corners=False)[:, 0]
    return beta.float()


class LocationClassifier(nn.Module):
    r"""$K \times K$ linear classifiers over D-dimensional hypercolumns, $n$ outputs each,
    interpolated by pixel position: $y_i = \sum_k \beta_{ik} (W_k \hat h_i + b_k)$.

    `grid=1` is one linear classifier for every pixel (a 1 x 1 convolution). The per-channel
    standardisation of the features is part of the classifier (buffers `feature_mean`,
    `feature_std`), so it takes raw hypercolumns.
    """

    def __init__(
        self, n_features: int, standardizer: Standardizer, *, grid: int = 1, n_outputs: int = 2
    ):
        super().__init__()
        self.n_features = checks.integer("n_features", n_features)
        self.grid = checks.integer("grid", grid)
        self.n_outputs = checks.integer("n_outputs", n_outputs)
        checks.tensor("standardizer.mean", standardizer.mean, "(D,)", D=n_features)
        checks.tensor("standardizer.std", standardizer.std, "(D,)", D=n_features)
        self.register_buffer("feature_mean", standardizer.mean.clone())
        self.register_buffer("feature_std", standardizer.std.clone())
        k2 = self.grid**2
        self.weight = nn.Parameter(torch.zeros(k2, n_outputs, n_features))  # W_k
        self.bias = nn.Parameter(torch.zeros(k2, n_outputs))  # b_k

    def standardize(self, h: torch.Tensor, dim: int = -1, start: int = 0) -> torch.Tensor:
        r"""$(h_c - \mu_c) / \sigma_c$ along `dim`, for the channels from `start` on."""
        stop = start + h.shape[dim]
        shape = [1] * h.dim()
        shape[dim] = -1
        mean, std = self.feature_mean[start:stop], self.feature_std[start:stop]
        return (h - mean.view(shape)) / std.view(shape)

    def per_cell(self, h: torch.Tensor) -> torch.Tensor:
        """Every cell's classifier at every position: (B, D, H, W) -> (B, K^2, n, H, W)."""
        z = torch.einsum("kod,bdhw->bkohw", self.weight, self.standardize(h, dim=1))
        return z + self.bias[None, :, :, None, None]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Logits (B, n, H, W) of hypercolumn maps (B, D, H, W): upsample, then classify."""
        checks.tensor("h", h, "(B, D, H, W)", D=self.n_features, dtype="floating")
        beta = interpolation_weights(self.grid, tuple(h.shape[-2:])).to(h.dtype)  # (K^2, H, W)
        return torch.einsum("khw,bkohw->bohw", beta, self.per_cell(h))

    def at_pixels(self, h: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
        """Logits (N, n) of sampled pixels: hypercolumns (N, D) with their weights (N, K^2)."""
        scores = torch.einsum("kod,nd->nko", self.weight, self.standardize(h)) + self.bias
        return torch.einsum("nk,nko->no", beta, scores)


# -- 4. classify, then upsample -------------------------------------------------------------------


def classify_then_upsample(
    classifier: LocationClassifier,
    feature_maps: Sequence[torch.Tensor],
    size: int | tuple[int, int],
    align_corners: bool = False,
) -> torch.Tensor:
    r"""The classifier's logits (B, n, H, W) computed the paper's efficient way: each layer's
    block $W_k^{(l)}$ of every cell's classifier runs as a 1 x 1 convolution on that layer's
    coarse map (standardised), the $K^2 n$ output channels are upsampled and summed over the
    layers, the biases added, and the cells combined with their bilinear weights $\beta_{ik}$.
    Equal to `classifier(hypercolumns(feature_maps, size))` by linearity."""
    size = _size(size)
    maps = _check_maps(feature_maps)
    total = sum(m.shape[1] for m in maps)
    if total != classifier.n_features:
        raise ValueError(
            f"feature_maps hold {total} channels; the classifier takes {classifier.n_features}"
        )
    k2, n = classifier.grid**2, classifier.n_outputs
    out = classifier.bias.reshape(1, k2 * n, 1, 1)
    start = 0
    for m in maps:
        stop = start + m.shape[1]
        block = classifier.weight[:, :, start:stop].reshape(k2 * n, stop - start, 1, 1)
        coarse = F.conv2d(classifier.standardize(m, dim=1, start=start), block)
        out = out + upsample(coarse, size, align_corners)
        start = stop
    beta = interpolation_weights(classifier.grid, size).to(out.dtype)
    return torch.einsum("khw,bkohw->bohw", beta, out.view(-1, k2, n, *size))


# -- training a classifier on sampled pixels ------------------------------------------------------


@dataclass(frozen=True)
class PixelSample:
    """Hypercolumns (N, D) of sampled pixels, their labels (N,), their positions (N, 2) as
    (row, column), the window size, and (optionally) the index of each pixel's image (N,)."""

    features: torch.Tensor
    labels: torch.Tensor
    positions: torch.Tensor
    size: tuple[int, int]
    images: torch.Tensor | None = None


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
            maps = select(model.feature_maps(data.images[start:stop]), layers)
            cols = hypercolumns(maps, size)
            parts.append((mine.nonzero()[:, 0], cols[image[mine] - start, :, row[mine], col[mine]]))
    features = torch.empty(n_pixels, parts[0][1].shape[1])
    for index, values in parts:
        features[index] = values
    positions = torch.stack([row, col], 1)
    return PixelSample(features, data.masks[image, row, col], positions, size, image)


def train_pixel_classifier(
    sample: PixelSample,
    *,
    grid: int = 1,
    seed: int,
    steps: int = 150,
    batch_size: int = 2048,
    lr: float = 0.05,
    weight_decay: float = 1e-4,
) -> tuple[LocationClassifier, History]:
    """Fit a LocationClassifier (standardiser from the sample) by Adam on cross-entropy over
    minibatches of the sampled pixels; returns it in eval mode, gradients off."""
    d = checks.tensor("sample.features", sample.features, "(N, D)", dtype="floating")
    checks.tensor("sample.labels", sample.labels, "(N,)", N=d["N"])
    grid = checks.integer("grid", grid)
    lr = checks.number("lr", lr, 0.0, low_open=True)
    standardizer = Standardizer.fit(sample.features)
    classifier = LocationClassifier(d["D"], standardizer, grid=grid, n_outputs=2)
    beta_maps = interpolation_weights(grid, sample.size)  # (K^2, H, W)
    beta = beta_maps[:, sample.positions[:, 0], sample.positions[:, 1]].T  # (N, K^2)
    batches = minibatches(d["N"], min(batch_size, d["N"]), generator(seed, stream=5))

    def loss_of_update(_):
        index = next(batches)
        logits = classifier.at_pixels(sample.features[index], beta[index])
        return F.cross_entropy(logits, sample.labels[index])

    optimizer = torch.optim.Adam(classifier.parameters(), lr=lr, weight_decay=weight_decay)
    history = train(classifier, optimizer, loss_of_update, steps, desc=f"classifier K={grid}")
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
    classifier: LocationClassifier,
    images: torch.Tensor,
    layers: Sequence[str],
    chunk: int = 100,
) -> torch.Tensor:
    """Figure-ground masks (N, H, W) of the images: hypercolumns of the frozen network's
    `layers`, classified pixel by pixel, the larger logit at each pixel."""
    checks.tensor("images", images, "(N, 1, H, W)", dtype="floating")
    masks = []
    with torch.no_grad():
        for start in range(0, images.shape[0], chunk):
            x = images[start : start + chunk]
            h = hypercolumns(select(model.feature_maps(x), layers), tuple(x.shape[-2:]))
            masks.append(classifier(h).argmax(1))
    return torch.cat(masks)
