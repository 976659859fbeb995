"""Broken variants of the oracle-robustness mechanisms (papernotes.oracle_robustness).

Each function patches the mechanism module in place; the chapter, run with the patch, must stop
on its claim check, and no null of its claims may move (the nulls are built, trained and
attacked by the experiment's own code). The attack looks `_attack` up in the module's globals
when it runs, `attack_by_values` looks up `_attack_by_values`, `oracle_twin` looks up
`_oracle_twin` there, and the experiment's training loop
(papernotes.oracle_robustness.experiment) calls `oracle_robustness.siamese_penalty` and
`oracle_robustness.oracle_twin` through the module at every update, so they see the patch.

A projection dropped from the attack is not among them: every claim attacks at epsilon = 1, and
a 20-step attack without its projection changes hardly more answers at the smaller radii either
(the chapter's sweep found it caught by no row). The unit tests check the projection exactly
(tests/test_oracle_robustness.py: the clamp, the margin of a linear classifier, the largest move
at each radius).
"""

import torch

from papernotes import oracle_robustness as m


def attack_ignores_its_mask():
    """The attack moves every feature, the oracle's pixels included, not only the masked ones."""
    attack = m._attack

    def _attack(model, x, mask, epsilon, steps, alpha, low, high):
        return attack(model, x, torch.ones_like(mask), epsilon, steps, alpha, low, high)

    m._attack = _attack


def attack_descends_the_loss():
    """The attack steps down the gradient of the loss of the clean prediction instead of up it:
    it makes the prediction surer, and only the pasted codes still find adversarial examples."""
    attack = m._attack

    def _attack(model, x, mask, epsilon, steps, alpha, low, high):
        return attack(model, x, mask, epsilon, steps, -alpha, low, high)

    m._attack = _attack


def siamese_penalty_with_the_wrong_sign():
    """The Siamese term rewards a large distance between an input's and its twin's
    representations instead of penalising it."""

    def siamese_penalty(model, x, x_twin):
        return -(model.features(x) - model.features(x_twin)).pow(2).sum(-1).mean()

    m.siamese_penalty = siamese_penalty


def siamese_penalty_on_the_same_input():
    """The Siamese term compares an input's representation with itself, not with its twin's."""

    def siamese_penalty(model, x, x_twin):
        return (model.features(x) - model.features(x)).pow(2).sum(-1).mean()

    m.siamese_penalty = siamese_penalty


def twin_redraws_the_oracle_features():
    """The oracle twin redraws the pixels the oracle reads and keeps the extra features: the
    mask the wrong way round, so the Siamese pairs differ where the oracle looks."""

    def _oracle_twin(x, ignored, generator, low, high):
        fresh = low + (high - low) * torch.rand(x.shape, generator=generator)
        return torch.where(ignored, x, fresh)

    m._oracle_twin = _oracle_twin


def twin_keeps_the_input():
    """The oracle twin is the input itself: nothing is redrawn, so the Siamese term is always 0
    and (iii) trains as (i) does."""

    def _oracle_twin(x, ignored, generator, low, high):
        return x.clone()

    m._oracle_twin = _oracle_twin


def search_skips_the_codes():
    """The pasting search writes its candidates and never reports a change: only the gradient
    attack is left to measure (iii), a weaker attack than the nulls face."""
    search = m._attack_by_values

    def _attack_by_values(model, x, mask, values):
        found = search(model, x, mask, values)
        return m.Attack(x.clone(), torch.zeros_like(found.flipped))

    m._attack_by_values = _attack_by_values


MUTANTS = [
    attack_ignores_its_mask,
    attack_descends_the_loss,
    siamese_penalty_with_the_wrong_sign,
    siamese_penalty_on_the_same_input,
    twin_redraws_the_oracle_features,
    twin_keeps_the_input,
    search_skips_the_codes,
]
