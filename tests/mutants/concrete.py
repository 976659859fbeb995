"""Broken variants of the Concrete / Gumbel-softmax mechanism (papernotes.concrete).

Each function patches the mechanism's module in place; the chapter, run with the patch, must
stop on its claim check. The mechanism's own calls look these names up in its globals, and
`papernotes.concrete.experiment` calls them as `concrete.<name>` at call time, so the samplers,
the density, the estimator lab and the VAE all see the patch.
"""

import math

import torch

from papernotes import concrete as m


def temperature_on_the_logits_alone():
    """Relaxed samples are softmax(logits / tau + g) instead of softmax((logits + g) / tau)."""

    def relax(logits, temperature, *, hard=False, generator=None):
        y = torch.softmax(logits / temperature + m.gumbel_noise(logits, generator), dim=-1)
        return m.straight_through(y) if hard else y

    m.relax = relax


def softmax_over_the_wrong_axis():
    """The relaxation's softmax runs over dim=1: the right axis for the (N, K) logits of the
    samplers and the estimator lab, the wrong one for the VAE's (B, latents, K), where it mixes
    the latent variables instead of normalising each one."""

    def relax(logits, temperature, *, hard=False, generator=None):
        y = torch.softmax((logits + m.gumbel_noise(logits, generator)) / temperature, dim=1)
        return m.straight_through(y) if hard else y

    m.relax = relax


def exponential_noise_for_gumbel():
    """The noise is -log(u), an exponential variable, instead of the Gumbel -log(-log u)."""

    def gumbel_noise(like, generator=None):
        u = torch.rand(like.shape, generator=generator, dtype=like.dtype)
        return -torch.log(u.clamp_min(torch.finfo(like.dtype).tiny))

    m.gumbel_noise = gumbel_noise


def straight_through_without_the_detach():
    """Straight-through returns z - y + y: the one-hot forward, but no gradient at all."""

    def straight_through(y):
        return m.one_hot_argmax(y) - y + y

    m.straight_through = straight_through


def density_with_gamma_of_k_minus_one():
    """The density's constant is Gamma(K - 1) instead of Gamma(K) (the same when K = 2)."""
    right = m.log_density

    def log_density(y, logits, temperature):
        k = logits.shape[-1]
        return right(y, logits, temperature) - math.lgamma(k) + math.lgamma(k - 1)

    m.log_density = log_density


# One variant is not listed: the softmax over the wrong axis (softmax_over_the_wrong_axis above),
# which breaks only the VAE's codes. It was caught by straight-through's row against REINFORCE
# while that row's margin was thin; with the learning-rate grid reaching REINFORCE's best rate the
# margin widened, and straight-through through the broken relaxation still beats REINFORCE (the
# sweep of the seven-rate grid). It is caught by
# test_straight_through_decodes_one_hot_codes_and_gumbel_softmax_relaxed_ones (each variable's
# relaxed code sums to 1).
MUTANTS = [
    temperature_on_the_logits_alone,
    exponential_noise_for_gumbel,
    straight_through_without_the_detach,
    density_with_gamma_of_k_minus_one,
]
