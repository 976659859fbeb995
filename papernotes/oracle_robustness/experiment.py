"""The chapter's experiment around oracle robustness (papernotes.oracle_robustness): the toy
data and the digits with unnecessary features, the training of f1 (with or without the Siamese
penalty), decisions c1 retrained on a frozen g1, and the measurements of its tables and claims.

The paper's objects (the oracle, the classifier, the attack, the Siamese penalty, the oracle
twin) are `papernotes.oracle_robustness`; this module calls them through the module
(`oracle_robustness.name`), so a mutant patched there reaches the chapter's arms.

The nulls of the chapter's claims must stay out of a mutant's reach. So the runs that stand for
them (the plain classifier, the augmentation baseline, the adversarially trained classifier,
the pixels-only classifier, the decisions retrained on a frozen g1) and their measurements use
code of this module's own: `PlainNetwork` for their network, `redraw_ignored` for their twins,
`worst_code` for their adversarial examples and `null_search` for their attack, each with a
random stream of its own. Unbroken, each is the mechanism's counterpart exactly (the unit tests
compare them); only the Siamese network (iii) is the mechanism's `Classifier`.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from papernotes import checks, oracle_robustness, together, training
from papernotes.data import Digits, minibatches

# The random streams of a run (generator(seed, stream)); the integers the chapter's numbers were
# drawn with. FEATURES: one stream per split (train, validation, test) for the extra features.
BATCHES, TWINS, CODES = 1, 2, 3
FEATURES = {"train": 4, "val": 5, "test": 6}
TOY_TRAIN, TOY_TEST = 10, 11
SHIFT = 12  # the twins and the partners of the representation's shift
AUGMENT_TWINS = 13  # the augmentation baseline's twins (its own stream, its own code)
DECISIONS = 100  # c1 retrained on a frozen g1: its j-th run draws from DECISIONS + j
DECISION_TWINS = 200  # the twins of a robustness-seeking c1: run j draws from DECISION_TWINS + j
DECISION_RECIPES = ("plain", "siamese", "twins", "adversarial")  # how a retrained c1 is trained


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


# -- the nulls' network ---------------------------------------------------------------------------


class PlainNetwork(torch.nn.Module):
    """The network of the nulls, written again out of the mechanism's reach: g1 reads the
    features in `reads` through one ReLU layer of `hidden` units (or, without `hidden`, is the
    selection itself), c1 is a linear layer. Its layers are made in the order of
    `oracle_robustness.Classifier`'s, so the same seed draws the same initial weights (a unit
    test compares the two)."""

    def __init__(self, n_features: int, n_classes: int, *, hidden=64, reads=None):
        super().__init__()
        reads = torch.ones(n_features, dtype=torch.bool) if reads is None else reads
        self.register_buffer("reads", reads.clone())
        width = int(reads.sum())
        self.g = torch.nn.Identity()
        if hidden is not None:
            self.g = torch.nn.Sequential(torch.nn.Linear(width, hidden), torch.nn.ReLU())
            width = hidden
        self.c = torch.nn.Linear(width, n_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.g(x[:, self.reads])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(self.features(x))


def worst_code(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    ignored: torch.Tensor,
    codes: torch.Tensor,
) -> torch.Tensor:
    """x with, per row, the one of `codes` (V, M) written into its `ignored` features that gives
    the model its largest cross-entropy on y: the adversarial example of the pasting search, the
    nulls' adversarial training draws on (the model's answers are not changed by this call)."""
    with torch.no_grad():
        losses, pasted = [], []
        for code in codes:
            candidate = x.clone()
            candidate[:, ignored] = code.to(x.dtype)
            pasted.append(candidate)
            losses.append(F.cross_entropy(model(candidate), y, reduction="none"))
        worst = torch.stack(losses).argmax(0)
    return torch.stack(pasted)[worst, torch.arange(len(x))]


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
    adversarial: float = 0.0,
    codes: torch.Tensor | None = None,
    ignored: torch.Tensor | None = None,
    steps: int = 200,
    lr: float = 1e-2,
    batch_size: int = 64,
    val: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> training.Run:
    """Train f1 with Adam on cross-entropy plus, when `penalty` (lambda) > 0, the Siamese
    penalty on pairs (x, x~) whose `ignored` features are redrawn. `augment` > 0 is the
    baseline that trains on the twins instead: lambda CE(f1(x~), y) in place of the penalty;
    `adversarial` > 0 trains on adversarial examples instead, lambda CE(f1(x*), y) with x* the
    input with the worst of `codes` in its `ignored` features (`worst_code`). Weights, batches
    and the redrawn features follow `seed`; `val`, when given, is logged as "val_accuracy".
    Only the Siamese network is the mechanism's `Classifier`; without a penalty the network is
    `PlainNetwork` and the run calls nothing of the mechanism: the plain, augmented, adversarial
    and pixels-only classifiers are the claims' nulls."""
    n_features = checks.tensor("x", x, "(N, D)", dtype="floating")["D"]
    checks.tensor("y", y, "(N,)", dtype=torch.int64, N=len(x))
    checks.integer("seed", seed, 0)
    penalty = checks.number("penalty", penalty, 0.0)
    augment = checks.number("augment", augment, 0.0)
    adversarial = checks.number("adversarial", adversarial, 0.0)
    if (penalty > 0 or augment > 0 or adversarial > 0) and ignored is None:
        raise ValueError("a penalty needs `ignored`: the features the oracle does not use")
    if sum(w > 0 for w in (penalty, augment, adversarial)) > 1:
        raise ValueError("penalty, augment and adversarial are three arms: give one of them")
    if adversarial > 0 and codes is None:
        raise ValueError("adversarial training needs `codes`: the values its examples paste")
    if ignored is not None:
        oracle_robustness._check_mask("ignored", ignored, n_features)
    checks.number("lr", lr, 0.0, low_open=True)
    network = oracle_robustness.Classifier if penalty > 0 else PlainNetwork
    with training.seeded(seed):
        model = network(n_features, n_classes, hidden=hidden, reads=reads)
    redraw = training.generator(seed, TWINS)
    redraw_own = training.generator(seed, AUGMENT_TWINS)

    def siamese(index: torch.Tensor) -> torch.Tensor:
        # L = CE(c1(g1(x)), y) + lambda ||g1(x) - g1(x~)||^2, x~ the oracle's twin of x
        twin = oracle_robustness.oracle_twin(x[index], ignored, redraw)
        return penalty * oracle_robustness.siamese_penalty(model, x[index], twin)

    def on_twins(index: torch.Tensor) -> torch.Tensor:
        # the augmentation baseline: L = CE(c1(g1(x)), y) + lambda CE(c1(g1(x~)), y), with
        # twins of its own (a null: no mutant of the mechanism reaches it)
        twin = redraw_ignored(x[index], ignored, redraw_own)
        return augment * F.cross_entropy(model(twin), y[index])

    def on_adversarial(index: torch.Tensor) -> torch.Tensor:
        # adversarial training: L = CE(c1(g1(x)), y) + lambda CE(c1(g1(x*)), y), x* the worst
        # pasted code (a null: the experiment's own search)
        worst = worst_code(model, x[index], y[index], ignored, codes)
        return adversarial * F.cross_entropy(model(worst), y[index])

    terms = [(penalty, siamese), (augment, on_twins), (adversarial, on_adversarial)]
    history = training.train_classifier(
        model,
        y,
        torch.optim.Adam(model.parameters(), lr=lr),
        steps,
        batches=minibatches(len(x), batch_size, training.generator(seed, BATCHES)),
        logits_of=lambda index: model(x[index]),
        # lambda = 0: plain cross-entropy
        extra_loss=next((term for weight, term in terms if weight > 0), None),
        evaluate=lambda: (
            {} if val is None else {"val_accuracy": training.accuracy(model(val[0]), val[1])}
        ),
        eval_every=max(1, steps // 4),
        desc="f1",
    )
    return training.Run(model, history)


def retrain_decision(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    weight: float = 0.0,
    **options,
) -> training.Run:
    """One decision of `retrain_decisions`: a copy of `model` whose g1 is frozen and whose c1
    is drawn afresh and trained alone, by `recipe` with weight `weight`; `options` are
    `retrain_decisions`'s own keywords (`seed` and `run`, then `recipe`, `ignored`, `codes`,
    `steps`, `lr`, `batch_size`)."""
    (found,) = retrain_decisions(model, x, y, weights=(weight,), **options)
    return found


def retrain_decisions(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    seed: int,
    run: int,
    recipe: str = "plain",
    weights=(0.0,),
    ignored: torch.Tensor | None = None,
    codes: torch.Tensor | None = None,
    steps: int = 400,
    lr: float = 1e-2,
    batch_size: int = 64,
) -> list[training.Run]:
    """Copies of `model` whose g1 is frozen and whose c1 (a linear layer) is drawn afresh and
    trained alone, one for each weight lambda in `weights`: run `run` of the decisions that g1
    can carry. `recipe` says how c1 is trained:

    - "plain": cross-entropy, a c1 that does not try to be robust (weight 0);
    - "siamese": the Siamese penalty moved to the only place c1 can act, its output,
      CE(f1(x), y) + lambda ||f1(x) - f1(x~)||^2, x~ the input with its `ignored` features
      redrawn (`redraw_ignored`);
    - "twins": CE(f1(x), y) + lambda CE(f1(x~), y), trained on the same twins;
    - "adversarial": CE(f1(x), y) + lambda CE(f1(x*), y), x* the input with the worst of
      `codes` (for this c1) pasted into its `ignored` features, as `worst_code` chooses it.

    Every recipe is this module's own code: no mutant of the mechanism reaches a c1 on a g1 it
    did not train. Each weight's c1 starts from the same initial weights and sees the same
    batches and twins, as its own run would: the initial c1 and the batches follow
    (seed, DECISIONS + run), the twins (seed, DECISION_TWINS + run). The c1s of the grid train
    together (`together`: one forward and backward an update for all of them, g1 computed once
    for all); each is its own run to float rounding. The original model is left as it was."""
    checks.integer("seed", seed, 0)
    checks.integer("run", run, 0)
    checks.one_of("recipe", recipe, DECISION_RECIPES)
    weights = [checks.number("weight", w, 0.0) for w in weights]
    if not weights or any((recipe == "plain") != (w == 0) for w in weights):
        raise ValueError(
            f"weights must be 0 for the plain recipe and > 0 for the others; got {weights}"
        )
    if recipe != "plain" and ignored is None:
        raise ValueError("a robustness-seeking c1 needs `ignored`: the features the oracle ignores")
    if recipe == "adversarial" and codes is None:
        raise ValueError("the adversarial recipe needs `codes`: the values its examples paste")
    frozen = copy.deepcopy(model)
    for parameter in frozen.parameters():
        parameter.requires_grad_(False)
    stream = training.generator(seed, DECISIONS + run)
    redraw = training.generator(seed, DECISION_TWINS + run)
    with training.seeded(int(torch.randint(2**31, (1,), generator=stream))):
        first = torch.nn.Sequential(torch.nn.Linear(frozen.c.in_features, frozen.c.out_features))
    stack = together.stack([copy.deepcopy(first) for _ in weights])
    weight = torch.tensor(weights)
    batches = minibatches(len(x), batch_size, stream)

    def decide(inputs: torch.Tensor) -> torch.Tensor:
        # every c1 on the frozen g1: logits (K, N, C)
        return stack.on_all(frozen.features(inputs))

    def seeking(index, logits) -> torch.Tensor:
        # lambda ||c1(g1(x)) - c1(g1(x~))||^2: g1 is frozen, so only c1 can make them agree
        twin = redraw_ignored(x[index], ignored, redraw)
        return (logits - decide(twin)).pow(2).sum(-1).mean(-1)

    def on_twins(index, logits) -> torch.Tensor:
        # CE(c1(g1(x~)), y): c1 trained on the twins as well
        return together.cross_entropy(decide(redraw_ignored(x[index], ignored, redraw)), y[index])

    def adversarial(index, logits) -> torch.Tensor:
        # CE(c1(g1(x*)), y): c1 trained on its worst pasted code as well
        return together.cross_entropy(
            worst_logits(decide, x[index], y[index], ignored, codes), y[index]
        )

    terms = {"siamese": seeking, "twins": on_twins, "adversarial": adversarial}

    def losses_of_update(_: int) -> torch.Tensor:
        index = next(batches)
        logits = decide(x[index])
        loss = together.cross_entropy(logits, y[index])
        return loss if recipe == "plain" else loss + weight * terms[recipe](index, logits)

    histories = together.train(
        stack,
        together.Adam(stack.parameters(), lr=lr),
        losses_of_update,
        steps,
        desc="c1",
    )
    found = []
    for k, history in enumerate(histories):
        new = copy.deepcopy(frozen)
        new.c = stack.member(k)[0]
        found.append(training.Run(new, history))
    return found


def worst_logits(decide, x, y, ignored, codes) -> torch.Tensor:
    """Each decision's logits (K, N, C) on x with the one of `codes` pasted into its `ignored`
    features that gives that decision its largest cross-entropy on y (`worst_code` for K
    decisions at once; `decide` maps inputs (N, D) to logits (K, N, C))."""
    pasted = x.unsqueeze(0).repeat(len(codes), 1, 1)
    pasted[:, :, ignored] = codes.to(x.dtype).unsqueeze(1)
    logits = decide(pasted.flatten(0, 1))  # (K, V N, C)
    logits = logits.view(logits.shape[0], len(codes), len(x), -1)  # (K, V, N, C)
    with torch.no_grad():
        each = F.cross_entropy(
            logits.flatten(0, 2), y.repeat(logits.shape[0] * len(codes)), reduction="none"
        ).view(logits.shape[:3])
        worst = each.argmax(1)  # (K, N): the worst code of each decision, per input
    return logits.gather(1, worst[:, None, :, None].expand(-1, 1, -1, logits.shape[-1]))[:, 0]


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
    """Clean accuracy, and the mechanism's attack on the features the oracle ignores at each
    radius: {"accuracy", "correct" (N,), "attacks": {epsilon: Attack}, "flips": {epsilon:
    share}}. With `values` (rows of values for the ignored features, in the data range) also
    the exhaustive search over them, "pasted" (an Attack); "strongest": per input, flipped by
    the gradient attack at the largest radius or by the search (N,), and "strongest_flips";
    "robust": correct and not flipped (N,), and "robust_accuracy", the accuracy under the
    strongest attack."""
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
            "robust": correct & ~strongest,
            "robust_accuracy": (correct & ~strongest).float().mean().item(),
        }
    return result


# -- the nulls' own code: out of the mechanism's (and its mutants') reach -------------------------


def redraw_ignored(x: torch.Tensor, ignored: torch.Tensor, generator: torch.Generator):
    """x with its `ignored` features redrawn uniformly in [0, 1]: the oracle twin, written again
    for the nulls and the measurements (the mechanism's is `oracle_robustness.oracle_twin`)."""
    fresh = torch.rand(x.shape, generator=generator)
    return torch.where(ignored, fresh, x)


def null_search(
    model: torch.nn.Module, x: torch.Tensor, ignored: torch.Tensor, values: torch.Tensor, steps: int
) -> torch.Tensor:
    """Whether the strongest attack changes each prediction (N,), written again for the nulls:
    signed gradient steps of 2.5 / steps on the ignored features inside [0, 1] (the radius-1
    ball, which holds the whole range), each input stopping at its first change, or any row of
    `values` written into the ignored features. Unbroken, the same as `measure`'s
    "strongest"."""
    x = x.detach()
    with torch.no_grad():
        clean = model(x).argmax(-1)
    moved, flipped = x.clone(), torch.zeros(len(x), dtype=torch.bool)
    for _ in range(steps):
        active = ~flipped
        if not active.any():
            break
        point = moved[active].requires_grad_(True)
        with torch.enable_grad():
            loss = F.cross_entropy(model(point), clean[active], reduction="sum")
            (grad,) = torch.autograd.grad(loss, point)
        step = point.detach() + (2.5 / steps) * grad.sign() * ignored.to(x.dtype)
        here = x[active]
        moved[active] = (here + (step - here).clamp(-1.0, 1.0)).clamp(0.0, 1.0)
        with torch.no_grad():
            flipped[active] = model(moved[active]).argmax(-1) != clean[active]
    with torch.no_grad():
        for value in values:
            pasted = x.clone()
            pasted[:, ignored] = value.to(x.dtype)
            flipped |= model(pasted).argmax(-1) != clean
    return flipped


def measure_null(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    ignored: torch.Tensor,
    values: torch.Tensor,
    steps: int,
) -> dict:
    """A null's clean accuracy and its accuracy under `null_search`: {"accuracy", "correct",
    "strongest", "strongest_flips", "robust", "robust_accuracy"}, as `measure` reports them."""
    checks.tensor("x", x, "(N, D)", dtype="floating")
    with training.evaluating(model):
        correct = model(x).argmax(-1) == y
    strongest = null_search(model, x, ignored, values, steps)
    return {
        "accuracy": correct.float().mean().item(),
        "correct": correct,
        "strongest": strongest,
        "strongest_flips": strongest.float().mean().item(),
        "robust": correct & ~strongest,
        "robust_accuracy": (correct & ~strongest).float().mean().item(),
    }


def constant_decision(y: torch.Tensor) -> dict:
    """The best constant c1 (always the most frequent class of y), measured as `measure_null`
    reports: nothing changes its answer, so its accuracy under any attack is its accuracy."""
    n = checks.tensor("y", y, "(N,)", dtype=torch.int64)["N"]
    correct = y == torch.bincount(y).argmax()
    return {
        "accuracy": correct.float().mean().item(),
        "correct": correct,
        "strongest": torch.zeros(n, dtype=torch.bool),
        "strongest_flips": 0.0,
        "robust": correct,
        "robust_accuracy": correct.float().mean().item(),
    }


def paired_difference(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """The difference of two means measured on the same inputs, mean(a) - mean(b), and its
    standard error from sampling the inputs: the standard deviation of the per-input
    differences a_i - b_i over sqrt(N). a and b are (N,), boolean or real."""
    n = checks.tensor("a", a, "(N,)")["N"]
    checks.tensor("b", b, "(N,)", N=n)
    if n < 2:
        raise ValueError("a paired difference needs two inputs at least")
    d = a.double() - b.double()
    return d.mean().item(), (d.std() / n**0.5).item()


def shift_per_input(
    model: oracle_robustness.Classifier,
    x: torch.Tensor,
    ignored: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """How much g1 moves when only the ignored features change, per input (N,), against how
    much it moves between two different inputs: ||g1(x_n) - g1(x~_n)||^2 over the mean of
    ||g1(x) - g1(x_pi)||^2, x~ a twin (`redraw_ignored`), x_pi the inputs shuffled. Its mean is
    `representation_shift`: 0 when g1 ignores those features exactly (a constant g1 among
    them, whose every distance is 0), near 1 when it moves as much as between two digits."""
    checks.tensor("x", x, "(N, D)", dtype="floating")
    with training.evaluating(model):
        twin = redraw_ignored(x, ignored, generator)
        other = x[torch.randperm(len(x), generator=generator)]
        g = model.features(x)
        to_twin = (g - model.features(twin)).pow(2).sum(-1)
        to_other = (g - model.features(other)).pow(2).sum(-1).mean()
    return to_twin / to_other if to_other > 0 else torch.zeros_like(to_twin)


def shift_at_values(
    model: torch.nn.Module,
    x: torch.Tensor,
    ignored: torch.Tensor,
    values: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """`shift_per_input` at the attack's values instead of a random twin, per input (N,): the
    largest ||g1(x_n) - g1(x_n^v)||^2 over the rows v of `values` written into the ignored
    features (each class's code, the pasting search's candidates), over the mean of
    ||g1(x) - g1(x_pi)||^2. The theorem's condition is a supremum over the inputs the oracle
    holds together; this is its largest value over the points the attack tries."""
    checks.tensor("x", x, "(N, D)", dtype="floating")
    with training.evaluating(model):
        other = x[torch.randperm(len(x), generator=generator)]
        g = model.features(x)
        to_other = (g - model.features(other)).pow(2).sum(-1).mean()
        largest = torch.zeros(len(x))
        for value in values:
            pasted = x.clone()
            pasted[:, ignored] = value.to(x.dtype)
            largest = torch.maximum(largest, (g - model.features(pasted)).pow(2).sum(-1))
    return largest / to_other if to_other > 0 else torch.zeros_like(largest)


def representation_shift(
    model: oracle_robustness.Classifier,
    x: torch.Tensor,
    ignored: torch.Tensor,
    generator: torch.Generator,
) -> float:
    """The mean of `shift_per_input`: mean ||g1(x) - g1(x~)||^2 over mean ||g1(x) -
    g1(x_pi)||^2, the measure of how far g1 is from ignoring the features the oracle ignores."""
    return shift_per_input(model, x, ignored, generator).mean().item()


def choose_weight(validation: dict) -> float:
    """The weight chosen on validation (`validation`: {weight: measure(...)}), the same rule for
    every arm (the plain classifier's weight decay, the Siamese lambda, the augmentation's
    lambda, a robustness-seeking c1's lambda): the highest accuracy under the strongest attack,
    which charges every point of clean accuracy an arm spends; on a tie, fewer changed
    predictions, then the smaller weight."""
    if not validation:
        raise ValueError("no weights to choose from")
    return min(
        validation,
        key=lambda w: (-validation[w]["robust_accuracy"], validation[w]["strongest_flips"], w),
    )
