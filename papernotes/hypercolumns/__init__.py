"""Hypercolumns: every layer's activations at a pixel, stacked into one vector, classified.

Hariharan, Arbeláez, Girshick & Malik 2015, *Hypercolumns for Object Segmentation and
Fine-grained Localization*, CVPR (arXiv:1411.5752). Deep layers know *what* is in the image but
their cells are large; shallow layers know *where* edges are but little else. The paper upsamples
every layer's map to the image, stacks them at each pixel (the hypercolumn), and classifies each
pixel with a grid of location-specific linear classifiers whose probabilities are interpolated
by the pixel's position; since upsampling and a linear classifier commute, it classifies the
coarse maps first and upsamples the few outputs. The chapter (chapters/hypercolumns.ipynb, "The
idea") derives each step; this module computes them in the paper's order. The per-channel
standardisation of the features is `papernotes.data.Standardizer`; the chapter's data, network
and measurements are in `papernotes.hypercolumns.experiment`.

Every function reads `upsample`, `hypercolumns` and `interpolation_weights` from this module
when called, and the experiment reads `select` and `hypercolumns` through the module, so a
patched module (tests/mutants/hypercolumns.py) is seen everywhere. Arguments are checked at the
entry points (`hypercolumns`, `select`, `LocationClassifier`, `classify_then_upsample`); the
cores below them (`stack`, `LocationClassifier.classify`, `classify_coarse`), which the chapter
shows, trust their input.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from papernotes import checks
from papernotes.data import Standardizer

# fine (stride 1), middle (stride 4), coarse (stride 8), top (one cell for the whole window)
LAYERS = ("conv1", "pool2", "pool3", "gap")

# -- 1. the hypercolumn ---------------------------------------------------------------------------


def upsample(x: torch.Tensor, size: int | tuple[int, int], align_corners: bool = False):
    """Bilinear interpolation of (B, C, h, w) maps to `size`.

    With `align_corners=False` a cell is centred on the middle of the pixels it covers, which
    is where a stride-s pooled cell sits; `True` pins the corner cells to the corner pixels.
    """
    # f_i = sum_k alpha_ik F_k, alpha_ik the bilinear weights of pixel i between cell centres
    return F.interpolate(x, size=size, mode="bilinear", align_corners=align_corners)


def hypercolumns(
    feature_maps: Sequence[torch.Tensor],
    size: int | tuple[int, int],
    align_corners: bool = False,
) -> torch.Tensor:
    """Every map upsampled to `size` and concatenated in order along the channels:
    (B, C_i, H_i, W_i) maps in, (B, sum C_i, H, W) out."""
    size = _size(size)
    maps = _check_maps(feature_maps)
    checks.boolean("align_corners", align_corners)
    return stack(maps, size, align_corners)


def stack(maps: Sequence[torch.Tensor], size: tuple[int, int], align_corners: bool = False):
    """The hypercolumns of checked maps: each upsampled to `size`, concatenated in order."""
    # h_i = [f^(1)_i; f^(2)_i; ...; f^(L)_i]
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


# -- 2. location-specific classifiers -------------------------------------------------------------


def interpolation_weights(grid: int, size: int | tuple[int, int]) -> torch.Tensor:
    """(K^2, H, W): beta_ik, the bilinear weight of grid cell k (row-major) at pixel i.

    Cell k's weight map is the K x K one-hot map of k upsampled bilinearly with cells centred on
    their pixels (`align_corners=False`): weight 1 at the cell's centre, falling linearly to 0 at
    the neighbouring centres, clamped at the border. The weights at a pixel sum to 1.
    """
    one_hot = torch.eye(grid * grid, dtype=torch.float64).view(grid * grid, 1, grid, grid)
    beta = F.interpolate(one_hot, size=size, mode="bilinear", align_corners=False)[:, 0]
    return beta.float()


def cell_membership(grid: int, size: int | tuple[int, int]) -> torch.Tensor:
    """(K^2, H, W): 1 where pixel i lies in grid cell k (row-major), else 0.

    The paper's system without fine-tuning trains each cell's classifier on the pixels of its
    own cell and interpolates the classifiers at test time only; these are the weights its
    training sees in place of `interpolation_weights`.
    """
    h, w = _size(size)
    grid = checks.integer("grid", grid)
    # k(i) = floor(K row_i / H) K + floor(K col_i / W)
    rows = torch.arange(h) * grid // h
    cols = torch.arange(w) * grid // w
    cell = rows[:, None] * grid + cols[None, :]
    return (cell[None] == torch.arange(grid * grid)[:, None, None]).float()


class LocationClassifier(nn.Module):
    """K x K linear classifiers over D-dimensional hypercolumns, n outputs each, whose class
    probabilities are interpolated by pixel position, one such set per category (the detection's
    category picks it). Each cell's classifier turns its scores into probabilities (a softmax
    over the n outputs; for n = 2 the paper's sigmoid of the score difference) and the pixel
    mixes the probabilities, not the scores, as the paper does.

    `grid=1` is one linear classifier for every pixel (a 1 x 1 convolution); `n_categories=1`
    is one set for every window. The per-channel standardisation of the features is part of the
    classifier (buffers `feature_mean`, `feature_std`, from a `data.Standardizer` fitted on the
    training pixels: layers can differ in scale by orders of magnitude, and an unnormalised
    classifier is dominated by the largest), so it takes raw hypercolumns.
    """

    def __init__(
        self,
        n_features: int,
        standardizer: Standardizer,
        *,
        grid: int = 1,
        n_outputs: int = 2,
        n_categories: int = 1,
    ):
        super().__init__()
        self.n_features = checks.integer("n_features", n_features)
        self.grid = checks.integer("grid", grid)
        self.n_outputs = checks.integer("n_outputs", n_outputs)
        self.n_categories = checks.integer("n_categories", n_categories)
        checks.tensor("standardizer.mean", standardizer.mean, "(D,)", D=n_features)
        checks.tensor("standardizer.std", standardizer.std, "(D,)", D=n_features)
        self.register_buffer("feature_mean", standardizer.mean.clone())
        self.register_buffer("feature_std", standardizer.std.clone())
        shape = (self.n_categories, self.grid**2, n_outputs)
        self.weight = nn.Parameter(torch.zeros(*shape, n_features))  # W_ck
        self.bias = nn.Parameter(torch.zeros(*shape))  # b_ck

    def standardize(self, h: torch.Tensor, dim: int = -1, start: int = 0) -> torch.Tensor:
        """The channels from `start` on, standardised along `dim`."""
        # (h_c - mu_c) / sigma_c, a per-channel affine map, so it commutes with the upsampling
        stop = start + h.shape[dim]
        shape = [1] * h.dim()
        shape[dim] = -1
        mean, std = self.feature_mean[start:stop], self.feature_std[start:stop]
        return (h - mean.view(shape)) / std.view(shape)

    def categories_of(self, categories: torch.Tensor | None, n: int) -> torch.Tensor:
        """Checked category indices (n,); None means category 0, allowed with one set only."""
        if categories is None:
            if self.n_categories != 1:
                raise ValueError(
                    f"categories are required: the classifier holds {self.n_categories} sets"
                )
            return torch.zeros(n, dtype=torch.long)
        checks.tensor("categories", categories, "(N,)", N=n, dtype=torch.long)
        if ((categories < 0) | (categories >= self.n_categories)).any():
            raise ValueError(f"categories must lie in [0, {self.n_categories})")
        return categories

    def per_cell(self, h: torch.Tensor, categories: torch.Tensor) -> torch.Tensor:
        """Every cell's classifier of each window's category at every position:
        (B, D, H, W) -> (B, K^2, n, H, W)."""
        # g_ck(h) = W_ck h + b_ck, c the window's category
        z = torch.einsum("bkod,bdhw->bkohw", self.weight[categories], self.standardize(h, dim=1))
        return z + self.bias[categories][:, :, :, None, None]

    def forward(self, h: torch.Tensor, categories: torch.Tensor | None = None) -> torch.Tensor:
        """Class probabilities (B, n, H, W) of hypercolumn maps (B, D, H, W) of windows of
        `categories` (B,): upsample, then classify."""
        checks.tensor("h", h, "(B, D, H, W)", D=self.n_features, dtype="floating")
        return self.classify(h, self.categories_of(categories, h.shape[0]))

    def classify(self, h: torch.Tensor, categories: torch.Tensor) -> torch.Tensor:
        """`forward` on checked hypercolumn maps: every cell's classifier of the window's
        category at every pixel, its probabilities mixed by the pixel's bilinear weights among
        the cell centres."""
        beta = interpolation_weights(self.grid, tuple(h.shape[-2:])).to(h.dtype)  # (K^2, H, W)
        # p_i = sum_k beta_ik softmax(W_ck h_i + b_ck)
        return torch.einsum("khw,bkohw->bohw", beta, self.per_cell(h, categories).softmax(2))

    def at_pixels(
        self, h: torch.Tensor, beta: torch.Tensor, categories: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Log-probabilities (N, n) of sampled pixels: hypercolumns (N, D) with their weights
        (N, K^2) and their windows' categories (N,). Cross-entropy on them is the negative
        log-likelihood of the blended probabilities (they sum to one, so the softmax inside the
        cross-entropy leaves them unchanged)."""
        c = self.categories_of(categories, h.shape[0])
        # W_ck h_i + b_ck for every category c and cell k (one matrix product), then the
        # pixel's own category's K^2 cells
        scores = self.standardize(h) @ self.weight.flatten(0, 2).T + self.bias.flatten()
        scores = scores.view(h.shape[0], *self.bias.shape)[torch.arange(h.shape[0]), c]
        # log p_i = log sum_k beta_ik softmax(...), summed in log space (log 0 = -inf drops a cell)
        return torch.logsumexp(beta.log().unsqueeze(-1) + scores.log_softmax(-1), dim=1)


# -- 3. classify, then upsample -------------------------------------------------------------------


def classify_then_upsample(
    classifier: LocationClassifier,
    feature_maps: Sequence[torch.Tensor],
    size: int | tuple[int, int],
    align_corners: bool = False,
    categories: torch.Tensor | None = None,
) -> torch.Tensor:
    """The classifier's probabilities (B, n, H, W) computed the paper's efficient way: each
    layer's block of every cell's classifier (of the window's category) runs as a 1 x 1
    convolution on that layer's coarse map (standardised), the K^2 n output channels are
    upsampled and summed over the layers, the biases added, each cell's scores turned into
    probabilities and the cells combined with their bilinear weights. Equal to
    `classifier(hypercolumns(feature_maps, size), categories)`: the scores by linearity, and
    what follows is the same computation on the same scores."""
    size = _size(size)
    maps = _check_maps(feature_maps)
    checks.boolean("align_corners", align_corners)
    categories = classifier.categories_of(categories, maps[0].shape[0])
    total = sum(m.shape[1] for m in maps)
    if total != classifier.n_features:
        raise ValueError(
            f"feature_maps hold {total} channels; the classifier takes {classifier.n_features}"
        )
    return classify_coarse(classifier, maps, size, align_corners, categories)


def classify_coarse(
    classifier: LocationClassifier,
    maps: Sequence[torch.Tensor],
    size: tuple[int, int],
    align_corners: bool = False,
    categories: torch.Tensor | None = None,
) -> torch.Tensor:
    """`classify_then_upsample` on checked maps: classify each coarse map, then upsample."""
    c = torch.zeros(maps[0].shape[0], dtype=torch.long) if categories is None else categories
    k2, n = classifier.grid**2, classifier.n_outputs
    ckn = classifier.n_categories * k2 * n
    # W sum_k alpha_ik F_k = sum_k alpha_ik (W F_k), block by block over the layers:
    # sum_l upsample(W^(l) F^(l)) + b, every category's classifiers at once
    out = classifier.bias.reshape(1, ckn, 1, 1)
    start = 0
    for m in maps:
        stop = start + m.shape[1]
        block = classifier.weight[..., start:stop].reshape(ckn, stop - start, 1, 1)
        coarse = F.conv2d(classifier.standardize(m, dim=1, start=start), block)
        out = out + upsample(coarse, size, align_corners)
        start = stop
    # each window keeps its category's K^2 n channels
    out = out.view(-1, classifier.n_categories, k2, n, *size)[torch.arange(len(c)), c]
    # p_i = sum_k beta_ik softmax(...)
    beta = interpolation_weights(classifier.grid, size).to(out.dtype)
    return torch.einsum("khw,bkohw->bohw", beta, out.softmax(2))
