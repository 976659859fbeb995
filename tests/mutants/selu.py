"""Broken variants of the self-normalizing network's mechanism (papernotes.selu).

Each function patches the module in place; the chapter, run with the patch, must stop on its
claim check. The module's functions read `ALPHA`, `LAMBDA`, `_moments`, `lecun_normal_`,
`alpha_dropout_affine` and `alpha_dropout` from its globals when called, and the experiment
(`papernotes.selu.experiment`) looks them up on the module, so the activation, the moment map,
the random networks and the trained SNN all see the patch.
"""

import math

import torch

from papernotes import selu as m


def he_initialisation():
    """Weights are drawn with variance 2/n (He, made for ReLU) instead of LeCun's 1/n."""

    def lecun_normal_(tensor, *, generator=None):
        fan_in = tensor[0].numel()
        with torch.no_grad():
            return tensor.normal_(0.0, math.sqrt(2.0 / fan_in), generator=generator)

    m.lecun_normal_ = lecun_normal_


def drop_rate_where_the_keep_probability_belongs():
    """Alpha-dropout's (a, b) are computed with q = p, the drop rate, instead of q = 1 - p."""

    def alpha_dropout_affine(p, saturation=None):
        q = p
        saturation = -m.LAMBDA * m.ALPHA if saturation is None else saturation
        a = (q + saturation**2 * q * (1 - q)) ** -0.5
        return a, -a * (1 - q) * saturation

    m.alpha_dropout_affine = alpha_dropout_affine


def lambda_rounded_to_one():
    """The SELU scale lambda is 1 (an ELU with alpha = 1.6733) instead of 1.0507."""
    m.LAMBDA = 1.0


def alpha_of_an_elu():
    """The SELU alpha is 1, an ELU's, instead of 1.6733."""
    m.ALPHA = 1.0


def plain_dropout_for_alpha_dropout():
    """Alpha-dropout is standard inverted dropout: dropped units go to 0, the rest scale by 1/q."""

    def alpha_dropout(x, p, training=True, generator=None, saturation=None):
        return m.plain_dropout(x, p, training=training, generator=generator)

    m.alpha_dropout = alpha_dropout


def dropped_units_at_zero():
    """Alpha-dropout drops to 0, a ReLU's resting value, instead of the saturation value
    -lambda alpha (with a and b computed for that drop value, so the moments still come out
    as 0 and 1 at the fixed point)."""
    original = m.alpha_dropout

    def alpha_dropout(x, p, training=True, generator=None, saturation=None):
        return original(x, p, training=training, generator=generator, saturation=0.0)

    m.alpha_dropout = alpha_dropout


def variance_is_the_second_moment():
    """The moment map returns the second moment xi~ = E[y^2] as the variance, without
    subtracting mu~^2 (nu~ = xi~ - mu~^2 is the step it skips)."""
    original = m._moments

    def _moments(mu, nu, omega, tau, alpha, lam):
        mean, variance = original(mu, nu, omega, tau, alpha, lam)
        return mean, variance + mean**2

    m._moments = _moments


def drop_value_of_the_wrong_sign():
    """Alpha-dropout drops to +lambda alpha instead of -lambda alpha (a and b depend only on
    alpha'^2, so the moments after one layer still come out as 0 and 1)."""
    original = m.alpha_dropout

    def alpha_dropout(x, p, training=True, generator=None, saturation=None):
        return original(x, p, training=training, generator=generator, saturation=m.LAMBDA * m.ALPHA)

    m.alpha_dropout = alpha_dropout


def affine_shift_of_the_wrong_sign():
    """Alpha-dropout's shift b is +a (1 - q) alpha' instead of -a (1 - q) alpha': the mean it
    should restore moves by 2 a (1 - q) alpha' at every dropout (the dropped units still sit
    below the kept ones, and the scale a is right)."""

    def alpha_dropout_affine(p, saturation=None):
        q = 1.0 - p
        saturation = -m.LAMBDA * m.ALPHA if saturation is None else saturation
        a = (q + saturation**2 * q * (1 - q)) ** -0.5
        return a, a * (1 - q) * saturation

    m.alpha_dropout_affine = alpha_dropout_affine


MUTANTS = [
    he_initialisation,
    drop_rate_where_the_keep_probability_belongs,
    lambda_rounded_to_one,
    alpha_of_an_elu,
    plain_dropout_for_alpha_dropout,
    dropped_units_at_zero,
    variance_is_the_second_moment,
    drop_value_of_the_wrong_sign,
    affine_shift_of_the_wrong_sign,
]
