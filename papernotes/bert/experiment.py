"""The bert chapter's experiment: a bracket language with long-range structure, the masked LM and
the left-to-right LM pre-trained on it, a linear probe on their frozen features, and the
measurements (what the masking did, what each position sees).

The data: balanced sequences of three kinds of brackets (a Dyck language), framed by `[CLS]`
and `[SEP]` and padded. The probe asks, of each opening bracket, whether the very next token
closes it: a question that needs the context to the right. The paper fine-tunes, and also
(section 5.3) uses the frozen features with a classifier on top; here, frozen features and a
linear probe.

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
# pre-training batches, their masks and the validation loss's masks; the masking read back in
# the claim check, and the masking drawn in the picture.
CORPUS, VALIDATION, PROBE_TRAIN, PROBE_VALIDATION, PROBE_TEST = 1, 2, 3, 4, 5
FULL_LENGTH, INFLUENCE = 6, 7
BATCHES, MASKS, VALIDATION_MASKS, MASKING = 11, 12, 13, 14
PICTURE = 20

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


def masking_shares(tokens: torch.Tensor, inputs: torch.Tensor, labels: torch.Tensor) -> dict:
    """What a masking did, read from its output alone: the share of eligible tokens that carry
    the loss ("selected"), and among those the shares whose input is [MASK] ("mask"), another
    token ("other token") or the original token ("unchanged"); with the counts they come from
    ("eligible", "selected_count")."""
    checks.tensor("tokens", tokens, "(B, T)", dtype=torch.long)
    checks.tensor("inputs", inputs, "(B, T)", B=tokens.shape[0], T=tokens.shape[1])
    checks.tensor("labels", labels, "(B, T)", B=tokens.shape[0], T=tokens.shape[1])
    eligible = ~torch.isin(tokens, torch.tensor(bert.SPECIAL_IDS))
    selected = labels != bert.IGNORE
    n_eligible, n_selected = eligible.sum().item(), selected.sum().item()
    mask = bert.MASK
    return {
        "eligible": n_eligible,
        "selected_count": n_selected,
        "selected": n_selected / n_eligible,
        "mask": (selected & (inputs == mask)).sum().item() / n_selected,
        "other token": (selected & (inputs != mask) & (inputs != tokens)).sum().item() / n_selected,
        "unchanged": (selected & (inputs == tokens)).sum().item() / n_selected,
    }


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
    """A pre-trained encoder, the History of its validation LM loss ("val_loss"), and copies of
    its weights after each evaluation (`snapshots[step]`)."""

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
    causal: bool,
    seed: int,
    steps: int = 800,
    batch_size: int = 32,
    lr: float = 3e-3,
    eval_every: int = 100,
    mask_prob: float = 0.15,
    mask_fraction: float = 0.8,
    random_fraction: float = 0.1,
    **sizes,
) -> PretrainRun:
    """Pre-train an encoder on `corpus` (N, T): the masked LM (`causal=False`, BERT) or the
    left-to-right LM (`causal=True`), with Adam, the same initial weights for both, batches and
    masks from the run's seed. Snapshots of the weights are kept at every evaluation."""
    d = checks.tensor("corpus", corpus, "(N, T)", dtype=torch.long)
    checks.tensor("val", val, "(M, T)", T=d["T"], dtype=torch.long)
    checks.boolean("causal", causal)
    model = new_encoder(causal=causal, seed=seed, max_len=d["T"], **sizes)
    batches = minibatches(d["N"], batch_size, training.generator(seed, BATCHES))
    masks = training.generator(seed, MASKS)
    fractions = {"mask_fraction": mask_fraction, "random_fraction": random_fraction}
    snapshots: dict[int, dict] = {}

    def loss_of(batch: torch.Tensor, masking: torch.Generator | None) -> torch.Tensor:
        if causal:
            return bert.ltr_loss(model, batch)
        # each batch masked afresh, from the run's mask stream
        return bert.mlm_loss(model, batch, masking, mask_prob, **fractions)

    def evaluate() -> dict[str, float]:
        snapshots[len(snapshots) * eval_every + eval_every] = copy.deepcopy(model.state_dict())
        # the validation loss masks the validation set the same way at every evaluation
        return {"val_loss": loss_of(val, training.generator(seed, VALIDATION_MASKS)).item()}

    history = training.train(
        model,
        torch.optim.Adam(model.parameters(), lr=lr),
        lambda _: loss_of(corpus[next(batches)], masks),
        steps,
        evaluate=evaluate,
        eval_every=eval_every,
        desc="LTR LM" if causal else "masked LM",
    )
    snapshots = dict(zip(history.steps, snapshots.values(), strict=True))
    return PretrainRun(model, history, snapshots)


# -- the probe ------------------------------------------------------------------------------------


def probe_set(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every opening bracket of `tokens` (B, T) and its label: 1 when the very next token closes
    it. Returns (rows, columns, labels), each (N,). The label needs the right-hand context."""
    checks.tensor("tokens", tokens, "(B, T)", dtype=torch.long)
    opening = torch.isin(tokens[:, :-1], torch.tensor(OPEN))
    rows, cols = opening.nonzero(as_tuple=True)
    labels = torch.isin(tokens[rows, cols + 1], torch.tensor(CLOSE)).long()
    return rows, cols, labels


def probe_features(model: bert.Encoder, tokens: torch.Tensor, rows, cols) -> torch.Tensor:
    """The frozen encoder's last-layer features at (rows, cols), (N, D)."""
    checks.tensor("tokens", tokens, "(B, T)", dtype=torch.long)
    with training.evaluating(model):
        return model.features(tokens)[rows, cols]


@dataclass
class ProbeRun(training.Run):
    """A linear probe (`model`, on standardised features), the History of its "val_accuracy",
    and the standardisation fitted on its training features."""

    standardize: data.Standardizer

    def accuracy(self, x: torch.Tensor, y: torch.Tensor) -> float:
        return training.accuracy_of(self.model, self.standardize(x), y)


def train_probe(
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    val_x: torch.Tensor,
    val_y: torch.Tensor,
    *,
    seed: int,
    steps: int = 300,
    lr: float = 0.01,
    weight_decay: float = 0.0,
) -> ProbeRun:
    """Logistic regression on frozen features: one linear layer, full-batch Adam on
    cross-entropy, the features standardised with the training set's mean and deviation."""
    d = checks.tensor("train_x", train_x, "(N, D)", dtype="floating")
    checks.tensor("train_y", train_y, "(N,)", N=d["N"])
    checks.tensor("val_x", val_x, "(M, D)", D=d["D"], dtype="floating")
    checks.tensor("val_y", val_y, "(M,)", M=val_x.shape[0])
    checks.number("weight_decay", weight_decay, 0.0)
    standardize = data.Standardizer.fit(train_x, eps=1e-6)
    x = standardize(train_x)
    with training.seeded(seed):
        probe = nn.Linear(d["D"], 2)
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


def probe_accuracy(
    model: bert.Encoder, tokens: dict, items: dict, *, seed: int
) -> tuple[float, float]:
    """Probe a frozen encoder: its features at the items (`probe_set`) of tokens["train"],
    tokens["validation"] and tokens["test"], a probe trained on the first and validated on the
    second (`train_probe`); returns (validation accuracy, test accuracy)."""
    features = {
        name: probe_features(model, tokens[name], rows, cols)
        for name, (rows, cols, _) in items.items()
    }
    labels = {name: item[2] for name, item in items.items()}
    run = train_probe(
        features["train"], labels["train"], features["validation"], labels["validation"], seed=seed
    )
    return run.history.final("val_accuracy"), run.accuracy(features["test"], labels["test"])


def majority_accuracy(train_y: torch.Tensor, test_y: torch.Tensor) -> float:
    """Accuracy on `test_y` of always answering the training labels' majority class."""
    majority = int(train_y.float().mean() >= 0.5)
    return (test_y == majority).float().mean().item()


def difference_noise(a: float, b: float, n: int, standard_errors: int = 3) -> float:
    """`standard_errors` standard errors of the difference of two accuracies `a` and `b`, each
    over `n` items: k sqrt((a (1 - a) + b (1 - b)) / n)."""
    return standard_errors * math.sqrt((a * (1 - a) + b * (1 - b)) / n)


# -- what each position sees ----------------------------------------------------------------------


def influence(model: bert.Encoder, tokens: torch.Tensor, generator: torch.Generator | None = None):
    """How much the features at position i move when the bracket at position j is replaced by
    another bracket: (T, T), entry (i, j) the mean over sequences of the change's norm, divided
    by the mean norm of the features. `tokens` (B, T) should have no padding (see
    `dyck_sequences(min_pairs=...)`); [CLS] and [SEP] are never replaced. A causal encoder has
    zeros above the diagonal (j > i); a bidirectional one need not."""
    b, t = checks.tensor("tokens", tokens, "(B, T)", dtype=torch.long).values()
    brackets = torch.tensor(OPEN + CLOSE)
    out = torch.zeros(t, t)
    with training.evaluating(model):
        base = model.features(tokens)
        scale = base.norm(dim=-1).mean()
        for j in range(t):
            if not torch.isin(tokens[:, j], brackets).all():
                continue
            # another bracket, never the same one: a shift of 1-5 around the six
            shift = torch.randint(1, len(brackets), (b,), generator=generator)
            index = (tokens[:, j, None] == brackets).long().argmax(-1)
            changed = tokens.clone()
            changed[:, j] = brackets[(index + shift) % len(brackets)]
            out[:, j] = (model.features(changed) - base).norm(dim=-1).mean(0) / scale
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
