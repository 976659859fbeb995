"""The chapter's experiment (chapters/randomout.ipynb): the filter lottery on the 8x8 digits.

A convolutional network with a handful of 3x3 filters (`FilterNet`), trained from several seeds
with and without RandomOut (`train_lottery`) through the book's training loop, RandomOut running
as a hook just before each optimizer step. The seeds' networks train side by side as one module
(`Lottery`: a grouped convolution, one group per seed), which leaves each network's gradients,
and so its CGN and its updates, as they would be alone.

RandomOut is the mechanism's (`papernotes.randomout`), looked up at call time so that a broken
variant patched into that module is the one these runs use. The runs without it, the chapter's
nulls, never call the mechanism: the baseline logs its gradients with `GradientLog`, and
`RandomResets` resets random filters at a fixed rate with code and random streams of its own.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from papernotes import checks, training
from papernotes import randomout as ro
from papernotes.data import IMAGE_SHAPE, minibatches

# Random streams, each of a member's own seed: its minibatches, RandomOut's fresh filters, and,
# for the null that resets filters at random, when and which (RANDOM_CHOICE) and their fresh
# weights (NULL_FILTERS).
BATCHES, FRESH_FILTERS, RANDOM_CHOICE, NULL_FILTERS = 1, 2, 3, 4
# The chapter's bootstrap over seeds draws from a stream of the chapter's seed.
BOOTSTRAP = 5


class FilterNet(nn.Module):
    """`n_filters` 3x3 filters on the 8x8 image, ReLU, and a linear classifier on the 6x6 maps.

    Weights take PyTorch's default initialisation; the convolution's biases are drawn from
    U(-bias_shift, 0), a shift towards negative pre-activations that makes some initial filters
    dead or nearly so (bias_shift = 0: biases at 0; None: PyTorch's default biases,
    U(-1/3, 1/3) for a 3x3 filter of one channel)."""

    def __init__(self, n_filters: int = 2, *, bias_shift: float | None = 1.0, n_classes: int = 10):
        super().__init__()
        n_filters = checks.integer("n_filters", n_filters)
        if bias_shift is not None:
            bias_shift = checks.number("bias_shift", bias_shift, 0.0)
        n_classes = checks.integer("n_classes", n_classes, 2)
        self.conv = nn.Conv2d(1, n_filters, kernel_size=3)
        with torch.no_grad():
            if bias_shift is None:
                pass  # PyTorch's default bias, drawn by nn.Conv2d
            elif bias_shift > 0:
                self.conv.bias.uniform_(-bias_shift, 0.0)
            else:
                self.conv.bias.zero_()
        side = IMAGE_SHAPE[0] - 2
        self.head = nn.Linear(n_filters * side * side, n_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The filters' ReLU maps (N, filters, 6, 6) of flattened images (N, 64)."""
        return F.relu(self.conv(x.reshape(-1, 1, *IMAGE_SHAPE)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def dead_filters(model: FilterNet, x: torch.Tensor) -> torch.Tensor:
    """A bool per filter: True where its ReLU output is 0 at every position of every image of
    `x` (N, 64), so that it gets no gradient from these images and cannot learn."""
    checks.tensor("x", x, "(N, 64)", dtype="floating")
    with torch.no_grad():
        return model.features(x).amax(dim=(0, 2, 3)) <= 0.0


# Where the 3x3 patches of an 8x8 image sit in its 64 flattened pixels: (9, 36), row i the
# pixel i (row-major in the kernel) of each of the 6x6 patch positions, as F.unfold orders them.
_PATCHES = F.unfold(torch.arange(64.0).reshape(1, 1, *IMAGE_SHAPE), kernel_size=3)[0].long()


class Lottery(nn.Module):
    """Several `FilterNet`s side by side, trained as one module: the filter lottery drawn for
    many seeds at once.

    Member $s$ keeps its own weights, its own minibatches and its own loss. The members'
    convolutions are one grouped `nn.Conv2d` (group $s$ sees only member $s$'s images, so its
    filters are rows sF to sF + F - 1 of the weight), and their classifiers are one
    batched matrix product. The loss is the sum of the members' mean cross-entropies, so each
    member's gradient, and so its CGN, is exactly what it would be trained alone; SGD with
    momentum acts elementwise, so each member's updates are too. `member(s)` gives member $s$
    back as a `FilterNet`.
    """

    def __init__(self, nets: list[FilterNet]):
        super().__init__()
        if not nets or not all(isinstance(net, FilterNet) for net in nets):
            raise TypeError("nets must be a non-empty list of FilterNet")
        shapes = {(net.conv.out_channels, net.head.out_features) for net in nets}
        if len(shapes) != 1:
            raise ValueError(f"nets must all have the same filters and classes; got {shapes}")
        (self.n_filters, self.n_classes), self.members = shapes.pop(), len(nets)
        self.conv = nn.Conv2d(self.members, self.members * self.n_filters, 3, groups=self.members)
        with torch.no_grad():
            self.conv.weight.copy_(torch.cat([net.conv.weight for net in nets]))
            self.conv.bias.copy_(torch.cat([net.conv.bias for net in nets]))
        self.head_weight = nn.Parameter(torch.stack([net.head.weight.detach() for net in nets]))
        self.head_bias = nn.Parameter(torch.stack([net.head.bias.detach() for net in nets]))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(S, B, 64) images, one batch per member -> ReLU maps (S, filters * 36, B): column b
        holds image b's maps, flattened as a FilterNet flattens them.

        The grouped convolution computed as one batched matrix product over the images' 3x3
        patches (im2col), laid out so that neither product needs a copy: on a CPU and at this
        size, several times faster than `conv2d` with groups, and the same numbers
        (tests/test_randomout.py checks it)."""
        pixels = x.transpose(1, 2).contiguous()  # (S, 64, B)
        patches = torch.index_select(pixels, 1, _PATCHES.flatten())  # (S, 9 * 36, B)
        patches = patches.reshape(self.members, 9, -1)  # (S, 9, 36 * B)
        w = self.conv.weight.reshape(self.members, self.n_filters, 9)
        b = self.conv.bias.reshape(self.members, self.n_filters, 1)
        maps = F.relu(torch.baddbmm(b, w, patches))  # (S, F, 36 * B)
        return maps.reshape(self.members, -1, x.shape[1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(S, B, 64) -> logits (S, B, classes) (a transposed view of (S, classes, B))."""
        logits = torch.baddbmm(self.head_bias.unsqueeze(2), self.head_weight, self.features(x))
        return logits.transpose(1, 2)

    def member(self, s: int) -> FilterNet:
        """Member `s` as a stand-alone FilterNet (a copy of its current weights)."""
        s = checks.integer("s", s, 0)
        if s >= self.members:
            raise ValueError(f"s must be below the number of members, {self.members}; got {s}")
        net = FilterNet(self.n_filters, bias_shift=0.0, n_classes=self.n_classes)
        rows = slice(s * self.n_filters, (s + 1) * self.n_filters)
        with torch.no_grad():
            net.conv.weight.copy_(self.conv.weight[rows])
            net.conv.bias.copy_(self.conv.bias[rows])
            net.head.weight.copy_(self.head_weight[s])
            net.head.bias.copy_(self.head_bias[s])
        return net.eval()


def member_accuracy(model: Lottery, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Each member's accuracy on the same images `x` (N, 64) with labels `y` (N,): (S,)."""
    n = checks.tensor("x", x, "(N, 64)", dtype="floating")["N"]
    checks.tensor("y", y, "(N,)", N=n)
    with torch.no_grad():
        logits = model(x.expand(model.members, *x.shape))
    return (logits.argmax(-1) == y).float().mean(dim=1)


def member_dead_filters(model: Lottery, x: torch.Tensor) -> torch.Tensor:
    """`dead_filters` of every member on images `x` (N, 64): a bool tensor (S, filters)."""
    return torch.stack([dead_filters(model.member(s), x) for s in range(model.members)])


@dataclass
class LotteryRun(training.Run):
    """Members trained from `seeds`: the model (a Lottery), its History (per epoch,
    "val_accuracy/<s>" for member s and "val_accuracy" for their mean), and RandomOut's log
    (`log.cgn` is reshaped to (updates, members, filters) by `cgn`; `log.resets` holds
    (update, row) pairs)."""

    log: ro.RandomOut | GradientLog
    seeds: tuple[int, ...]
    randomout: bool

    @property
    def cgn(self) -> torch.Tensor:
        return self.log.cgn.reshape(-1, self.model.members, self.model.n_filters)

    def resets_per_member(self) -> list[int]:
        counts = [0] * self.model.members
        for _, row in self.log.resets:
            counts[row // self.model.n_filters] += 1
        return counts


def _filter_norms(conv: nn.Conv2d) -> torch.Tensor:
    """Each filter's absolute gradient summed over its weights, measured for the runs without
    RandomOut by the experiment's own code (a broken mechanism must not reach the nulls)."""
    return conv.weight.grad.detach().abs().sum(dim=(1, 2, 3))


class GradientLog:
    """The log of the runs without RandomOut: each filter's gradient norm before every update
    (`cgn`, (updates, filters)) and the resets a null made (`resets`, (update, row) pairs)."""

    def __init__(self, conv: nn.Conv2d):
        self.conv = conv
        self._cgn: list[torch.Tensor] = []
        self.resets: list[tuple[int, int]] = []

    def attach(self, optimizer: torch.optim.Optimizer):
        return optimizer.register_step_pre_hook(lambda opt, args, kwargs: self._before_step(opt))

    def _before_step(self, optimizer: torch.optim.Optimizer) -> None:
        self._cgn.append(_filter_norms(self.conv).clone())

    @property
    def cgn(self) -> torch.Tensor:
        return torch.stack(self._cgn) if self._cgn else torch.empty(0, self.conv.out_channels)


class RandomResets(GradientLog):
    """The null that resets filters without looking at their gradient: before every update each
    network, with probability `rate`, draws the weights of one of its filters, chosen uniformly,
    again from the layer's initial distribution U(-1/sqrt(n), 1/sqrt(n)), keeps its bias and
    clears its momentum, as RandomOut resets a filter. The rate is fixed in advance, so neither
    when nor where a reset happens depends on the CGN.

    Its own code and its own random streams (`choosers` decide when and which, `fresh` deal the
    new weights, one generator of each per network), so a broken RandomOut cannot move it."""

    def __init__(self, conv: nn.Conv2d, n_filters: int, rate: float, *, choosers, fresh):
        super().__init__(conv)
        self.n_filters = checks.integer("n_filters", n_filters)
        self.rate = checks.number("rate", rate, 0.0, 1.0)
        self.choosers, self.fresh = list(choosers), list(fresh)
        if len(self.choosers) * self.n_filters != conv.out_channels or len(self.fresh) != len(
            self.choosers
        ):
            raise ValueError("one chooser and one fresh-filter generator per network")

    def _before_step(self, optimizer: torch.optim.Optimizer) -> None:
        super()._before_step(optimizer)
        update = len(self._cgn) - 1
        bound = 1.0 / math.sqrt(self.conv.weight[0].numel())
        for s, chooser in enumerate(self.choosers):
            # two draws per network and update, whatever the outcome: the streams stay aligned
            fires = torch.rand((), generator=chooser).item() < self.rate
            k = int(torch.randint(self.n_filters, (), generator=chooser))
            if not fires:
                continue
            row = s * self.n_filters + k
            fresh = torch.empty(self.conv.weight.shape[1:]).uniform_(
                -bound, bound, generator=self.fresh[s]
            )
            with torch.no_grad():
                self.conv.weight[row] = fresh
            for parameter in (self.conv.weight, self.conv.bias):
                buffer = optimizer.state.get(parameter, {}).get("momentum_buffer")
                if buffer is not None:
                    buffer[row] = 0.0
            self.resets.append((update, row))


def train_lottery(
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    val_x: torch.Tensor,
    val_y: torch.Tensor,
    *,
    seeds,
    randomout: bool,
    n_filters: int = 2,
    bias_shift: float | None = 1.0,
    threshold: float = 1e-8,
    random_rate: float | None = None,
    epochs: int = 30,
    batch_size: int = 128,
    lr: float = 0.1,
    momentum: float = 0.9,
) -> LotteryRun:
    """Train one `FilterNet` per seed of `seeds` (as a `Lottery`) with SGD and momentum on the
    mean cross-entropy, with RandomOut (checked before every update), without it, or with the
    null that resets random filters at the fixed rate `random_rate` (`RandomResets`).

    Member s's initial weights follow `seeds[s]`, and so do its minibatches (stream BATCHES)
    and its fresh filters (stream FRESH_FILTERS; the null's: RANDOM_CHOICE and NULL_FILTERS), so
    each member's resets are what they would be if it trained alone. Runs with the same seeds
    start from the same weights, see the same batches and differ only by the resets. The runs
    without RandomOut never call the mechanism: their log (`GradientLog`) is the experiment's.
    """
    d = checks.tensor("train_x", train_x, "(N, 64)", dtype="floating")
    checks.tensor("train_y", train_y, "(N,)", N=d["N"])
    checks.tensor("val_x", val_x, "(M, 64)", dtype="floating")
    checks.tensor("val_y", val_y, "(M,)", M=val_x.shape[0])
    seeds = tuple(checks.integer("seeds", s, 0) for s in seeds)
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be one or more different integers; got {seeds}")
    checks.boolean("randomout", randomout)
    epochs, batch_size = checks.integer("epochs", epochs), checks.integer("batch_size", batch_size)
    lr = checks.number("lr", lr, 0.0, low_open=True)
    momentum = checks.number("momentum", momentum, 0.0, 1.0, high_open=True)
    if random_rate is not None:
        random_rate = checks.number("random_rate", random_rate, 0.0, 1.0)
        if randomout:
            raise ValueError("random_rate is the null without RandomOut: pass randomout=False")
    n_classes = int(train_y.max()) + 1
    nets = []
    for seed in seeds:
        with training.seeded(seed):
            nets.append(FilterNet(n_filters, bias_shift=bias_shift, n_classes=n_classes))
    model = Lottery(nets)
    if randomout:
        fresh = [training.generator(seed, FRESH_FILTERS) for seed in seeds]
        log = ro.RandomOut(model.conv, threshold, generator=fresh)
    elif random_rate is not None:
        log = RandomResets(
            model.conv,
            n_filters,
            random_rate,
            choosers=[training.generator(seed, RANDOM_CHOICE) for seed in seeds],
            fresh=[training.generator(seed, NULL_FILTERS) for seed in seeds],
        )
    else:
        log = GradientLog(model.conv)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    handle = log.attach(optimizer)
    streams = [minibatches(d["N"], batch_size, training.generator(seed, BATCHES)) for seed in seeds]
    per_epoch = d["N"] // batch_size

    def loss_of_update(_):
        index = torch.stack([next(stream) for stream in streams])  # (S, B)
        logits = model(train_x[index])  # (S, B, classes)
        # the members' mean losses, summed: cross_entropy takes (S, classes, B) against (S, B)
        return F.cross_entropy(logits.transpose(1, 2), train_y[index]) * len(seeds)

    def evaluate():
        accuracies = member_accuracy(model, val_x, val_y)
        return {"val_accuracy": accuracies.mean().item()} | {
            f"val_accuracy/{s}": a for s, a in enumerate(accuracies.tolist())
        }

    history = training.train(
        model,
        optimizer,
        loss_of_update,
        epochs * per_epoch,
        evaluate=evaluate,
        eval_every=per_epoch,
        desc="RandomOut" if randomout else ("random resets" if random_rate else "baseline"),
    )
    handle.remove()
    return LotteryRun(model, history, log, seeds, randomout)


# -- measuring the claims -------------------------------------------------------------------------


def seed_summary(accuracies: list[float]) -> dict[str, float]:
    """The spread of accuracy over seeds: the fraction of runs that fail (below 50%), the median,
    the mean, the (population) standard deviation and the worst."""
    return {
        "failed": sum(a < 0.5 for a in accuracies) / len(accuracies),
        "median": statistics.median(accuracies),
        "mean": statistics.mean(accuracies),
        "std": statistics.pstdev(accuracies),
        "min": min(accuracies),
    }


def paired_standard_error(first, second) -> float:
    """The standard error of the mean of the paired differences first[i] - second[i] (one pair
    per seed, the two arms trained from the same seed): their sample standard deviation over
    sqrt(n)."""
    d = torch.as_tensor(first, dtype=torch.float64) - torch.as_tensor(second, dtype=torch.float64)
    checks.tensor("first - second", d, "(N,)")
    if len(d) < 2:
        raise ValueError("a standard error needs two pairs at least")
    return (d.std() / math.sqrt(len(d))).item()


STATISTICS = {
    "median": lambda a: a.quantile(0.5, dim=-1),
    "std": lambda a: a.std(dim=-1, correction=0),
    "mean": lambda a: a.mean(dim=-1),
}


def bootstrap_standard_error(
    first, second, statistic: str, *, generator: torch.Generator, draws: int = 2000
) -> float:
    """The bootstrap standard error of statistic(first) - statistic(second) over seeds, the seeds
    resampled in pairs (both arms of a seed together): the standard deviation of the difference
    over `draws` resamples. `statistic` is "median" (the midpoint of the middle two for an even
    count), "std" (population) or "mean"."""
    a = torch.as_tensor(first, dtype=torch.float64)
    b = torch.as_tensor(second, dtype=torch.float64)
    n = checks.tensor("first", a, "(N,)")["N"]
    checks.tensor("second", b, "(N,)", N=n)
    checks.one_of("statistic", statistic, tuple(STATISTICS))
    draws = checks.integer("draws", draws, 2)
    stat = STATISTICS[statistic]
    index = torch.randint(n, (draws, n), generator=generator)
    return (stat(a[index]) - stat(b[index])).std().item()


def death_update(cgn_of_member: torch.Tensor) -> int | None:
    """The first update from which a filter's CGN stays at 0, of one member's CGN log
    (updates, filters); None if no filter dies."""
    stays_zero = (cgn_of_member == 0).int().flip(0).cumprod(0).flip(0)  # (updates, filters)
    dead = stays_zero.any(1)
    return int(dead.nonzero()[0]) if dead.any() else None


def epochs_to_reach(accuracies, level: float) -> int:
    """The first epoch (counted from 1) at whose end the validation accuracy `accuracies` (one
    value per epoch) reaches `level`; a run that never reaches it counts as its budget plus
    one epoch, len(accuracies) + 1, the soonest it could have (a lower bound on its time)."""
    values = torch.as_tensor(accuracies, dtype=torch.float64)
    checks.tensor("accuracies", values, "(E,)")
    level = checks.number("level", level, 0.0, 1.0)
    reached = (values >= level).nonzero()
    return int(reached[0]) + 1 if len(reached) else len(values) + 1
