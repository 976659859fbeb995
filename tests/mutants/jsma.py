"""Broken variants of the saliency-map attack (papernotes.jsma, the mechanism's module).

Each function patches the mechanism module in place; the chapter, run with the patch, must stop
on its claim check. The attack (`jsma.jsma` and `jsma.random_pairs`, which the chapter calls)
looks `_jacobian`, `pair_scores` and `search_domain` up in the module's globals when it runs, so
it sees the patch.
"""

import torch

from papernotes import jsma as m


def saliency_on_softmax_probabilities():
    """The forward derivative is taken on the softmax probabilities instead of the logits."""
    on_logits = m._jacobian

    def _jacobian(model, x):
        return on_logits(lambda inputs: torch.softmax(model(inputs), dim=-1), x)

    m._jacobian = _jacobian


def other_classes_need_not_oppose():
    """The pair search drops the condition on beta: any pair that moves the target's logit the
    right way counts, scored |alpha| * |beta|."""

    def pair_scores(d_target, d_others, domain, increase):
        alpha = d_target[:, :, None] + d_target[:, None, :]
        beta = d_others[:, :, None] + d_others[:, None, :]
        n = d_target.shape[1]
        allowed = domain[:, :, None] & domain[:, None, :] & ~torch.eye(n, dtype=torch.bool)
        passes = alpha > 0 if increase else alpha < 0
        return torch.where(allowed & passes, alpha.abs() * beta.abs(), 0.0)

    m.pair_scores = pair_scores


def saturated_features_stay_in_the_domain():
    """Features at the clip bound stay in the search domain, so a saturated pixel can be
    picked again and the step changes nothing."""

    def search_domain(x, theta, low, high):
        return torch.ones_like(x, dtype=torch.bool)

    m.search_domain = search_domain


MUTANTS = [
    saliency_on_softmax_probabilities,
    other_classes_need_not_oppose,
    saturated_features_stay_in_the_domain,
]
