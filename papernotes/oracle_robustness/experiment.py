"""The chapter's experiment around oracle robustness (papernotes.oracle_robustness): the toy
data and the digits with unnecessary features, the training of f1 (with or without the Siamese
penalty), and the measurements of its tables and claims.

The paper's objects (the oracle, the classifier, the attack, the Siamese penalty) are
`papernotes.oracle_robustness`; this module calls them through the module
(`oracle_robustness.name`), so a mutant patched there reaches the chapter.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from papernotes import checks, oracle_robustness, training
from papernotes.data import Digits, minibatches

# The random streams of a run (generator(seed, stream)); the integers the chapter's numbers were
# drawn with. FEATURES: one stream per split (train, validation, test) for the extra features.
BATCHES, TWINS, CODES = 1, 2, 3
FEATURES = {"train": 4, "val": 5, "test": 6}
TOY_TRAIN, TOY_TEST = 10, 11
SHIFT = 12  # the twins and the partners of the representation's shift
DECISIONS = 100  # c1 retrained on a frozen g1: its j-th run draws from DECISIONS + j


# -- data with unnecessary features ---------------------------------------------------------------


def toy_data(
    oracle: oracle_robustness.Oracle, n: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """n points (x1, x2) of the two-feature toy: the oracle labels them from x1, and x2, which
    it never reads, is moved to track the label it gives (0.75 towards its side, plus half of
    its own noise)."""
    checks.integer("n", n)
    x = torch.randn(n, 2, generator=generator)
    y = oracle(x)  # the oracle labels the data; it never reads x2
    x[:, 1] = 0.75 * (2 * y - 1) + 0.5 * x[:, 1]  # x2 tracks the label it cannot see
    return x, y


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


def codes_of(k: int, seed: int) -> torch.Tensor:
    """The class codes (10, k) that `with_unnecessary_features(digits, k, ..., seed)` shows."""
    return label_codes(k, 10, training.generator(seed, CODES))


def with_unnecessary_features(
    digits: Digits, k: int, correlation: float, seed: int
) -> dict[str, torch.Tensor]:
    """Each split's digits (64 pixels) followed by k unnecessary features of the given
    correlation with the label, one code per class for all splits: {"train", "val", "test"}."""
    codes = codes_of(k, seed)
    splits = {
        "train": (digits.train_x, digits.train_y),
        "val": (digits.val_x, digits.val_y),
        "test": (digits.test_x, digits.test_y),
    }
    return {
        split: torch.cat(
            [x, unnecessary_features(y, codes, correlation, training.generator(seed, stream))], 1
        )
        for split, stream in FEATURES.items()
        for x, y in [splits[split]]
    }


# -- training f1 ----------------------------------------------------------------------------------


def train_classifier(
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    n_classes: int,
    seed: int,
    reads: torch.Tensor | None = None,
    hidden: int | None = 64,
    penalty: float = 0.0,
    augment: float = 0.0,
    weight_decay: float = 0.0,
    ignored: torch.Tensor | None = None,
    steps: int = 200,
    lr: float = 1e-2,
    batch_size: int = 64,
    val: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> training.Run:
    """Train f1 with Adam on cross-entropy plus, when `penalty` (lambda) > 0, the Siamese
    penalty on pairs (x, x~) whose `ignored` features are redrawn. `augment` > 0 is the
    baseline that trains on the twins instead: lambda CE(f1(x~), y) in place of the penalty.
    `weight_decay` is Adam's. Weights, batches and the redrawn features follow `seed`; `val`,
    when given, is logged as "val_accuracy"."""
    n_features = checks.tensor("x", x, "(N, D)", dtype="floating")["D"]
    checks.tensor("y", y, "(N,)", dtype=torch.int64, N=len(x))
    checks.integer("seed", seed, 0)
    penalty = checks.number("penalty", penalty, 0.0)
    augment = checks.number("augment", augment, 0.0)
    weight_decay = checks.number("weight_decay", weight_decay, 0.0)
    if (penalty > 0 or augment > 0) and ignored is None:
        raise ValueError("a penalty needs `ignored`: the features the oracle does not use")
    if penalty > 0 and augment > 0:
        raise ValueError("penalty and augment are two arms: give one of them")
    if ignored is not None:
        oracle_robustness._check_mask("ignored", ignored, n_features)
    checks.number("lr", lr, 0.0, low_open=True)
    with training.seeded(seed):
        model = oracle_robustness.Classifier(n_features, n_classes, hidden=hidden, reads=reads)
    redraw = training.generator(seed, TWINS)

    def siamese(index: torch.Tensor) -> torch.Tensor:
        # L = CE(c1(g1(x)), y) + lambda ||g1(x) - g1(x~)||^2, x~ the oracle's twin of x
        twin = oracle_robustness.oracle_twin(x[index], ignored, redraw)
        return penalty * oracle_robustness.siamese_penalty(model, x[index], twin)

    def on_twins(index: torch.Tensor) -> torch.Tensor:
        # the augmentation baseline: L = CE(c1(g1(x)), y) + lambda CE(c1(g1(x~)), y)
        twin = oracle_robustness.oracle_twin(x[index], ignored, redraw)
        return augment * F.cross_entropy(model(twin), y[index])

    history = training.train_classifier(
        model,
        y,
        torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay),
        steps,
        batches=minibatches(len(x), batch_size, training.generator(seed, BATCHES)),
        logits_of=lambda index: model(x[index]),
        # lambda = 0: plain cross-entropy
        extra_loss=siamese if penalty > 0 else on_twins if augment > 0 else None,
        evaluate=lambda: (
            {} if val is None else {"val_accuracy": training.accuracy(model(val[0]), val[1])}
        ),
        eval_every=max(1, steps // 4),
        desc="f1",
    )
    return training.Run(model, history)


def retrain_decision(
    model: oracle_robustness.Classifier,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    seed: int,
    run: int,
    steps: int = 200,
    lr: float = 1e-2,
    batch_size: int = 64,
) -> training.Run:
    """A copy of `model` whose g1 is frozen and whose c1 is drawn afresh and trained alone on
    plain cross-entropy: run `run` of the decisions that g1 can carry. Its initial c1 and its
    batches follow (seed, DECISIONS + run); the original model is left as it was."""
    checks.integer("seed", seed, 0)
    checks.integer("run", run, 0)
    new = copy.deepcopy(model)
    for parameter in new.g.parameters():
        parameter.requires_grad_(False)
    stream = training.generator(seed, DECISIONS + run)
    with training.seeded(int(torch.randint(2**31, (1,), generator=stream))):
        new.c = torch.nn.Linear(new.c.in_features, new.c.out_features)
    history = training.train_classifier(
        new,
        y,
        torch.optim.Adam(new.c.parameters(), lr=lr),
        steps,
        batches=minibatches(len(x), batch_size, stream),
        logits_of=lambda index: new(x[index]),
        desc="c1",
    )
    return training.Run(new, history)


# -- measurements ---------------------------------------------------------------------------------


def measure(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    oracle: oracle_robustness.Oracle,
    epsilons,
    steps: int,
    values: torch.Tensor | None = None,
) -> dict:
    """Clean accuracy, and the attack on the features the oracle ignores at each radius:
    {"accuracy", "correct" (N,), "attacks": {epsilon: Attack}, "flips": {epsilon: share}}.
    With `values` (rows of values for the ignored features, in the data range) also the
    exhaustive search over them, "pasted" (an Attack), and "strongest": per input, flipped by
    the gradient attack at the largest radius or by the search (N,), and "strongest_flips"."""
    with training.evaluating(model):
        correct = model(x).argmax(-1) == y
    attacks = {
        eps: oracle_robustness.attack_unnecessary_features(model, x, oracle.ignored, eps, steps)
        for eps in epsilons
    }
    result = {
        "accuracy": correct.float().mean().item(),
        "correct": correct,
        "attacks": attacks,
        "flips": {eps: a.flipped.float().mean().item() for eps, a in attacks.items()},
    }
    if values is not None:
        pasted = oracle_robustness.attack_by_values(model, x, oracle.ignored, values)
        strongest = pasted.flipped | attacks[max(epsilons)].flipped
        result |= {
            "pasted": pasted,
            "strongest": strongest,
            "strongest_flips": strongest.float().mean().item(),
        }
    return result


def paired_difference(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """The difference of two shares measured on the same inputs, mean(a) - mean(b), and its
    standard error from sampling the inputs: the standard deviation of the per-input
    differences a_i - b_i over sqrt(N). a and b are boolean (N,)."""
    n = checks.tensor("a", a, "(N,)", dtype=torch.bool)["N"]
    checks.tensor("b", b, "(N,)", dtype=torch.bool, N=n)
    if n < 2:
        raise ValueError("a paired difference needs two inputs at least")
    d = a.float() - b.float()
    return d.mean().item(), (d.std() / n**0.5).item()


def representation_shift(
    model: oracle_robustness.Classifier,
    x: torch.Tensor,
    ignored: torch.Tensor,
    generator: torch.Generator,
) -> float:
    """How much g1 moves when only the ignored features change, against how much it moves
    between two different inputs: mean ||g1(x) - g1(x~)||^2 over mean ||g1(x) - g1(x_pi)||^2,
    x~ the oracle's twins, x_pi the same inputs shuffled. 0 when g1 ignores those features
    exactly; near 1 or above when it moves as much as between two digits."""
    checks.tensor("x", x, "(N, D)", dtype="floating")
    with training.evaluating(model):
        twin = oracle_robustness.oracle_twin(x, ignored, generator)
        other = x[torch.randperm(len(x), generator=generator)]
        g = model.features(x)
        to_twin = (g - model.features(twin)).pow(2).sum(-1).mean()
        to_other = (g - model.features(other)).pow(2).sum(-1).mean()
    return (to_twin / to_other).item()


def choose_penalty(
    validation: dict, reference_accuracy: float, epsilon: float = 1.0, tolerance: float = 0.02
) -> float:
    """The weight chosen on validation (`validation`: {weight: measure(...)}), the same rule for
    every arm (the Siamese lambda, the augmentation's lambda, the plain classifier's weight
    decay): among the weights whose accuracy is within `tolerance` of the reference's, the one
    flipped least at `epsilon` (the smaller weight on a tie); if none is, the most accurate."""
    admissible = [
        lam for lam, r in validation.items() if r["accuracy"] >= reference_accuracy - tolerance
    ]
    if admissible:
        return min(admissible, key=lambda lam: (validation[lam]["flips"][epsilon], lam))
    return max(validation, key=lambda lam: validation[lam]["accuracy"])
