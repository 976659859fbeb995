"""Broken variants of the saliency-map attack (papernotes.jsma, the mechanism's module).

Each function patches the mechanism module in place; the chapter, run with the patch, must stop
on its claim check. The attack (`jsma.jsma`, which the chapter calls) looks `_jacobian`,
`pair_scores`, `search_domain` and `_attack` up in the module's globals when it runs, so it sees
the patch. The chapter's nulls (`papernotes.jsma.experiment.null_attack`) are written apart and
see none of them.
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


def runs_past_its_target():
    """An example that reaches its target stays in the loop and keeps changing pairs until its
    budget or its pairs run out (the success test left out of the loop's stop)."""

    def _attack(model, x, target, theta, budget, low, high, choose):
        x_adv = x.detach().clone()
        domain = m.search_domain(x_adv, theta, low, high)
        active = domain.any(1)
        for _ in range(budget):
            rows = active.nonzero().squeeze(1)
            if len(rows) == 0:
                break
            jacobian = m._jacobian(model, x_adv[rows])
            chosen, found = choose(jacobian, target[rows], domain[rows], theta > 0)
            moved = (x_adv[rows] + theta * chosen).clamp(low, high)
            x_adv[rows] = moved
            domain[rows] = m.search_domain(moved, theta, low, high) & domain[rows]
            active[rows] = found & domain[rows].any(1)
        with torch.no_grad():
            success = model(x_adv).argmax(1) == target
        return m.Attack(x_adv, success, (x_adv != x).float().mean(-1))

    m._attack = _attack


def weakest_admissible_pair_first():
    """The pair search takes the admissible pair with the smallest -alpha * beta instead of the
    largest (the scores of the pairs that pass both conditions inverted)."""
    scores_of = m.pair_scores

    def pair_scores(d_target, d_others, domain, increase):
        scores = scores_of(d_target, d_others, domain, increase)
        return torch.where(scores > 0, 1 / scores.clamp_min(1e-30), 0.0)

    m.pair_scores = pair_scores


MUTANTS = [
    saliency_on_softmax_probabilities,
    other_classes_need_not_oppose,
    saturated_features_stay_in_the_domain,
    runs_past_its_target,
    weakest_admissible_pair_first,
]
