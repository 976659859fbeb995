"""Broken variants of the BN-LSTM's per-step statistics (papernotes.recurrent_batch_norm).

Each function patches the mechanism (StepwiseBatchNorm, the Figure-1 network, or the
population estimate) in place, so the BN-LSTM and every helper of the experiment
that goes through it (training, population estimates, the statistics cut, the gradient flow) see
the bug; the nulls, written apart in the experiment, do not. `make mutants` executes the
chapter once per mutant and requires a claim to fail.

A BN inside the cell's own recurrence (the normalized c_t carried to the next step) is not
here: no claim of the chapter failed under it in a sweep (it survived), and the paper makes no
measured claim about it. The unit tests catch it
(the BN-LSTM against the written-out equations, the cell carried unchanged through open gates).
"""

import torch

from papernotes import batch_norm
from papernotes import recurrent_batch_norm as m

_remember = m.StepwiseBatchNorm.remember


def shared_statistics():
    """One set of population statistics for every time step, as a plain BatchNorm reused at each
    step keeps: every step updates row 0, and evaluation reads row 0 at every step."""

    def remember(self, rows, mean, variance, batch):
        if isinstance(rows, slice):  # several steps at once: one after the other, as a loop would
            for step_mean, step_variance in zip(mean, variance, strict=True):
                _remember(self, 0, step_mean, step_variance, batch)
        else:
            _remember(self, 0, mean, variance, batch)

    m.StepwiseBatchNorm.remember = remember
    m.StepwiseBatchNorm.statistics_step = lambda self, t: 0


def population_statistics_never_estimated():
    """The population statistics are never updated: evaluation normalizes with the initial
    buffers (mean 0, variance 1) at every step."""
    m.StepwiseBatchNorm.remember = lambda self, rows, mean, variance, batch: None


def steps_beyond_t_max_reuse_step_0():
    """A step beyond the last one with statistics of its own reuses step 0's statistics instead
    of step T_max's."""
    m.StepwiseBatchNorm.statistics_step = lambda self, t: t if t < self.max_steps else 0


def population_statistics_averaged_over_time():
    """The population estimate averages each BN's statistics over the time steps: one set for
    every step, the shortcut the paper warns against (the chapter's `shared_by_every_step`
    ablation, as a bug of the estimate)."""
    original = m.estimate_population_statistics

    def estimate_population_statistics(model, x, state=None):
        original(model, x, state)
        with torch.no_grad():
            for bn in model.modules():
                if isinstance(bn, m.StepwiseBatchNorm):
                    bn.running_mean[:] = bn.running_mean.mean(dim=0)
                    bn.running_var[:] = bn.running_var.mean(dim=0)

    m.estimate_population_statistics = estimate_population_statistics


def gamma_starts_at_one():
    """Every per-step BN starts gamma at 1 whatever gamma_init says: the customary BN
    initialisation (torch's nn.BatchNorm default), the one the paper argues against."""
    original = m.StepwiseBatchNorm.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        with torch.no_grad():
            self.gamma.fill_(1.0)

    m.StepwiseBatchNorm.__init__ = __init__


def tanh_rnn_ignores_gamma():
    """The Figure-1 network normalizes its pre-activation but never scales it by gamma: every
    gamma behaves as gamma = 1, h_t = tanh(BN(z; 1, 0))."""

    def forward(self, x, h0):
        states = [h0]
        for input_term in (x @ self.weight_x).unbind(1):
            z = states[-1] @ self.weight_h + input_term
            mean, variance = batch_norm.batch_statistics(z)
            states.append(torch.tanh(batch_norm.normalize(z, mean, variance, self.eps)))
        return states

    m.BNTanhRNN.forward = forward


MUTANTS = [
    shared_statistics,
    population_statistics_never_estimated,
    steps_beyond_t_max_reuse_step_0,
    population_statistics_averaged_over_time,
    gamma_starts_at_one,
    tanh_rnn_ignores_gamma,
]
