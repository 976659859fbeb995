"""BERT: a bidirectional transformer encoder pre-trained as a masked language model.

Devlin, Chang, Lee & Toutanova 2018, *BERT: Pre-training of Deep Bidirectional Transformers for
Language Understanding*, NAACL 2019 (arXiv:1810.04805). A transformer encoder whose every layer
reads both sides of each position would, asked to predict a token, simply read it; BERT hides the
targets instead (the masked LM: 15% of the positions selected, of those 80% replaced by [MASK],
10% by a random token, 10% left) and puts the loss on the selected positions only. The baselines
are the same encoder with a causal mask, trained left to right on the next token (the paper's
"LTR" ablation), the same causal encoder reading the sequence backwards, trained on the previous
token (a right-to-left LM), and the two one-way encoders' features side by side (ELMo's shallow
concatenation, section 5.1). The chapter (chapters/bert.ipynb, "The idea") derives it; each
equation is written again below, above the lines that compute it, in the paper's order: the
encoder and its mask, the masking, the losses.

The bracket language the chapter pre-trains on, the pre-training runs, the probe and the
measurements are in `papernotes.bert.experiment`.

The functions look `mask_tokens`, `choose_masking` and `attention_mask` up in this module's
globals when called, so a patched module (tests/mutants/bert.py) is seen everywhere. Arguments
are checked where they enter (`mask_tokens`, `Encoder` and its `features`); the cores below them
trust their input.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from papernotes import checks

# -- the special tokens ---------------------------------------------------------------------------

PAD, CLS, SEP, MASK = 0, 1, 2, 3
SPECIAL_IDS = (PAD, CLS, SEP)  # never selected for masking; [MASK] never occurs in the data
IGNORE = -100  # the label of a position that carries no loss (cross_entropy's ignore_index)


# -- 1. the encoder -------------------------------------------------------------------------------


def attention_mask(length: int, causal: bool) -> torch.Tensor | None:
    """The mask $M$ of self-attention as booleans (True: may not attend), or None for none.

    Causal: position i may not see any j > i (the strict upper triangle). Bidirectional: no
    mask, every position sees every other (padding is masked separately, by key).
    """
    # Attn(i) = sum_j softmax_j(q_i . k_j / sqrt(d_k) + M_ij) v_j. Bidirectional (BERT):
    # M_ij = 0 for every real j, both sides in every layer.
    if not causal:
        return None
    # Left-to-right (GPT, the LTR ablation): M_ij = -inf for j > i, the left context only.
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
        vocab_size: int,
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
        # h^0_i = E[x_i] + P_i (normalised, as BERT's embedding layer)
        h = self.norm(self.tokens(tokens) + self.positions.weight[:t])
        # h^l = TransformerLayer(h^(l-1)), l = 1..L: the two encoders differ in M alone; padding
        # is -inf as a key for both
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
    # Special tokens ([CLS], [SEP], padding) are never selected.
    eligible = ~torch.isin(tokens, torch.tensor(list(special_ids), dtype=tokens.dtype))
    # S: each eligible position with probability 0.15
    draw = torch.rand(tokens.shape, generator=generator)
    selected = eligible & (draw < mask_prob)
    # of S: 80% [MASK], 10% a random token, 10% unchanged (one uniform draw splits the three)
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
    return _mask_tokens(
        tokens, mask_id, ordinary, mask_prob, generator, special_ids, mask_fraction, random_fraction
    )


def _mask_tokens(
    tokens, mask_id, ordinary, mask_prob, generator, special_ids, mask_fraction, random_fraction
):
    """`mask_tokens` without its checks: `ordinary` (K,) holds the tokens a random replacement
    is drawn from."""
    m = choose_masking(tokens, mask_prob, generator, special_ids, mask_fraction, random_fraction)
    # x~: [MASK] at the masked positions, a uniform ordinary token at the randomised ones, the
    # original token everywhere else
    random_tokens = ordinary[torch.randint(len(ordinary), tokens.shape, generator=generator)]
    inputs = torch.where(m.masked, mask_id, tokens)
    inputs = torch.where(m.randomized, random_tokens, inputs)
    # the targets: x_i for i in S, and no loss (IGNORE) anywhere else
    labels = torch.where(m.selected, tokens, IGNORE)
    return inputs, labels


def mlm_loss(
    model: Encoder,
    tokens: torch.Tensor,
    generator: torch.Generator | None,
    mask_prob: float = 0.15,
    mask_fraction: float = 0.8,
    random_fraction: float = 0.1,
    *,
    keep: list | None = None,
) -> torch.Tensor:
    r"""$\mathcal L_{\mathrm{MLM}}$: cross-entropy of the original tokens at the selected
    positions of a freshly masked batch (labels -100 elsewhere are ignored). When `keep` is a
    list, the (inputs, labels) the loss was computed on are appended to it."""
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
    if keep is not None:
        keep.append((inputs, labels))
    logits = model(inputs)
    # L_MLM = -1/|S| sum_{i in S} log p(x_i | x~): the mean over the positions not IGNORE'd
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)


# -- 3. the left-to-right LM ----------------------------------------------------------------------


def ltr_loss(model: Encoder, tokens: torch.Tensor) -> torch.Tensor:
    r"""$\mathcal L_{\mathrm{LTR}}$: cross-entropy of the next token at every position whose next
    token is real (padding after `[SEP]` carries no loss)."""
    # L_LTR = -1/(T-1) sum_{i<T} log p(x_{i+1} | x_{<=i}), over the real next tokens
    logits = model(tokens)[:, :-1]
    labels = tokens[:, 1:].masked_fill(tokens[:, 1:] == PAD, IGNORE)
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)


# -- 4. the right-to-left LM ----------------------------------------------------------------------


def reversal(tokens: torch.Tensor) -> torch.Tensor:
    """The index (B, T) that reads each sequence backwards: position t of the reversed sequence
    is position n - 1 - t of the original, n its number of real tokens; padding stays at the end.
    Reversing twice gives the original back (`tokens.gather(1, index)`)."""
    n = (tokens != PAD).sum(1, keepdim=True)
    t = torch.arange(tokens.shape[1], device=tokens.device)[None]
    return torch.where(t < n, n - 1 - t, t)


def rtl_loss(model: Encoder, tokens: torch.Tensor) -> torch.Tensor:
    r"""$\mathcal L_{\mathrm{RTL}}$: a causal encoder reading each sequence backwards, trained on
    the previous token: `ltr_loss` of the reversed sequences."""
    # L_RTL = -1/(T-1) sum_{i>1} log p(x_{i-1} | x_{>=i})
    return ltr_loss(model, tokens.gather(1, reversal(tokens)))


def rtl_features(model: Encoder, tokens: torch.Tensor) -> torch.Tensor:
    """The right-to-left encoder's features (B, T, D) in the original order: at position i they
    have read x_i and everything after it, nothing before."""
    index = reversal(tokens)
    h = model.features(tokens.gather(1, index))
    return h.gather(1, index[..., None].expand(-1, -1, h.shape[-1]))
