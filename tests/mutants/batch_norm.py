"""Broken variants of papernotes.batch_norm: plausible bugs of the layer's statistics.

Each function patches the module in place (`make mutants` calls it right after the chapter's
setup cell); the chapter must then stop on a failed claim.
"""

import torch

from papernotes import batch_norm as m


def running_statistics_never_updated():
    """The running mean and variance are never updated: eval mode normalises with 0 and 1."""

    def update(self, mean, variance, n):
        pass

    m.BatchNorm._update_running_statistics = update


def eval_mode_uses_batch_statistics():
    """Eval mode normalises with the statistics of the batch it is given, as training does."""

    def forward(self, x):
        self._check_input(x)
        mean, variance = m.batch_statistics(x)
        if self.training:
            self._update_running_statistics(mean, variance, m.values_per_feature(x))
        x_hat = m.normalize(x, mean, variance, self.eps)
        return m._per_feature(self.gamma, x) * x_hat + m._per_feature(self.beta, x)

    m.BatchNorm.forward = forward


def momentum_weighs_the_old_value():
    """The running averages give the old value the weight `momentum` (Keras's convention fed
    PyTorch's 0.1), so they follow the last batch instead of averaging many."""

    @torch.no_grad()
    def update(self, mean, variance, n):
        self.running_mean.lerp_(mean, 1.0 - self.momentum)
        self.running_var.lerp_(m.unbiased(variance, n), 1.0 - self.momentum)

    m.BatchNorm._update_running_statistics = update


def statistics_outside_the_gradient():
    """The batch mean and variance are treated as constants: no gradient flows through them."""
    original = m.batch_statistics

    def batch_statistics(x):
        mean, variance = original(x)
        return mean.detach(), variance.detach()

    m.batch_statistics = batch_statistics


def scale_and_shift_dropped():
    """gamma and beta are never applied: the layer outputs x_hat itself, y = x_hat instead of
    y = gamma x_hat + beta (so they never learn either)."""

    def _transform(self, x):
        if self.training:
            mean, variance = m.batch_statistics(x)
            self._update_running_statistics(mean, variance, m.values_per_feature(x))
        else:
            mean, variance = self.running_mean, self.running_var
        return m.normalize(x, mean, variance, self.eps)

    m.BatchNorm._transform = _transform


MUTANTS = [
    running_statistics_never_updated,
    eval_mode_uses_batch_statistics,
    momentum_weighs_the_old_value,
    statistics_outside_the_gradient,
    scale_and_shift_dropped,
]
