r"""The Jacobian-based saliency map attack (JSMA): targeted misclassification from the forward
derivative.

Papernot, McDaniel, Jha, Fredrikson, Celik & Swami 2016, *The Limitations of Deep Learning in
Adversarial Settings*, IEEE EuroS&P (arXiv:1511.07528). The module follows the paper in order:
the forward derivative, the saliency maps, the pairwise attack it runs on MNIST, then its
hardness and distance measures.

1. **The forward derivative.** For a network $F$ with inputs $X \in \mathbb{R}^M$ and class
   outputs $F_j$, the Jacobian of the outputs with respect to the inputs,

   $$\nabla F(X) = \frac{\partial F(X)}{\partial X}
       = \Big[\frac{\partial F_j(X)}{\partial x_i}\Big]_{j \in 1..N,\ i \in 1..M},$$

   taken here, as in the paper's experiments, on the logits (the layer before the softmax): the
   softmax's own derivatives vanish once a prediction is confident.

2. **The adversarial saliency map.** To push $X$ towards a target class $t$ by *increasing*
   features, a feature is useful only if it raises $F_t$ and lowers the other classes together:

   $$S(X, t)_i = \begin{cases} 0 & \text{if } \frac{\partial F_t}{\partial x_i} < 0
       \text{ or } \sum_{j \neq t} \frac{\partial F_j}{\partial x_i} > 0, \\
       \frac{\partial F_t}{\partial x_i}\,\Big|\sum_{j \neq t} \frac{\partial F_j}{\partial x_i}
       \Big| & \text{otherwise;} \end{cases}$$

   to *decrease* features, the signs turn over: $S = 0$ if $\partial F_t / \partial x_i > 0$ or
   $\sum_{j \neq t} \partial F_j / \partial x_i < 0$, else
   $|\partial F_t / \partial x_i| \sum_{j \neq t} \partial F_j / \partial x_i$.

3. **Pairs of features.** On MNIST few single features pass both conditions, so the attack
   scores pairs $(p, q)$ of the search domain $\Gamma$ with
   $\alpha = \sum_{i \in \{p, q\}} \partial F_t / \partial x_i$ and
   $\beta = \sum_{i \in \{p, q\}} \sum_{j \neq t} \partial F_j / \partial x_i$, and takes the pair
   with $\alpha > 0$, $\beta < 0$ (increasing; $\alpha < 0$, $\beta > 0$ decreasing) that
   maximises $-\alpha \beta$.

4. **The attack.** Starting from $X^* = X$ and
   $\Gamma = \{i : x_i \text{ can still move in } \theta\text{'s direction}\}$: while $X^*$ is not
   classified $t$, fewer than $\lfloor M \Upsilon / 2 \rfloor$ pairs were changed ($\Upsilon$ the
   maximum distortion, a fraction of the $M$ features) and $\Gamma$ holds a pair, add $\theta$
   to the chosen pair, clip to the input range, and drop from $\Gamma$ a feature that reached
   the bound ($\theta = +1$ sets a pixel to 1 and $\theta = -1$ to 0, each in one step).
   Recompute the forward derivative and repeat. A run stops, and fails, when no pair of $\Gamma$
   passes the conditions. Two variants share the loop: the single-feature ablation
   (`pairs=False`: one feature a step, by $S(X, t)$, with the same budget in features) and the
   random baseline (`random_pairs`: pairs drawn uniformly from $\Gamma$).

5. **Hardness and distance.** The hardness of a source-target pair is the area under the curve
   of the average distortion $\varepsilon$ of successful samples against the success rate
   $\tau$, over budgets $\Upsilon_1 < \dots < \Upsilon_K$, by the trapezoidal rule:

   $$H(s, t) \approx \sum_{k=1}^{K-1} (\tau_{k+1} - \tau_k)\,
       \frac{\varepsilon_{k+1} + \varepsilon_k}{2}.$$

   The adversarial distance of an input to a class counts the features with a useful saliency,
   $A(X, t) = 1 - \frac{1}{M} \sum_i 1[S(X, t)_i > 0]$, and the robustness of a network is
   $R(F) = \min_t \mathbb{E}_X[A(X, t)]$.

6. **The networks under attack**: the chapter's perceptron and a small CNN, trained with Adam
   through the book's loop.

Arguments are checked where they enter (`forward_derivative`, `saliency_map`, `jsma`,
`random_pairs`, `adversarial_distance`, `hardness`, `train_classifier`); the helpers below them
trust their input.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from papernotes import checks
from papernotes.data import IMAGE_SHAPE, N_CLASSES, Digits, minibatches
from papernotes.training import History, accuracy, generator, seeded, train

# -- checks at the door ---------------------------------------------------------------------------


def _check_inputs(x) -> int:
    """A floating batch of flattened inputs (B, M); returns M."""
    return checks.tensor("x", x, "(B, M)", dtype="floating")["M"]


def _check_target(target, batch: int, classes: int) -> torch.Tensor:
    """One target class per example, as an int64 tensor (B,); an int is one class for all."""
    if isinstance(target, int) and not isinstance(target, bool):
        target = torch.full((batch,), target, dtype=torch.int64)
    checks.tensor("target", target, "(B,)", dtype=torch.int64, B=batch)
    if ((target < 0) | (target >= classes)).any():
        raise ValueError(f"target must hold class indices in [0, {classes - 1}]")
    return target


def _check_clip(clip, x: torch.Tensor) -> tuple[float, float]:
    if not isinstance(clip, tuple) or len(clip) != 2:
        raise TypeError(f"clip must be a tuple (low, high); got {clip!r}")
    low, high = (checks.number(f"clip[{i}]", v) for i, v in enumerate(clip))
    if low >= high:
        raise ValueError(f"clip must have low < high; got {clip!r}")
    if (x < low).any() or (x > high).any():
        raise ValueError(f"x must lie inside clip = {clip!r}")
    return low, high


def _check_attack(model, x, target, theta, max_distortion, clip):
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch nn.Module; got {type(model).__name__}")
    _check_inputs(x)
    theta = checks.number("theta", theta)
    if theta == 0:
        raise ValueError("theta must be non-zero: its sign says whether features rise or fall")
    checks.number("max_distortion", max_distortion, 0.0, 1.0, low_open=True)
    low, high = _check_clip(clip, x)
    with torch.no_grad():
        classes = model(x[:1]).shape[-1]
    return _check_target(target, len(x), classes), theta, low, high


# -- 1. the forward derivative --------------------------------------------------------------------


def forward_derivative(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The Jacobian of the model's logits with respect to its input, (B, classes, features).

    One backward pass per class: each example's logits depend on that example only (no batch
    statistics), so the gradient of a class's logit summed over the batch gives every row.
    """
    _check_inputs(x)
    return _jacobian(model, x)


def _jacobian(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        logits = model(x)
        rows = [
            torch.autograd.grad(logits[:, j].sum(), x, retain_graph=j < logits.shape[1] - 1)[0]
            for j in range(logits.shape[1])
        ]
    return torch.stack(rows, dim=1)


# -- 2. the adversarial saliency map --------------------------------------------------------------


def target_and_others(jacobian: torch.Tensor, target: torch.Tensor):
    """dF_t/dx_i and sum_{j != t} dF_j/dx_i, each (B, M)."""
    d_target = jacobian.gather(1, target[:, None, None].expand(-1, 1, jacobian.shape[2]))[:, 0]
    d_others = jacobian.sum(1) - d_target
    return d_target, d_others


def saliency_map(
    jacobian: torch.Tensor, target: torch.Tensor, increase: bool = True
) -> torch.Tensor:
    """The single-feature adversarial saliency map S(X, t), shape (B, M).

    Increasing: 0 where dF_t/dx_i < 0 or sum_{j != t} dF_j/dx_i > 0, else
    dF_t/dx_i * |sum_{j != t} dF_j/dx_i|. Decreasing: the signs turned over.
    """
    sizes = checks.tensor("jacobian", jacobian, "(B, C, M)", dtype="floating")
    target = _check_target(target, sizes["B"], sizes["C"])
    if not isinstance(increase, bool):
        raise TypeError(f"increase must be True or False; got {type(increase).__name__}")
    d_target, d_others = target_and_others(jacobian, target)
    if increase:
        useless = (d_target < 0) | (d_others > 0)
        return torch.where(useless, 0.0, d_target * d_others.abs())
    useless = (d_target > 0) | (d_others < 0)
    return torch.where(useless, 0.0, d_target.abs() * d_others)


# -- 3. the pair search ---------------------------------------------------------------------------


def pair_scores(
    d_target: torch.Tensor, d_others: torch.Tensor, domain: torch.Tensor, increase: bool
) -> torch.Tensor:
    """-alpha * beta for every pair (p, q) of the search domain that passes the conditions
    (alpha > 0 and beta < 0 when increasing, alpha < 0 and beta > 0 when decreasing), 0 for
    every other pair and for p = q; shape (B, M, M)."""
    alpha = d_target[:, :, None] + d_target[:, None, :]
    beta = d_others[:, :, None] + d_others[:, None, :]
    m = d_target.shape[1]
    allowed = domain[:, :, None] & domain[:, None, :] & ~torch.eye(m, dtype=torch.bool)
    passes = (alpha > 0) & (beta < 0) if increase else (alpha < 0) & (beta > 0)
    return torch.where(allowed & passes, -alpha * beta, 0.0)


def choose_features(
    jacobian: torch.Tensor, target: torch.Tensor, domain: torch.Tensor, increase: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The features to change for each example, (B, M) booleans, and whether a pair was found.

    The pair of the search domain with the largest pair saliency; none where no pair passes.
    """
    d_target, d_others = target_and_others(jacobian, target)
    scores = pair_scores(d_target, d_others, domain, increase).flatten(1)
    best, index = scores.max(1)
    m = jacobian.shape[2]
    chosen = F.one_hot(index // m, m).bool() | F.one_hot(index % m, m).bool()
    found = best > 0
    return chosen & found[:, None], found


def choose_feature(
    jacobian: torch.Tensor, target: torch.Tensor, domain: torch.Tensor, increase: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ablation: the one feature of the search domain with the largest single-feature
    saliency S(X, t) (the paper's general algorithm, before pairs); none where no feature has
    S > 0."""
    scores = saliency_map(jacobian, target, increase).masked_fill(~domain, 0.0)
    best, index = scores.max(1)
    found = best > 0
    return F.one_hot(index, jacobian.shape[2]).bool() & found[:, None], found


# -- 4. the attack --------------------------------------------------------------------------------


class Attack(NamedTuple):
    """What an attack returns: the adversarial inputs (B, M), whether each is now classified as
    its target (B,), and the fraction of its features that changed (B,)."""

    x_adv: torch.Tensor
    success: torch.Tensor
    changed: torch.Tensor


def max_iterations(n_features: int, max_distortion: float, per_step: int = 2) -> int:
    """The budget in steps: floor(M * Upsilon / 2) pairs, so that at most M * Upsilon features
    change (floor(M * Upsilon) single features for the ablation)."""
    return math.floor(n_features * max_distortion / per_step + 1e-9)


def search_domain(x: torch.Tensor, theta: float, low: float, high: float) -> torch.Tensor:
    """Gamma: the features that can still move in theta's direction (not at that clip bound)."""
    return x < high if theta > 0 else x > low


def jsma(
    model: nn.Module,
    x: torch.Tensor,
    target,
    theta: float = 1.0,
    max_distortion: float = 0.145,
    clip: tuple[float, float] = (0.0, 1.0),
    *,
    pairs: bool = True,
) -> Attack:
    """The paper's pairwise saliency-map attack on a batch: each example towards its target.

    Every iteration recomputes the forward derivative at the current inputs, changes the best
    pair of each unfinished example by theta (then clips), and drops from the search domain the
    features that reached the bound. An example stops when it is classified as its target, when
    it has used its floor(M * max_distortion / 2) pairs, or when no pair is left to choose.
    With `pairs=False` (the ablation) each step changes the one feature with the largest
    single-feature saliency, with the same budget in features.
    """
    target, theta, low, high = _check_attack(model, x, target, theta, max_distortion, clip)
    if not isinstance(pairs, bool):
        raise TypeError(f"pairs must be True or False; got {type(pairs).__name__}")
    choose, per_step = (choose_features, 2) if pairs else (choose_feature, 1)
    budget = max_iterations(x.shape[1], max_distortion, per_step)
    return _attack(model, x, target, theta, budget, low, high, choose)


def random_pairs(
    model: nn.Module,
    x: torch.Tensor,
    target,
    theta: float = 1.0,
    max_distortion: float = 0.145,
    clip: tuple[float, float] = (0.0, 1.0),
    *,
    generator: torch.Generator,
) -> Attack:
    """The baseline: the same loop, budget, clip and search domain, but each pair is drawn
    uniformly from the search domain instead of chosen by the saliency map."""
    target, theta, low, high = _check_attack(model, x, target, theta, max_distortion, clip)
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator; got {type(generator).__name__}")

    def choose(_jacobian, _target, domain, _increase):
        keys = torch.rand(domain.shape, generator=generator).masked_fill(~domain, -1.0)
        chosen = torch.zeros_like(domain).scatter_(1, keys.topk(2, dim=1).indices, True)
        return chosen & domain, domain.sum(1) >= 2

    budget = max_iterations(x.shape[1], max_distortion)
    return _attack(model, x, target, theta, budget, low, high, choose, derivative=False)


def _attack(model, x, target, theta, budget, low, high, choose, derivative=True) -> Attack:
    """The loop shared by the attack, its ablation and the random baseline, on a whole batch;
    `choose(jacobian, target, domain, increase)` returns the features to change and whether it
    found any."""
    x_adv = x.detach().clone()
    domain = search_domain(x_adv, theta, low, high)  # Gamma: what can still move
    with torch.no_grad():
        success = model(x_adv).argmax(1) == target
    active = ~success & domain.any(1)
    for _ in range(budget):  # floor(M * Upsilon / 2) pairs at most
        rows = active.nonzero().squeeze(1)  # the examples still under way
        if len(rows) == 0:
            break
        jacobian = _jacobian(model, x_adv[rows]) if derivative else None  # at the current X*
        chosen, found = choose(jacobian, target[rows], domain[rows], theta > 0)
        moved = (x_adv[rows] + theta * chosen).clamp(low, high)
        x_adv[rows] = moved
        domain[rows] = search_domain(moved, theta, low, high) & domain[rows]  # saturated: out
        with torch.no_grad():
            success[rows] = model(moved).argmax(1) == target[rows]
        active[rows] = found & ~success[rows] & domain[rows].any(1)
    return Attack(x_adv, success, (x_adv != x).float().mean(-1))


def success_within(attack: Attack, max_distortion: float) -> torch.Tensor:
    """Which examples of an attack run at a larger budget succeed within `max_distortion`.

    The greedy search does not look at its budget until it runs out, so a run with a smaller
    budget is the first steps of a larger one. When every step moves its features to the clip
    bound (|theta| spans the clip range, as theta = +1 or -1 on [0, 1]), each step changes
    exactly its one or two features, and the example succeeds within the smaller budget exactly
    when it succeeded having changed at most that fraction of its features.
    """
    checks.number("max_distortion", max_distortion, 0.0, 1.0, low_open=True)
    return attack.success & (attack.changed <= max_distortion + 1e-6)


# -- 5. hardness, adversarial distance and robustness ---------------------------------------------


def hardness(success_rates, distortions) -> float:
    """H(s, t): the area under the average distortion of successful samples against the
    success rate, over increasing budgets, by the trapezoidal rule.

    Budgets at which nothing succeeded yet have no average distortion: the curve starts at the
    first budget with a success.
    """
    tau = torch.as_tensor(success_rates, dtype=torch.float64)
    eps = torch.as_tensor(distortions, dtype=torch.float64)
    checks.tensor("success_rates", tau, "(K,)")
    checks.tensor("distortions", eps, "(K,)", K=len(tau))
    if ((tau < 0) | (tau > 1)).any() or (tau.diff() < 0).any():
        raise ValueError("success_rates must lie in [0, 1] and not decrease with the budget")
    keep = tau > 0
    tau, eps = tau[keep], eps[keep]
    if len(tau) < 2:
        return 0.0
    return float(((tau[1:] - tau[:-1]) * (eps[1:] + eps[:-1]) / 2).sum())


def adversarial_distance(model: nn.Module, x: torch.Tensor, target) -> torch.Tensor:
    """A(X, t) = 1 - (1/M) sum_i 1[S(X, t)_i > 0]: the share of features with no use for
    reaching t by increasing them, one value per example (B,)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch nn.Module; got {type(model).__name__}")
    _check_inputs(x)
    jacobian = _jacobian(model, x)
    target = _check_target(target, len(x), jacobian.shape[1])
    return 1 - (saliency_map(jacobian, target, increase=True) > 0).to(x.dtype).mean(-1)


def robustness(distances: torch.Tensor, target: torch.Tensor) -> float:
    """R(F) = min_t E_X[A(X, t)]: the adversarial distances (N,) of inputs to their targets
    (N,), averaged per target class, and the smallest of those averages."""
    n = checks.tensor("distances", distances, "(N,)")["N"]
    checks.tensor("target", target, "(N,)", dtype=torch.int64, N=n)
    return min(distances[target == t].mean().item() for t in target.unique())


# -- the networks under attack --------------------------------------------------------------------


class MLP(nn.Module):
    """64 pixels -> hidden ReLU units -> 10 logits."""

    def __init__(self, hidden: int = 128, n_inputs: int = 64):
        super().__init__()
        checks.integer("hidden", hidden)
        checks.integer("n_inputs", n_inputs)
        self.net = nn.Sequential(
            nn.Linear(n_inputs, hidden), nn.ReLU(), nn.Linear(hidden, N_CLASSES)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


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


class Trained(NamedTuple):
    model: nn.Module
    history: History


def train_classifier(
    digits: Digits,
    *,
    cnn: bool = False,
    lr: float = 3e-3,
    steps: int = 600,
    batch_size: int = 64,
    seed: int,
) -> Trained:
    """Train the MLP (or, with `cnn=True`, the CNN) with Adam on cross-entropy, logging the
    validation accuracy. Weights and batches follow `seed`."""
    checks.number("lr", lr, 0.0, low_open=True)
    checks.integer("steps", steps)
    checks.integer("batch_size", batch_size)
    checks.integer("seed", seed, 0)
    with seeded(seed):
        model = CNN() if cnn else MLP(n_inputs=digits.n_pixels)
    batches = minibatches(len(digits.train_x), batch_size, generator(seed, stream=1))

    def loss_of_update(_: int) -> torch.Tensor:
        index = next(batches)
        return F.cross_entropy(model(digits.train_x[index]), digits.train_y[index])

    def evaluate() -> dict[str, float]:
        return {"val_accuracy": accuracy(model(digits.val_x), digits.val_y)}

    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    history = train(
        model,
        optimizer,
        loss_of_update,
        steps,
        evaluate=evaluate,
        eval_every=max(1, steps // 6),
        desc="CNN" if cnn else "MLP",
    )
    return Trained(model, history)
