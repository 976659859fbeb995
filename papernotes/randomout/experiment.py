"""The chapter's experiment (chapters/randomout.ipynb): the filter lottery on the 8x8 digits.

A convolutional network with a handful of 3x3 filters (`FilterNet`), trained from many seeds
under several rules at once (`train_lottery`) through the book's training loop: no resets,
RandomOut (the mechanism, as a hook just before each optimizer step), and the nulls, which
never look at a gradient: resets of random filters at a fixed rate, on an early schedule or
throughout (`RandomResets`), and a redraw before training of the filters that fire on too few
training images (`redraw_before_training_`). Every seed's network trains under every rule side
by side in one module (`Lottery`: a grouped convolution per rule, one group per seed), which
leaves each network's gradients, and so its CGN and its updates, as they would be alone.

RandomOut is the mechanism's (`papernotes.randomout`), looked up at call time so that a broken
variant patched into that module is the one these runs use. The nulls have code and random
streams of their own, so a broken RandomOut cannot move them.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from papernotes import checks, together, training
from papernotes import randomout as ro
from papernotes.data import IMAGE_SHAPE

# Random streams, each of a network's own seed: its minibatches, RandomOut's fresh filters, and,
# for the nulls, when and which filter a random reset hits (RANDOM_CHOICE), its fresh weights
# (NULL_FILTERS) and the redraws before training (REDRAW).
BATCHES, FRESH_FILTERS, RANDOM_CHOICE, NULL_FILTERS, REDRAW = 1, 2, 3, 4, 6
# The chapter's bootstrap over seeds draws from a stream of the chapter's seed.
BOOTSTRAP = 5


class FilterNet(nn.Module):
    """`n_filters` 3x3 filters on the 8x8 image, ReLU, and a linear classifier on the 6x6 maps.

    Weights take PyTorch's default initialisation. The convolution's biases are drawn from
    U(-bias_shift, 0), a shift towards negative pre-activations that makes some initial filters
    dead or nearly so (bias_shift = 0: biases at 0; None: PyTorch's default biases, U(-1/3, 1/3)
    for a 3x3 filter of one channel). `conv_bias=False` leaves the convolution without biases
    (then bias_shift must be None): a filter is then dead only by its weights."""

    def __init__(
        self,
        n_filters: int = 2,
        *,
        bias_shift: float | None = 1.0,
        conv_bias: bool = True,
        n_classes: int = 10,
    ):
        super().__init__()
        n_filters = checks.integer("n_filters", n_filters)
        if bias_shift is not None:
            bias_shift = checks.number("bias_shift", bias_shift, 0.0)
        conv_bias = checks.boolean("conv_bias", conv_bias)
        if not conv_bias and bias_shift is not None:
            raise ValueError("bias_shift must be None when conv_bias is False (no biases)")
        n_classes = checks.integer("n_classes", n_classes, 2)
        self.conv = nn.Conv2d(1, n_filters, kernel_size=3, bias=conv_bias)
        with torch.no_grad():
            if bias_shift is None:
                pass  # PyTorch's default bias (drawn by nn.Conv2d), or none
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


def firing_fraction(weight: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor):
    """For filters of weights (R, 9) and biases (R,) (or None), the fraction of the images `x`
    (N, 64) on which each fires, its ReLU output positive at one position at least: (R,).
    `x` may also be the images' patches, (N, 9, 36), cut once by `patches_of`."""
    patches = x if x.dim() == 3 else patches_of(x)
    pre = torch.einsum("rk,nkp->rnp", weight, patches)
    if bias is not None:
        pre = pre + bias.view(-1, 1, 1)
    return (pre.amax(dim=2) > 0).float().mean(dim=1)


def patches_of(x: torch.Tensor) -> torch.Tensor:
    """The 3x3 patches of images x (N, 64): (N, 9, 36), pixel i of the kernel at position p."""
    return x[:, _PATCHES.flatten()].reshape(len(x), 9, -1)


class Lottery(nn.Module):
    """Several `FilterNet`s side by side, trained as one module: the filter lottery drawn for
    many seeds, and for several arms, at once.

    `Lottery(nets, arms=A)` holds A copies of the S networks `nets`, seed-major: member
    k = s A + a is arm a's copy of network s (so that the arms' maps of one seed's batch, one
    product, are the members' maps without a copy). Each arm's filters are one `nn.Conv2d` of their
    own, `conv_of(a)` (rows s F to s F + F - 1 are network s's filters, as in a grouped
    convolution), so that a rule that resets filters by their gradient sees its own arm's
    gradients only; the classifiers are one batched matrix product over all members. Member k
    sees only its own images, and the loss is the sum of the members' mean cross-entropies, so
    each member's gradient, and so its CGN, is exactly what it would be trained alone; SGD with
    momentum acts elementwise, so each member's updates are too. `member(k)` gives member k
    back as a `FilterNet`.

    Why not the book's shared stacks (`papernotes.together`): they hold a member's weights as
    slices of stacked tensors, and RandomOut acts on the filters of an `nn.Conv2d`, the rows of
    its weight and of its gradient.
    """

    def __init__(self, nets: list[FilterNet], arms: int = 1):
        super().__init__()
        if not nets or not all(isinstance(net, FilterNet) for net in nets):
            raise TypeError("nets must be a non-empty list of FilterNet")
        shapes = {(n.conv.out_channels, n.head.out_features, n.conv.bias is not None) for n in nets}
        if len(shapes) != 1:
            raise ValueError(
                f"nets must all have the same filters, classes and biases; got {shapes}"
            )
        (self.n_filters, self.n_classes, has_bias) = shapes.pop()
        self.arms = checks.integer("arms", arms)
        self.seeds = len(nets)
        self.members = self.arms * self.seeds
        weight = torch.cat([net.conv.weight.detach() for net in nets])
        bias = torch.cat([net.conv.bias.detach() for net in nets]) if has_bias else None
        self.convs = nn.ModuleList()
        for _ in range(self.arms):
            conv = nn.Conv2d(self.seeds, self.seeds * self.n_filters, 3, groups=self.seeds)
            conv.bias = nn.Parameter(bias.clone()) if has_bias else None
            with torch.no_grad():
                conv.weight.copy_(weight)
            self.convs.append(conv)
        heads = [net.head for net in nets for _ in range(self.arms)]
        self.head_weight = nn.Parameter(torch.stack([h.weight.detach() for h in heads]))
        self.head_bias = nn.Parameter(torch.stack([h.bias.detach() for h in heads]))

    def conv_of(self, arm: int) -> nn.Conv2d:
        """Arm `arm`'s filters: row s F + f is filter f of network s."""
        arm = checks.integer("arm", arm, 0)
        if arm >= self.arms:
            raise ValueError(f"arm must be below the number of arms, {self.arms}; got {arm}")
        return self.convs[arm]

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """ReLU maps (K, filters * 36, B) of images x: (S, B, 64), network s's batch, which
        every arm's copy of network s sees, or (B, 64), the same images for every member.
        Column b holds image b's maps, flattened as a FilterNet flattens them.

        Every member's convolution is one batched matrix product over the images' 3x3 patches
        (im2col), one product per batch of images: the patches of a seed's batch are cut once
        for all arms. On a CPU and at this size, several times faster than `conv2d` with
        groups, and the same numbers (tests/test_randomout.py checks it)."""
        shared = x.dim() == 2
        x = x.unsqueeze(0) if shared else x
        groups, batch = x.shape[0], x.shape[1]
        if not shared and groups != self.seeds:
            raise ValueError(f"x must hold one batch per seed ({self.seeds}); got {groups}")
        pixels = x.transpose(1, 2).contiguous()  # (G, 64, B)
        patches = torch.index_select(pixels, 1, _PATCHES.flatten())  # (G, 9 * 36, B)
        patches = patches.reshape(groups, 9, -1)  # (G, 9, 36 * B)
        w = self._by_group(torch.cat([conv.weight for conv in self.convs]), shared, 9)
        if self.convs[0].bias is None:
            maps = F.relu(torch.bmm(w, patches))  # (G, rows, 36 * B)
        else:
            b = self._by_group(torch.cat([conv.bias for conv in self.convs]), shared, 1)
            maps = F.relu(torch.baddbmm(b, w, patches))
        # rows (seed, arm, filter), columns (position, image): member s A + a's maps, a view
        return maps.reshape(self.members, -1, batch)

    def _by_group(self, rows: torch.Tensor, shared: bool, width: int) -> torch.Tensor:
        """The arms' filter rows (A S F, ...) in member order, (S, A F, width): network s's
        filters of every arm, beside its batch; (1, K F, width) for shared images."""
        by_arm = rows.reshape(self.arms, self.seeds, self.n_filters, width)
        by_seed = by_arm.transpose(0, 1).reshape(self.seeds, -1, width)
        return by_seed.reshape(1, -1, width) if shared else by_seed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(S, B, 64) or (B, 64) as in `features` -> logits (K, B, classes) (a transposed
        view of `class_logits`)."""
        return self.class_logits(x).transpose(1, 2)

    def class_logits(self, x: torch.Tensor) -> torch.Tensor:
        """(S, B, 64) or (B, 64) as in `features` -> logits (K, classes, B), the layout the
        batched products give."""
        return torch.baddbmm(self.head_bias.unsqueeze(2), self.head_weight, self.features(x))

    def arm_class_logits(self, x: torch.Tensor, arm: int) -> torch.Tensor:
        """Logits (S, classes, N) of arm `arm`'s networks alone on the same images x (N, 64),
        computed as `class_logits` computes them (one batched product)."""
        conv = self.conv_of(arm)
        pixels = x.transpose(0, 1).contiguous()  # (64, N)
        patches = torch.index_select(pixels, 0, _PATCHES.flatten()).reshape(1, 9, -1)
        w = conv.weight.reshape(1, -1, 9)
        if conv.bias is None:
            maps = F.relu(torch.bmm(w, patches))  # (1, S F, 36 N)
        else:
            maps = F.relu(torch.baddbmm(conv.bias.reshape(1, -1, 1), w, patches))
        rows = slice(arm, self.members, self.arms)  # members s A + arm
        features = maps.reshape(self.seeds, -1, x.shape[0])
        return torch.baddbmm(self.head_bias[rows].unsqueeze(2), self.head_weight[rows], features)

    def member(self, k: int) -> FilterNet:
        """Member `k` as a stand-alone FilterNet (a copy of its current weights)."""
        k = checks.integer("k", k, 0)
        if k >= self.members:
            raise ValueError(f"k must be below the number of members, {self.members}; got {k}")
        conv, s = self.convs[k % self.arms], k // self.arms
        has_bias = conv.bias is not None
        net = FilterNet(
            self.n_filters,
            bias_shift=0.0 if has_bias else None,
            conv_bias=has_bias,
            n_classes=self.n_classes,
        )
        rows = slice(s * self.n_filters, (s + 1) * self.n_filters)
        with torch.no_grad():
            net.conv.weight.copy_(conv.weight[rows])
            if has_bias:
                net.conv.bias.copy_(conv.bias[rows])
            net.head.weight.copy_(self.head_weight[k])
            net.head.bias.copy_(self.head_bias[k])
        return net.eval()


def member_accuracy(model: Lottery, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Each member's accuracy on the same images `x` (N, 64) with labels `y` (N,): (K,)."""
    n = checks.tensor("x", x, "(N, 64)", dtype="floating")["N"]
    checks.tensor("y", y, "(N,)", N=n)
    with torch.no_grad():
        return (model.class_logits(x).max(dim=1).indices == y).float().mean(dim=1)


def member_dead_filters(model: Lottery, x: torch.Tensor) -> torch.Tensor:
    """`dead_filters` of every member on images `x` (N, 64): a bool tensor (K, filters)."""
    return torch.stack([dead_filters(model.member(k), x) for k in range(model.members)])


# -- the rules an arm follows: RandomOut, and the nulls --------------------------------------------


@dataclass(frozen=True)
class NoResets:
    """The baseline: no filter is ever reset."""


@dataclass(frozen=True)
class ByCGN:
    """RandomOut (the mechanism, `papernotes.randomout`): before every update, a new draw of
    the weights of every filter whose CGN is below `threshold`."""

    threshold: float


@dataclass(frozen=True)
class AtRandom:
    """A null: before every update (of the first `until` updates only, when given), each
    network, with probability `rate`, redraws one of its filters chosen at random."""

    rate: float
    until: int | None = None


@dataclass(frozen=True)
class BeforeTraining:
    """A null: before training, each filter that fires on fewer than `min_fraction` of the
    training images is drawn again until it fires on that many (0: no redraw)."""

    min_fraction: float


RULES = (NoResets, ByCGN, AtRandom, BeforeTraining)


def _check_rule(name: str, rule) -> None:
    if not isinstance(rule, RULES):
        raise TypeError(
            f"rules[{name!r}] must be NoResets, ByCGN, AtRandom or BeforeTraining; got "
            f"{type(rule).__name__}"
        )
    if isinstance(rule, ByCGN):
        checks.number(f"rules[{name!r}].threshold", rule.threshold, 0.0)
    if isinstance(rule, AtRandom):
        checks.number(f"rules[{name!r}].rate", rule.rate, 0.0, 1.0)
        if rule.until is not None:
            checks.integer(f"rules[{name!r}].until", rule.until, 0)
    if isinstance(rule, BeforeTraining):
        checks.number(f"rules[{name!r}].min_fraction", rule.min_fraction, 0.0, 1.0)


def _filter_norms(conv: nn.Conv2d) -> torch.Tensor:
    """Each filter's absolute gradient summed over its weights, measured for the runs without
    RandomOut by the experiment's own code (a broken mechanism must not reach the nulls)."""
    return conv.weight.grad.detach().abs().sum(dim=(1, 2, 3))


class GradientLog:
    """The log of the runs without RandomOut: each filter's gradient norm before every update
    (`cgn`, (updates, filters)) and the resets a null made (`resets`, (update, row) pairs)."""

    def __init__(self, conv: nn.Conv2d):
        self.conv = conv
        self._cgn: list[list[float]] = []  # floats, as RandomOut logs them (no tensor kept)
        self.resets: list[tuple[int, int]] = []

    def attach(self, optimizer: torch.optim.Optimizer):
        return optimizer.register_step_pre_hook(lambda opt, args, kwargs: self._before_step(opt))

    def _before_step(self, optimizer: torch.optim.Optimizer) -> None:
        self._cgn.append(_filter_norms(self.conv).tolist())

    @property
    def cgn(self) -> torch.Tensor:
        return torch.tensor(self._cgn) if self._cgn else torch.empty(0, self.conv.out_channels)


def _redraw_rows_(conv: nn.Conv2d, rows: list[int], generators, n_filters: int) -> None:
    """The null's own redraw: the weights of `rows` from U(-1/sqrt(n), 1/sqrt(n)), each from
    its network's generator; biases kept."""
    bound = 1.0 / math.sqrt(conv.weight[0].numel())
    with torch.no_grad():
        for row in rows:
            fresh = torch.empty(conv.weight.shape[1:]).uniform_(
                -bound, bound, generator=generators[row // n_filters]
            )
            conv.weight[row] = fresh


class RandomResets(GradientLog):
    """The null that resets filters without looking at their gradient: before every update
    (before update `until` only, when given: an early schedule) each network, with probability
    `rate`, draws the weights of one of its filters, chosen uniformly, again from the layer's
    initial distribution U(-1/sqrt(n), 1/sqrt(n)), keeps its bias and clears its momentum, as
    RandomOut resets a filter. The rate and the schedule are fixed in advance, so neither when
    nor where a reset happens depends on the CGN.

    Its own code and its own random streams (`choosers` decide when and which, `fresh` deal the
    new weights, one generator of each per network), so a broken RandomOut cannot move it."""

    def __init__(
        self, conv: nn.Conv2d, n_filters: int, rate: float, *, choosers, fresh, until=None
    ):
        super().__init__(conv)
        self.n_filters = checks.integer("n_filters", n_filters)
        self.rate = checks.number("rate", rate, 0.0, 1.0)
        self.until = None if until is None else checks.integer("until", until, 0)
        self.choosers, self.fresh = list(choosers), list(fresh)
        if len(self.choosers) * self.n_filters != conv.out_channels or len(self.fresh) != len(
            self.choosers
        ):
            raise ValueError("one chooser and one fresh-filter generator per network")

    def _before_step(self, optimizer: torch.optim.Optimizer) -> None:
        super()._before_step(optimizer)
        update = len(self._cgn) - 1
        if self.until is not None and update >= self.until:
            return
        for s, chooser in enumerate(self.choosers):
            # two draws per network and update, whatever the outcome: the streams stay aligned
            fires = torch.rand((), generator=chooser).item() < self.rate
            k = int(torch.randint(self.n_filters, (), generator=chooser))
            if not fires:
                continue
            row = s * self.n_filters + k
            _redraw_rows_(self.conv, [row], self.fresh, self.n_filters)
            for parameter in (self.conv.weight, self.conv.bias):
                buffer = optimizer.state.get(parameter, {}).get("momentum_buffer")
                if buffer is not None:
                    buffer[row] = 0.0
            self.resets.append((update, row))


def redraw_before_training_(
    conv: nn.Conv2d,
    n_filters: int,
    x: torch.Tensor,
    min_fraction: float,
    generators,
    *,
    max_draws: int = 1000,
) -> list[int]:
    """The null that needs no gradient: before training, draw the weights of every filter
    that fires on fewer than `min_fraction` of the images `x` (N, 64) again (biases kept), from
    its network's generator, until it fires on that many, or `max_draws` draws. Returns the
    draws each filter took (0: kept its first weights). `min_fraction` = 0 redraws none; any
    value up to 1 / N redraws the filters dead on `x` only."""
    checks.tensor("x", x, "(N, 64)", dtype="floating")
    min_fraction = checks.number("min_fraction", min_fraction, 0.0, 1.0)
    max_draws = checks.integer("max_draws", max_draws)
    draws = [0] * conv.out_channels
    rows = list(range(conv.out_channels))
    patches = patches_of(x)
    with torch.no_grad():
        for _ in range(max_draws + 1):
            bias = None if conv.bias is None else conv.bias[rows]
            fraction = firing_fraction(conv.weight[rows].reshape(len(rows), -1), bias, patches)
            rows = [row for row, f in zip(rows, fraction.tolist(), strict=True) if f < min_fraction]
            rows = [row for row in rows if draws[row] < max_draws]
            if not rows:
                break
            _redraw_rows_(conv, rows, generators, n_filters)
            for row in rows:
                draws[row] += 1
    return draws


@dataclass
class LotteryRun(training.Run):
    """One arm's networks, trained from `seeds` beside the other arms: the model (the whole
    Lottery; this arm's members are s A + arm for each network s), its History (per epoch,
    "accuracy/<s>", network s's accuracy on the split `train_lottery` was given for its curves,
    and "accuracy", their mean), the log of its rule (`log.cgn`, reshaped to (updates, networks,
    filters) by `cgn`; `log.resets` holds (update, row) pairs), and `draws`, the redraws before
    training of each filter (BeforeTraining; zeros otherwise)."""

    log: ro.RandomOut | GradientLog
    seeds: tuple[int, ...]
    rule: NoResets | ByCGN | AtRandom | BeforeTraining
    arm: int
    draws: list[int]

    @property
    def members(self) -> range:
        return range(self.arm, self.model.members, self.model.arms)

    @property
    def cgn(self) -> torch.Tensor:
        return self.log.cgn.reshape(-1, len(self.seeds), self.model.n_filters)

    def accuracy(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Each network's accuracy on `x` (N, 64), `y` (N,): (S,)."""
        n = checks.tensor("x", x, "(N, 64)", dtype="floating")["N"]
        checks.tensor("y", y, "(N,)", N=n)
        with torch.no_grad():
            logits = self.model.arm_class_logits(x, self.arm)
        return (logits.max(dim=1).indices == y).float().mean(dim=1)

    def dead_filters(self, x: torch.Tensor) -> torch.Tensor:
        """Each network's dead filters on `x` (N, 64), those that fire on none of its images: a
        bool tensor (S, filters)."""
        checks.tensor("x", x, "(N, 64)", dtype="floating")
        conv = self.model.conv_of(self.arm)
        with torch.no_grad():
            fraction = firing_fraction(conv.weight.reshape(conv.out_channels, -1), conv.bias, x)
        return (fraction == 0).reshape(len(self.seeds), self.model.n_filters)

    def resets_per_member(self) -> list[int]:
        counts = [0] * len(self.seeds)
        for _, row in self.log.resets:
            counts[row // self.model.n_filters] += 1
        return counts


def _rule_log(rule, conv: nn.Conv2d, seeds, n_filters: int):
    """The hook of an arm's rule on its own filters, with its own random streams."""
    if isinstance(rule, ByCGN):
        fresh = [training.generator(seed, FRESH_FILTERS) for seed in seeds]
        return ro.RandomOut(conv, rule.threshold, generator=fresh)
    if isinstance(rule, AtRandom):
        return RandomResets(
            conv,
            n_filters,
            rule.rate,
            choosers=[training.generator(seed, RANDOM_CHOICE) for seed in seeds],
            fresh=[training.generator(seed, NULL_FILTERS) for seed in seeds],
            until=rule.until,
        )
    return GradientLog(conv)


def train_lottery(
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    curve_x: torch.Tensor,
    curve_y: torch.Tensor,
    *,
    seeds,
    rules: dict,
    n_filters: int = 2,
    bias_shift: float | None = 1.0,
    conv_bias: bool = True,
    epochs: int = 30,
    batch_size: int = 128,
    lr: float = 0.1,
    momentum: float = 0.9,
) -> dict[str, LotteryRun]:
    """Train one `FilterNet` per seed of `seeds` under each rule of `rules` (a name to
    `NoResets()`, `ByCGN(threshold)` for RandomOut, `AtRandom(rate, until)` or
    `BeforeTraining(min_fraction)`), all of them side by side as one `Lottery`, with SGD and
    momentum on the mean cross-entropy; returns each rule's `LotteryRun`, by name. Every
    network's accuracy on `curve_x`, `curve_y` is logged at the end of each epoch.

    Network s's initial weights follow `seeds[s]`, the same under every rule, and so do its
    minibatches (stream BATCHES), RandomOut's fresh filters (FRESH_FILTERS) and the nulls'
    draws (RANDOM_CHOICE and NULL_FILTERS; REDRAW before training), so each network's resets
    are what they would be if it trained alone: the runs of one seed differ only by their
    rule. Only RandomOut's arms call the mechanism; the others' logs are the experiment's.
    """
    d = checks.tensor("train_x", train_x, "(N, 64)", dtype="floating")
    checks.tensor("train_y", train_y, "(N,)", N=d["N"])
    checks.tensor("curve_x", curve_x, "(M, 64)", dtype="floating")
    checks.tensor("curve_y", curve_y, "(M,)", M=curve_x.shape[0])
    seeds = tuple(checks.integer("seeds", s, 0) for s in seeds)
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be one or more different integers; got {seeds}")
    if not isinstance(rules, dict) or not rules:
        raise TypeError("rules must be a non-empty dict of a name to a rule")
    for name, rule in rules.items():
        _check_rule(name, rule)
    epochs, batch_size = checks.integer("epochs", epochs), checks.integer("batch_size", batch_size)
    lr = checks.number("lr", lr, 0.0, low_open=True)
    momentum = checks.number("momentum", momentum, 0.0, 1.0, high_open=True)
    n_classes = int(train_y.max()) + 1
    nets = []
    for seed in seeds:
        with training.seeded(seed):
            nets.append(
                FilterNet(
                    n_filters, bias_shift=bias_shift, conv_bias=conv_bias, n_classes=n_classes
                )
            )
    model = Lottery(nets, arms=len(rules))
    draws = {}
    for arm, (name, rule) in enumerate(rules.items()):
        draws[name] = [0] * (len(seeds) * n_filters)
        if isinstance(rule, BeforeTraining):
            draws[name] = redraw_before_training_(
                model.conv_of(arm),
                n_filters,
                train_x,
                rule.min_fraction,
                [training.generator(seed, REDRAW) for seed in seeds],
            )
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    logs = {
        name: _rule_log(rule, model.conv_of(arm), seeds, n_filters)
        for arm, (name, rule) in enumerate(rules.items())
    }
    handles = [log.attach(optimizer) for log in logs.values()]
    batches = together.minibatches(
        d["N"], batch_size, [training.generator(seed, BATCHES) for seed in seeds]
    )
    per_epoch = d["N"] // batch_size

    def loss_of_update(_):
        index = next(batches)  # (S, B): every arm's copy of network s sees seed s's batch
        targets = train_y[index].repeat_interleave(len(rules), dim=0)  # (K, B), member s A + a
        # the members' mean losses, summed: each member's gradient is its own loss's
        each = F.cross_entropy(model.class_logits(train_x[index]), targets, reduction="none")
        return each.mean(dim=1).sum()

    def evaluate():
        accuracy = member_accuracy(model, curve_x, curve_y).tolist()
        return {f"accuracy/{k}": a for k, a in enumerate(accuracy)}

    shared = training.train(
        model,
        optimizer,
        loss_of_update,
        epochs * per_epoch,
        evaluate=evaluate,
        eval_every=per_epoch,
        desc="filter lottery",
    )
    for handle in handles:
        handle.remove()
    return {
        name: LotteryRun(
            model,
            _arm_history(shared, arm, len(rules), len(seeds)),
            logs[name],
            seeds,
            rule,
            arm,
            draws[name],
        )
        for arm, (name, rule) in enumerate(rules.items())
    }


def _arm_history(shared: training.History, arm: int, arms: int, n: int) -> training.History:
    """Arm `arm`'s part of the lottery's History: its networks' accuracies under their own
    index (network s of the arm is member s A + arm), and their mean."""
    history = training.History()
    for i, step in enumerate(shared.steps):
        each = [shared[f"accuracy/{s * arms + arm}"][i] for s in range(n)]
        values = {"loss": shared["loss"][i], "accuracy": statistics.mean(each)}
        history.log(step, values | {f"accuracy/{s}": a for s, a in enumerate(each)})
    return history


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


FAILED = 0.5  # a run below this test accuracy failed to train


def paired_failures(first, second) -> tuple[int, int]:
    """McNemar's discordant pairs of two arms trained from the same seeds: (runs that fail in
    `second` only, runs that fail in `first` only), a run failing below 50% accuracy."""
    a = torch.as_tensor(first, dtype=torch.float64)
    b = torch.as_tensor(second, dtype=torch.float64)
    n = checks.tensor("first", a, "(N,)")["N"]
    checks.tensor("second", b, "(N,)", N=n)
    fail_a, fail_b = a < FAILED, b < FAILED
    return int((fail_b & ~fail_a).sum()), int((fail_a & ~fail_b).sum())


def failure_bound(first, second, k: float = 2.0) -> float:
    """The most failed runs `first` may have to beat `second` by k standard errors of the
    paired count (McNemar): second's failures less k sqrt(discordant pairs); with b runs failing
    in second only and c in first only, first's count is below it when b - c > k sqrt(b + c)."""
    k = checks.number("k", k, 0.0)
    only_second, only_first = paired_failures(first, second)
    failed_second = sum(v < FAILED for v in second)
    return failed_second - k * math.sqrt(only_second + only_first)


def choose_with_ties(per_seed: dict, prefer, k: float = 1.0):
    """The grid value whose mean over seeds is best (`per_seed`: value -> one score a seed, the
    seeds paired), except that `prefer` is kept when the best beats it by no more than k
    standard errors of their paired difference: a tie goes to `prefer`."""
    if prefer not in per_seed:
        raise ValueError(
            f"prefer must be one of the grid's values {list(per_seed)}; got {prefer!r}"
        )
    k = checks.number("k", k, 0.0)
    best = max(per_seed, key=lambda value: statistics.mean(per_seed[value]))
    gap = statistics.mean(per_seed[best]) - statistics.mean(per_seed[prefer])
    if best == prefer or gap <= k * paired_standard_error(per_seed[best], per_seed[prefer]):
        return prefer
    return best
