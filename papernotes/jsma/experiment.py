"""The chapter's experiment around the saliency-map attack (papernotes.jsma): the networks under
attack, their training, the attacked sample and the measurements of its tables and claims.

The attack itself is `papernotes.jsma`; this module calls it through the module (`jsma.name`),
so a mutant patched there reaches the chapter.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from papernotes import checks, jsma, training
from papernotes.data import IMAGE_SHAPE, N_CLASSES, Digits, minibatches

# The random streams of a run (generator(seed, stream)); the integers the chapter's numbers were
# drawn with: minibatches, the test digits attacked, random pairs, the validation digits attacked.
BATCHES, SAMPLE, RANDOM_PAIRS, VALIDATION_SAMPLE = 1, 2, 3, 4


# -- the networks under attack --------------------------------------------------------------------


class CNN(nn.Module):
    """A small LeNet-like network for 8x8 digits: two 3x3 convolutions (the second after a 2x2
    max-pool), a ReLU hidden layer and 10 logits. Takes flattened images (B, 64)."""

    def __init__(self, channels: int = 16, hidden: int = 64):
        super().__init__()
        checks.integer("channels", channels)
        checks.integer("hidden", hidden)
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(channels, 2 * channels, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(8 * channels, hidden), nn.ReLU(), nn.Linear(hidden, N_CLASSES)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x.reshape(-1, 1, *IMAGE_SHAPE)))


def train_classifier(
    digits: Digits,
    *,
    cnn: bool = False,
    lr: float = 3e-3,
    steps: int = 600,
    batch_size: int = 64,
    seed: int,
) -> training.Run:
    """Train the perceptron (64 pixels -> 128 ReLU units -> 10 logits) or, with `cnn=True`, the
    CNN, with Adam on cross-entropy, logging the validation accuracy. Weights and batches follow
    `seed`."""
    checks.boolean("cnn", cnn)
    checks.number("lr", lr, 0.0, low_open=True)
    checks.integer("steps", steps)
    checks.integer("batch_size", batch_size)
    checks.integer("seed", seed, 0)
    with training.seeded(seed):
        model = CNN() if cnn else training.mlp([digits.n_pixels, 128, N_CLASSES])
    history = training.train_classifier(
        model,
        digits.train_y,
        torch.optim.Adam(model.parameters(), lr=lr),
        steps,
        batches=minibatches(len(digits.train_x), batch_size, training.generator(seed, BATCHES)),
        logits_of=lambda index: model(digits.train_x[index]),
        evaluate=lambda: {"val_accuracy": training.accuracy(model(digits.val_x), digits.val_y)},
        eval_every=max(1, steps // 6),
        desc="CNN" if cnn else "MLP",
    )
    return training.Run(model, history)


def untrained_perceptron(n_pixels: int, *, seed: int) -> nn.Module:
    """The perceptron that `train_classifier(seed=seed)` starts from, before any update: the
    guide of the untrained network's null."""
    checks.integer("n_pixels", n_pixels)
    checks.integer("seed", seed, 0)
    with training.seeded(seed):
        return training.mlp([n_pixels, 128, N_CLASSES])


# -- the attacked sample --------------------------------------------------------------------------


def correctly_classified(
    labels: torch.Tensor, predictions: torch.Tensor, per_class: int, generator: torch.Generator
) -> torch.Tensor:
    """Indices of `per_class` correctly classified examples of each class, drawn without
    replacement class by class (class 0 first), in the order drawn."""
    checks.tensor("labels", labels, "(N,)", dtype=torch.int64)
    checks.tensor("predictions", predictions, "(N,)", N=len(labels))
    checks.integer("per_class", per_class)
    return torch.cat(
        [
            correct[torch.randperm(len(correct), generator=generator)[:per_class]]
            for correct in (
                ((labels == d) & (predictions == d)).nonzero().squeeze(1) for d in range(N_CLASSES)
            )
        ]
    )


def other_classes(labels: torch.Tensor) -> torch.Tensor:
    """For each label, the nine other classes in increasing order: the targets of its attacks,
    (9 N,) (repeat each input 9 times with `repeat_interleave(9, dim=0)` to match)."""
    checks.tensor("labels", labels, "(N,)", dtype=torch.int64)
    return torch.tensor([t for s in labels.tolist() for t in range(N_CLASSES) if t != s])


# -- measurements ---------------------------------------------------------------------------------


def success_rate(attack: jsma.Attack, budget: float, rows=slice(None)) -> float:
    """The share of the attacks (of `rows`) that reach their target within the budget."""
    return jsma.success_within(attack, budget)[rows].float().mean().item()


def distortion(attack: jsma.Attack, budget: float, rows=slice(None)) -> float:
    """The mean share of features changed by the attacks (of `rows`) that succeed within the
    budget; NaN when none does."""
    succeeded = jsma.success_within(attack, budget)[rows]
    return attack.changed[rows][succeeded].mean().item() if succeeded.any() else math.nan


def pair_hardness(
    attack: jsma.Attack,
    budgets: list[float],
    rows,
    strip: bool = True,
    per_success: bool = False,
) -> float:
    """H(s, t) of the attacks of `rows` over the increasing `budgets` (a budget with no success
    yet contributes a distortion of 0, which `jsma.hardness` skips), with the book's strip below
    the first success rate or, `strip=False`, the paper's trapezoids alone.

    `per_success=True` divides H by the success rate at the last budget: the area per unit of
    success reached, the mean distortion along the curve. In the paper every curve ends near a
    success of 1, where the two agree; here some cells stop far short, and their area alone would
    read them as easy. A cell with no success has no such value (NaN)."""
    rates = [success_rate(attack, b, rows) for b in budgets]
    area = jsma.hardness(
        rates,
        [
            distortion(attack, b, rows) if r > 0 else 0.0
            for b, r in zip(budgets, rates, strict=True)
        ],
        strip=strip,
    )
    if not per_success:
        return area
    # H / tau_K: the area per unit of the success the curve reaches
    return area / rates[-1] if rates[-1] > 0 else math.nan


def per_class_pair(
    measure: Callable[[torch.Tensor], float], source: torch.Tensor, target: torch.Tensor
) -> torch.Tensor:
    """A (10, 10) matrix of `measure(rows)` over the attacks from source class s to target
    class t (rows a boolean mask), NaN on the diagonal."""
    matrix = torch.full((N_CLASSES, N_CLASSES), math.nan, dtype=torch.float64)
    for s in range(N_CLASSES):
        for t in range(N_CLASSES):
            if s != t:
                matrix[s, t] = measure((source == s) & (target == t))
    return matrix


def clustered_mean(values: torch.Tensor, clusters: torch.Tensor) -> tuple[float, float]:
    """The mean of per-attack `values` (N,) and its standard error when the attacks come in
    clusters (the nine attacks of one source digit share it): the cluster-robust variance of a
    mean, the squared sums of each cluster's residuals over N^2, with the small-sample factor
    C / (C - 1) for C clusters. `clusters` is int64 (N,)."""
    n = checks.tensor("values", values, "(N,)", dtype="floating")["N"]
    checks.tensor("clusters", clusters, "(N,)", dtype=torch.int64, N=n)
    _, index, sizes = clusters.unique(return_inverse=True, return_counts=True)
    if len(sizes) < 2:
        raise ValueError("a clustered standard error needs two clusters at least")
    d = values.double()
    mean = d.mean()
    # var = C / (C - 1) * sum_c (sum_{i in c} (d_i - mean))^2 / N^2
    residual = torch.zeros(len(sizes), dtype=torch.float64).index_add_(0, index, d - mean)
    c = len(sizes)
    variance = c / (c - 1) * residual.pow(2).sum() / n**2
    return mean.item(), variance.sqrt().item()


def paired_difference(
    a: torch.Tensor, b: torch.Tensor, clusters: torch.Tensor
) -> tuple[float, float]:
    """The difference of two success rates measured on the same attacks, mean(a) - mean(b), and
    its standard error clustered by source digit (`clustered_mean` of the per-attack
    differences). a and b are boolean (N,), clusters int64 (N,)."""
    n = checks.tensor("a", a, "(N,)", dtype=torch.bool)["N"]
    checks.tensor("b", b, "(N,)", dtype=torch.bool, N=n)
    return clustered_mean(a.double() - b.double(), clusters)


def gap_beyond(
    first: tuple[torch.Tensor, torch.Tensor],
    second: tuple[torch.Tensor, torch.Tensor],
    clusters: torch.Tensor,
) -> tuple[float, float]:
    """How much wider one pair of attacks' gap in success is than another's, on the same attacks:
    mean((a1 - b1) - (a2 - b2)) for first = (a1, b1), second = (a2, b2), each a boolean (N,),
    and its clustered standard error (the difference of two paired differences)."""
    (a1, b1), (a2, b2) = first, second
    for name, t in (("a1", a1), ("b1", b1), ("a2", a2), ("b2", b2)):
        checks.tensor(name, t, "(N,)", dtype=torch.bool, N=len(a1))
    return clustered_mean((a1.double() - b1.double()) - (a2.double() - b2.double()), clusters)


def three_standard_errors(p: float, q: float, n: int) -> float:
    """Three standard errors of the difference of two success rates p and q, each over n
    attacks: the margin a difference must beat to be more than sampling noise."""
    return 3 * math.sqrt((p * (1 - p) + q * (1 - q)) / n)


# -- the nulls: attacks without the saliency map, by code of their own ----------------------------
#
# The chapter's nulls are the same greedy pair search with its pairs chosen without the saliency
# map: scored by the target's derivative alone (the ablation of the saliency map's condition on
# the other classes) or drawn at random (no derivative at all). They are written here again, with
# their own derivative, search domain and loop, so that a broken mechanism (tests/mutants/jsma.py
# patches papernotes.jsma) cannot move them.


def _null_jacobian(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The logits' Jacobian (B, classes, features), by torch's own routine rather than the
    mechanism's `_jacobian`, so that a broken forward derivative cannot steer the nulls."""
    # Each example's logits depend on that example only, so the Jacobian of the logits summed
    # over the batch, (classes, B, features), holds every example's rows.
    summed = torch.autograd.functional.jacobian(lambda inputs: model(inputs).sum(0), x.detach())
    return summed.transpose(0, 1).contiguous()


NULL_RULES = ("target alone", "random")


def null_attack(
    model: nn.Module,
    x: torch.Tensor,
    target: torch.Tensor,
    theta: float,
    max_distortion: float,
    *,
    rule: str,
    generator: torch.Generator | None = None,
    clip: tuple[float, float] = (0.0, 1.0),
    guide: nn.Module | None = None,
) -> jsma.Attack:
    """The pair search without the saliency map, on a batch: the same budget of
    floor(M * max_distortion / 2) pairs, the same step theta with clipping, the same search domain
    (features not yet at the bound theta moves them to) and the same stops (the target reached,
    the budget spent, no pair left) as `jsma.jsma`, with each pair chosen by `rule`:

    - "target alone": the pair with the largest |alpha| among those whose alpha moves the
      target's logit the right way (alpha > 0 raising, < 0 lowering), whatever the other classes
      do; no such pair ends the search;
    - "random": two features of the search domain drawn uniformly (`generator`).

    `guide`: the network whose derivative scores the pairs (by default `model`, the network
    attacked, which always judges success): the untrained network's null steers the search by
    the attacked network's initial weights.
    """
    checks.tensor("x", x, "(B, M)", dtype="floating")
    checks.tensor("target", target, "(B,)", dtype=torch.int64, B=len(x))
    theta = checks.number("theta", theta)
    if theta == 0:
        raise ValueError("theta must be non-zero: its sign says whether features rise or fall")
    checks.number("max_distortion", max_distortion, 0.0, 1.0, low_open=True)
    checks.one_of("rule", rule, NULL_RULES)
    if rule == "random" and not isinstance(generator, torch.Generator):
        raise TypeError("the random rule needs a torch.Generator")
    low, high = clip
    if (x < low).any() or (x > high).any():
        raise ValueError(f"x must lie inside clip = {clip!r}")
    m = x.shape[1]
    budget = math.floor(m * max_distortion / 2 + 1e-9)

    def movable(values):
        return values < high if theta > 0 else values > low

    x_adv = x.detach().clone()
    domain = movable(x_adv)
    with torch.no_grad():
        success = model(x_adv).argmax(1) == target
    active = ~success & (domain.sum(1) >= 2)
    not_self = ~torch.eye(m, dtype=torch.bool)
    for _ in range(budget):
        rows = active.nonzero().squeeze(1)
        if len(rows) == 0:
            break
        gamma = domain[rows]
        if rule == "random":
            keys = torch.rand(gamma.shape, generator=generator).masked_fill(~gamma, -1.0)
            chosen = torch.zeros_like(gamma).scatter_(1, keys.topk(2, dim=1).indices, True)
            found = gamma.sum(1) >= 2
            chosen &= gamma
        else:
            jacobian = _null_jacobian(model if guide is None else guide, x_adv[rows])
            d_target = jacobian[torch.arange(len(rows)), target[rows]]  # (R, M)
            alpha = d_target[:, :, None] + d_target[:, None, :]
            allowed = gamma[:, :, None] & gamma[:, None, :] & not_self
            right_way = alpha > 0 if theta > 0 else alpha < 0
            scores = torch.where(allowed & right_way, alpha.abs(), 0.0).flatten(1)
            best, index = scores.max(1)
            found = best > 0
            chosen = torch.zeros_like(gamma)
            chosen[torch.arange(len(rows)), index // m] = True
            chosen[torch.arange(len(rows)), index % m] = True
            chosen &= found[:, None]
        moved = (x_adv[rows] + theta * chosen).clamp(low, high)
        x_adv[rows] = moved
        domain[rows] = movable(moved) & gamma
        with torch.no_grad():
            success[rows] = model(moved).argmax(1) == target[rows]
        active[rows] = found & ~success[rows] & (domain[rows].sum(1) >= 2)
    return jsma.Attack(x_adv, success, (x_adv != x).float().mean(-1))


def null_success_within(attack: jsma.Attack, max_distortion: float) -> torch.Tensor:
    """Which attacks of a null (a run of `null_attack` at a larger budget) succeed within
    `max_distortion`: those that succeeded having changed at most that fraction of their
    features. The nulls' reading, written apart from `jsma.success_within` so that a broken
    mechanism cannot move it (each step of a null changes exactly its two features at theta =
    +1 or -1, so a smaller budget's run is the first steps of a larger one)."""
    checks.number("max_distortion", max_distortion, 0.0, 1.0, low_open=True)
    # the budget's features, with room for the rounding of a fraction of M
    return attack.success & (attack.changed <= max_distortion + 1e-6)


# -- choosing the budget on validation, and the reliability of hardness ---------------------------


def levelled_off(attack: jsma.Attack, budgets: list[float], clusters: torch.Tensor) -> float:
    """The smallest of the increasing `budgets` at which the attack's success has levelled off:
    no longer below its success at the last budget by more than two standard errors of the
    paired difference (the same attacks at both budgets, clustered by `clusters`)."""
    if not budgets or list(budgets) != sorted(budgets):
        raise ValueError("budgets must be a non-empty increasing list")
    last = jsma.success_within(attack, budgets[-1])
    for budget in budgets:
        gap, se = paired_difference(last, jsma.success_within(attack, budget), clusters)
        if gap <= 2 * se:
            return budget
    return budgets[-1]


def spearman_brown(r: float) -> float:
    """The reliability of a measure from the correlation r of its two halves: 2r / (1 + r)."""
    checks.number("r", r, -1.0, 1.0)
    return 2 * r / (1 + r) if r > -1 else -1.0
