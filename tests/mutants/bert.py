"""Broken variants of BERT's mechanism (papernotes.bert).

Each function patches the mechanism's module in place; the chapter, run with the patch, must stop
on its claim check. The encoder reads `attention_mask`, and the losses read `mask_tokens` and
`choose_masking`, from the module's globals when called, and the experiment
(papernotes.bert.experiment) calls the losses through the module, so pre-training sees the patch.
The right-to-left LM is the causal encoder reading backwards, so a broken causal mask reaches it
too.

A loss divided by every position instead of the selected ones is not here: under Adam it changes
only the printed losses, not what the encoder learns, so no claim of the chapter can see it;
tests/test_bert.py (test_the_loss_sits_on_the_selected_positions_and_a_broken_loss_does_not)
catches it against the paper's equation.
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


def causal_mask_leaks_the_next_token():
    """The causal mask starts one diagonal too far right: position i sees x_(i+1) as well."""

    def attention_mask(length, causal):
        if not causal:
            return None
        return torch.ones(length, length, dtype=torch.bool).triu(2)

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


def labels_are_the_corrupted_inputs():
    """The labels at the selected positions are the corrupted inputs, not the original tokens:
    the masked LM learns to copy what it sees ([MASK] too); the masks' shares stay right."""
    original = m.mask_tokens

    def mask_tokens(tokens, *args, **kwargs):
        inputs, labels = original(tokens, *args, **kwargs)
        return inputs, torch.where(labels == m.IGNORE, labels, inputs)

    m.mask_tokens = mask_tokens


MUTANTS = [
    causal_mask_in_the_bidirectional_encoder,
    no_mask_in_the_left_to_right_encoder,
    causal_mask_leaks_the_next_token,
    loss_on_every_position,
    random_tokens_only,
    mask_never_applied,
    labels_are_the_corrupted_inputs,
]
