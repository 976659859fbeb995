r"""Robustness judged by an oracle: strong-robustness and the features an oracle does not use.

Wang, Gao & Qi 2016, *A Theoretical Framework for Robustness of (Deep) Classifiers against
Adversarial Examples*, ICLR 2017 workshop (arXiv:1612.00334). The paper is theoretical; this
module states its objects in code, in the paper's order, so that each one can be run.

Notation. $X$ is the input space.

1. **Classifier and oracle.** The learned classifier is $f_1 = c_1 \circ g_1$ and the oracle
   (a human annotator, say) is $f_2 = c_2 \circ g_2$. Each $g_i$ maps an input to the features
   it extracts, each $c_i$ decides a class from those features. Each $g_i$ turns a norm on its
   feature space into a pseudometric on the inputs,

   $$d_1'(x, x') = \lVert g_1(x) - g_1(x') \rVert, \qquad
     d_2'(x, x') = \lVert g_2(x) - g_2(x') \rVert,$$

   a *pseudo*metric because two different inputs can have the same features, at distance 0.
   `Oracle` is $f_2$ with its $g_2$ (`features`) and $c_2$ (`decide`); `Classifier` is $f_1$
   with its $g_1$ (`features`) and $c_1$ (`decide`).

2. **Adversarial example, by the oracle.** For an input $x$, an adversarial example is an
   $x'$ that the classifier labels differently while the oracle sees the same class, close by:

   $$f_1(x) \neq f_1(x'), \qquad f_2(x) = f_2(x'), \qquad d_2'(x, x') < \delta_2 .$$

   Closeness is measured in the oracle's features, not in the input's pixels.

3. **Strong-robustness.** $f_1$ is strong-robust (against the oracle $f_2$) when, for almost
   every pair of inputs, what the oracle sees as the same class close by the classifier labels
   alike:

   $$\forall x, x' \in X \text{ a.e.:}\quad f_2(x) = f_2(x') \,\wedge\, d_2'(x, x') < \delta_2
     \;\Rightarrow\; f_1(x) = f_1(x').$$

   It is a statement about *every* such pair: no amount of clean accuracy shows it.

4. **The theorem.** With $c_1$ continuous almost everywhere, $f_1$ is strong-robust if and only
   if a topological relationship holds between the pseudometric spaces $(X, d_1')$ and
   $(X, d_2')$, phrased through their topological equivalence; roughly, inputs close for the
   oracle must stay close for the classifier's features. The condition involves $g_1$ only:
   strong-robustness is decided by the features a classifier extracts, not by its decision rule.

5. **The corollary: one unnecessary feature breaks it.** Let $g_1$ use a feature that $g_2$
   ignores. Two inputs that differ only in that feature are at $d_2' = 0$ (the oracle cannot
   tell them apart) but at $d_1' > 0$. Where $c_1$'s decision depends on that feature, moving it
   changes $f_1$ and leaves $f_2$ alone: an adversarial example, so $f_1$ is not strong-robust.
   `attack_unnecessary_features` searches for exactly these: it moves only the features the
   oracle ignores (a mask), within an $L_\infty$ ball of radius $\varepsilon$, projected after
   every step, and reports which predictions changed.

6. **The paper's remedy: Siamese training.** Train $g_1$ so that oracle-equivalent inputs get
   the same representation. For a pair $(x, \tilde x)$ that the oracle cannot tell apart (here:
   $x$ with its unnecessary features redrawn at random),

   $$\mathcal{L} = \mathrm{CE}\big(c_1(g_1(x)), y\big)
       + \lambda \,\lVert g_1(x) - g_1(\tilde x) \rVert_2^2 ,$$

   which pushes $d_1'$ towards 0 wherever $d_2'$ is 0 (`siamese_penalty`, `train_classifier`).

Arguments are checked where they enter (`Oracle`, `LabelLookup`, `Classifier`,
`attack_unnecessary_features`, `label_codes`, `unnecessary_features`, `oracle_twin`,
`train_classifier`); the helpers below them trust their input.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from papernotes import checks
from papernotes.data import minibatches
from papernotes.training import History, accuracy, generator, seeded, train


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
        """d2'(x, x') = ||g2(x) - g2(x')||_inf, one value per pair (N,)."""
        return (self.features(x) - self.features(x_other)).abs().amax(-1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """f2(x) = c2(g2(x))."""
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
        """g1(x): the representation the decision is made from."""
        return self.g(x[:, self.reads])

    def decide(self, representation: torch.Tensor) -> torch.Tensor:
        """c1: logits from the representation."""
        return self.c(representation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
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

    Projected gradient ascent on the cross-entropy of the model's clean prediction: each step
    moves every masked feature by alpha = 2.5 epsilon / steps in the direction of its gradient's
    sign, then projects back onto the ball (|x' - x| <= epsilon, feature by feature) and into
    `clip`. Unmasked features never move. An example stops at its first changed prediction.
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
    """Back onto the L-inf ball of radius epsilon around x, then into the data range [low, high]:
    x' <- clip(x + clamp(x' - x, -epsilon, epsilon), low, high)."""
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
        step = point.detach() + alpha * grad.sign() * move[active]  # only the masked features
        x_adv[active] = project(step, x[active], epsilon, low, high)
        with torch.no_grad():
            flipped[active] = model(x_adv[active]).argmax(-1) != clean[active]
    return Attack(x_adv, flipped)


# -- data with unnecessary features --------------------------------------------------------------


def label_codes(k: int, n_classes: int, generator: torch.Generator) -> torch.Tensor:
    """A random binary code of k bits per class, (n_classes, k): what the k unnecessary
    features show for each class. Drawn once per run, shared by its train, validation and test
    splits."""
    checks.integer("k", k)
    checks.integer("n_classes", n_classes, 2)
    return (torch.rand(n_classes, k, generator=generator) < 0.5).float()


def unnecessary_features(
    labels: torch.Tensor,
    codes: torch.Tensor,
    correlation: float,
    generator: torch.Generator,
    noise: float = 0.1,
) -> torch.Tensor:
    """k features per example that track the label: with probability `correlation` an example
    shows its own class's code, otherwise the code of a class drawn uniformly (its own one time
    in n_classes). Gaussian noise of std `noise` is added, then clipped to [0, 1]."""
    n = checks.tensor("labels", labels, "(N,)", dtype=torch.int64)["N"]
    n_classes = checks.tensor("codes", codes, "(C, K)")["C"]
    checks.number("correlation", correlation, 0.0, 1.0)
    checks.number("noise", noise, 0.0)
    keep = torch.rand(n, generator=generator) < correlation
    other = torch.randint(n_classes, (n,), generator=generator)
    shown = torch.where(keep, labels, other)
    jitter = noise * torch.randn(n, codes.shape[1], generator=generator)
    return (codes[shown] + jitter).clamp(0.0, 1.0)


# -- 6. Siamese training --------------------------------------------------------------------------


def oracle_twin(
    x: torch.Tensor, ignored: torch.Tensor, generator: torch.Generator, low=0.0, high=1.0
) -> torch.Tensor:
    """x with the features the oracle ignores redrawn uniformly in [low, high]: an input the
    oracle cannot tell from x (d2' = 0), for the Siamese pair."""
    n_features = checks.tensor("x", x, "(N, D)", dtype="floating")["D"]
    _check_mask("ignored", ignored, n_features)
    fresh = low + (high - low) * torch.rand(x.shape, generator=generator)
    return torch.where(ignored, fresh, x)


def siamese_penalty(model: Classifier, x: torch.Tensor, x_twin: torch.Tensor) -> torch.Tensor:
    """||g1(x) - g1(x~)||_2^2, averaged over the batch."""
    return (model.features(x) - model.features(x_twin)).pow(2).sum(-1).mean()


class Trained(NamedTuple):
    model: Classifier
    history: History


def train_classifier(
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    n_classes: int,
    seed: int,
    reads: torch.Tensor | None = None,
    hidden: int | None = 64,
    penalty: float = 0.0,
    ignored: torch.Tensor | None = None,
    steps: int = 200,
    lr: float = 1e-2,
    batch_size: int = 64,
    val: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> Trained:
    """Train f1 with Adam on cross-entropy plus, when `penalty` (lambda) > 0, the Siamese
    penalty on pairs (x, x~) whose `ignored` features are redrawn. Weights, batches and the
    redrawn features follow `seed`; `val`, when given, is logged as "val_accuracy"."""
    n_features = checks.tensor("x", x, "(N, D)", dtype="floating")["D"]
    checks.tensor("y", y, "(N,)", dtype=torch.int64, N=len(x))
    checks.integer("seed", seed, 0)
    penalty = checks.number("penalty", penalty, 0.0)
    if penalty > 0 and ignored is None:
        raise ValueError("penalty > 0 needs `ignored`: the features the oracle does not use")
    if ignored is not None:
        _check_mask("ignored", ignored, n_features)
    checks.number("lr", lr, 0.0, low_open=True)
    with seeded(seed):
        model = Classifier(n_features, n_classes, hidden=hidden, reads=reads)
    batches = minibatches(len(x), batch_size, generator(seed, stream=1))
    redraw = generator(seed, stream=2)

    def loss_of_update(_: int) -> torch.Tensor:
        index = next(batches)
        loss = F.cross_entropy(model(x[index]), y[index])
        if penalty > 0:
            twin = oracle_twin(x[index], ignored, redraw)
            loss = loss + penalty * siamese_penalty(model, x[index], twin)
        return loss

    def evaluate() -> dict[str, float]:
        return {} if val is None else {"val_accuracy": accuracy(model(val[0]), val[1])}

    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    history = train(
        model,
        optimizer,
        loss_of_update,
        steps,
        evaluate=evaluate,
        eval_every=max(1, steps // 4),
        desc="f1",
    )
    return Trained(model, history)
