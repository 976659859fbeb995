r"""Batch Normalization: normalise each layer's inputs with the statistics of the mini-batch.

Ioffe & Szegedy 2015, *Batch Normalization: Accelerating Deep Network Training by Reducing
Internal Covariate Shift* (arXiv:1502.03167). The chapter (chapters/batch_norm.ipynb, "The
idea") derives it; this module is the mechanism alone, in the paper's order, each equation above
the line that computes it:

1. training (Algorithm 1): normalise each feature with the mini-batch's mean and *biased*
   variance, then scale and shift it by a learned gamma and beta;
2. convolutions (Section 3.2): one gamma, beta per channel, the statistics pooled over the batch
   and every pixel of the map;
3. inference (Algorithm 2): population statistics instead of the batch's, kept as moving
   averages while training (`BatchNorm`) and computed after it (`population_statistics`);
4. at test time BN is one affine map, so it folds into the linear layer before it
   (`fold_into_linear`).

The paper's MNIST network and the measurements of the chapter are in
`papernotes.batch_norm.experiment`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from papernotes import checks
from papernotes.data import minibatches
from papernotes.training import generator

STATISTICS_BATCHES = 2  # the generator stream of population_statistics's shuffled pass

# -- 1 and 2. Mini-batch statistics and the normalising transform ----------------------------------


def _feature_dims(x: torch.Tensor) -> tuple[int, ...]:
    """The dims a feature's statistics are taken over: the batch, and the pixels of a map."""
    return (0,) if x.dim() == 2 else (0, 2, 3)


def _per_feature(stat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Shape a (C,) statistic or parameter to broadcast against x, (N, C) or (N, C, H, W)."""
    return stat if x.dim() == 2 else stat.view(-1, 1, 1)


def values_per_feature(x: torch.Tensor) -> int:
    """m' = N (fully connected) or N * H * W (convolutional): values behind one statistic."""
    return x.numel() // x.shape[1]


def batch_statistics(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Per-feature mean and *biased* variance of a mini-batch (Algorithm 1), each of shape (C,).

    x is (N, C), or (N, C, H, W) with the pixels of a map pooled with the batch (m' values).
    """
    dims = _feature_dims(x)
    # mu_B = 1/m sum_i x_i
    mean = x.mean(dim=dims)
    # sigma^2_B = 1/m sum_i (x_i - mu_B)^2: divide by m', not m' - 1.
    # Written out: torch's x.var(dims) divides by m' - 1 unless given correction=0 (that is
    # Algorithm 2's unbiased estimate, not this one), and reusing mu_B is faster on a small CPU.
    variance = (x - _per_feature(mean, x)).square().mean(dim=dims)
    return mean, variance


def normalize(
    x: torch.Tensor, mean: torch.Tensor, variance: torch.Tensor, eps: float
) -> torch.Tensor:
    r"""x_hat with per-feature (C,) statistics: the batch's in training, the population's at
    inference (Algorithm 1)."""
    # x_hat = (x - mu) / sqrt(sigma^2 + eps)
    return (x - _per_feature(mean, x)) * _per_feature(torch.rsqrt(variance + eps), x)


def unbiased(variance: torch.Tensor, m: int) -> torch.Tensor:
    r"""The unbiased estimate of a population variance from a batch's biased variance over m
    values (Algorithm 2)."""
    # Var = m / (m - 1) * sigma^2_B
    return variance * (m / (m - 1))


# -- 3. The layer: batch statistics to train, population statistics to predict ---------------------


class BatchNorm(nn.Module):
    """Batch normalisation of (N, C) features or (N, C, H, W) feature maps, one gamma and beta
    per feature (channel).

    - train mode: normalise with the batch's mean and biased variance, and move the running
      mean and the running *unbiased* variance towards the batch's by `momentum`;
    - eval mode: normalise with the running statistics (the paper's population statistics).

    gamma starts at 1 and beta at 0, so a fresh layer outputs x_hat itself: the layer can undo
    the normalisation (gamma = sigma, beta = mu gives back x) if that is what the loss wants.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1):
        super().__init__()
        self.num_features = checks.integer("num_features", num_features)
        self.eps = checks.number("eps", eps, low=0.0, low_open=True)
        self.momentum = checks.number("momentum", momentum, low=0.0, low_open=True, high=1.0)
        self.gamma = nn.Parameter(torch.ones(num_features))
        self.beta = nn.Parameter(torch.zeros(num_features))
        # Before any batch is seen, "population" statistics that leave x unchanged.
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        return self._transform(x)

    def _transform(self, x: torch.Tensor) -> torch.Tensor:
        """The layer's transform of an input already checked."""
        if self.training:
            # Gradients flow through mu_B and sigma^2_B too: the statistics are part of the net.
            mean, variance = batch_statistics(x)
            self._update_running_statistics(mean, variance, values_per_feature(x))
        else:
            # A prediction must not depend on the other examples in its batch (Algorithm 2).
            mean, variance = self.running_mean, self.running_var
        x_hat = normalize(x, mean, variance, self.eps)
        # y = gamma x_hat + beta
        return _per_feature(self.gamma, x) * x_hat + _per_feature(self.beta, x)

    @torch.no_grad()
    def _update_running_statistics(self, mean, variance, m: int) -> None:
        # r <- (1 - momentum) r + momentum * (the batch's value); the variance unbiased.
        # momentum weighs the *new* batch, PyTorch's convention (Keras's 0.99 weighs the old).
        self.running_mean.lerp_(mean, self.momentum)
        self.running_var.lerp_(unbiased(variance, m), self.momentum)

    def _check_input(self, x: torch.Tensor) -> None:
        maps = isinstance(x, torch.Tensor) and x.dim() == 4
        shape = "(N, C, H, W)" if maps else "(N, C)"
        checks.tensor("x", x, shape, dtype=self.gamma.dtype, C=self.num_features)
        if self.training and values_per_feature(x) < 2:
            raise ValueError(
                "BatchNorm in train mode needs at least 2 values per feature to estimate a "
                f"variance; got input {tuple(x.shape)} (use eval mode to predict one example)"
            )

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps:g}, momentum={self.momentum:g}"


@dataclass(frozen=True)
class Statistics:
    """Per-feature mean and (unbiased) variance of the inputs of one BN layer, each (C,)."""

    mean: torch.Tensor
    variance: torch.Tensor


@torch.no_grad()
def population_statistics(
    model: nn.Module, x: torch.Tensor, batch_size: int, seed: int
) -> tuple[list[Statistics], list[list[Statistics]]]:
    r"""Algorithm 2's population statistics of every BN layer of a trained network (one with
    its BN layers in `model.norms`).

    One pass over `x` (the training set) in shuffled mini-batches of `batch_size`, the network
    in training mode (each layer normalised with its batch's statistics, as in training) with its
    weights frozen. A batch's variance is unbiased over the m' values behind it: m' =
    `batch_size` for (N, C) features, `batch_size` * H * W for (N, C, H, W) maps (Section 3.2).

    Returns the population statistics of each layer, and each layer's per-batch statistics
    (mean and unbiased variance of every batch): what one batch alone would estimate.
    """
    checks.integer("batch_size", batch_size, 2)
    probe = copy.deepcopy(model).train()  # a copy: its running statistics move, the model's not
    seen: list[list[tuple[torch.Tensor, torch.Tensor, int]]] = [[] for _ in probe.norms]

    def record(i: int, z: torch.Tensor) -> None:
        seen[i].append((*batch_statistics(z), values_per_feature(z)))

    hooks = [
        bn.register_forward_pre_hook(lambda _, args, i=i: record(i, args[0]))
        for i, bn in enumerate(probe.norms)
    ]
    batches = minibatches(len(x), batch_size, generator(seed, STATISTICS_BATCHES))
    for _ in range(len(x) // batch_size):  # one epoch
        probe(x[next(batches)])
    for hook in hooks:
        hook.remove()
    population, per_batch = [], []
    for layer in seen:
        means = torch.stack([mean for mean, _, _ in layer])
        # each batch's variance unbiased over its m' values: m' / (m' - 1) sigma^2_B
        variances = torch.stack([unbiased(variance, m) for _, variance, m in layer])
        # E[x] = E_B[mu_B],  Var[x] = m' / (m' - 1) E_B[sigma^2_B]
        population.append(Statistics(means.mean(0), variances.mean(0)))
        per_batch.append([Statistics(m, v) for m, v in zip(means, variances, strict=True)])
    return population, per_batch


# -- 4. At test time BN is one linear map ----------------------------------------------------------


def fold_into_linear(linear: nn.Linear, bn: BatchNorm) -> nn.Linear:
    """One nn.Linear equal to bn(linear(x)) with bn in eval mode (its running statistics)."""
    if not isinstance(linear, nn.Linear):
        raise TypeError(f"linear must be a torch.nn.Linear; got {type(linear).__name__}")
    if not isinstance(bn, BatchNorm):
        raise TypeError(f"bn must be a papernotes.batch_norm.BatchNorm; got {type(bn).__name__}")
    if linear.out_features != bn.num_features:
        raise ValueError(
            f"linear has {linear.out_features} outputs but bn normalises {bn.num_features} features"
        )
    with torch.no_grad():
        # With fixed statistics BN is affine per feature: y = s x + (beta - s E[x]),
        # s = gamma / sqrt(Var[x] + eps); so W' = diag(s) W and b' = s (b - E[x]) + beta
        # (b = 0 when the linear layer has no bias).
        scale = bn.gamma / torch.sqrt(bn.running_var + bn.eps)
        bias = linear.bias if linear.bias is not None else torch.zeros_like(bn.running_mean)
        folded = nn.Linear(linear.in_features, linear.out_features, bias=True)
        folded = folded.to(dtype=linear.weight.dtype, device=linear.weight.device)
        folded.weight.copy_(scale[:, None] * linear.weight)
        folded.bias.copy_(scale * (bias - bn.running_mean) + bn.beta)
    return folded
