"""The chapter's experiment: the paper's MNIST network with and without BN (Section 4.1), its
training run, and the measurements of the claims (chapters/batch_norm.ipynb).

The BN layers are the mechanism's (`papernotes.batch_norm`), looked up at call time so that a
broken variant patched into that module is the one these networks run.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from papernotes import batch_norm, checks, training
from papernotes.data import Digits, minibatches

BATCHES = 1  # the generator stream of the training batches

# -- the paper's MNIST network, with and without BN ------------------------------------------------

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
        _check_counts(n_inputs=n_inputs, hidden=hidden, n_layers=n_layers, n_classes=n_classes)
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


def _check_counts(**counts) -> None:
    """Each keyword a positive integer (sizes, step counts), named in the error if not."""
    for name, value in counts.items():
        checks.integer(name, value)


def _bn_layer(features: int) -> nn.Module:
    # Out here because MNISTNet's argument `batch_norm` hides the module's name inside __init__.
    return batch_norm.BatchNorm(features)


PERCENTILES = (0.15, 0.50, 0.85)  # the paper's Figure 1 (b, c)


def percentile_band(inputs: torch.Tensor) -> torch.Tensor:
    """The 15th, 50th and 85th percentiles over examples of each unit's input (N, units) ->
    (3, units); (N, members, units) -> (3, members, units)."""
    return torch.quantile(inputs, torch.tensor(PERCENTILES, dtype=inputs.dtype), dim=0)


@dataclass
class Run(training.Run):
    """One training run: the network as training left it (in eval mode), its History (the
    training loss, and the validation and test accuracy, every `eval_every` updates and after
    the last), the percentile bands of the last hidden layer's nonlinearity inputs over the
    test set at the evaluations after `band_steps` updates, shape (len(band_steps), 3, hidden),
    and the norm of every hidden unit's incoming weights at each evaluation of the History,
    shape (evaluations, n_layers, hidden): ||w_j||, the scale BN's output ignores (Section 3.3).
    """

    bands: torch.Tensor
    band_steps: list[int]
    weight_norms: torch.Tensor


@dataclass(frozen=True)
class Setting:
    """What one network of a side-by-side training differs in.

    - `lr`: the learning rate of the weights in front of each hidden layer's nonlinearity (and,
      without BN, of the hidden biases);
    - `affine_lr`: the rate of gamma and beta (weight normalisation's g and b), and
      `readout_lr` the read-out layer's (None: `lr`): what BN's scale invariance does not cover;
    - `init_std`: the standard deviation of the initial weights;
    - `standardised`: (a network without BN) whose start is standardised once on the training
      images (`standardise_start`);
    - `clip`: the norm each update's gradient is clipped to (None: no clipping)."""

    lr: float
    affine_lr: float | None = None
    init_std: float = 0.1
    standardised: bool = False
    readout_lr: float | None = None
    clip: float | None = None


# The rate each parameter steps at: the member's `lr`, `affine_lr` or `readout_lr`.
LR, AFFINE, READOUT = "lr", "affine_lr", "readout_lr"


class MNISTNets(nn.Module):
    """`len(settings)` sigmoid MNISTNets trained side by side as one module: member k has its
    own weights (the seed's Gaussian draw times its `init_std`), and every member
    sees the same mini-batches. The linear layers are one batched matrix product (weights
    (members, out, in)); each BN layer is one `batch_norm.BatchNorm` over members x hidden
    features, each feature normalised over the batch on its own, so no member's output,
    gradient or statistics depend on another's. `member(k)` hands member k back as a
    stand-alone MNISTNet."""

    def __init__(
        self, settings, *, batch_norm: bool, n_inputs: int, n_layers: int = 3, hidden: int = 100
    ):
        super().__init__()
        self.settings = tuple(settings)
        self.batch_norm, self.n_inputs, self.n_layers = batch_norm, n_inputs, n_layers
        self.hidden, self.n_classes = hidden, 10
        k = len(self.settings)
        widths = [n_inputs] + [self.hidden] * n_layers + [self.n_classes]
        shapes = list(zip(widths[1:], widths[:-1], strict=True))
        # MNISTNet's draws, in its order: member k starts from them times its own scale.
        draws = [torch.randn(shape) for shape in shapes]
        scale = torch.tensor([s.init_std for s in self.settings]).view(k, 1, 1)
        self.weights = nn.ParameterList(nn.Parameter(w * scale) for w in draws)
        biased = [not batch_norm] * n_layers + [True]  # beta replaces a hidden layer's bias
        self.biases = nn.ParameterList(
            nn.Parameter(torch.zeros(k, out))
            for (out, _), b in zip(shapes, biased, strict=True)
            if b
        )
        self.norms = nn.ModuleList(
            _bn_layer(k * self.hidden) for _ in range(n_layers if batch_norm else 0)
        )

    def pre_activation(self, i: int, h: torch.Tensor) -> torch.Tensor:
        """Hidden layer i's nonlinearity input (members, N, hidden) from its input h:
        BN(Wu) with BN, Wu + b without."""
        pre = torch.bmm(h, self.weights[i].transpose(1, 2))
        if not self.batch_norm:
            return pre + self.biases[i].unsqueeze(1)
        k, n = pre.shape[:2]
        flat = pre.transpose(0, 1).reshape(n, k * self.hidden)  # (N, members x hidden)
        return self.norms[i](flat).reshape(n, k, self.hidden).transpose(0, 1)

    def nonlinearity_inputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Every hidden layer's nonlinearity input, (members, N, hidden) each, from x (N, D)."""
        h, inputs = x.expand(len(self.settings), *x.shape), []
        for i in range(self.n_layers):
            inputs.append(self.pre_activation(i, h))
            h = torch.sigmoid(inputs[-1])
        return inputs

    def logits(self, last_input: torch.Tensor) -> torch.Tensor:
        """The read-out, (members, N, classes), from the last nonlinearity's input."""
        readout = self.weights[-1].transpose(1, 2)
        return torch.baddbmm(self.biases[-1].unsqueeze(1), torch.sigmoid(last_input), readout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N, D) -> logits (members, N, classes)."""
        return self.logits(self.nonlinearity_inputs(x)[-1])

    def weight_norms(self) -> torch.Tensor:
        """||w_j|| of every hidden unit's incoming weights, (members, n_layers, hidden)."""
        return torch.stack([w.norm(dim=2) for w in self.weights[: self.n_layers]], dim=1)

    @torch.no_grad()
    def rescale(self, i: int, mu: torch.Tensor, sigma: torch.Tensor) -> None:
        """Make hidden layer i's nonlinearity input (z - mu) / sigma (mu, sigma (members,
        hidden)): W <- W / sigma, b <- (b - mu) / sigma. Networks without BN only."""
        self.weights[i].div_(sigma.unsqueeze(-1))
        self.biases[i].sub_(mu).div_(sigma)

    def owners(self) -> list[tuple[nn.Parameter, torch.Tensor, str]]:
        """Each parameter, the member that owns each of its entries (broadcastable to it), and
        which of the member's rates it steps at: `lr` (every hidden layer's weights, and a
        network without BN's hidden biases), `affine_lr` (every gamma and beta) or `readout_lr`
        (the read-out): see `Setting`."""
        found = self._weight_and_bias_owners(hidden_biases=LR)
        every_unit = torch.arange(len(self.settings)).repeat_interleave(self.hidden)
        for bn in self.norms:
            found += [(p, every_unit, AFFINE) for p in (bn.gamma, bn.beta)]
        return found

    def _weight_and_bias_owners(self, *, hidden_biases: str) -> list:
        """`owners` of the weights (hidden at `lr`, read-out at `readout_lr`) and of the biases
        (hidden at the rate `hidden_biases`, read-out at `readout_lr`), in that order."""
        k = torch.arange(len(self.settings))
        hidden, last = self.n_layers, len(self.biases) - 1
        found = [
            (w, k.view(-1, 1, 1), LR if i < hidden else READOUT) for i, w in enumerate(self.weights)
        ]
        found += [
            (b, k.view(-1, 1), hidden_biases if i < last else READOUT)
            for i, b in enumerate(self.biases)
        ]
        return found

    def member(self, k: int) -> MNISTNet:
        """Member k as a stand-alone MNISTNet in eval mode (its weights, BN parameters and
        running statistics copied)."""
        with training.seeded(0):  # the draws of a new net are overwritten; keep the global stream
            net = MNISTNet(
                batch_norm=self.batch_norm,
                n_inputs=self.n_inputs,
                n_layers=self.n_layers,
                hidden=self.hidden,
            )
        rows = slice(k * self.hidden, (k + 1) * self.hidden)
        layers = [*net.linears, net.readout]
        with torch.no_grad():
            for i, layer in enumerate(layers):
                layer.weight.copy_(self.effective_weight(i)[k])
            biased = [layer for layer in layers if layer.bias is not None]
            for layer, b in zip(biased, self.biases, strict=True):
                layer.bias.copy_(b[k])
            for ours, stacked in zip(net.norms, self.norms, strict=True):
                for name in ("gamma", "beta", "running_mean", "running_var"):
                    getattr(ours, name).copy_(getattr(stacked, name)[rows])
        return net.eval()

    def effective_weight(self, i: int) -> torch.Tensor:
        """Layer i's weights as a plain linear layer uses them, (members, out, in)."""
        return self.weights[i]


class WeightNormNets(MNISTNets):
    """Networks without BN whose hidden layers are weight-normalised (Salimans & Kingma 2016):
    w_j = g_j v_j / ||v_j||, so a hidden unit's input g_j (v_j . u) / ||v_j|| + b_j ignores the
    scale of v_j, as BN's does that of w_j, but no batch statistics enter it. The null of the
    claims that asks whether scale invariance alone, without normalising by the batch, lets the
    network train at the rates BN does. Code of its own: nothing of `papernotes.batch_norm`.

    g starts at ||v||, so an unstandardised start is the plain network's function;
    `standardise_start` gives it Salimans & Kingma's data-dependent start (g_j = 1 / sigma_j,
    b_j = -mu_j / sigma_j over the images). g and b step at `affine_lr`, v at `lr`."""

    def __init__(self, settings, *, n_inputs: int, n_layers: int = 3, hidden: int = 100):
        super().__init__(
            settings, batch_norm=False, n_inputs=n_inputs, n_layers=n_layers, hidden=hidden
        )
        self.gains = nn.ParameterList(
            nn.Parameter(w.detach().norm(dim=2)) for w in self.weights[:n_layers]
        )

    def effective_weight(self, i: int) -> torch.Tensor:
        if i == self.n_layers:  # the read-out is not normalised
            return self.weights[i]
        v = self.weights[i]
        # w = g v / ||v||, row by row
        return self.gains[i].unsqueeze(-1) * v / v.norm(dim=2, keepdim=True)

    def pre_activation(self, i: int, h: torch.Tensor) -> torch.Tensor:
        return torch.bmm(h, self.effective_weight(i).transpose(1, 2)) + self.biases[i].unsqueeze(1)

    @torch.no_grad()
    def rescale(self, i: int, mu: torch.Tensor, sigma: torch.Tensor) -> None:
        # g <- g / sigma, b <- (b - mu) / sigma: the scale lives in g, not in v
        self.gains[i].div_(sigma)
        self.biases[i].sub_(mu).div_(sigma)

    def owners(self) -> list[tuple[nn.Parameter, torch.Tensor, str]]:
        # g and the hidden biases are the layer's affine part, as gamma and beta are BN's
        found = self._weight_and_bias_owners(hidden_biases=AFFINE)
        k = torch.arange(len(self.settings))
        return found + [(g, k.view(-1, 1), AFFINE) for g in self.gains]


@torch.no_grad()
def standardise_start(nets: MNISTNets, x: torch.Tensor, which) -> None:
    """Rescale each hidden layer of the members `which` (one bool a member) of networks without
    BN, first to last, so that its nonlinearity inputs have mean 0 and variance 1 per unit over
    the images x (`nets.rescale`: W <- W / sigma, b <- (b - mu) / sigma; g instead of W under
    weight normalisation), with the layer's inputs u those of the layers already rescaled. BN's
    normalisation done once, at the start, with the statistics of the data set instead of each
    batch's, and never again (a data-dependent initialisation)."""
    which = torch.tensor(list(which), dtype=torch.bool)
    if not which.any():
        return
    if nets.batch_norm:
        raise ValueError("standardise_start rescales networks without BN")
    h = x.expand(len(nets.settings), *x.shape)
    for i in range(nets.n_layers):
        pre = nets.pre_activation(i, h)
        # (z - mu) / sigma; the other members keep (0, 1)
        mu = torch.where(which[:, None], pre.mean(1), 0.0)
        sigma = torch.where(which[:, None], pre.std(1, correction=0), 1.0)
        nets.rescale(i, mu, sigma)
        h = torch.sigmoid((pre - mu.unsqueeze(1)) / sigma.unsqueeze(1))


class MemberSGD(torch.optim.Optimizer):
    """Plain SGD for side-by-side members: an entry of member k moves by -rate_k * gradient,
    rate_k its `lr`, `affine_lr` or `readout_lr` (see `MNISTNets.owners`), with member k's
    gradient first scaled to norm at most its `clip` (as `nn.utils.clip_grad_norm_` scales a
    run's); a member marked dead in `alive` does not move."""

    def __init__(self, nets: MNISTNets, alive: torch.Tensor):
        owned = nets.owners()
        super().__init__([p for p, _, _ in owned], {})
        rates = {
            LR: [s.lr for s in nets.settings],
            AFFINE: [s.lr if s.affine_lr is None else s.affine_lr for s in nets.settings],
            READOUT: [s.lr if s.readout_lr is None else s.readout_lr for s in nets.settings],
        }
        # (parameter, owner, the members' rates, the rates spread over its entries)
        self.rates = []
        for p, owner, which in owned:
            member_rates = torch.tensor(rates[which])
            self.rates.append((p, owner, member_rates, member_rates[owner]))
        clips = [math.inf if s.clip is None else s.clip for s in nets.settings]
        self.clip = torch.tensor(clips) if any(s.clip is not None for s in nets.settings) else None
        self.alive = alive

    def _clip_scale(self) -> torch.Tensor:
        """Each member's min(1, clip / (||g|| + 1e-6)), ||g|| the norm of all its gradients."""
        k = len(self.clip)
        # every parameter reshapes to (members, its entries): gamma's member k owns rows k*H..
        square = sum(
            p.grad.reshape(k, -1).square().sum(1) for p, *_ in self.rates if p.grad is not None
        )
        return torch.clamp(self.clip / (square.sqrt() + 1e-6), max=1.0)

    @torch.no_grad()
    def step(self, closure=None):
        scale = None if self.clip is None else self._clip_scale()
        everyone = bool(self.alive.all())
        for p, owner, rates, spread in self.rates:
            if p.grad is None:
                continue
            step = (spread if scale is None else (rates * scale)[owner]) * p.grad
            # a dead member's gradient may be 0 * inf = nan: keep it out, not multiplied by 0
            p.sub_(step if everyone else torch.where(self.alive[owner], step, 0.0))


def train_mnist_nets(
    digits: Digits,
    settings,
    *,
    batch_norm: bool,
    seed: int,
    steps: int = 800,
    batch_size: int = 60,
    eval_every: int = 50,
    band_every: int | None = None,
    n_layers: int = 3,
    hidden: int = 100,
    weight_norm: bool = False,
) -> list[Run]:
    """Plain SGD on cross-entropy, as in the paper's MNIST experiment, for one sigmoid network
    per `Setting`, side by side (`MNISTNets`, or `WeightNormNets` with `weight_norm`) through
    the book's loop: one Run per setting.

    The initial weights and the order of the batches follow `seed`, so networks of one seed
    with and without BN, and at every setting, start from the same draw
    and see the same batches. A network whose loss stops being finite stops updating (its
    history's `diverged`) and is scored as it stands; the others carry on.

    The percentile bands are recorded every `band_every` updates (a multiple of `eval_every`;
    None: after the last update only) and after the last.

    A setting with `standardised` (networks without BN only) starts from its weights rescaled
    once, layer by layer, so that every nonlinearity input has mean 0 and variance 1 over the
    training images (`standardise_start`): a normalisation without batch statistics.
    """
    settings = tuple(settings)
    if not settings or not all(isinstance(s, Setting) for s in settings):
        raise TypeError("settings must be a non-empty list of experiment.Setting")
    for s in settings:
        checks.number("lr", s.lr, low=0.0, low_open=True)
        for name in (AFFINE, READOUT, "clip"):
            if getattr(s, name) is not None:
                checks.number(name, getattr(s, name), low=0.0, low_open=True)
        checks.number("init_std", s.init_std, low=0.0, low_open=True)
        checks.boolean("standardised", s.standardised)
    checks.boolean("batch_norm", batch_norm)
    checks.boolean("weight_norm", weight_norm)
    if batch_norm and weight_norm:
        raise ValueError("a network has batch_norm or weight_norm, not both")
    if batch_norm and any(s.standardised for s in settings):
        raise ValueError("a standardised start is a start for networks without BN")
    _check_counts(
        steps=steps, batch_size=batch_size, eval_every=eval_every, n_layers=n_layers, hidden=hidden
    )
    checks.integer("seed", seed, 0)
    if eval_every > steps:
        raise ValueError(f"eval_every ({eval_every}) must not exceed steps ({steps})")
    band_every = steps if band_every is None else checks.integer("band_every", band_every)
    if band_every % eval_every and band_every != steps:
        raise ValueError(
            f"band_every ({band_every}) must be a multiple of eval_every ({eval_every})"
        )
    k = len(settings)
    shape = {"n_inputs": digits.n_pixels, "n_layers": n_layers, "hidden": hidden}
    with training.seeded(seed):
        if weight_norm:
            nets = WeightNormNets(settings, **shape)
        else:
            nets = MNISTNets(settings, batch_norm=batch_norm, **shape)
    standardise_start(nets, digits.train_x, [s.standardised for s in settings])
    alive = torch.ones(k, dtype=torch.bool)
    diverged = [False] * k
    last_loss = torch.full((k,), math.nan)
    batches = minibatches(len(digits.train_x), batch_size, training.generator(seed, BATCHES))
    bands: list[torch.Tensor] = []
    band_steps: list[int] = []
    norms: list[torch.Tensor] = []
    evaluated = [0]  # evaluations so far

    def loss_of_update(_: int) -> torch.Tensor:
        index = next(batches)
        logits = nets(digits.train_x[index])  # (members, B, classes)
        losses = F.cross_entropy(
            logits.transpose(1, 2), digits.train_y[index].expand(k, -1), reduction="none"
        ).mean(1)
        finite = torch.isfinite(losses.detach())
        for j in torch.nonzero(alive & ~finite).flatten().tolist():
            diverged[j] = True
        alive.logical_and_(finite)
        last_loss.copy_(torch.where(alive, losses.detach(), last_loss))
        # The members' summed losses: each member's gradient is its own loss's.
        return losses[alive].sum() if alive.any() else losses.sum()

    def evaluate() -> dict[str, float]:
        evaluated[0] += 1
        step = min(evaluated[0] * eval_every, steps)
        last_input = nets.nonlinearity_inputs(digits.test_x)[-1]  # (members, N, hidden)
        if step % band_every == 0 or step == steps:
            bands.append(percentile_band(last_input.transpose(0, 1)).transpose(0, 1))
            band_steps.append(step)
        norms.append(nets.weight_norms())
        val = (nets(digits.val_x).argmax(-1) == digits.val_y).float().mean(1)
        test = (nets.logits(last_input).argmax(-1) == digits.test_y).float().mean(1)
        return {
            f"{metric}/{j}": value
            for metric, values in [
                ("val_accuracy", val),
                ("test_accuracy", test),
                ("loss", last_loss),
            ]
            for j, value in enumerate(values.tolist())
        }

    kind = "BN" if batch_norm else "weight norm" if weight_norm else "no BN"
    history = training.train(
        nets,
        MemberSGD(nets, alive),
        loss_of_update,
        steps,
        evaluate=evaluate,
        eval_every=eval_every,
        desc=f"{kind}, {k} network(s)",
    )
    stacked = torch.stack(bands)  # (evaluations, members, 3, hidden)
    stacked_norms = torch.stack(norms)  # (evaluations, members, n_layers, hidden)
    runs = []
    for j in range(k):
        own = training.History()
        own.diverged = diverged[j]
        for e, step in enumerate(history.steps):
            metrics = ("loss", "val_accuracy", "test_accuracy")
            own.log(step, {m: history[f"{m}/{j}"][e] for m in metrics})
        runs.append(Run(nets.member(j), own, stacked[:, j], list(band_steps), stacked_norms[:, j]))
    return runs


def train_mnist_net(
    digits: Digits,
    lr: float,
    *,
    affine_lr: float | None = None,
    readout_lr: float | None = None,
    init_std: float = 0.1,
    **options,
) -> Run:
    """One network of `train_mnist_nets`: plain SGD at `lr` (`affine_lr`, `readout_lr`,
    `init_std`: see `Setting`), with `train_mnist_nets`'s own keywords in `options`
    (`batch_norm` and `seed`, then `steps`, `batch_size`, `eval_every`, `band_every`, ...)."""
    setting = Setting(lr, affine_lr, init_std, readout_lr=readout_lr)
    (run,) = train_mnist_nets(digits, [setting], **options)
    return run


# -- measuring the claims --------------------------------------------------------------------------


def steps_to(run: Run, level: float, never: int) -> int:
    """The first evaluation's update count at which the run's test accuracy is at least
    `level`; `never` if it gets there at no evaluation."""
    step = run.history.first_step_reaching("test_accuracy", level)
    return never if step is None else step


def chosen(scores: dict):
    """The key with the best score (validation accuracy); of equals, the first in order."""
    if not scores:
        raise ValueError("no scores to choose from")
    return max(scores, key=lambda key: scores[key])


def correct(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size=None) -> torch.Tensor:
    """1.0 for every image the model (in its current mode, `batch_size` images at a time)
    classifies right, 0.0 for the others: (N,)."""
    return (predictions(model, x, batch_size) == y).float()


def paired_difference(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """The mean of a - b over paired per-image values (N,) and its standard error,
    std(a - b) / sqrt(N)."""
    checks.tensor("a", a, "(N,)", dtype="floating")
    checks.tensor("b", b, "(N,)", N=a.shape[0], dtype="floating")
    difference = a - b
    return difference.mean().item(), (difference.std() / len(difference) ** 0.5).item()


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
        eval_correct = correct(model, x, y)
    return paired_difference(eval_correct, mode_correct(model, x, y, batch_size))


def mode_correct(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int):
    """`correct` in training mode: each image normalised with the statistics of its batch of
    `batch_size` (the images in order), the model itself untouched."""
    return correct(batch_statistics_model(model), x, y, batch_size)


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
