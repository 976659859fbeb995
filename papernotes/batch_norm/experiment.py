"""The chapter's experiment: the paper's MNIST network with and without BN (Section 4.1), its
training run, and the measurements of the claims (chapters/batch_norm.ipynb).

The BN layers are the mechanism's (`papernotes.batch_norm`), looked up at call time so that a
broken variant patched into that module is the one these networks run.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from papernotes import batch_norm, checks, training
from papernotes.data import Digits, minibatches

BATCHES = 1  # the generator stream of the training batches

# -- the paper's MNIST network, with and without BN -----------------------------------------------

ACTIVATIONS = {"sigmoid": nn.Sigmoid, "relu": nn.ReLU}


class MNISTNet(nn.Module):
    """The paper's Section 4.1 network: `n_layers` hidden layers of `hidden` units and a linear
    read-out to 10 classes. With batch_norm, each hidden layer is g(BN(Wu)) (no bias, beta
    replaces it); without, g(Wu + b). Weights start as small Gaussians, N(0, init_std^2), and
    biases at 0.

    `nonlinearity_inputs(x)` returns what enters each nonlinearity, the quantity of the paper's
    Figure 1 (b, c).
    """

    def __init__(
        self,
        *,
        batch_norm: bool,
        activation: str = "sigmoid",
        n_inputs: int = 64,
        hidden: int = 100,
        n_layers: int = 3,
        n_classes: int = 10,
        init_std: float = 0.1,
    ):
        super().__init__()
        checks.boolean("batch_norm", batch_norm)
        checks.one_of("activation", activation, tuple(ACTIVATIONS))
        for name, value in [
            ("n_inputs", n_inputs),
            ("hidden", hidden),
            ("n_layers", n_layers),
            ("n_classes", n_classes),
        ]:
            checks.integer(name, value)
        checks.number("init_std", init_std, low=0.0, low_open=True)
        self.batch_norm = batch_norm
        widths = [n_inputs] + [hidden] * n_layers + [n_classes]
        shapes = list(zip(widths[1:], widths[:-1], strict=True))  # (out, in) of each weight
        # Drawn before any layer is built (building one draws its default initialisation, more
        # of it with a bias), so the networks with and without BN start from the same weights.
        weights = [torch.randn(shape) * init_std for shape in shapes]
        # BN normalises x = Wu, the input of the nonlinearity: z = g(BN(Wu)); beta takes the
        # place of the bias.
        self.linears = nn.ModuleList(
            nn.Linear(n_in, n_out, bias=not batch_norm) for n_out, n_in in shapes[:-1]
        )
        self.norms = nn.ModuleList(_bn_layer(hidden) for _ in range(n_layers if batch_norm else 0))
        self.act = ACTIVATIONS[activation]()
        self.readout = nn.Linear(hidden, n_classes)
        with torch.no_grad():
            for layer, weight in zip([*self.linears, self.readout], weights, strict=True):
                layer.weight.copy_(weight)
                if layer.bias is not None:
                    layer.bias.zero_()

    def nonlinearity_inputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The input of every hidden layer's nonlinearity, in order: BN(Wu) or Wu + b."""
        inputs = []
        for i, linear in enumerate(self.linears):
            pre = linear(x)
            if self.batch_norm:
                pre = self.norms[i](pre)
            inputs.append(pre)
            x = self.act(pre)
        return inputs

    def logits(self, last_input: torch.Tensor) -> torch.Tensor:
        """The read-out of the last hidden layer, from its nonlinearity's input."""
        return self.readout(self.act(last_input))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits(self.nonlinearity_inputs(x)[-1])


def _bn_layer(features: int) -> nn.Module:
    # Out here because MNISTNet's argument `batch_norm` hides the module's name inside __init__.
    return batch_norm.BatchNorm(features)


PERCENTILES = (0.15, 0.50, 0.85)  # the paper's Figure 1 (b, c)


def percentile_band(inputs: torch.Tensor) -> torch.Tensor:
    """The 15th, 50th and 85th percentiles over examples of each unit's input (N, units) ->
    (3, units)."""
    return torch.quantile(inputs, torch.tensor(PERCENTILES, dtype=inputs.dtype), dim=0)


@dataclass
class Run(training.Run):
    """One training run: the network as training left it (in eval mode), its History (the
    training loss, and the validation and test accuracy, every `eval_every` updates and after
    the last), and the percentile bands of the last hidden layer's nonlinearity inputs over the
    test set at each of those evaluations, shape (evaluations, 3, hidden)."""

    bands: torch.Tensor


def train_mnist_net(
    digits: Digits,
    lr: float,
    *,
    batch_norm: bool,
    activation: str = "sigmoid",
    seed: int,
    steps: int = 800,
    batch_size: int = 60,
    eval_every: int = 50,
    affine_lr: float | None = None,
) -> Run:
    """Plain SGD on cross-entropy, as in the paper's MNIST experiment, through the book's loop.

    The initial weights and the order of the batches follow `seed`, so runs of one seed with and
    without BN start from the same weights and see the same batches. A run whose loss stops
    being finite stops updating (`run.history.diverged`) and is scored as it stands.

    `affine_lr` (default: `lr`) is the learning rate of the parameters BN's scale invariance
    does not cover: every gamma and beta and the read-out layer; the weights in front of the
    BN layers (and every weight and bias of a network without BN but its read-out) take `lr`.
    """
    checks.number("lr", lr, low=0.0, low_open=True)
    if affine_lr is not None:
        checks.number("affine_lr", affine_lr, low=0.0, low_open=True)
    for name, value in [("steps", steps), ("batch_size", batch_size), ("eval_every", eval_every)]:
        checks.integer(name, value)
    checks.integer("seed", seed, 0)
    if eval_every > steps:
        raise ValueError(f"eval_every ({eval_every}) must not exceed steps ({steps})")
    with training.seeded(seed):
        model = MNISTNet(batch_norm=batch_norm, activation=activation, n_inputs=digits.n_pixels)
    optimizer = torch.optim.SGD(parameter_groups(model, lr, affine_lr), lr=lr)
    batches = minibatches(len(digits.train_x), batch_size, training.generator(seed, BATCHES))
    bands: list[torch.Tensor] = []

    def evaluate() -> dict[str, float]:
        last_input = model.nonlinearity_inputs(digits.test_x)[-1]
        bands.append(percentile_band(last_input))
        return {
            "val_accuracy": training.accuracy(model(digits.val_x), digits.val_y),
            "test_accuracy": training.accuracy(model.logits(last_input), digits.test_y),
        }

    name = f"{'BN' if batch_norm else 'no BN'}, {activation}, lr {lr:g}"
    history = training.train_classifier(
        model,
        digits.train_y,
        optimizer,
        steps,
        batches=batches,
        logits_of=lambda index: model(digits.train_x[index]),
        evaluate=evaluate,
        eval_every=eval_every,
        desc=name,
    )
    return Run(model, history, torch.stack(bands))


def parameter_groups(model: MNISTNet, lr: float, affine_lr: float | None) -> list[dict]:
    """SGD's parameter groups: the linear layers in front of the nonlinearities at `lr`; the BN
    layers' gamma and beta and the read-out layer at `affine_lr` (`lr` when None)."""
    unscaled = [*model.norms.parameters(), *model.readout.parameters()]
    return [
        {"params": list(model.linears.parameters()), "lr": lr},
        {"params": unscaled, "lr": lr if affine_lr is None else affine_lr},
    ]


def thinned(run: Run, every: int) -> Run:
    """The run as if it had been evaluated every `every` updates (and after the last) only: its
    history and bands at those evaluations, to compare runs logged on different schedules."""
    checks.integer("every", every)
    last = run.history.steps[-1]
    keep = [i for i, step in enumerate(run.history.steps) if step % every == 0 or step == last]
    history = training.History()
    history.diverged = run.history.diverged
    for i in keep:
        history.log(run.history.steps[i], {k: v[i] for k, v in run.history.metrics.items()})
    return Run(run.model, history, run.bands[keep])


# -- measuring the claims -----------------------------------------------------------------------


def band_drift(bands: torch.Tensor) -> torch.Tensor:
    """How far a unit's percentile band wanders over training: for each of the 15th, 50th and
    85th percentile, its range (max - min) over the evaluations, averaged over the three.

    bands: (evaluations, 3, units) -> (units,). A steady input distribution has a small drift.
    """
    spread = bands.max(dim=0).values - bands.min(dim=0).values
    return spread.mean(dim=0)


def saturated_fraction(band: torch.Tensor) -> float:
    """The fraction of units whose 15th-85th percentile band, (3, units), lies entirely beyond
    |x| = 5, where the sigmoid's slope is below 0.007."""
    low, _, high = band
    return ((low > 5) | (high < -5)).float().mean().item()


def largest_affine(model: MNISTNet) -> float:
    """The largest |gamma| or |beta| of the network's last BN layer."""
    last = model.norms[-1]
    return max(last.gamma.abs().max().item(), last.beta.abs().max().item())


def predictions(model: nn.Module, x: torch.Tensor, batch_size: int | None = None) -> torch.Tensor:
    """Predicted classes, the images sent through in batches of `batch_size` (all at once: None),
    without gradients and in the model's current mode."""
    with torch.no_grad():
        chunks = x.split(batch_size or len(x))
        return torch.cat([model(chunk).argmax(-1) for chunk in chunks])


def mode_gap(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int
) -> tuple[float, float]:
    """Eval-mode accuracy minus train-mode accuracy (each image normalised with the statistics
    of its batch of `batch_size`, the images in order), and the standard error of that
    difference, paired over the images."""
    checks.integer("batch_size", batch_size, 2)
    with training.evaluating(model):
        eval_correct = (predictions(model, x) == y).float()
    train_correct = (predictions(batch_statistics_model(model), x, batch_size) == y).float()
    difference = eval_correct - train_correct
    return difference.mean().item(), (difference.std() / len(difference) ** 0.5).item()


def batch_statistics_model(model: nn.Module) -> nn.Module:
    """A copy in training mode: every batch it is given is normalised with its own statistics."""
    return copy.deepcopy(model).train()


def normalisation_error(
    estimate: batch_norm.Statistics, population: batch_norm.Statistics, eps: float
) -> float:
    r"""How far normalising with `estimate` instead of `population` moves $\hat{x}$: the RMS over
    the population of the difference, averaged over the features."""
    # With x_p = (x - E[x]) / sigma_p of unit variance and x_e = (x - mu_e) / sigma_e (each
    # sigma = sqrt(Var + eps)), x_e - x_p = (E[x] - mu_e) / sigma_e + (sigma_p / sigma_e - 1) x_p,
    # whose mean square is the sum of the two terms' squares.
    sigma_e = torch.sqrt(estimate.variance + eps)
    sigma_p = torch.sqrt(population.variance + eps)
    shift = (population.mean - estimate.mean) / sigma_e
    stretch = sigma_p / sigma_e - 1.0
    return torch.sqrt(shift.square() + stretch.square()).mean().item()


def running_statistics(model: MNISTNet) -> list[batch_norm.Statistics]:
    """The running averages each BN layer of a network predicts with (copies)."""
    return [
        batch_norm.Statistics(bn.running_mean.clone(), bn.running_var.clone()) for bn in model.norms
    ]


def with_statistics(model: MNISTNet, statistics: list[batch_norm.Statistics]) -> MNISTNet:
    """A copy of a BN network (in eval mode) whose layers predict with the given statistics."""
    copied = copy.deepcopy(model).eval()
    with torch.no_grad():
        for bn, stats in zip(copied.norms, statistics, strict=True):
            bn.running_mean.copy_(stats.mean)
            bn.running_var.copy_(stats.variance)
    return copied
