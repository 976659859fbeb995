"""Broken variants of the hypercolumn mechanism (papernotes.hypercolumns).

Each function patches the mechanism's module in place; the chapter, run with the patch, must
stop on its claim check. The module's functions read `upsample` and `interpolation_weights` from
its globals when called, and `papernotes.hypercolumns.experiment` calls `hypercolumns.select`,
`hypercolumns.hypercolumns` and `hypercolumns.LocationClassifier` through the module, so the
sampled training pixels, the predicted masks and the efficient route of the paper's arms all see
the patch. The nulls run on the experiment's own code and see none of it.
"""

import torch
import torch.nn.functional as F

from papernotes import hypercolumns as m

_hypercolumns = m.hypercolumns


def top_layer_only():
    """The hypercolumn is the top layer's map alone, whatever layers were asked for."""
    select = m.select

    def top_only(maps, layers):
        select(maps, layers)  # the same checks
        return [maps[-1]]

    m.select = top_only


def fine_layers_zeroed():
    """Every map but the last is stacked as zeros: the channels are there, the detail is not."""

    def hypercolumns(feature_maps, size, align_corners=False):
        maps = [torch.zeros_like(x) for x in feature_maps[:-1]] + [feature_maps[-1]]
        return _hypercolumns(maps, size, align_corners)

    m.hypercolumns = hypercolumns


def fine_layers_shuffled_in_space():
    """Every map but the last has its cells in a fixed random order (a reshape gone wrong)."""

    def shuffled(x):
        order = torch.randperm(
            x.shape[-2] * x.shape[-1], generator=torch.Generator().manual_seed(0)
        )
        return x.flatten(-2)[..., order].view_as(x)

    def hypercolumns(feature_maps, size, align_corners=False):
        maps = [shuffled(x) for x in feature_maps[:-1]] + [feature_maps[-1]]
        return _hypercolumns(maps, size, align_corners)

    m.hypercolumns = hypercolumns


def efficient_route_with_corners_aligned():
    """Classify-then-upsample interpolates with align_corners=True while the hypercolumns the
    classifier was trained on use False: the two orders no longer agree."""
    upsample = m.upsample
    classify_then_upsample = m.classify_then_upsample

    def misaligned(classifier, feature_maps, size, align_corners=False, categories=None):
        m.upsample = lambda x, size, align_corners=False: F.interpolate(
            x, size=size, mode="bilinear", align_corners=True
        )
        try:
            return classify_then_upsample(
                classifier, feature_maps, size, align_corners, categories=categories
            )
        finally:
            m.upsample = upsample

    m.classify_then_upsample = misaligned


def grid_cells_never_blended():
    """The location-specific classifiers are not interpolated: each pixel gets its own cell's
    classifier alone (the weights are the cells' indicator maps), in training and at test."""
    m.interpolation_weights = lambda grid, size: m.cell_membership(grid, size)


def every_window_gets_the_first_categorys_classifiers():
    """The window's category is dropped: every window is scored by category 0's classifiers."""
    categories_of = m.LocationClassifier.categories_of

    def first_category(self, categories, n):
        categories = categories_of(self, categories, n)
        return torch.zeros_like(categories)

    m.LocationClassifier.categories_of = first_category


def scores_blended_instead_of_probabilities():
    """The cells' scores are blended and only then turned into probabilities (the logit blend),
    not the cells' probabilities as the paper blends them."""

    def classify(self, h, categories):
        beta = m.interpolation_weights(self.grid, tuple(h.shape[-2:])).to(h.dtype)
        return torch.einsum("khw,bkohw->bohw", beta, self.per_cell(h, categories)).softmax(1)

    def at_pixels(self, h, beta, categories=None):
        c = self.categories_of(categories, h.shape[0])
        scores = self.standardize(h) @ self.weight.flatten(0, 2).T + self.bias.flatten()
        scores = scores.view(h.shape[0], *self.bias.shape)[torch.arange(h.shape[0]), c]
        return (beta.unsqueeze(-1) * scores).sum(1).log_softmax(-1)

    m.LocationClassifier.classify = classify
    m.LocationClassifier.at_pixels = at_pixels


MUTANTS = [
    top_layer_only,
    fine_layers_zeroed,
    fine_layers_shuffled_in_space,
    efficient_route_with_corners_aligned,
    grid_cells_never_blended,
    every_window_gets_the_first_categorys_classifiers,
    scores_blended_instead_of_probabilities,
]
