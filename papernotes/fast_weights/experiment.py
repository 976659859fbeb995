"""The fast_weights chapter's experiment: the associative-retrieval task, the three networks
trained on it alike (the fast-weights RNN, the same RNN without fast weights, an LSTM of the same
size), and the measurements of the memory's read.

Associative retrieval, the paper's first task: read key-value pairs such as ``c9k8j3f1``, then
``??`` and one of the keys, and answer its value: ``c9k8j3f1??c`` -> ``9``.

The chapter also checks the mechanism against the paper's equations written out independently
(`written_out_read`, `by_the_equations`): those references share no code with the module.

The mechanism is `papernotes.fast_weights`, called through the module
(`fast_weights.FastWeightsRNN(...)`) so that a mutant patched onto it reaches these runs.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from papernotes import checks, fast_weights, training

# The random streams of a run (papernotes.training.generator(seed, stream)): the training
# batches, the validation sequences and the test sequences each come from their own; the
# chapter's checks of the equations draw their random states and inputs from EQUATIONS.
EQUATIONS, BATCHES, VALIDATION, TEST = 0, 1, 2, 3


# -- The written-out equations, for the chapter's checks ------------------------------------------


def written_out_read(
    hs: torch.Tensor, query: torch.Tensor, decay: float, fast_lr: float, *, shared: bool = False
) -> torch.Tensor:
    """eta * sum_tau lambda^(t - tau) h(tau) (h(tau)^T q) for states hs (B, t, H) and queries
    (B, H), written out with einsum; shared=True pools every sequence's states (a memory shared
    by the batch)."""
    checks.boolean("shared", shared)
    age = torch.arange(hs.shape[1] - 1, -1, -1, dtype=hs.dtype)  # t - tau
    if shared:
        weights = fast_lr * decay**age * torch.einsum("ctd,bd->bct", hs, query)
        return torch.einsum("bct,ctd->bd", weights, hs)
    weights = fast_lr * decay**age * torch.einsum("btd,bd->bt", hs, query)
    return torch.einsum("bt,btd->bd", weights, hs)


def by_the_equations(
    core: fast_weights.FastWeightsRNN, x: torch.Tensor, *, late: bool = False
) -> torch.Tensor:
    """h(1..T) (B, T, H) of `core` on x (B, T, D) from the paper's equations, with an explicit
    A(t) per sequence; late=True stores h(t) instead of h(t+1) (a memory one step late)."""
    checks.boolean("late", late)
    W, C = core.recurrent_weights.weight, core.input_weights.weight
    b = core.input_weights.bias
    h = x.new_zeros(len(x), core.hidden_size)
    A = x.new_zeros(len(x), core.hidden_size, core.hidden_size)  # A(0) = 0
    states = []
    for t in range(x.shape[1]):
        slow = h @ W.T + x[:, t] @ C.T + b  # W h(t) + C x(t)
        stored = h if late else None
        h = torch.relu(slow)  # h_0(t+1)
        for _ in range(core.inner_steps):  # h_{s+1}(t+1) = f(LN[slow + A(t) h_s(t+1)])
            h = torch.relu(core.norm(slow + (A @ h.unsqueeze(2)).squeeze(2)))
        stored = h if stored is None else stored  # A(t+1) gets h(t+1), or h(t) if late
        A = core.decay * A + core.fast_lr * stored.unsqueeze(2) * stored.unsqueeze(1)
        states.append(h)
    return torch.stack(states, 1)


# -- Associative retrieval ------------------------------------------------------------------------

KEYS = string.ascii_lowercase  # 26 letters
VALUES = string.digits  # 10 digits: the classes
QUERY_MARK = "?"
VOCABULARY = KEYS + VALUES + QUERY_MARK  # 37 tokens


def retrieval_batch(
    batch_size: int, n_pairs: int = 4, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences like "c9k8j3f1??c" as token ids (B, 2 n_pairs + 3), and their answers (B,).

    Each sequence has n_pairs distinct letter keys, each followed by a random digit; then two
    query marks and one of the keys, chosen uniformly. The answer is that key's digit (0..9).
    """
    batch_size = checks.integer("batch_size", batch_size)
    n_pairs = checks.integer("n_pairs", n_pairs)
    checks.number("n_pairs", n_pairs, 1, len(KEYS))  # the keys of a sequence are distinct
    keys = torch.rand(batch_size, len(KEYS), generator=generator).argsort(1)[:, :n_pairs]
    values = torch.randint(len(VALUES), (batch_size, n_pairs), generator=generator)
    asked = torch.randint(n_pairs, (batch_size, 1), generator=generator)
    pairs = torch.stack([keys, len(KEYS) + values], dim=2).flatten(1)  # k1 v1 k2 v2 ...
    mark = torch.full((batch_size, 2), VOCABULARY.index(QUERY_MARK))
    tokens = torch.cat([pairs, mark, keys.gather(1, asked)], dim=1)
    return tokens, values.gather(1, asked).squeeze(1)


@dataclass(frozen=True)
class RetrievalSets:
    """Held-out sequences of one seed: validation (for choices) and test (for claims), each a
    pair (tokens (N, T), answers (N,)) from its own random stream."""

    validation: tuple[torch.Tensor, torch.Tensor]
    test: tuple[torch.Tensor, torch.Tensor]


def retrieval_sets(seed: int, size: int = 2000, n_pairs: int = 4) -> RetrievalSets:
    """Validation and test sequences that follow the run's seed, each from its own stream (and
    neither from the training batches' stream)."""
    return RetrievalSets(
        validation=retrieval_batch(size, n_pairs, training.generator(seed, VALIDATION)),
        test=retrieval_batch(size, n_pairs, training.generator(seed, TEST)),
    )


def decode(tokens: torch.Tensor) -> str:
    """Token ids (T,) back to text, e.g. "c9k8j3f1??c"."""
    return "".join(VOCABULARY[i] for i in tokens.tolist())


def _check_tokens(tokens) -> int:
    """Token ids (B, T) in [0, 37); returns B."""
    batch = checks.tensor("tokens", tokens, "(B, T)", dtype=torch.long)["B"]
    if tokens.numel() and (tokens.min() < 0 or tokens.max() >= len(VOCABULARY)):
        raise ValueError(f"token ids must lie in [0, {len(VOCABULARY) - 1}]")
    return batch


def _check_sequences(name: str, sequences) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(sequences, tuple) or len(sequences) != 2:
        raise TypeError(f"{name} must be a pair (tokens (N, T), answers (N,))")
    tokens, answers = sequences
    checks.tensor(f"{name} answers", answers, "(N,)", N=_check_tokens(tokens))
    return tokens, answers


# -- Three models on the task, trained alike ------------------------------------------------------


class RetrievalNet(nn.Module):
    """Token ids (B, T) -> embedding -> a recurrent core -> the last hidden state -> 10 logits.

    The core is the fast-weights RNN (the default), the same RNN without fast weights
    (`fast_lr=0.0`), or an LSTM with the same number of hidden units (`lstm=True`). Everything
    but the core is shared. Other keyword arguments go to FastWeightsRNN.
    """

    def __init__(
        self,
        hidden_size: int = 32,
        embedding_size: int = 100,
        *,
        lstm: bool = False,
        **fast_weight_settings,
    ):
        super().__init__()
        checks.boolean("lstm", lstm)
        if lstm and fast_weight_settings:
            raise ValueError(f"an LSTM takes no fast-weight settings; got {fast_weight_settings}")
        self.embedding = nn.Embedding(
            len(VOCABULARY), checks.integer("embedding_size", embedding_size)
        )
        if lstm:
            self.core = nn.LSTM(
                embedding_size, checks.integer("hidden_size", hidden_size), batch_first=True
            )
        else:
            self.core = fast_weights.FastWeightsRNN(
                embedding_size, hidden_size, **fast_weight_settings
            )
        self.readout = nn.Linear(hidden_size, len(VALUES))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        _check_tokens(tokens)
        outputs, _ = self.core(self.embedding(tokens))
        return self.readout(outputs[:, -1])


def retrieval_accuracy(model: RetrievalNet, sequences: tuple[torch.Tensor, torch.Tensor]) -> float:
    """Fraction of the sequences (tokens, answers) whose answer digit gets the largest logit."""
    tokens, answers = _check_sequences("sequences", sequences)
    return training.accuracy_of(model, tokens, answers)


def train_retrieval(
    validation: tuple[torch.Tensor, torch.Tensor],
    *,
    seed: int,
    steps: int = 1000,
    batch_size: int = 128,
    lr: float = 1e-2,
    clip: float = 5.0,
    n_pairs: int = 4,
    eval_every: int = 100,
    **model_settings,
) -> training.Run:
    """Build a RetrievalNet (`model_settings` choose the core) and train it with Adam on fresh
    batches of the task, through papernotes.training.train.

    The seed fixes the initial weights and the batches (its own stream), so models trained with
    the same seed see the same sequences in the same order. The history logs the training loss
    and the accuracy on `validation` every `eval_every` updates.
    """
    _check_sequences("validation", validation)
    checks.number("lr", lr, 0.0, low_open=True)
    n_pairs = checks.integer("n_pairs", n_pairs)
    batch_size = checks.integer("batch_size", batch_size)
    with training.seeded(seed):
        model = RetrievalNet(**model_settings)
    batches = training.generator(seed, BATCHES)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    # Every update draws a fresh batch of sequences (there is no fixed training set to index),
    # so the loop is training.train with the cross-entropy rather than train_classifier.
    def loss_of_update(i: int) -> torch.Tensor:
        tokens, answers = retrieval_batch(batch_size, n_pairs, batches)
        return F.cross_entropy(model(tokens), answers)

    history = training.train(
        model,
        optimizer,
        loss_of_update,
        steps,
        evaluate=lambda: {"val_accuracy": retrieval_accuracy(model, validation)},
        eval_every=eval_every,
        clip=clip,
        desc="associative retrieval",
    )
    return training.Run(model, history)


# -- What the memory reads at the query -----------------------------------------------------------


def attention_at_query(model: RetrievalNet, tokens: torch.Tensor) -> torch.Tensor:
    """How the last step reads the memory: the weight of each earlier state h(1..T-1), (B, T-1).

    At the last step the network has just read the query key. Its preliminary vector h_0(T) is
    the query of the first inner-loop read, A(T-1) h_0(T) = sum_tau weight_tau h(tau).
    """
    if not isinstance(model.core, fast_weights.FastWeightsRNN):
        raise TypeError(
            f"attention_at_query needs a fast-weights core; got {type(model.core).__name__}"
        )
    _check_tokens(tokens)
    core = model.core
    with training.evaluating(model):
        trace = core.trace(model.embedding(tokens))
        return fast_weights.attention_weights(
            trace.hidden[:, :-1], trace.preliminary[:, -1], core.decay, core.fast_lr
        )


ROLES = ("queried key", "its value", "other keys", "other values", "'?' marks")


def mean_weight_by_role(weights: torch.Tensor, tokens: torch.Tensor) -> dict[str, float]:
    """The mean read weight (from `attention_at_query`) on the stored states of each role: the
    queried key and its value, the other keys and values, and the two query marks.

    weights is (B, T-1), tokens (B, T) with T = 2 n_pairs + 3.
    """
    batch, length = _check_tokens(tokens), tokens.shape[1]
    checks.tensor("weights", weights, "(B, T)", B=batch, T=length - 1)
    n_pairs = (length - 3) // 2
    rows = torch.arange(batch)
    key = 2 * (tokens[:, : 2 * n_pairs : 2] == tokens[:, -1:]).long().argmax(1)  # its position
    pairs = weights[:, : 2 * n_pairs]
    queried = torch.zeros_like(pairs, dtype=torch.bool)
    queried[rows, key] = queried[rows, key + 1] = True
    is_key = (torch.arange(2 * n_pairs) % 2 == 0).expand_as(pairs)
    means = (
        weights[rows, key],
        weights[rows, key + 1],
        pairs[~queried & is_key],
        pairs[~queried & ~is_key],
        weights[:, 2 * n_pairs :],
    )
    return {role: values.mean().item() for role, values in zip(ROLES, means, strict=True)}


def queried_over_others(model: RetrievalNet, tokens: torch.Tensor) -> float:
    """Mean read weight at the last step on the queried pair, over that on the other pairs."""
    by_role = mean_weight_by_role(attention_at_query(model, tokens), tokens)
    queried = (by_role["queried key"] + by_role["its value"]) / 2
    return queried / ((by_role["other keys"] + by_role["other values"]) / 2)


def relative_to_other_pairs(by_role: dict[str, float]) -> list[float]:
    """Each role's mean weight (`mean_weight_by_role`) over the mean of the other pairs' keys
    and values, in the order of ROLES."""
    others = (by_role["other keys"] + by_role["other values"]) / 2
    return [value / others for value in by_role.values()]


def read_with_settings(
    model: RetrievalNet,
    sequences: tuple[torch.Tensor, torch.Tensor],
    *,
    decay: float,
    fast_lr: float,
    inner_steps: int,
    accuracy: bool = True,
) -> tuple[float | None, torch.Tensor, dict[str, float]]:
    """At these test-time settings of the model's fast-weights core, on `sequences` (tokens,
    answers): the accuracy (None unless `accuracy`), the read weights at the last step and their
    mean by role. The model's own settings are restored after."""
    tokens, _ = _check_sequences("sequences", sequences)
    checks.boolean("accuracy", accuracy)
    with model.core.settings(decay=decay, fast_lr=fast_lr, inner_steps=inner_steps):
        weights = attention_at_query(model, tokens)
        measured = retrieval_accuracy(model, sequences) if accuracy else None
    return measured, weights, mean_weight_by_role(weights, tokens)
