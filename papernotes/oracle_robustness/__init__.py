r"""Robustness judged by an oracle: strong-robustness and the features an oracle does not use.

Wang, Gao & Qi 2016, *A Theoretical Framework for Robustness of (Deep) Classifiers against
Adversarial Examples*, ICLR 2017 workshop (arXiv:1612.00334). The paper splits a classifier
$f_1 = c_1 \circ g_1$ and an oracle $f_2 = c_2 \circ g_2$ (a human annotator, say) into the
features each extracts and the decision each makes from them, defines adversarial examples and
strong-robustness by the oracle's features rather than the input's pixels, and proves that
strong-robustness is decided by the classifier's features alone: one feature the classifier
uses and the oracle ignores is enough to break it. Its remedy is Siamese training, which pulls
together the representations of inputs the oracle cannot tell apart. The chapter
(chapters/oracle_robustness.ipynb, "The idea") derives the definitions and the theorem; this
module states the paper's objects in code, in the paper's order (oracle, classifier, the search
for oracle-invisible adversarial examples, Siamese training), each equation in a comment above
the lines that compute it.

The data with unnecessary features, the training of f1 and the chapter's measurements live in
`papernotes.oracle_robustness.experiment`. Arguments are checked where they enter (`Oracle`,
`LabelLookup`, `Classifier`, `attack_unnecessary_features`, `attack_by_values`,
`oracle_twin`); the cores below
them trust their input.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from papernotes import checks


def _check_model(model) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch nn.Module; got {type(model).__name__}")


def _check_mask(name: str, mask, n_features: int) -> torch.Tensor:
    """A boolean mask over the features, (D,) or broadcasting to (N, D)."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError(f"{name} must be a boolean tensor; got {getattr(mask, 'dtype', mask)!r}")
    if mask.dim() == 0 or mask.shape[-1] != n_features:
        raise ValueError(
            f"{name} must broadcast to the inputs' {n_features} features; got {tuple(mask.shape)}"
        )
    return mask


# -- 1. the oracle f2 = c2 ∘ g2 --------------------------------------------------------------------


class Oracle:
    """f2 = c2 ∘ g2. `keep` (a boolean mask over the input features) says which features the
    oracle looks at: g2(x) = x[..., keep]. `decide` is c2, from those features to a class."""

    def __init__(self, keep: torch.Tensor, decide: Callable[[torch.Tensor], torch.Tensor]):
        if not isinstance(keep, torch.Tensor) or keep.dtype != torch.bool or keep.dim() != 1:
            raise TypeError("keep must be a one-dimensional boolean tensor over the features")
        if not callable(decide):
            raise TypeError(f"decide must be callable; got {type(decide).__name__}")
        self.keep = keep
        self.decide = decide

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """g2(x): the features the oracle uses."""
        checks.tensor("x", x, "(N, D)", D=len(self.keep))
        return x[:, self.keep]

    def distance(self, x: torch.Tensor, x_other: torch.Tensor) -> torch.Tensor:
        """The oracle's pseudometric, one value per pair (N,): a *pseudo*metric, because two
        inputs that differ only in ignored features are at distance 0."""
        # d2'(x, x') = ||g2(x) - g2(x')||_inf
        return (self.features(x) - self.features(x_other)).abs().amax(-1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # f2(x) = c2(g2(x))
        return self.decide(self.features(x))

    @property
    def ignored(self) -> torch.Tensor:
        """The mask of the features the oracle ignores: where an unnecessary feature can live."""
        return ~self.keep


class LabelLookup:
    """A c2 for real data: the class a person gave each known image, looked up by its exact
    pixels; -1 for an image nobody labelled. It stands in for the human annotator of the
    digits: it answers for the images in its table and for no other."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        n = checks.tensor("images", images, "(N, P)", dtype="floating")["N"]
        checks.tensor("labels", labels, "(N,)", dtype=torch.int64, N=n)
        self.table = {
            _key(image): label for image, label in zip(images, labels.tolist(), strict=True)
        }

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return torch.tensor([self.table.get(_key(image), -1) for image in images])


def _key(image: torch.Tensor) -> bytes:
    return image.detach().to(torch.float32).contiguous().numpy().tobytes()


# -- 2. the classifier f1 = c1 ∘ g1 ----------------------------------------------------------------


class Classifier(nn.Module):
    """f1 = c1 ∘ g1. g1 reads the features in `reads` (all by default) and, with `hidden`
    units, maps them through one ReLU layer (without `hidden`, g1 is the selection itself);
    c1 is a linear layer to the class logits."""

    def __init__(
        self,
        n_features: int,
        n_classes: int,
        *,
        hidden: int | None = 64,
        reads: torch.Tensor | None = None,
    ):
        super().__init__()
        checks.integer("n_features", n_features)
        checks.integer("n_classes", n_classes, 2)
        reads = torch.ones(n_features, dtype=torch.bool) if reads is None else reads
        _check_mask("reads", reads, n_features)
        if reads.dim() != 1 or not reads.any():
            raise ValueError("reads must be a one-dimensional mask that reads at least a feature")
        self.register_buffer("reads", reads.clone())
        width = int(reads.sum())
        if hidden is None:
            self.g = nn.Identity()
        else:
            checks.integer("hidden", hidden)
            self.g = nn.Sequential(nn.Linear(width, hidden), nn.ReLU())
            width = hidden
        self.c = nn.Linear(width, n_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """g1(x): the representation the decision is made from (its distances are d1')."""
        return self.g(x[:, self.reads])

    def decide(self, representation: torch.Tensor) -> torch.Tensor:
        """c1: logits from the representation."""
        return self.c(representation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # f1(x) = c1(g1(x))
        return self.decide(self.features(x))


# -- 3 to 5. searching for oracle-invisible adversarial examples -----------------------------------


class Attack(NamedTuple):
    """What the attack returns: the perturbed inputs (N, D) and, per example, whether the
    classifier's prediction changed (N,)."""

    x_adv: torch.Tensor
    flipped: torch.Tensor


def attack_unnecessary_features(
    model: nn.Module,
    x: torch.Tensor,
    mask: torch.Tensor,
    epsilon: float,
    steps: int,
    *,
    clip: tuple[float, float] | None = (0.0, 1.0),
) -> Attack:
    """Change the model's predictions by moving only the masked features, within the L-inf ball
    of radius `epsilon` around x and, unless `clip` is None, inside the data range `clip`.

    The corollary's adversarial examples: inputs that differ from x only in features the oracle
    ignores (the mask) are at d2' = 0, so where f1 changes its prediction, f1 is not
    strong-robust. Projected gradient ascent on the cross-entropy of the model's clean
    prediction: each step moves every masked feature by alpha = 2.5 epsilon / steps in the
    direction of its gradient's sign, then projects back onto the ball and into `clip`. Unmasked
    features never move. An example stops at its first changed prediction.
    """
    _check_model(model)
    n_features = checks.tensor("x", x, "(N, D)", dtype="floating")["D"]
    mask = _check_mask("mask", mask, n_features)
    epsilon = checks.number("epsilon", epsilon, 0.0)
    steps = checks.integer("steps", steps)
    low, high = -torch.inf, torch.inf
    if clip is not None:
        if not isinstance(clip, tuple) or len(clip) != 2:
            raise TypeError(f"clip must be a tuple (low, high) or None; got {clip!r}")
        low, high = (checks.number(f"clip[{i}]", v) for i, v in enumerate(clip))
        if low >= high or (x < low).any() or (x > high).any():
            raise ValueError(f"clip must have low < high and hold x; got {clip}")
    return _attack(model, x, mask, epsilon, steps, 2.5 * epsilon / steps, low, high)


def project(x_adv, x, epsilon, low, high) -> torch.Tensor:
    """Back onto the L-inf ball of radius epsilon around x, then into the data range [low, high]."""
    # x' <- clip(x + clamp(x' - x, -epsilon, epsilon), low, high)
    return (x + (x_adv - x).clamp(-epsilon, epsilon)).clamp(low, high)


def _attack(model, x, mask, epsilon, steps, alpha, low, high) -> Attack:
    x = x.detach()
    with torch.no_grad():
        clean = model(x).argmax(-1)
    x_adv = x.clone()
    flipped = torch.zeros(len(x), dtype=torch.bool)
    move = mask.to(x.dtype).expand_as(x)
    for _ in range(steps):
        active = ~flipped
        if not active.any():
            break
        point = x_adv[active].requires_grad_(True)
        with torch.enable_grad():
            loss = F.cross_entropy(model(point), clean[active], reduction="sum")
            (grad,) = torch.autograd.grad(loss, point)
        # x' <- x' + alpha sign(grad), on the masked features only: the oracle's stay as they are
        step = point.detach() + alpha * grad.sign() * move[active]
        x_adv[active] = project(step, x[active], epsilon, low, high)
        # f1(x) != f1(x') while f2(x) = f2(x') and d2'(x, x') = 0: an adversarial example
        with torch.no_grad():
            flipped[active] = model(x_adv[active]).argmax(-1) != clean[active]
    return Attack(x_adv, flipped)


def attack_by_values(
    model: nn.Module, x: torch.Tensor, mask: torch.Tensor, values: torch.Tensor
) -> Attack:
    """The exhaustive search: write each row of `values` (V, M), M the number of masked
    features, into the masked features of every input and keep, per input, the first row that
    changes the model's prediction. The oracle's features never move, so every input it
    returns is at d2' = 0 from x. Where the values are the codes the classes show in the
    unnecessary features, this pastes each class's code in turn."""
    _check_model(model)
    n_features = checks.tensor("x", x, "(N, D)", dtype="floating")["D"]
    mask = _check_mask("mask", mask, n_features)
    if mask.dim() != 1:
        raise ValueError("attack_by_values needs one mask for every input, of shape (D,)")
    checks.tensor("values", values, "(V, M)", dtype="floating", M=int(mask.sum()))
    return _attack_by_values(model, x, mask, values)


def _attack_by_values(model, x, mask, values) -> Attack:
    x = x.detach()
    with torch.no_grad():
        clean = model(x).argmax(-1)
        x_adv = x.clone()
        flipped = torch.zeros(len(x), dtype=torch.bool)
        for value in values:
            # x' = x on the oracle's features, the candidate value on the masked ones
            candidate = x.clone()
            candidate[:, mask] = value.to(x.dtype)
            # f1(x) != f1(x') while d2'(x, x') = 0: an adversarial example
            new = (model(candidate).argmax(-1) != clean) & ~flipped
            x_adv[new] = candidate[new]
            flipped |= new
    return Attack(x_adv, flipped)


# -- 6. Siamese training --------------------------------------------------------------------------


def oracle_twin(
    x: torch.Tensor, ignored: torch.Tensor, generator: torch.Generator, low=0.0, high=1.0
) -> torch.Tensor:
    """x with the features the oracle ignores redrawn uniformly in [low, high]: an input the
    oracle cannot tell from x (d2' = 0), for the Siamese pair."""
    n_features = checks.tensor("x", x, "(N, D)", dtype="floating")["D"]
    _check_mask("ignored", ignored, n_features)
    return _oracle_twin(x, ignored, generator, low, high)


def _oracle_twin(x, ignored, generator, low, high) -> torch.Tensor:
    # x~ = x on the oracle's features, fresh uniform draws on the ignored ones
    fresh = low + (high - low) * torch.rand(x.shape, generator=generator)
    return torch.where(ignored, fresh, x)


def siamese_penalty(model: Classifier, x: torch.Tensor, x_twin: torch.Tensor) -> torch.Tensor:
    """The Siamese term, averaged over the batch; added with weight lambda to the cross-entropy
    it pushes d1' towards 0 wherever d2' is 0:
    L = CE(c1(g1(x)), y) + lambda ||g1(x) - g1(x~)||_2^2."""
    # ||g1(x) - g1(x~)||_2^2
    return (model.features(x) - model.features(x_twin)).pow(2).sum(-1).mean()
