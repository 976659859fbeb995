"""The bert chapter's experiment: a bracket language with joints that need both sides, four
pre-trainings on it (the masked LM with the paper's 80/10/10 mix and with 100/0/0, a left-to-right
LM, a right-to-left LM), a probe on their frozen features, and the measurements (what the masking
did, where the loss went, what each position sees).

The data: short balanced bracket words of three kinds, joined by joint symbols and framed by
`[CLS]` and `[SEP]`. A joint's value is the sum modulo 3 of the kinds of its two neighbours, so
either side alone leaves it uniform and no rule that adds a score from the left to one from the
right computes it. The probe's question: one joint of each sequence is replaced by a random joint
symbol (no [MASK] anywhere); which one belongs there? The paper fine-tunes, and also (section 5.3)
trains a BiLSTM on frozen features; here, frozen features and a small MLP head (or a linear one)
whose weight decay is chosen on validation, the same for every encoder.

The mechanism is `papernotes.bert`, called through the module (`bert.mlm_loss(...)`) so that a
mutant patched onto it reaches these runs. The count-only rule (`side_counts`) and the probe
heads use no part of it.
"""

from __future__ import annotations

import contextlib
import copy
import math
from dataclasses import dataclass, field

import torch
from torch import nn

from papernotes import bert, checks, data, together, training
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
# the encoder's sizes (bert.Encoder's defaults): width, heads, layers, feed-forward width 2d
ENCODER = {"d_model": 64, "n_heads": 4, "n_layers": 2, "d_ff": 128}

# -- the vocabulary: BERT's special tokens (papernotes.bert), the brackets, the joint symbols ------

N_TYPES = 3  # ( [ {
OPEN = tuple(range(4, 4 + N_TYPES))  # 4 5 6
CLOSE = tuple(range(4 + N_TYPES, 4 + 2 * N_TYPES))  # 7 8 9
JOINT = tuple(range(4 + 2 * N_TYPES, 4 + 3 * N_TYPES))  # 10 11 12: the joint symbols 0 1 2
BRACKETS = OPEN + CLOSE
VOCAB_SIZE = 4 + 3 * N_TYPES
# for pictures: pad, CLS, SEP, MASK, the brackets, the joint symbols
SYMBOLS = ("·", "C", "S", "M", "(", "[", "{", ")", "]", "}", "0", "1", "2")


# -- the data: a bracket language with a joint -----------------------------------------------------


def _dyck_words(pairs: torch.Tensor, length: int, generator) -> torch.Tensor:
    """Balanced bracket words of `pairs` (n,) pairs each, padded to `length` (n, length): position
    by position the next symbol opens (a kind drawn uniformly) or closes the innermost open
    bracket, with even odds whenever both keep the word completable."""
    n = len(pairs)
    total = 2 * pairs
    kinds = torch.randint(N_TYPES, (n, length), generator=generator)
    coins = torch.rand(n, length, generator=generator) < 0.5
    stack = torch.zeros(n, length // 2 + 1, dtype=torch.long)
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
    return words


def dyck_sequences(
    n: int, max_pairs: int = 10, generator: torch.Generator | None = None, *, min_pairs: int = 1
) -> torch.Tensor:
    """`n` balanced bracket sequences of three kinds, `[CLS] w [SEP]` padded to 2 max_pairs + 2,
    each with a number of bracket pairs drawn uniformly from min_pairs..max_pairs. Returns
    (n, 2 max_pairs + 2) long."""
    n = checks.integer("n", n)
    max_pairs = checks.integer("max_pairs", max_pairs)
    min_pairs = checks.integer("min_pairs", min_pairs)
    if min_pairs > max_pairs:
        raise ValueError(f"min_pairs must be at most max_pairs = {max_pairs}; got {min_pairs}")
    pairs = torch.randint(min_pairs, max_pairs + 1, (n,), generator=generator)
    words = _dyck_words(pairs, 2 * max_pairs, generator)
    framed = torch.full((n, 2 * max_pairs + 2), bert.PAD, dtype=torch.long)
    framed[:, 0] = bert.CLS
    framed[:, 1:-1] = words
    framed[torch.arange(n), 2 * pairs + 1] = bert.SEP
    return framed


def joint_of(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """A joint symbol's value (0-2) for the kind (0-2) of the bracket right before it (a closing
    one) and the kind of the bracket right after it (an opening one): their sum modulo 3."""
    return (before + after) % N_TYPES


def joint_sequences(
    n: int,
    segments: int = 5,
    max_pairs: int = 2,
    generator: torch.Generator | None = None,
    *,
    min_segments: int = 2,
) -> torch.Tensor:
    """`n` sequences `[CLS] w1 j1 w2 j2 ... wk [SEP]`, padded to segments (2 max_pairs + 1) + 1:
    k balanced bracket words (min_segments..segments of them, each of 1..max_pairs pairs, drawn
    uniformly), and between each two a joint symbol whose value is `joint_of` the kind of the
    bracket before it (the closing bracket that ends one word) and the kind of the bracket after
    it (the opening bracket that starts the next). Returns (n, segments (2 max_pairs + 1) + 1)
    long."""
    n = checks.integer("n", n)
    segments = checks.integer("segments", segments, 2)
    max_pairs = checks.integer("max_pairs", max_pairs)
    min_segments = checks.integer("min_segments", min_segments, 2)
    if min_segments > segments:
        raise ValueError(f"min_segments must be at most segments = {segments}; got {min_segments}")
    count = torch.randint(min_segments, segments + 1, (n,), generator=generator)
    rows = torch.arange(n)
    out = torch.full((n, segments * (2 * max_pairs + 1) + 1), bert.PAD, dtype=torch.long)
    out[:, 0] = bert.CLS
    at = torch.ones(n, dtype=torch.long)  # where the next symbol goes
    before = torch.zeros(n, dtype=torch.long)  # the kind of the last closing bracket written
    for s in range(segments):
        live = s < count
        pairs = torch.randint(1, max_pairs + 1, (n,), generator=generator)
        word = _dyck_words(pairs, 2 * max_pairs, generator)
        if s > 0:  # the joint between the last word and this one
            joint = joint_of(before, word[:, 0] - OPEN[0]) + JOINT[0]
            out[rows[live], at[live]] = joint[live]
            at = at + live.long()
        for j in range(2 * max_pairs):
            real = live & (j < 2 * pairs)
            out[rows[real], at[real]] = word[real, j]
            at = at + real.long()
        last = word[rows, 2 * pairs - 1] - CLOSE[0]  # a word ends with a closing bracket
        before = torch.where(live, last, before)
    out[rows, at] = bert.SEP
    return out


def spell(row) -> str:
    """A sequence (a list or a 1-d tensor of token ids) as text, padding left out."""
    return "".join(SYMBOLS[t] for t in row if t != bert.PAD)


# -- what the masking did --------------------------------------------------------------------------


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


# -- pre-training ----------------------------------------------------------------------------------


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


# -- the probe: which joint symbol belongs here? ---------------------------------------------------


def joint_items(tokens: torch.Tensor, generator: torch.Generator | None = None):
    """The probe's items from joint sequences `tokens` (B, T): returns (inputs, cols, labels).
    One joint of each sequence is drawn uniformly: `cols` (B,) is its position, `labels` (B,)
    its value (0-2), and `inputs` the sequences with it replaced by a joint symbol drawn
    uniformly (the true one a third of the time): what every encoder reads, with no [MASK]."""
    b = checks.tensor("tokens", tokens, "(B, T)", dtype=torch.long)["B"]
    is_joint = torch.isin(tokens, torch.tensor(JOINT))
    count = is_joint.sum(1)
    if not (count >= 1).all():
        raise ValueError("tokens must hold at least one joint symbol per sequence")
    pick = (torch.rand(b, generator=generator) * count).long()  # which joint, 0..count-1
    cols = ((is_joint.cumsum(1) == (pick + 1)[:, None]) & is_joint).long().argmax(1)
    rows = torch.arange(b)
    labels = tokens[rows, cols] - JOINT[0]
    inputs = tokens.clone()
    inputs[rows, cols] = JOINT[0] + torch.randint(N_TYPES, (b,), generator=generator)
    return inputs, cols, labels


def by_length(read, inputs: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """`read(inputs, cols)` -> (B, D) run on the sequences of each real length together, each
    group cut to its length: the padding after [SEP] costs as much as a real token and changes
    nothing a real position sees (it is masked as a key, and positions are counted from the
    start). Rows come back in the order of `inputs`."""
    length = (inputs != bert.PAD).sum(1)
    out = None
    for n in length.unique().tolist():
        rows = (length == n).nonzero()[:, 0]
        part = read(inputs[rows, :n], cols[rows])
        if out is None:
            out = part.new_empty(len(inputs), part.shape[-1])
        out[rows] = part
    return out


def gap_features(encoders: dict, inputs: torch.Tensor, cols: torch.Tensor, *, mask=False):
    """Frozen features for the joint at `cols` (B,) of `inputs` (B, T), (B, D).

    `encoders` holds what reads it: {"mlm": m} the bidirectional encoder's features at the
    joint's position (its input there the symbol shown, or [MASK] with `mask=True`); {"ltr": m}
    the left-to-right LM's features one position before (it has read everything left of the
    joint); {"rtl": m} the right-to-left LM's one position after; {"ltr": a, "rtl": b} both
    side by side (ELMo's concatenation). Sequences are read in groups of one length
    (`by_length`)."""
    checks.tensor("inputs", inputs, "(B, T)", dtype=torch.long)

    def read(inputs: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        rows = torch.arange(len(cols))
        parts = []
        if "mlm" in encoders:
            shown = inputs.clone()
            if mask:
                shown[rows, cols] = bert.MASK
            parts.append(encoders["mlm"].features(shown)[rows, cols])
        if "ltr" in encoders:
            parts.append(encoders["ltr"].features(inputs)[rows, cols - 1])
        if "rtl" in encoders:
            parts.append(bert.rtl_features(encoders["rtl"], inputs)[rows, cols + 1])
        return torch.cat(parts, -1)

    with contextlib.ExitStack() as frozen:
        for model in encoders.values():
            frozen.enter_context(training.evaluating(model))
        return by_length(read, inputs, cols)


def untrained_features(
    inputs: torch.Tensor, cols: torch.Tensor, *, seed: int, read: str, **sizes
) -> torch.Tensor:
    """Features of untrained encoders for the joint at `cols` (B,) of `inputs` (B, T), written
    with torch alone: no code of `papernotes.bert`, so no bug of the mechanism reaches these
    nulls. Built in `bert.Encoder`'s order from `seed` (for sequences of T positions), the
    layers hold the weights the pre-trainings start from. `read="shown"`: a bidirectional
    encoder at the joint, reading the symbol shown; `"mask"`: the same with [MASK] there;
    `"halves"`: a causal encoder one position before the joint beside a causal encoder reading
    backwards one position after it (two untrained halves, the concatenation's read-out),
    (B, 2 D). `sizes` as `bert.Encoder`'s."""
    checks.tensor("inputs", inputs, "(B, T)", dtype=torch.long)
    checks.one_of("read", read, ("shown", "mask", "halves"))
    d_model, n_heads, n_layers, d_ff = ((ENCODER | sizes)[k] for k in ENCODER)
    with training.seeded(seed):
        embed = nn.Embedding(VOCAB_SIZE, d_model)
        positions = nn.Embedding(inputs.shape[1], d_model)
        norm = nn.LayerNorm(d_model)
        layer = nn.TransformerEncoderLayer(
            d_model, n_heads, d_ff, 0.0, activation="gelu", batch_first=True
        )
        layers = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False).eval()

    def encode(x: torch.Tensor, causal: bool) -> torch.Tensor:
        t = x.shape[1]
        mask = torch.isinf(nn.Transformer.generate_square_subsequent_mask(t)) if causal else None
        h = norm(embed(x) + positions.weight[:t])
        return layers(h, mask=mask, is_causal=causal, src_key_padding_mask=x == bert.PAD)

    def features(x: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        rows = torch.arange(len(cols))
        if read != "halves":
            shown = x.clone()
            if read == "mask":
                shown[rows, cols] = bert.MASK
            return encode(shown, causal=False)[rows, cols]
        # the sequences backwards (all of one length here: no padding to keep at the end)
        after = encode(x.flip(1), causal=True)[rows, x.shape[1] - 1 - (cols + 1)]
        return torch.cat([encode(x, causal=True)[rows, cols - 1], after], -1)

    with torch.no_grad():
        return by_length(features, inputs, cols)


def joint_logprobs(head: nn.Module, features: torch.Tensor) -> torch.Tensor:
    """What a pre-trained LM itself says of a joint, with no probe and no label: its own LM head
    on its frozen features (B, D) read where its objective predicts the joint (the masked LM at
    [MASK] in the joint's place, the left-to-right LM one position before, the right-to-left LM
    one position after), as log-probabilities of the three joint symbols renormalised among
    them, (B, 3)."""
    checks.tensor("features", features, "(B, D)", dtype="floating")
    with torch.no_grad():
        return head(features)[:, list(JOINT)].log_softmax(-1)


# An additive rule: value c scores LEFT_SCORES[c][a] + RIGHT_SCORES[c][b] for a closing bracket
# of kind a before the joint and an opening one of kind b after it (found by linear programming,
# tests/test_bert.py: no additive rule names more of the nine pairs).
LEFT_SCORES = ((-1, -3, 0), (0, 0, -1), (0, 2, -3))
RIGHT_SCORES = ((5, 0, -2), (3, 0, 0), (0, -1, 1))


def additive_rule_pairs() -> int:
    """On how many of the nine (left kind, right kind) pairs the additive rule of LEFT_SCORES and
    RIGHT_SCORES names the joint: 7, the most any rule that adds a score of the left kind to a
    score of the right kind can name (section 1's argument rules out all nine)."""
    a, b = torch.meshgrid(torch.arange(N_TYPES), torch.arange(N_TYPES), indexing="ij")
    left, right = torch.tensor(LEFT_SCORES), torch.tensor(RIGHT_SCORES)
    scores = left[:, a] + right[:, b]  # (value, a, b)
    return (scores.argmax(0) == joint_of(a, b)).sum().item()


def side_counts(inputs: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """How many of each bracket lie left of the joint and how many right of it, (B, 12): the
    features of the count-only rule, computed from the tokens alone (no encoder)."""
    checks.tensor("inputs", inputs, "(B, T)", dtype=torch.long)
    position = torch.arange(inputs.shape[1])[None]
    one_hot = (inputs[..., None] == torch.tensor(BRACKETS)).float()  # (B, T, 6)
    left = (one_hot * (position < cols[:, None])[..., None]).sum(1)
    right = (one_hot * (position > cols[:, None])[..., None]).sum(1)
    return torch.cat([left, right], -1)


def probe_head(width: int, classes: int, hidden: int) -> nn.Module:
    """The head a probe trains: one linear layer (`hidden=0`, a linear probe) or a small MLP,
    a hidden layer of `hidden` GELU units before the linear output (a non-linear combiner)."""
    if hidden == 0:
        return nn.Linear(width, classes)
    return nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, classes))


@dataclass
class Tuned:
    """Probes tuned on validation: per weight decay of the grid, the validation accuracy and the
    training loss after each `eval_every` updates (`val_curve`, `loss_curve`, lists over
    `steps`), the one chosen on the final validation accuracy (`choose`), and on the test
    items whether the chosen probe answered each right (`correct`)."""

    steps: list[int]
    val_curve: dict[float, list[float]]
    loss_curve: dict[float, list[float]]
    chosen: float
    correct: torch.Tensor

    @property
    def val_accuracy(self) -> dict[float, float]:
        return {wd: curve[-1] for wd, curve in self.val_curve.items()}

    @property
    def test_accuracy(self) -> float:
        return self.correct.float().mean().item()


def choose(scores: dict, tolerance: float = 0.0) -> object:
    """The grid value with the best score, where scores within `tolerance` of the best count as
    tied; a tie goes to the value nearest the grid's middle (a flat stretch chooses no edge),
    then to the earlier one."""
    values = list(scores)
    best = max(scores.values())
    middle = (len(values) - 1) / 2
    tied = [i for i, v in enumerate(values) if scores[v] >= best - tolerance]
    return values[min(tied, key=lambda i: (abs(i - middle), i))]


def one_standard_error(accuracy: float, n: int) -> float:
    """The standard error of an accuracy measured on n items, with Agresti and Coull's adjusted
    share p = (right + 2) / (n + 4): sqrt(p (1 - p) / (n + 4)), which stays above zero at 100%."""
    p = (accuracy * n + 2) / (n + 4)
    return math.sqrt(p * (1 - p) / (n + 4))


def tolerance_of(scores: dict, val_labels: torch.Tensor) -> float:
    """How far below the best validation accuracy of `scores` a grid value still ties with it:
    one standard error (`one_standard_error`) on the validation items; or every value, when the
    best does not beat the best constant answer on those items (the most common of their
    labels) by two standard errors: an arm at chance has nothing to choose its weight decay by,
    and goes to the grid's middle (the best of a few noisy scores lands on an edge of the grid
    as often as not, and beats a constant answer by one standard error often)."""
    best = max(scores.values())
    error = one_standard_error(best, len(val_labels))
    constant = torch.bincount(val_labels).max().item() / len(val_labels)
    if best - constant <= 2 * error:
        return math.inf
    return error


def tune_probes(
    features: dict,
    labels: dict,
    weight_decays,
    *,
    seed: int,
    classes: int = N_TYPES,
    hidden: int = 0,
    labelled: int | None = None,
    steps: int = 300,
    lr: float = 0.01,
    eval_every: int = 100,
) -> dict[str, Tuned]:
    """A probe per arm and weight decay of the grid, all trained together (`papernotes.together`:
    one stacked model per feature width, one forward and backward an update for all of them).

    `features` maps each arm to its features {"train": (N, D), "validation": ..., "test": ...};
    `labels` the splits to their labels. Each probe (`probe_head`: linear, or an MLP with
    `hidden` units; every probe starts from the same weights) trains on the first `labelled`
    training items (None: all) by full-batch Adam on cross-entropy, its weight decay an L2
    penalty, on features standardised with the mean and deviation of the arm's training
    features (unlabelled: all N of them). Each is scored on the validation items; per arm the
    best (`tolerance_of`, `choose`: accuracies within one standard error of the best tie) answers
    the test items. Returns {arm: Tuned}."""
    grid = [checks.number("weight_decay", wd, 0.0) for wd in weight_decays]
    checks.integer("hidden", hidden, 0)
    n = len(labels["train"]) if labelled is None else checks.integer("labelled", labelled, 1)
    by_width: dict[int, list[str]] = {}
    for arm, split in features.items():
        d = checks.tensor(f"{arm}'s train features", split["train"], "(N, D)", dtype="floating")
        checks.tensor("train labels", labels["train"], "(N,)", N=d["N"])
        if n > d["N"]:
            raise ValueError(f"labelled must lie in [1, {d['N']}]; got {n}")
        by_width.setdefault(d["D"], []).append(arm)
    tuned = {}
    for width, arms in by_width.items():
        found = _probes_of_one_width(
            {arm: features[arm] for arm in arms},
            labels,
            grid,
            width,
            classes,
            hidden,
            n,
            seed,
            steps=steps,
            lr=lr,
            eval_every=eval_every,
        )
        tuned |= found
    return {arm: tuned[arm] for arm in features}


def _probes_of_one_width(features, labels, grid, width, classes, hidden, n, seed, **schedule):
    """`tune_probes` for arms whose features share one width: arms x grid members, one stack."""
    x = {}
    for split in ("train", "validation", "test"):
        per_arm = []
        for arm in features:
            standardize = data.Standardizer.fit(features[arm]["train"], eps=1e-6)
            per_arm.append(standardize(features[arm][split]))
        # member (arm a, weight decay g) is number a * len(grid) + g
        x[split] = torch.stack(per_arm).repeat_interleave(len(grid), 0)
    x["train"], y = x["train"][:, :n], labels["train"][:n]
    members = []
    for _ in range(len(features) * len(grid)):
        with training.seeded(seed):
            members.append(probe_head(width, classes, hidden))
    stack = together.stack(members)
    optimizer = together.Adam(
        stack.parameters(), lr=schedule["lr"], weight_decay=grid * len(features)
    )

    def losses_of_update(i: int) -> torch.Tensor:
        return together.cross_entropy(stack(x["train"]), y)

    def evaluate() -> dict[str, torch.Tensor]:
        return {"val": together.accuracy(stack(x["validation"]), labels["validation"])}

    histories = together.train(
        stack,
        optimizer,
        losses_of_update,
        schedule["steps"],
        evaluate=evaluate,
        eval_every=schedule["eval_every"],
        desc="probes",
    )
    with torch.no_grad():
        correct = stack(x["test"]).argmax(-1) == labels["test"]  # (K, N_test)
    tuned = {}
    for a, arm in enumerate(features):
        mine = range(a * len(grid), (a + 1) * len(grid))
        val = {wd: histories[k]["val"] for wd, k in zip(grid, mine, strict=True)}
        final = {wd: curve[-1] for wd, curve in val.items()}
        chosen = choose(final, tolerance_of(final, labels["validation"]))
        tuned[arm] = Tuned(
            list(histories[0].steps),
            val,
            {wd: histories[k]["loss"] for wd, k in zip(grid, mine, strict=True)},
            chosen,
            correct[mine[grid.index(chosen)]],
        )
    return tuned


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


# -- what each position sees -----------------------------------------------------------------------


def influence(
    model: bert.Encoder,
    tokens: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    backwards: bool = False,
):
    """How much the features at position i move when the bracket at position j is replaced by
    another bracket: (T, T), entry (i, j) the mean over sequences of the change's norm, divided
    by the mean norm of the features, over the sequences with a bracket at j (the joint symbol,
    [CLS] and [SEP] are never replaced). `tokens` (B, T) should have no padding (see
    `joint_sequences(min_pairs=...)`). A causal encoder has
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
            rows = torch.isin(tokens[:, j], brackets)  # the sequences with a bracket at j
            if not rows.any():
                continue
            # another bracket, never the same one: a shift of 1-5 around the six
            shift = torch.randint(1, len(brackets), (b,), generator=generator)
            index = (tokens[:, j, None] == brackets).long().argmax(-1)
            changed = tokens.clone()
            changed[rows, j] = brackets[(index + shift) % len(brackets)][rows]
            moved = (features(changed) - base).norm(dim=-1)
            out[:, j] = moved[rows].mean(0) / scale
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
