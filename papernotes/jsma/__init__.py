r"""The Jacobian-based saliency map attack (JSMA): targeted misclassification from the forward
derivative.

Papernot, McDaniel, Jha, Fredrikson, Celik & Swami 2016, *The Limitations of Deep Learning in
Adversarial Settings*, IEEE EuroS&P (arXiv:1511.07528). The attack takes the Jacobian of a
network's outputs with respect to its inputs (the forward derivative), scores each feature, or
pair of features, by how much raising it helps the target class while hurting every other class
(the adversarial saliency map), and changes the best pair, step by step, until the network
outputs the target or the distortion budget is spent. The paper then measures how hard each
source-target pair is and how far an input is from each class. The chapter
(chapters/jsma.ipynb, "The idea") derives the equations; each stands in a comment above the
lines that compute it, in the paper's order: the forward derivative, the saliency maps, the
pair search, the attack loop and its variants, then hardness and distance.

The networks under attack and the chapter's measurements live in `papernotes.jsma.experiment`.
Arguments are checked where they enter (`forward_derivative`, `saliency_map`, `jsma`,
`success_within`, `adversarial_distance`, `hardness`, `robustness`); the cores below them trust
their input. The attacks without the saliency map that the chapter compares with (the target's
derivative alone, random pairs) are the experiment's (`experiment.null_attack`), written apart
so that a broken mechanism cannot move them.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from papernotes import checks

# -- checks at the door ---------------------------------------------------------------------------


def _check_target(target, batch: int, classes: int) -> torch.Tensor:
    """One target class per example, as an int64 tensor (B,); an int is one class for all."""
    if isinstance(target, int) and not isinstance(target, bool):
        target = torch.full((batch,), target, dtype=torch.int64)
    checks.tensor("target", target, "(B,)", dtype=torch.int64, B=batch)
    if ((target < 0) | (target >= classes)).any():
        raise ValueError(f"target must hold class indices in [0, {classes - 1}]")
    return target


def _check_model(model) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch nn.Module; got {type(model).__name__}")


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
    _check_model(model)
    checks.tensor("x", x, "(B, M)", dtype="floating")
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
    """The Jacobian of the model's logits with respect to its input, (B, classes, features)."""
    checks.tensor("x", x, "(B, M)", dtype="floating")
    return _jacobian(model, x)


def _jacobian(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    # nabla F(X) = [dF_j(X) / dx_i], taken on the logits (the layer before the softmax, as in
    # the paper's experiments): the softmax's own derivatives vanish once a prediction is
    # confident. One backward pass per class: each example's logits depend on that example only
    # (no batch statistics), so the gradient of a class's logit summed over the batch gives
    # every row.
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
    """The single-feature adversarial saliency map S(X, t), shape (B, M): how much changing
    each feature helps the target while hurting the other classes (0 where it does not)."""
    sizes = checks.tensor("jacobian", jacobian, "(B, C, M)", dtype="floating")
    target = _check_target(target, sizes["B"], sizes["C"])
    checks.boolean("increase", increase)
    return _saliency_map(jacobian, target, increase)


def _saliency_map(jacobian: torch.Tensor, target: torch.Tensor, increase: bool) -> torch.Tensor:
    d_target, d_others = target_and_others(jacobian, target)
    if increase:
        # Raising x_i helps only if it raises F_t and lowers the other classes together:
        # S(X, t)_i = 0 if dF_t/dx_i < 0 or sum_{j != t} dF_j/dx_i > 0,
        #             dF_t/dx_i * |sum_{j != t} dF_j/dx_i| otherwise.
        useless = (d_target < 0) | (d_others > 0)
        return torch.where(useless, 0.0, d_target * d_others.abs())
    # Lowering x_i: the signs turn over, S = 0 if dF_t/dx_i > 0 or sum_{j != t} dF_j/dx_i < 0,
    # else |dF_t/dx_i| * sum_{j != t} dF_j/dx_i.
    useless = (d_target > 0) | (d_others < 0)
    return torch.where(useless, 0.0, d_target.abs() * d_others)


# -- 3. the pair search ---------------------------------------------------------------------------


def pair_scores(
    d_target: torch.Tensor, d_others: torch.Tensor, domain: torch.Tensor, increase: bool
) -> torch.Tensor:
    """-alpha * beta for every pair (p, q) of the search domain that passes the conditions, 0
    for every other pair and for p = q; shape (B, M, M). On MNIST few single features pass both
    conditions of the saliency map, so the paper scores pairs."""
    # alpha = sum_{i in {p, q}} dF_t/dx_i,  beta = sum_{i in {p, q}} sum_{j != t} dF_j/dx_i
    alpha = d_target[:, :, None] + d_target[:, None, :]
    beta = d_others[:, :, None] + d_others[:, None, :]
    m = d_target.shape[1]
    # (p, q) in Gamma x Gamma, p != q
    allowed = domain[:, :, None] & domain[:, None, :] & ~torch.eye(m, dtype=torch.bool)
    # alpha > 0 and beta < 0 when increasing; alpha < 0 and beta > 0 when decreasing
    passes = (alpha > 0) & (beta < 0) if increase else (alpha < 0) & (beta > 0)
    # the pair that maximises -alpha * beta is changed
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
    scores = _saliency_map(jacobian, target, increase).masked_fill(~domain, 0.0)
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
    With `pairs=False` (an ablation) each step changes the one feature with the largest
    single-feature saliency, with the same budget in features. (The attacks without the
    saliency map, the chapter's nulls, are `papernotes.jsma.experiment.null_attack`.)
    """
    checked = _check_attack(model, x, target, theta, max_distortion, clip)
    checks.boolean("pairs", pairs)
    choose, per_step = (choose_features, 2) if pairs else (choose_feature, 1)
    return _budgeted(model, x, max_distortion, checked, choose, per_step)


def _budgeted(model, x, max_distortion, checked, choose, per_step) -> Attack:
    """The loop at the budget of `max_distortion`, for the checked (target, theta, low, high)."""
    target, theta, low, high = checked
    budget = max_iterations(x.shape[1], max_distortion, per_step)
    return _attack(model, x, target, theta, budget, low, high, choose)


def _attack(model, x, target, theta, budget, low, high, choose) -> Attack:
    """The loop shared by the pair attack and its single-feature ablation, on a whole batch;
    `choose(jacobian, target, domain, increase)` returns the features to change and whether it
    found any. The search domain starts as the features that can still move in theta's
    direction, which for theta = +1 or -1 is the same as Algorithm 3's removing each feature
    once it reaches the bound."""
    # X* = X; Gamma = the features that can still move in theta's direction
    x_adv = x.detach().clone()
    domain = search_domain(x_adv, theta, low, high)
    with torch.no_grad():
        success = model(x_adv).argmax(1) == target
    active = ~success & domain.any(1)
    # while F(X*) != t and fewer than floor(M * Upsilon / 2) pairs changed and Gamma holds a pair
    for _ in range(budget):
        rows = active.nonzero().squeeze(1)  # the examples still under way
        if len(rows) == 0:
            break
        # the forward derivative at the current X*
        jacobian = _jacobian(model, x_adv[rows])
        chosen, found = choose(jacobian, target[rows], domain[rows], theta > 0)
        # x_p, x_q <- clip(x_p + theta), clip(x_q + theta)
        moved = (x_adv[rows] + theta * chosen).clamp(low, high)
        x_adv[rows] = moved
        # a feature that reached the bound leaves Gamma
        domain[rows] = search_domain(moved, theta, low, high) & domain[rows]
        with torch.no_grad():
            success[rows] = model(moved).argmax(1) == target[rows]
        # a run with no admissible pair left stops, and fails
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


def hardness(success_rates, distortions, *, strip: bool = True) -> float:
    """H(s, t): the area under the average distortion of successful samples against the
    success rate, over increasing budgets, by the trapezoidal rule.

    Budgets at which nothing succeeded yet have no average distortion. The paper's sum runs
    over the trapezoids between the budgets (`strip=False`). The book adds the strip from a
    success rate of 0 to the first budget's (`strip=True`): the successes of the first budget
    with one are the only successes on that way, so the curve is flat there at their average
    distortion, and the area starts with the rectangle tau_first * eps_first.
    """
    tau = torch.as_tensor(success_rates, dtype=torch.float64)
    eps = torch.as_tensor(distortions, dtype=torch.float64)
    checks.tensor("success_rates", tau, "(K,)")
    checks.tensor("distortions", eps, "(K,)", K=len(tau))
    if ((tau < 0) | (tau > 1)).any() or (tau.diff() < 0).any():
        raise ValueError("success_rates must lie in [0, 1] and not decrease with the budget")
    keep = tau > 0
    tau, eps = tau[keep], eps[keep]
    if len(tau) == 0:
        return 0.0
    checks.boolean("strip", strip)
    # the paper: H(s, t) ~ sum_k (tau_{k+1} - tau_k) (eps_{k+1} + eps_k) / 2
    trapezoids = ((tau[1:] - tau[:-1]) * (eps[1:] + eps[:-1]) / 2).sum()
    # the book's strip [0, tau_first], flat at eps_first
    return float(trapezoids + (tau[0] * eps[0] if strip else 0.0))


def adversarial_distance(model: nn.Module, x: torch.Tensor, target) -> torch.Tensor:
    """A(X, t): the share of features with no use for reaching t by increasing them, one value
    per example (B,)."""
    _check_model(model)
    checks.tensor("x", x, "(B, M)", dtype="floating")
    jacobian = _jacobian(model, x)
    target = _check_target(target, len(x), jacobian.shape[1])
    # A(X, t) = 1 - (1/M) sum_i 1[S(X, t)_i > 0]
    return 1 - (_saliency_map(jacobian, target, increase=True) > 0).to(x.dtype).mean(-1)


def robustness(distances: torch.Tensor, target: torch.Tensor, *, per_target: bool = True) -> float:
    """R(F) from the adversarial distances (N,) of inputs to their targets (N,): with
    `per_target`, the distances averaged per target class and the smallest of those averages,
    min_t E_X[A(X, t)]; without, the smallest distance of any (X, t), min_(X, t) A(X, t)."""
    n = checks.tensor("distances", distances, "(N,)")["N"]
    checks.tensor("target", target, "(N,)", dtype=torch.int64, N=n)
    checks.boolean("per_target", per_target)
    if not per_target:
        # R(F) = min_(X, t) A(X, t)
        return distances.min().item()
    # R(F) = min_t E_X[A(X, t)]
    return min(distances[target == t].mean().item() for t in target.unique())
