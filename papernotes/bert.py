r"""BERT: a bidirectional transformer encoder pre-trained as a masked language model.

Devlin, Chang, Lee & Toutanova 2018, *BERT: Pre-training of Deep Bidirectional Transformers for
Language Understanding*, NAACL 2019 (arXiv:1810.04805). The module follows the paper in order.

1. **The encoder.** A stack of $L$ transformer layers over token plus position embeddings,
   $h^0_i = E[x_i] + P_i$ and $h^{l} = \mathrm{TransformerLayer}(h^{l-1})$, each layer
   self-attention followed by a feed-forward block, residual connections and layer norm after
   each (BERT's post-norm, GELU). Self-attention at position $i$ reads

   $$\mathrm{Attn}(i) = \sum_j \mathrm{softmax}_j\Big(\frac{q_i \cdot k_j}{\sqrt{d_k}}
     + M_{ij}\Big)\, v_j,$$

   where the mask $M$ decides what $i$ may see. A **bidirectional** encoder (BERT) has
   $M_{ij} = 0$ for every real token $j$: position $i$ sees both sides in every layer. A
   **left-to-right** encoder (OpenAI GPT, the paper's "LTR" ablation) has $M_{ij} = -\infty$ for
   $j > i$: position $i$ sees only its left context. Padding positions are $-\infty$ for both.
   The two differ in that one matrix only; `Encoder(causal=...)` switches it.

2. **Why a bidirectional encoder needs masking.** Trained to predict $x_i$ from the features at
   $i$, a bidirectional encoder could just read $x_i$ itself. The **masked LM** (section 3.1)
   hides the targets: it selects 15% of the token positions at random and, of those,

   - 80% are replaced by the `[MASK]` token,
   - 10% by a random token,
   - 10% are left unchanged,

   and the loss is the cross-entropy of the original token at the *selected* positions only,

   $$\mathcal L_{\mathrm{MLM}} = -\frac{1}{|S|}\sum_{i \in S} \log p_\theta(x_i \mid \tilde x),$$

   with $\tilde x$ the corrupted sequence and $S$ the selected positions. The random and
   unchanged 20% keep the encoder from trusting that an unmasked token is always right, and
   reduce the mismatch between pre-training (with `[MASK]`) and later use (without it).
   Special tokens (`[CLS]`, `[SEP]`, padding) are never selected.

3. **The left-to-right LM**, the baseline: a causal encoder trained to predict the next token,
   $\mathcal L_{\mathrm{LTR}} = -\frac{1}{T-1}\sum_{i<T} \log p_\theta(x_{i+1} \mid x_{\le i})$.

4. **Using the pre-trained features.** The paper fine-tunes, and also (section 5.3) uses the
   frozen features with a classifier on top. Here: frozen features, a linear probe, on a
   question that needs the context to the right of a token.

The data is a language with long-range structure: balanced sequences of three kinds of
brackets (a Dyck language), framed by `[CLS]` and `[SEP]` and padded. The probe asks, of each
opening bracket, whether the very next token closes it.

Functions read `mask_tokens`, `attention_mask` and the rest from this module's globals when
called, so a patched module (tests/mutants/bert.py) is seen everywhere. Arguments are checked
where they enter (`mask_tokens`, `Encoder`, `dyck_sequences`, `pretrain`, `probe_set`,
`probe_features`, `train_probe`); the helpers below them trust their input.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from papernotes import checks
from papernotes.data import minibatches
from papernotes.training import History, accuracy, evaluating, generator, seeded, train

# -- the vocabulary -------------------------------------------------------------------------------

PAD, CLS, SEP, MASK = 0, 1, 2, 3
SPECIAL_IDS = (PAD, CLS, SEP)  # never selected for masking; [MASK] never occurs in the data
N_TYPES = 3  # ( [ {
OPEN = tuple(range(4, 4 + N_TYPES))  # 4 5 6
CLOSE = tuple(range(4 + N_TYPES, 4 + 2 * N_TYPES))  # 7 8 9
VOCAB_SIZE = 4 + 2 * N_TYPES
SYMBOLS = ("·", "C", "S", "M", "(", "[", "{", ")", "]", "}")  # for pictures: pad, CLS, SEP, MASK
IGNORE = -100  # the label of a position that carries no loss (cross_entropy's ignore_index)


# -- 1. the encoder -------------------------------------------------------------------------------


def attention_mask(length: int, causal: bool) -> torch.Tensor | None:
    """The mask $M$ of self-attention as booleans (True: may not attend), or None for none.

    Causal: position i may not see any j > i (the strict upper triangle). Bidirectional: no
    mask, every position sees every other (padding is masked separately, by key).
    """
    if not causal:
        return None
    return torch.ones(length, length, dtype=torch.bool).triu(1)


class Encoder(nn.Module):
    """Token and learned position embeddings, `n_layers` of torch's TransformerEncoderLayer
    (batch-first, post-norm, GELU, as BERT), and a linear LM head over the vocabulary.

    `causal=True` is the left-to-right encoder: every layer sees only the left context. Padding
    (`PAD`) is masked as a key in both modes. `features(tokens)` is the last layer's output
    (B, T, D); calling the encoder gives the LM logits (B, T, V).
    """

    def __init__(
        self,
        *,
        causal: bool,
        vocab_size: int = VOCAB_SIZE,
        max_len: int = 64,
        d_model: int = 64,
        n_heads: int = 4,
        n_layers: int = 2,
        d_ff: int = 128,
        dropout: float = 0.0,
    ):
        super().__init__()
        self.causal = checks.boolean("causal", causal)
        self.vocab_size = checks.integer("vocab_size", vocab_size, 2)
        self.max_len = checks.integer("max_len", max_len)
        d_model = checks.integer("d_model", d_model)
        n_heads = checks.integer("n_heads", n_heads)
        if d_model % n_heads:
            raise ValueError(f"d_model must be a multiple of n_heads; got {d_model}, {n_heads}")
        checks.integer("n_layers", n_layers)
        checks.integer("d_ff", d_ff)
        checks.number("dropout", dropout, 0.0, 1.0, high_open=True)
        self.tokens = nn.Embedding(vocab_size, d_model)
        self.positions = nn.Embedding(max_len, d_model)
        self.norm = nn.LayerNorm(d_model)
        layer = nn.TransformerEncoderLayer(
            d_model, n_heads, d_ff, dropout, activation="gelu", batch_first=True
        )
        self.layers = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab_size)

    def features(self, tokens: torch.Tensor) -> torch.Tensor:
        """The last layer's output at every position, (B, T, D)."""
        t = checks.tensor("tokens", tokens, "(B, T)", dtype=torch.long)["T"]
        if t > self.max_len:
            raise ValueError(
                f"tokens must have at most max_len = {self.max_len} positions; got {t}"
            )
        return self._features(tokens)

    def _features(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        h = self.norm(self.tokens(tokens) + self.positions.weight[:t])
        return self.layers(
            h, mask=attention_mask(t, self.causal), src_key_padding_mask=tokens == PAD
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """LM logits (B, T, V): for the masked LM the token at each position, for the
        left-to-right LM the token after it."""
        return self.head(self.features(tokens))


# -- 2. the masked LM -----------------------------------------------------------------------------


@dataclass
class Masking:
    """The random choices of one masking: `selected` positions (the loss covers these), and
    among them those replaced by [MASK] (`masked`) or by a random token (`randomized`); the
    rest of the selected stay unchanged. All (B, T) booleans."""

    selected: torch.Tensor
    masked: torch.Tensor
    randomized: torch.Tensor


def choose_masking(
    tokens: torch.Tensor,
    mask_prob: float = 0.15,
    generator: torch.Generator | None = None,
    special_ids=(),
    mask_fraction: float = 0.8,
    random_fraction: float = 0.1,
) -> Masking:
    """Select each eligible (non-special) position with probability `mask_prob`; of the
    selected, `mask_fraction` go to [MASK], `random_fraction` to a random token, the rest stay.
    Every random choice is drawn from `generator`."""
    eligible = ~torch.isin(tokens, torch.tensor(list(special_ids), dtype=tokens.dtype))
    draw = torch.rand(tokens.shape, generator=generator)
    selected = eligible & (draw < mask_prob)
    which = torch.rand(tokens.shape, generator=generator)
    masked = selected & (which < mask_fraction)
    randomized = selected & (which >= mask_fraction) & (which < mask_fraction + random_fraction)
    return Masking(selected, masked, randomized)


def mask_tokens(
    tokens: torch.Tensor,
    mask_id: int,
    vocab_size: int,
    mask_prob: float = 0.15,
    generator: torch.Generator | None = None,
    special_ids=(),
    *,
    mask_fraction: float = 0.8,
    random_fraction: float = 0.1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking (section 3.1, appendix A.1): returns (inputs, labels), both (B, T) long.

    `mask_prob` of the eligible positions (not in `special_ids`) are selected; of those,
    `mask_fraction` (80%) become `mask_id`, `random_fraction` (10%) a random token and the rest
    (10%) stay. A random token is drawn uniformly from the ordinary tokens of the vocabulary
    (`range(vocab_size)` less `special_ids` and `mask_id`). `labels` holds the original token
    at the selected positions and -100 (ignored by the loss) everywhere else.
    """
    checks.tensor("tokens", tokens, "(B, T)", dtype=torch.long)
    checks.integer("vocab_size", vocab_size, 2)
    checks.integer("mask_id", mask_id, 0)
    if mask_id >= vocab_size:
        raise ValueError(f"mask_id must lie in [0, {vocab_size - 1}]; got {mask_id}")
    checks.number("mask_prob", mask_prob, 0.0, 1.0)
    checks.number("mask_fraction", mask_fraction, 0.0, 1.0)
    checks.number("random_fraction", random_fraction, 0.0, 1.0 - mask_fraction)
    special_ids = tuple(checks.integer("special_ids", s, 0) for s in special_ids)
    ordinary = torch.tensor([t for t in range(vocab_size) if t not in (*special_ids, mask_id)])
    if len(ordinary) == 0:
        raise ValueError("vocab_size leaves no ordinary token to draw random replacements from")
    if tokens.numel() and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise ValueError(f"tokens must lie in [0, {vocab_size - 1}]")
    m = choose_masking(tokens, mask_prob, generator, special_ids, mask_fraction, random_fraction)
    random_tokens = ordinary[torch.randint(len(ordinary), tokens.shape, generator=generator)]
    inputs = torch.where(m.masked, mask_id, tokens)
    inputs = torch.where(m.randomized, random_tokens, inputs)
    labels = torch.where(m.selected, tokens, IGNORE)
    return inputs, labels


def mlm_loss(
    model: Encoder,
    tokens: torch.Tensor,
    generator: torch.Generator | None,
    mask_prob: float = 0.15,
    mask_fraction: float = 0.8,
    random_fraction: float = 0.1,
) -> torch.Tensor:
    r"""$\mathcal L_{\mathrm{MLM}}$: cross-entropy of the original tokens at the selected
    positions of a freshly masked batch (labels -100 elsewhere are ignored)."""
    inputs, labels = mask_tokens(
        tokens,
        MASK,
        model.vocab_size,
        mask_prob,
        generator,
        SPECIAL_IDS,
        mask_fraction=mask_fraction,
        random_fraction=random_fraction,
    )
    logits = model(inputs)
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)


def masking_shares(tokens: torch.Tensor, inputs: torch.Tensor, labels: torch.Tensor) -> dict:
    """What a masking did, read from its output alone: the share of eligible tokens that carry
    the loss ("selected"), and among those the shares whose input is [MASK] ("mask"), another
    token ("other token") or the original token ("unchanged"); with the counts they come from
    ("eligible", "selected_count")."""
    checks.tensor("tokens", tokens, "(B, T)", dtype=torch.long)
    checks.tensor("inputs", inputs, "(B, T)", B=tokens.shape[0], T=tokens.shape[1])
    checks.tensor("labels", labels, "(B, T)", B=tokens.shape[0], T=tokens.shape[1])
    eligible = ~torch.isin(tokens, torch.tensor(SPECIAL_IDS))
    selected = labels != IGNORE
    n_eligible, n_selected = eligible.sum().item(), selected.sum().item()
    return {
        "eligible": n_eligible,
        "selected_count": n_selected,
        "selected": n_selected / n_eligible,
        "mask": (selected & (inputs == MASK)).sum().item() / n_selected,
        "other token": (selected & (inputs != MASK) & (inputs != tokens)).sum().item() / n_selected,
        "unchanged": (selected & (inputs == tokens)).sum().item() / n_selected,
    }


def expected_shares(
    mask_prob: float = 0.15, mask_fraction: float = 0.8, random_fraction: float = 0.1
) -> dict:
    """The shares `masking_shares` should find on this module's vocabulary: a random token is
    the original one with probability 1 / (number of ordinary tokens)."""
    same = 1 / (VOCAB_SIZE - len(SPECIAL_IDS) - 1)
    return {
        "selected": mask_prob,
        "mask": mask_fraction,
        "other token": random_fraction * (1 - same),
        "unchanged": 1 - mask_fraction - random_fraction * (1 - same),
    }


# -- 3. the left-to-right LM ----------------------------------------------------------------------


def ltr_loss(model: Encoder, tokens: torch.Tensor) -> torch.Tensor:
    r"""$\mathcal L_{\mathrm{LTR}}$: cross-entropy of the next token at every position whose next
    token is real (padding after `[SEP]` carries no loss)."""
    logits = model(tokens)[:, :-1]
    labels = tokens[:, 1:].masked_fill(tokens[:, 1:] == PAD, IGNORE)
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)


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
    words = torch.full((n, length), PAD, dtype=torch.long)
    rows = torch.arange(n)
    for t in range(length):
        live = t < total
        left = total - t  # symbols still to write, this one included
        may_open = depth + 1 <= left - 1
        opens = live & may_open & ((depth == 0) | coins[:, t])
        closes = live & ~opens
        top = stack[rows, (depth - 1).clamp(min=0)]
        words[:, t] = torch.where(opens, kinds[:, t] + OPEN[0], words[:, t])
        words[:, t] = torch.where(closes, top + CLOSE[0], words[:, t])
        stack[rows, depth] = torch.where(opens, kinds[:, t], stack[rows, depth])
        depth = depth + opens.long() - closes.long()
    framed = torch.full((n, length + 2), PAD, dtype=torch.long)
    framed[:, 0] = CLS
    framed[:, 1 : length + 1] = words
    framed[rows, total + 1] = SEP
    return framed


# -- pre-training ---------------------------------------------------------------------------------


@dataclass
class PretrainRun:
    """A pre-trained encoder, the History of its validation LM loss ("val_loss"), and copies of
    its weights after each evaluation (`snapshots[step]`)."""

    model: Encoder
    history: History
    snapshots: dict[int, dict] = field(default_factory=dict)

    def at(self, step: int) -> Encoder:
        """The encoder as it was after `step` updates (one of the snapshots)."""
        if step not in self.snapshots:
            raise ValueError(f"step must be one of {sorted(self.snapshots)}; got {step}")
        model = copy.deepcopy(self.model)
        model.load_state_dict(self.snapshots[step])
        return model.eval()


def new_encoder(*, causal: bool, seed: int, max_len: int, **sizes) -> Encoder:
    """An untrained encoder whose initial weights follow `seed` (the same for both modes)."""
    with seeded(seed):
        return Encoder(causal=causal, max_len=max_len, **sizes).eval()


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
    batches = minibatches(d["N"], batch_size, generator(seed, stream=11))
    masks = generator(seed, stream=12)
    fractions = {"mask_fraction": mask_fraction, "random_fraction": random_fraction}
    snapshots: dict[int, dict] = {}

    def loss_of(batch: torch.Tensor, masking: torch.Generator | None) -> torch.Tensor:
        if causal:
            return ltr_loss(model, batch)
        return mlm_loss(model, batch, masking, mask_prob, **fractions)

    def evaluate() -> dict[str, float]:
        snapshots[len(snapshots) * eval_every + eval_every] = copy.deepcopy(model.state_dict())
        return {"val_loss": loss_of(val, generator(seed, stream=13)).item()}

    history = train(
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


# -- 4. the probe ---------------------------------------------------------------------------------


def probe_set(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every opening bracket of `tokens` (B, T) and its label: 1 when the very next token closes
    it. Returns (rows, columns, labels), each (N,). The label needs the right-hand context."""
    checks.tensor("tokens", tokens, "(B, T)", dtype=torch.long)
    opening = torch.isin(tokens[:, :-1], torch.tensor(OPEN))
    rows, cols = opening.nonzero(as_tuple=True)
    labels = torch.isin(tokens[rows, cols + 1], torch.tensor(CLOSE)).long()
    return rows, cols, labels


def probe_features(model: Encoder, tokens: torch.Tensor, rows, cols) -> torch.Tensor:
    """The frozen encoder's last-layer features at (rows, cols), (N, D)."""
    checks.tensor("tokens", tokens, "(B, T)", dtype=torch.long)
    with evaluating(model):
        return model.features(tokens)[rows, cols]


@dataclass
class ProbeRun:
    """A linear probe (on standardised features) and the History of its "val_accuracy"."""

    probe: nn.Linear
    history: History
    mean: torch.Tensor
    std: torch.Tensor

    def accuracy(self, x: torch.Tensor, y: torch.Tensor) -> float:
        with evaluating(self.probe):
            return accuracy(self.probe((x - self.mean) / self.std), y)


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
    mean, std = train_x.mean(0), train_x.std(0) + 1e-6
    x = (train_x - mean) / std
    with seeded(seed):
        probe = nn.Linear(d["D"], 2)
    optimizer = torch.optim.Adam(probe.parameters(), lr=lr, weight_decay=weight_decay)
    run = ProbeRun(probe, History(), mean, std)
    run.history = train(
        probe,
        optimizer,
        lambda _: F.cross_entropy(probe(x), train_y),
        steps,
        evaluate=lambda: {"val_accuracy": run.accuracy(val_x, val_y)},
        eval_every=steps,
        desc="probe",
    )
    return run


def majority_accuracy(train_y: torch.Tensor, test_y: torch.Tensor) -> float:
    """Accuracy on `test_y` of always answering the training labels' majority class."""
    majority = int(train_y.float().mean() >= 0.5)
    return (test_y == majority).float().mean().item()


# -- what each position sees ----------------------------------------------------------------------


def influence(model: Encoder, tokens: torch.Tensor, generator: torch.Generator | None = None):
    """How much the features at position i move when the bracket at position j is replaced by
    another bracket: (T, T), entry (i, j) the mean over sequences of the change's norm, divided
    by the mean norm of the features. `tokens` (B, T) should have no padding (see
    `dyck_sequences(min_pairs=...)`); [CLS] and [SEP] are never replaced. A causal encoder has
    zeros above the diagonal (j > i); a bidirectional one need not."""
    b, t = checks.tensor("tokens", tokens, "(B, T)", dtype=torch.long).values()
    brackets = torch.tensor(OPEN + CLOSE)
    out = torch.zeros(t, t)
    with evaluating(model):
        base = model.features(tokens)
        scale = base.norm(dim=-1).mean()
        for j in range(t):
            if not torch.isin(tokens[:, j], brackets).all():
                continue
            shift = torch.randint(1, len(brackets), (b,), generator=generator)
            index = (tokens[:, j, None] == brackets).long().argmax(-1)
            changed = tokens.clone()
            changed[:, j] = brackets[(index + shift) % len(brackets)]
            out[:, j] = (model.features(changed) - base).norm(dim=-1).mean(0) / scale
    return out
