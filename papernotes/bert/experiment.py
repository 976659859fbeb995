"""The bert chapter's experiment: a bracket language in which every token is fixed by both sides
together, three pre-trainings on it (the masked LM, a left-to-right LM, a right-to-left LM), a
linear probe on their frozen features, and the measurements (what the masking did, where the loss
went, what each position sees).

The data: balanced sequences of three kinds of brackets (a Dyck language), framed by `[CLS]`
and `[SEP]` and padded. The probe's question is a cloze: one bracket of each sequence is hidden,
which was it? Given both sides exactly one bracket fits; given either side alone at least three
do. The paper fine-tunes, and also (section 5.3) uses frozen features with a classifier on top;
here, frozen features and a linear probe whose weight decay is chosen on validation.

The mechanism is `papernotes.bert`, called through the module (`bert.mlm_loss(...)`) so that a
mutant patched onto it reaches these runs.
"""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import dataclass, field

import torch
from torch import nn

from papernotes import bert, checks, data, training
from papernotes.data import minibatches

# The random streams of the chapter's seed (papernotes.training.generator(seed, stream)): the
# corpora, the probe's three sets, the full-length sequences and their replacements; the
# pre-training batches, their masks and the validation loss's masks; the masking of the loss
# check, and the masking drawn in the picture.
CORPUS, VALIDATION, PROBE_TRAIN, PROBE_VALIDATION, PROBE_TEST = 1, 2, 3, 4, 5
FULL_LENGTH, INFLUENCE = 6, 7
BATCHES, MASKS, VALIDATION_MASKS, LOSS_CHECK = 11, 12, 13, 14
PICTURE = 20
OBJECTIVES = ("mlm", "ltr", "rtl")  # masked LM, left-to-right LM, right-to-left LM

# -- the vocabulary: BERT's special tokens (papernotes.bert), then the brackets ------------------

N_TYPES = 3  # ( [ {
OPEN = tuple(range(4, 4 + N_TYPES))  # 4 5 6
CLOSE = tuple(range(4 + N_TYPES, 4 + 2 * N_TYPES))  # 7 8 9
VOCAB_SIZE = 4 + 2 * N_TYPES
SYMBOLS = ("·", "C", "S", "M", "(", "[", "{", ")", "]", "}")  # for pictures: pad, CLS, SEP, MASK


# -- the data: a bracket language -----------------------------------------------------------------


def dyck_sequences(
    n: int, max_pairs: int = 10, generator: torch.Generator | None = None, *, min_pairs: int = 1
) -> torch.Tensor:
    """`n` balanced bracket sequences of three kinds, `[CLS] w [SEP]` padded to 2 max_pairs + 2.

    Each has a number of bracket pairs drawn uniformly from min_pairs..max_pairs; position by
    position
    the next symbol opens (a kind drawn uniformly) or closes the innermost open bracket, with
    even odds whenever both keep the sequence completable. Returns (n, 2 max_pairs + 2) long.
    """
    n = checks.integer("n", n)
    max_pairs = checks.integer("max_pairs", max_pairs)
    min_pairs = checks.integer("min_pairs", min_pairs)
    if min_pairs > max_pairs:
        raise ValueError(f"min_pairs must be at most max_pairs = {max_pairs}; got {min_pairs}")
    length = 2 * max_pairs
    pairs = torch.randint(min_pairs, max_pairs + 1, (n,), generator=generator)
    total = 2 * pairs
    kinds = torch.randint(N_TYPES, (n, length), generator=generator)
    coins = torch.rand(n, length, generator=generator) < 0.5
    stack = torch.zeros(n, max_pairs + 1, dtype=torch.long)
    depth = torch.zeros(n, dtype=torch.long)
    words = torch.full((n, length), bert.PAD, dtype=torch.long)
    rows = torch.arange(n)
    for t in range(length):
        live = t < total
        left = total - t  # symbols still to write, this one included
        # Open only while the brackets still open can all be closed in the symbols left.
        may_open = depth + 1 <= left - 1
        opens = live & may_open & ((depth == 0) | coins[:, t])
        closes = live & ~opens
        top = stack[rows, (depth - 1).clamp(min=0)]
        words[:, t] = torch.where(opens, kinds[:, t] + OPEN[0], words[:, t])
        words[:, t] = torch.where(closes, top + CLOSE[0], words[:, t])
        stack[rows, depth] = torch.where(opens, kinds[:, t], stack[rows, depth])
        depth = depth + opens.long() - closes.long()
    framed = torch.full((n, length + 2), bert.PAD, dtype=torch.long)
    framed[:, 0] = bert.CLS
    framed[:, 1 : length + 1] = words
    framed[rows, total + 1] = bert.SEP
    return framed


def spell(row) -> str:
    """A sequence (a list or a 1-d tensor of token ids) as text, padding left out."""
    return "".join(SYMBOLS[t] for t in row if t != bert.PAD)


# -- what the masking did -------------------------------------------------------------------------


def masking_counts(tokens: torch.Tensor, inputs: torch.Tensor, labels: torch.Tensor) -> dict:
    """What a masking did, read from its output alone, as counts: the eligible tokens, those
    that carry the loss ("selected"), and among those the ones whose input is [MASK] ("mask"),
    another token ("other token") or the original token ("unchanged")."""
    checks.tensor("tokens", tokens, "(B, T)", dtype=torch.long)
    checks.tensor("inputs", inputs, "(B, T)", B=tokens.shape[0], T=tokens.shape[1])
    checks.tensor("labels", labels, "(B, T)", B=tokens.shape[0], T=tokens.shape[1])
    eligible = ~torch.isin(tokens, torch.tensor(bert.SPECIAL_IDS))
    selected = labels != bert.IGNORE
    mask = bert.MASK
    return {
        "eligible": eligible.sum().item(),
        "selected": selected.sum().item(),
        "mask": (selected & (inputs == mask)).sum().item(),
        "other token": (selected & (inputs != mask) & (inputs != tokens)).sum().item(),
        "unchanged": (selected & (inputs == tokens)).sum().item(),
    }


def shares_of(counts: dict) -> dict:
    """Counts (`masking_counts`, or their sums over batches) as shares: "selected" of the
    eligible tokens, the others of the selected ones; with the counts they come from
    ("eligible", "selected_count")."""
    n = counts["selected"]
    return {
        "eligible": counts["eligible"],
        "selected_count": n,
        "selected": n / counts["eligible"],
        **{k: counts[k] / n for k in ("mask", "other token", "unchanged")},
    }


def masking_shares(tokens: torch.Tensor, inputs: torch.Tensor, labels: torch.Tensor) -> dict:
    """`shares_of(masking_counts(tokens, inputs, labels))`: one masking's shares."""
    return shares_of(masking_counts(tokens, inputs, labels))


def expected_shares(
    mask_prob: float = 0.15, mask_fraction: float = 0.8, random_fraction: float = 0.1
) -> dict:
    """The shares `masking_shares` should find on this vocabulary: a random token is the
    original one with probability 1 / (number of ordinary tokens)."""
    same = 1 / (VOCAB_SIZE - len(bert.SPECIAL_IDS) - 1)
    return {
        "selected": mask_prob,
        "mask": mask_fraction,
        "other token": random_fraction * (1 - same),
        "unchanged": 1 - mask_fraction - random_fraction * (1 - same),
    }


def masking_z(shares: dict, expected: dict) -> dict:
    """Per share of `expected`, how many standard errors the measured share (`masking_shares`)
    lies from it, |z| = |share - p| / sqrt(p (1 - p) / count): "selected" is a share of the
    eligible tokens, the others are shares of the selected ones."""
    counts = {"selected": shares["eligible"]} | dict.fromkeys(
        ("mask", "other token", "unchanged"), shares["selected_count"]
    )
    return {k: abs(shares[k] - p) / math.sqrt(p * (1 - p) / counts[k]) for k, p in expected.items()}


# -- pre-training ---------------------------------------------------------------------------------


@dataclass
class PretrainRun(training.Run):
    """A pre-trained encoder, the History of its validation LM loss ("val_loss"), and for the
    masked LM the counts (`masking_counts`) summed over every batch pre-training masked
    (`masking`; empty for the one-way LMs), and copies of the weights after the updates asked
    for (`snapshots[step]`)."""

    masking: dict = field(default_factory=dict)
    snapshots: dict[int, dict] = field(default_factory=dict)

    def at(self, step: int) -> bert.Encoder:
        """The encoder as it was after `step` updates (one of the snapshots)."""
        if step not in self.snapshots:
            raise ValueError(f"step must be one of {sorted(self.snapshots)}; got {step}")
        model = copy.deepcopy(self.model)
        model.load_state_dict(self.snapshots[step])
        return model.eval()


def new_encoder(*, causal: bool, seed: int, max_len: int, **sizes) -> bert.Encoder:
    """An untrained encoder over this vocabulary whose initial weights follow `seed` (the same
    for both modes)."""
    with training.seeded(seed):
        return bert.Encoder(causal=causal, vocab_size=VOCAB_SIZE, max_len=max_len, **sizes).eval()


def pretrain(
    corpus: torch.Tensor,
    val: torch.Tensor,
    *,
    objective: str,
    seed: int,
    steps: int = 300,
    batch_size: int = 32,
    lr: float = 3e-3,
    eval_every: int = 100,
    mask_prob: float = 0.15,
    mask_fraction: float = 0.8,
    random_fraction: float = 0.1,
    snapshot_at: tuple = (),
    **sizes,
) -> PretrainRun:
    """Pre-train an encoder on `corpus` (N, T) with Adam: the masked LM (`objective="mlm"`,
    BERT, bidirectional), the left-to-right LM ("ltr", causal, the next token) or the
    right-to-left LM ("rtl", causal on the reversed sequences, the previous token). The three
    start from the same initial weights and see the same batches; the masked LM's masks come
    from the run's mask stream and are counted as they are drawn. The weights after each number
    of updates in `snapshot_at` are kept (`PretrainRun.at`)."""
    d = checks.tensor("corpus", corpus, "(N, T)", dtype=torch.long)
    checks.tensor("val", val, "(M, T)", T=d["T"], dtype=torch.long)
    checks.one_of("objective", objective, OBJECTIVES)
    model = new_encoder(causal=objective != "mlm", seed=seed, max_len=d["T"], **sizes)
    batches = minibatches(d["N"], batch_size, training.generator(seed, BATCHES))
    masks = training.generator(seed, MASKS)
    fractions = {"mask_fraction": mask_fraction, "random_fraction": random_fraction}
    counts: dict[str, int] = {}
    snapshots: dict[int, dict] = {}

    def loss_of(batch: torch.Tensor, masking: torch.Generator | None, count: bool) -> torch.Tensor:
        if objective == "ltr":
            return bert.ltr_loss(model, batch)
        if objective == "rtl":
            return bert.rtl_loss(model, batch)
        # each batch masked afresh, from the run's mask stream; what the masking did is counted
        kept: list = []
        loss = bert.mlm_loss(model, batch, masking, mask_prob, **fractions, keep=kept)
        if count:
            for k, v in masking_counts(batch, *kept[0]).items():
                counts[k] = counts.get(k, 0) + v
        return loss

    def evaluate() -> dict[str, float]:
        # the validation loss masks the validation set the same way at every evaluation
        masking = training.generator(seed, VALIDATION_MASKS)
        return {"val_loss": loss_of(val, masking, count=False).item()}

    def update(i: int) -> torch.Tensor:
        if i in snapshot_at:  # the weights after i updates
            snapshots[i] = copy.deepcopy(model.state_dict())
        return loss_of(corpus[next(batches)], masks, count=True)

    history = training.train(
        model,
        torch.optim.Adam(model.parameters(), lr=lr),
        update,
        steps,
        evaluate=evaluate,
        eval_every=eval_every,
        desc=f"{objective} LM",
    )
    if steps in snapshot_at:
        snapshots[steps] = copy.deepcopy(model.state_dict())
    return PretrainRun(model, history, counts, snapshots)


def loss_placement(model: bert.Encoder, tokens: torch.Tensor, seed: int) -> tuple[float, float]:
    """The masked-LM loss of `tokens` as `bert.mlm_loss` computes it, and by hand: the mean
    cross-entropy of the original tokens at the positions `bert.choose_masking` selects with
    the same random draws (the first draws of `mask_tokens`). Equal when the loss sits on the
    selected positions and nowhere else."""
    checks.tensor("tokens", tokens, "(B, T)", dtype=torch.long)
    kept: list = []
    with training.evaluating(model), torch.no_grad():
        loss = bert.mlm_loss(model, tokens, training.generator(seed, LOSS_CHECK), keep=kept)
        selected = bert.choose_masking(
            tokens, 0.15, training.generator(seed, LOSS_CHECK), bert.SPECIAL_IDS
        ).selected
        log_p = model(kept[0][0]).log_softmax(-1)
        by_hand = -log_p.gather(-1, tokens[..., None])[..., 0][selected].mean()
    return loss.item(), by_hand.item()


# -- the probe: which bracket was hidden? ---------------------------------------------------------

BRACKETS = OPEN + CLOSE  # the probe's six classes, in this order


def cloze_set(
    tokens: torch.Tensor, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One bracket of each sequence of `tokens` (B, T), drawn uniformly, to be hidden: returns
    (rows, columns, labels), each (B,), the label the bracket's index in `BRACKETS` (0-5)."""
    b = checks.tensor("tokens", tokens, "(B, T)", dtype=torch.long)["B"]
    length = torch.isin(tokens, torch.tensor(BRACKETS)).sum(1)
    cols = 1 + (torch.rand(b, generator=generator) * length).long()  # after [CLS]
    rows = torch.arange(b)
    labels = (tokens[rows, cols, None] == torch.tensor(BRACKETS)).long().argmax(-1)
    return rows, cols, labels


def cloze_features(encoders: dict, tokens: torch.Tensor, rows, cols) -> torch.Tensor:
    """Frozen features for the hidden bracket at (rows, cols) of `tokens`, (N, D).

    `encoders` holds what reads it: {"mlm": m} the bidirectional encoder's features at the
    position, its input there [MASK]; {"ltr": m} the left-to-right LM's features one position
    before (it has read everything left of the gap); {"rtl": m} the right-to-left LM's one
    position after; {"ltr": a, "rtl": b} both side by side (ELMo's concatenation)."""
    checks.tensor("tokens", tokens, "(B, T)", dtype=torch.long)
    parts = []
    with torch.no_grad():
        if "mlm" in encoders:
            hidden = tokens.clone()
            hidden[rows, cols] = bert.MASK
            with training.evaluating(encoders["mlm"]):
                parts.append(encoders["mlm"].features(hidden)[rows, cols])
        if "ltr" in encoders:
            with training.evaluating(encoders["ltr"]):
                parts.append(encoders["ltr"].features(tokens)[rows, cols - 1])
        if "rtl" in encoders:
            with training.evaluating(encoders["rtl"]):
                parts.append(bert.rtl_features(encoders["rtl"], tokens)[rows, cols + 1])
    return torch.cat(parts, -1)


@dataclass
class ProbeRun(training.Run):
    """A linear probe (`model`, on standardised features), the History of its "val_accuracy",
    and the standardisation fitted on its training features."""

    standardize: data.Standardizer

    def correct(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Whether each item's prediction is right, (N,) bool."""
        with training.evaluating(self.model), torch.no_grad():
            return self.model(self.standardize(x)).argmax(-1) == y

    def accuracy(self, x: torch.Tensor, y: torch.Tensor) -> float:
        return training.accuracy_of(self.model, self.standardize(x), y)


def train_probe(
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    val_x: torch.Tensor,
    val_y: torch.Tensor,
    *,
    seed: int,
    classes: int = 2,
    steps: int = 100,
    lr: float = 0.03,
    weight_decay: float = 0.0,
) -> ProbeRun:
    """Logistic regression on frozen features: one linear layer to `classes` outputs,
    full-batch Adam on cross-entropy (weight decay as an L2 penalty), the features standardised
    with the training set's mean and deviation."""
    d = checks.tensor("train_x", train_x, "(N, D)", dtype="floating")
    checks.tensor("train_y", train_y, "(N,)", N=d["N"])
    checks.tensor("val_x", val_x, "(M, D)", D=d["D"], dtype="floating")
    checks.tensor("val_y", val_y, "(M,)", M=val_x.shape[0])
    checks.integer("classes", classes, 2)
    checks.number("weight_decay", weight_decay, 0.0)
    standardize = data.Standardizer.fit(train_x, eps=1e-6)
    x = standardize(train_x)
    with training.seeded(seed):
        probe = nn.Linear(d["D"], classes)
    optimizer = torch.optim.Adam(probe.parameters(), lr=lr, weight_decay=weight_decay)
    run = ProbeRun(probe, training.History(), standardize)
    run.history = training.train_classifier(
        probe,
        train_y,
        optimizer,
        steps,
        batches=itertools.repeat(torch.arange(d["N"])),  # full batch: every item, every update
        logits_of=lambda index: probe(x[index]),
        evaluate=lambda: {"val_accuracy": run.accuracy(val_x, val_y)},
        eval_every=steps,
        desc="probe",
    )
    return run


@dataclass
class Tuned:
    """A probe tuned on validation: the validation accuracy at each weight decay of the grid,
    the one chosen, and on the test items whether each was answered right (`correct`)."""

    val_accuracy: dict[float, float]
    chosen: float
    correct: torch.Tensor

    @property
    def test_accuracy(self) -> float:
        return self.correct.float().mean().item()


def tune_probe(
    features: dict, labels: dict, weight_decays, *, seed: int, classes: int = len(BRACKETS)
) -> Tuned:
    """A probe per weight decay of the grid on features["train"], each scored on
    features["validation"]; the best on validation (the first of a tie) answers
    features["test"]."""
    runs = {
        wd: train_probe(
            features["train"],
            labels["train"],
            features["validation"],
            labels["validation"],
            seed=seed,
            classes=classes,
            weight_decay=wd,
        )
        for wd in weight_decays
    }
    val = {wd: run.history.final("val_accuracy") for wd, run in runs.items()}
    chosen = max(val, key=val.get)
    return Tuned(val, chosen, runs[chosen].correct(features["test"], labels["test"]))


def majority_accuracy(train_y: torch.Tensor, test_y: torch.Tensor) -> float:
    """Accuracy on `test_y` of always answering the training labels' most common class."""
    majority = torch.bincount(train_y).argmax()
    return (test_y == majority).float().mean().item()


def paired_noise(correct_a: torch.Tensor, correct_b: torch.Tensor, standard_errors: int = 3):
    """`standard_errors` standard errors of the difference of two accuracies measured on the
    same N items (`correct_a`, `correct_b`, (N,) bool): k sqrt(var(a_i - b_i) / N)."""
    checks.tensor("correct_a", correct_a, "(N,)")
    checks.tensor("correct_b", correct_b, "(N,)", N=correct_a.shape[0])
    diff = correct_a.float() - correct_b.float()
    return standard_errors * math.sqrt(diff.var(correction=0).item() / len(diff))


# -- what each position sees ----------------------------------------------------------------------


def influence(
    model: bert.Encoder,
    tokens: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    backwards: bool = False,
):
    """How much the features at position i move when the bracket at position j is replaced by
    another bracket: (T, T), entry (i, j) the mean over sequences of the change's norm, divided
    by the mean norm of the features. `tokens` (B, T) should have no padding (see
    `dyck_sequences(min_pairs=...)`); [CLS] and [SEP] are never replaced. A causal encoder has
    zeros above the diagonal (j > i); a bidirectional one need not. `backwards=True` reads a
    right-to-left encoder (`bert.rtl_features`): zeros below the diagonal."""
    b, t = checks.tensor("tokens", tokens, "(B, T)", dtype=torch.long).values()
    brackets = torch.tensor(OPEN + CLOSE)
    out = torch.zeros(t, t)

    def features(x):
        return bert.rtl_features(model, x) if backwards else model.features(x)

    with training.evaluating(model), torch.no_grad():
        base = features(tokens)
        scale = base.norm(dim=-1).mean()
        for j in range(t):
            if not torch.isin(tokens[:, j], brackets).all():
                continue
            # another bracket, never the same one: a shift of 1-5 around the six
            shift = torch.randint(1, len(brackets), (b,), generator=generator)
            index = (tokens[:, j, None] == brackets).long().argmax(-1)
            changed = tokens.clone()
            changed[:, j] = brackets[(index + shift) % len(brackets)]
            out[:, j] = (features(changed) - base).norm(dim=-1).mean(0) / scale
    return out


def influence_by_side(moved: torch.Tensor) -> dict[str, float]:
    """The mean of an influence map `moved` (T, T) (from `influence`) from the left of i
    (j < i), from its right (j > i) and from the next token (j = i + 1)."""
    t = checks.tensor("moved", moved, "(T, T)")["T"]
    right_of = torch.ones(t, t, dtype=torch.bool).triu(1)
    left_of = torch.ones(t, t, dtype=torch.bool).tril(-1)
    next_token = torch.zeros(t, t, dtype=torch.bool)
    next_token[torch.arange(t - 1), torch.arange(1, t)] = True
    return {
        "left": moved[left_of].mean().item(),
        "right": moved[right_of].mean().item(),
        "next": moved[next_token].mean().item(),
    }
