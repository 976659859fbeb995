"""The chapter's experiment (chapters/selu.ipynb): the mean and variance of activations layer
after layer in deep random networks (SELU against ReLU, tanh and ELU, with or without a
dropout), and a deep self-normalizing classifier against a ReLU network of the same depth
without normalisation, trained through the book's classifier loop.

SELU, LeCun-normal weights and alpha-dropout are the mechanism's (`papernotes.selu`), looked up
at call time so that a broken variant patched into that module is the one these run.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from papernotes import checks, selu, training
from papernotes.data import minibatches

# Random streams: the random networks' inputs, weights and dropout masks; the classifier's
# minibatches.
INPUTS, WEIGHTS, NOISE, BATCHES = 0, 1, 2, 3


# -- statistics of deep random networks -------------------------------------------------------

ACTIVATIONS = ("selu", "relu", "tanh", "elu")
DROPOUTS = ("none", "dropout", "alpha_dropout")


def activation(name: str):
    """The activation function of that name (SELU is this module's, read when called)."""
    checks.one_of("activation", name, ACTIVATIONS)
    return {"selu": selu.selu, "relu": F.relu, "tanh": torch.tanh, "elu": F.elu}[name]


def forward_statistics(
    name: str,
    *,
    depth: int = 32,
    width: int = 256,
    n: int = 256,
    init_scale: float = 1.0,
    dropout: str = "none",
    p: float = 0.1,
    seed: int = 0,
) -> torch.Tensor:
    r"""Mean and variance of the activations after each layer of a deep random network.

    `n` inputs from $\mathcal N(0, 1)$ of `width` features pass through `depth` layers
    $x \mapsto f(W x)$, no biases, $W$ LeCun-normal times $\sqrt{\text{init\_scale}}$ (so
    $\mathbb E[\tau]$ = `init_scale`), with `dropout` ("dropout" or "alpha_dropout", rate `p`)
    after each activation. Returns (depth, 2): per layer the mean and the variance over all
    units and inputs. Everything random follows `seed`.
    """
    f = activation(name)
    depth, width, n = (
        checks.integer(k, v) for k, v in (("depth", depth), ("width", width), ("n", n))
    )
    init_scale = checks.number("init_scale", init_scale, 0.0, low_open=True)
    checks.one_of("dropout", dropout, DROPOUTS)
    drop = {"none": None, "dropout": selu.plain_dropout, "alpha_dropout": selu.alpha_dropout}[
        dropout
    ]
    if drop is not None:
        checks.number("p", p, 0.0, 1.0, high_open=True)
    weights, noise = training.generator(seed, WEIGHTS), training.generator(seed, NOISE)
    x = torch.randn(n, width, generator=training.generator(seed, INPUTS))
    stats = torch.empty(depth, 2)
    w = torch.empty(width, width)
    for layer in range(depth):
        selu.lecun_normal_(w, generator=weights)
        x = f(x @ (w * math.sqrt(init_scale)).T)
        if drop is not None:
            x = drop(x, p, generator=noise)
        stats[layer] = torch.stack([x.mean(), x.var()])
    return stats


# -- a deep self-normalizing classifier against a deep ReLU network ---------------------------


def mlp(n_in: int, n_out: int, *, depth: int, width: int, snn: bool = True) -> nn.Sequential:
    """`depth` hidden layers of `width` units and a linear output, biases at zero.

    `snn=True`: the self-normalizing network, SELU with LeCun-normal weights. `snn=False`: the
    baseline, ReLU with He-normal weights (variance 2/n, the initialisation made for ReLU), no
    normalisation of any kind. The output layer is LeCun-normal in both.
    """
    n_in, n_out, depth, width = (
        checks.integer(k, v)
        for k, v in (("n_in", n_in), ("n_out", n_out), ("depth", depth), ("width", width))
    )

    def init(linear: nn.Linear, is_output: bool) -> None:
        if snn or is_output:
            selu.lecun_normal_(linear.weight)
        else:
            nn.init.kaiming_normal_(linear.weight, nonlinearity="relu")
        nn.init.zeros_(linear.bias)

    return training.mlp([n_in, *[width] * depth, n_out], selu.SELU if snn else nn.ReLU, init=init)


def standardize(train_x: torch.Tensor, *others: torch.Tensor) -> list[torch.Tensor]:
    """Centre every split on the training pixels' means and divide by the training data's one
    overall standard deviation (per-pixel deviations would blow up pixels that are almost
    always blank): inputs with mean 0 and variance 1 on average, as the SNN theory assumes."""
    checks.tensor("train_x", train_x, "(N, D)", dtype="floating")
    mean = train_x.mean(0)
    std = (train_x - mean).std()
    return [(x - mean) / std for x in (train_x, *others)]


def train_classifier(
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    val_x: torch.Tensor,
    val_y: torch.Tensor,
    *,
    snn: bool,
    seed: int,
    depth: int = 32,
    width: int = 64,
    lr: float = 0.01,
    steps: int = 300,
    batch_size: int = 128,
    eval_every: int = 50,
) -> training.Run:
    """Train `mlp(..., snn=snn)` with plain SGD (the paper's optimiser) on cross-entropy; the
    run's History logs the validation accuracy ("val_accuracy")."""
    d = checks.tensor("train_x", train_x, "(N, D)", dtype="floating")
    checks.tensor("train_y", train_y, "(N,)", N=d["N"])
    checks.tensor("val_x", val_x, "(M, D)", D=d["D"], dtype="floating")
    checks.tensor("val_y", val_y, "(M,)", M=val_x.shape[0])
    lr = checks.number("lr", lr, 0.0, low_open=True)
    n_classes = int(train_y.max()) + 1
    with training.seeded(seed):
        model = mlp(d["D"], n_classes, depth=depth, width=width, snn=snn)
    history = training.train_classifier(
        model,
        train_y,
        torch.optim.SGD(model.parameters(), lr=lr),
        steps,
        batches=minibatches(d["N"], batch_size, training.generator(seed, BATCHES)),
        logits_of=lambda index: model(train_x[index]),
        evaluate=lambda: {"val_accuracy": training.accuracy(model(val_x), val_y)},
        eval_every=eval_every,
        desc="SNN" if snn else "ReLU",
    )
    return training.Run(model, history)


# -- measuring the claims -------------------------------------------------------------------------


def distance_from_fixed_point(mean, variance) -> float:
    """How far a (mean, variance) pair is from (0, 1): max(|mean|, |variance - 1|)."""
    return max(abs(float(mean)), abs(float(variance) - 1.0))


def moved_from_fixed_point(x: torch.Tensor) -> float:
    """How far a sample's mean and (unbiased) variance are from (0, 1)."""
    return distance_from_fixed_point(x.mean(), x.var())


def layers_to_converge(path: torch.Tensor, tolerance: float = 1e-3) -> int | None:
    """The first layer of a moment-map path (layers + 1, 2) (as `selu.iterate_moment_map`
    returns) whose mean and variance are both within `tolerance` of (0, 1); None if none is."""
    close = ((path - torch.tensor([0.0, 1.0], dtype=path.dtype)).abs() <= tolerance).all(-1)
    return int(close.nonzero()[0]) if close.any() else None
