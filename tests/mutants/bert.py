"""Broken variants of BERT's mechanism (papernotes.bert).

Each function patches the mechanism's module in place; the chapter, run with the patch, must stop
on its claim check. The encoder reads `attention_mask`, and the losses read `mask_tokens` and
`choose_masking`, from the module's globals when called, and the experiment
(papernotes.bert.experiment) calls the losses through the module, so pre-training sees the patch.
"""

import torch

from papernotes import bert as m


def causal_mask_in_the_bidirectional_encoder():
    """The causal mask is applied whatever the switch says: the masked LM sees only the left."""

    def attention_mask(length, causal):
        return torch.ones(length, length, dtype=torch.bool).triu(1)

    m.attention_mask = attention_mask


def no_mask_in_the_left_to_right_encoder():
    """The causal switch does nothing: the left-to-right LM sees the token it must predict."""

    def attention_mask(length, causal):
        return None

    m.attention_mask = attention_mask


def loss_on_every_position():
    """The labels hold every real token, not only the selected ones (no -100 elsewhere)."""
    original = m.mask_tokens

    def mask_tokens(
        tokens, mask_id, vocab_size, mask_prob=0.15, generator=None, special_ids=(), **fractions
    ):
        inputs, _ = original(
            tokens, mask_id, vocab_size, mask_prob, generator, special_ids, **fractions
        )
        return inputs, tokens.masked_fill(tokens == m.PAD, m.IGNORE)

    m.mask_tokens = mask_tokens


def random_tokens_only():
    """Every selected position gets a random token: the 80/10/10 mix becomes 0/100/0."""
    original = m.choose_masking

    def choose_masking(
        tokens,
        mask_prob=0.15,
        generator=None,
        special_ids=(),
        mask_fraction=0.8,
        random_fraction=0.1,
    ):
        return original(tokens, mask_prob, generator, special_ids, 0.0, 1.0)

    m.choose_masking = choose_masking


def mask_never_applied():
    """The inputs are the tokens themselves: labels at the selected positions, nothing hidden."""
    original = m.mask_tokens

    def mask_tokens(tokens, *args, **kwargs):
        _, labels = original(tokens, *args, **kwargs)
        return tokens.clone(), labels

    m.mask_tokens = mask_tokens


MUTANTS = [
    causal_mask_in_the_bidirectional_encoder,
    no_mask_in_the_left_to_right_encoder,
    loss_on_every_position,
    random_tokens_only,
    mask_never_applied,
]
