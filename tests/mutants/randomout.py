"""Broken variants of RandomOut (papernotes.randomout).

Each function patches the module in place; the chapter, run with the patch, must stop on its
claim check. `randomout_` reads `conv_gradient_norm`, `filters_to_reset` and
`clear_filter_state_` from the module's globals when called, and so does the hook that the
chapter's training runs attach (`papernotes.randomout.experiment` builds it through the module),
so every run sees the patch.

`reset_writes_into_a_copy` is the indexing bug of `w[index].copy_(fresh)`, which PyTorch turns
into a write to a temporary. A reset that keeps the filter's stale momentum is not among them:
the chapter's claims are not built to tell it apart (a filter that has just died keeps the
momentum that killed it, its fresh draw may die again at the next update, and RandomOut then
draws again, so the accuracy after 30 epochs hardly moves); tests/test_randomout.py catches it
(`test_reset_clears_the_momentum_of_the_reset_filters_only`). Nor is a reset that sets the bias
to 0 (the lottery drawn in training has no bias) or a generator shared by the networks: the
unit tests catch those (`test_randomout_changes_only_the_filters_under_the_threshold`,
`test_each_members_resets_are_what_they_would_be_alone`).
"""

import torch

from papernotes import randomout as m


def cgn_summed_per_input_channel():
    """The CGN sums the gradient over output filters and kernel positions, one value per input
    channel (dims 0, 2, 3), instead of one value per output filter (dims 1, 2, 3)."""

    def conv_gradient_norm(conv):
        return conv.weight.grad.detach().abs().sum(dim=(0, 2, 3))

    m.conv_gradient_norm = conv_gradient_norm


def threshold_compared_the_wrong_way():
    """Filters whose CGN is above the threshold are reset, instead of those below it."""

    def filters_to_reset(cgn, threshold):
        return torch.nonzero(cgn > threshold).flatten()

    m.filters_to_reset = filters_to_reset


def cgn_read_after_zero_grad():
    """The CGN is read from a gradient already zeroed (as after optimizer.zero_grad with
    set_to_none=False), so every filter's CGN is 0."""

    def conv_gradient_norm(conv):
        return torch.zeros_like(conv.weight).abs().sum(dim=(1, 2, 3))

    m.conv_gradient_norm = conv_gradient_norm


def resets_pick_the_highest_cgn():
    """As many filters are reset as fall under the threshold, but the ones with the highest CGN
    (the sort read the wrong way round): the criterion picks the filters that learn most."""

    def filters_to_reset(cgn, threshold):
        return torch.argsort(cgn, descending=True)[: int((cgn < threshold).sum())]

    m.filters_to_reset = filters_to_reset


def cgn_of_the_weights():
    """The CGN sums the absolute *weights* of each filter instead of their gradient: a filter is
    judged by its size, not by how much it can still change the loss."""

    def conv_gradient_norm(conv):
        return conv.weight.detach().abs().sum(dim=(1, 2, 3))

    m.conv_gradient_norm = conv_gradient_norm


def reset_writes_into_a_copy():
    """The fresh weights are drawn but written into `conv.weight[index]` with `copy_`, which with
    an index tensor is a copy: the filter keeps its old weights (its momentum is still cleared)."""
    draw = m.reinitialise_filters_

    def reinitialise_filters_(conv, index, generator=None):
        kept = conv.weight.detach().clone()
        draw(conv, index, generator)  # the same draws from the same generators ...
        with torch.no_grad():
            conv.weight.copy_(kept)  # ... land in a copy

    m.reinitialise_filters_ = reinitialise_filters_


MUTANTS = [
    cgn_summed_per_input_channel,
    threshold_compared_the_wrong_way,
    cgn_read_after_zero_grad,
    resets_pick_the_highest_cgn,
    cgn_of_the_weights,
    reset_writes_into_a_copy,
]
