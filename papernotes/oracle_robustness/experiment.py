"""The chapter's experiment around oracle robustness (papernotes.oracle_robustness): the toy
data and the digits with unnecessary features, the training of f1 (with or without the Siamese
penalty), and the measurements of its tables and claims.

The paper's objects (the oracle, the classifier, the attack, the Siamese penalty) are
`papernotes.oracle_robustness`; this module calls them through the module
(`oracle_robustness.name`), so a mutant patched there reaches the chapter.
"""

from __future__ import annotations

import torch

from papernotes import checks, oracle_robustness, training
from papernotes.data import Digits, minibatches

# The random streams of a run (generator(seed, stream)); the integers the chapter's numbers were
# drawn with. FEATURES: one stream per split (train, validation, test) for the extra features.
BATCHES, TWINS, CODES = 1, 2, 3
FEATURES = {"train": 4, "val": 5, "test": 6}
TOY_TRAIN, TOY_TEST = 10, 11


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


def with_unnecessary_features(
    digits: Digits, k: int, correlation: float, seed: int
) -> dict[str, torch.Tensor]:
    """Each split's digits (64 pixels) followed by k unnecessary features of the given
    correlation with the label, one code per class for all splits: {"train", "val", "test"}."""
    codes = label_codes(k, 10, training.generator(seed, CODES))
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
    ignored: torch.Tensor | None = None,
    steps: int = 200,
    lr: float = 1e-2,
    batch_size: int = 64,
    val: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> training.Run:
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
        oracle_robustness._check_mask("ignored", ignored, n_features)
    checks.number("lr", lr, 0.0, low_open=True)
    with training.seeded(seed):
        model = oracle_robustness.Classifier(n_features, n_classes, hidden=hidden, reads=reads)
    redraw = training.generator(seed, TWINS)

    def siamese(index: torch.Tensor) -> torch.Tensor:
        # L = CE(c1(g1(x)), y) + lambda ||g1(x) - g1(x~)||^2, x~ the oracle's twin of x
        twin = oracle_robustness.oracle_twin(x[index], ignored, redraw)
        return penalty * oracle_robustness.siamese_penalty(model, x[index], twin)

    history = training.train_classifier(
        model,
        y,
        torch.optim.Adam(model.parameters(), lr=lr),
        steps,
        batches=minibatches(len(x), batch_size, training.generator(seed, BATCHES)),
        logits_of=lambda index: model(x[index]),
        extra_loss=siamese if penalty > 0 else None,  # lambda = 0: plain cross-entropy
        evaluate=lambda: (
            {} if val is None else {"val_accuracy": training.accuracy(model(val[0]), val[1])}
        ),
        eval_every=max(1, steps // 4),
        desc="f1",
    )
    return training.Run(model, history)


# -- measurements ---------------------------------------------------------------------------------


def measure(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    oracle: oracle_robustness.Oracle,
    epsilons,
    steps: int,
) -> dict:
    """Clean accuracy, and the attack on the features the oracle ignores at each radius:
    {"accuracy": float, "attacks": {epsilon: Attack}, "flips": {epsilon: share flipped}}."""
    clean = training.accuracy_of(model, x, y)
    attacks = {
        eps: oracle_robustness.attack_unnecessary_features(model, x, oracle.ignored, eps, steps)
        for eps in epsilons
    }
    return {
        "accuracy": clean,
        "attacks": attacks,
        "flips": {eps: a.flipped.float().mean().item() for eps, a in attacks.items()},
    }


def choose_penalty(
    validation: dict, reference_accuracy: float, epsilon: float = 1.0, tolerance: float = 0.02
) -> float:
    """The Siamese weight chosen on validation (`validation`: {lambda: measure(...)}): among the
    weights whose accuracy is within `tolerance` of the reference's, the one flipped least at
    `epsilon` (the smaller weight on a tie); if none is, the most accurate."""
    admissible = [
        lam for lam, r in validation.items() if r["accuracy"] >= reference_accuracy - tolerance
    ]
    if admissible:
        return min(admissible, key=lambda lam: (validation[lam]["flips"][epsilon], lam))
    return max(validation, key=lambda lam: validation[lam]["accuracy"])
