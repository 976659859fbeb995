r"""Fast weights: a recurrent network with a short-term memory in its weights.

Ba, Hinton, Mnih, Leibo & Ionescu 2016, *Using Fast Weights to Attend to the Recent Past*
(arXiv:1610.06258). The module follows the paper's argument in order.

1. **The fast-weight memory.** Besides its slow weights (learned by backpropagation and fixed
   while a sequence is read), every sequence carries a matrix $A$ of *fast* weights, reset to zero
   when the sequence starts and changed at every step by a decaying Hebbian rule:

   $$A(t) = \lambda\, A(t-1) + \eta\, h(t)\, h(t)^\top,\qquad A(0) = 0,$$

   with decay $\lambda \in [0, 1]$ and fast learning rate $\eta \ge 0$. Each sequence of a
   minibatch has its own $A$: the outer product is taken per example, never summed over the batch.

2. **The memory view.** Unrolling the rule, $A(t)$ applied to any vector $q$ is

   $$A(t)\, q = \eta \sum_{\tau \le t} \lambda^{t-\tau}\, h(\tau)\, \big(h(\tau)^\top q\big):$$

   a sum of the past hidden states, each weighted by its inner product with $q$ and by how long
   ago it was stored. That is attention over the recent past, with dot-product scores and no
   softmax; $A$ is a fixed-size summary of it, of $H \times H$ numbers whatever the length.

3. **The fast-weights RNN.** The next hidden state comes from a short inner loop. The slow part,
   $W h(t) + C x(t)$, is computed once; the preliminary vector is
   $h_0(t+1) = f(W h(t) + C x(t))$, which then settles for $S$ steps under the fast weights,
   with layer normalisation (LN) inside the loop,

   $$h_{s+1}(t+1) = f\big(\mathrm{LN}[\, W h(t) + C x(t) + A(t)\, h_s(t+1) \,]\big),$$

   and $h(t+1) = h_S(t+1)$, with $f$ = ReLU. The matrix $A(t)$ used for $h(t+1)$ already holds
   $h(t)$, and the memory stores the final $h(t+1)$, not the loop's intermediate states. With
   $\eta = 0$ the fast weights vanish and what is left, $h(t+1) = f(\mathrm{LN}[W h(t) + C
   x(t)])$, is the same recurrent network without them (our ablation).

4. **Associative retrieval**, the paper's first task: read key-value pairs such as ``c9k8j3f1``,
   then ``??`` and one of the keys, and answer its value: ``c9k8j3f1??c`` -> ``9``.

5. **Training** the fast-weights RNN, the ablation and an LSTM of the same size on that task,
   for the same number of updates, through the book's one training loop.

Arguments are checked where they enter (the constructors, `settings`, `retrieval_batch`,
`retrieval_sets`, `train_retrieval`, `retrieval_accuracy`, `attention_at_query` and the models'
forward passes); the equations of sections 1-3 trust their input.
"""

from __future__ import annotations

import string
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

from papernotes import checks
from papernotes.training import History, accuracy, evaluating, generator, seeded, train

# The random streams of a run (papernotes.training.generator(seed, stream)): the training
# batches, the validation sequences and the test sequences each come from their own.
BATCH_STREAM, VALIDATION_STREAM, TEST_STREAM = 1, 2, 3
MEMORIES = ("attention", "matrix")


# -- 1. The fast-weight memory --------------------------------------------------------------------


def fast_weight_update(
    A: torch.Tensor, h: torch.Tensor, decay: float, fast_lr: float
) -> torch.Tensor:
    """A(t) = decay * A(t-1) + fast_lr * h(t) h(t)^T, for each sequence: A (B, H, H), h (B, H).

    Example b's outer product h_b h_b^T goes into A_b only (a single `h.T @ h` would add up every
    example's outer product into one memory shared by the batch).
    """
    # baddbmm: beta * A + alpha * (h as a column) @ (h as a row), batched over b.
    return torch.baddbmm(A, h.unsqueeze(2), h.unsqueeze(1), beta=decay, alpha=fast_lr)


# -- 2. The memory view: attention over past hidden states, without a softmax --------------------


def attention_weights(
    hs: torch.Tensor, query: torch.Tensor, decay: float, fast_lr: float
) -> torch.Tensor:
    """The weight of each past state in A(t) q: fast_lr * decay^(t - tau) * h(tau)^T q.

    hs holds the past hidden states h(1) .. h(t), shape (B, t, H); query is (B, H); returns
    (B, t). Unlike softmax attention the weights need not be positive or sum to one.
    """
    scores = (hs * query.unsqueeze(1)).sum(2)  # h(tau)^T q, (B, t)
    return scores * decay_weights(hs.shape[1], decay, fast_lr, hs.dtype)


@lru_cache(maxsize=64)
def decay_weights(t: int, decay: float, fast_lr: float, dtype: torch.dtype) -> torch.Tensor:
    """fast_lr * decay^(t - tau) for tau = 1 .. t, the newest state last (computed once)."""
    age = torch.arange(t - 1, -1, -1, dtype=torch.float64)
    return (fast_lr * decay**age).to(dtype)


def attention_readout(
    hs: torch.Tensor, query: torch.Tensor, decay: float, fast_lr: float
) -> torch.Tensor:
    """fast_lr * sum_tau decay^(t - tau) h(tau) (h(tau)^T q), shape (B, H): the same vector as
    A(t) q after t fast-weight updates with h(1) .. h(t), computed from the stored states."""
    weights = attention_weights(hs, query, decay, fast_lr)
    return (weights.unsqueeze(2) * hs).sum(1)  # sum_tau weight_tau h(tau)


# -- 3. The fast-weights RNN ----------------------------------------------------------------------


class StateMemory:
    """The memory kept as the list of past hidden states and read by attention (section 2).

    The paper computes fast weights this way for minibatch training: no sequence needs a matrix
    of its own. A read costs O(t H) per sequence instead of O(H^2), the cheaper of the two
    while a sequence is shorter than the hidden size (as on the retrieval task).
    """

    def __init__(self, like: torch.Tensor, decay: float, fast_lr: float):
        self.states: list[torch.Tensor] = []
        self.decay, self.fast_lr = decay, fast_lr

    def write(self, h: torch.Tensor) -> None:
        self.states.append(h)

    def read(self, query: torch.Tensor) -> torch.Tensor:
        if not self.states:  # A(0) = 0
            return torch.zeros_like(query)
        return attention_readout(torch.stack(self.states, 1), query, self.decay, self.fast_lr)


class MatrixMemory:
    """The fast weights as the paper defines them: one (H, H) matrix A per sequence."""

    def __init__(self, like: torch.Tensor, decay: float, fast_lr: float):
        batch, hidden = like.shape
        self.A = like.new_zeros(batch, hidden, hidden)
        self.decay, self.fast_lr = decay, fast_lr

    def write(self, h: torch.Tensor) -> None:
        self.A = fast_weight_update(self.A, h, self.decay, self.fast_lr)

    def read(self, query: torch.Tensor) -> torch.Tensor:
        return (self.A * query.unsqueeze(1)).sum(2)  # A q, batched (faster than bmm on a CPU)


@dataclass(frozen=True)
class FastWeightsTrace:
    """What a forward pass saw: the hidden states h(1..T) and the preliminary vectors
    h_0(1..T), both (B, T, H)."""

    hidden: torch.Tensor
    preliminary: torch.Tensor


def _check_decay(decay) -> float:
    return checks.number("decay", decay, 0.0, 1.0)


def _check_fast_lr(fast_lr) -> float:
    return checks.number("fast_lr", fast_lr, 0.0)


def _check_inner_steps(inner_steps) -> int:
    return checks.integer("inner_steps", inner_steps)


def _check_memory(memory) -> str:
    return checks.one_of("memory", memory, MEMORIES)


def _check_flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False; got {value!r}")
    return value


class FastWeightsRNN(nn.Module):
    """A ReLU RNN with a per-sequence fast-weight memory and layer normalisation in its inner loop.

    forward(x) takes x of shape (B, T, input_size) and returns the hidden states (B, T, H) and
    the final hidden state (B, H). The slow weights are C (input, with a bias) and W
    (recurrent), which starts at 0.5 * I: an identity-like start lets the state carry
    information across steps from the first update (0.05 * I learned far slower in the
    book's pilot). fast_lr = 0 switches the fast weights off; layer_norm=False drops LN.

    memory chooses how A(t) h is computed, with the same result: "attention" (the default,
    faster here) keeps the past states and uses the memory view, "matrix" keeps A itself.
    decay, fast_lr, inner_steps and memory are plain settings, not parameters: `settings()`
    changes them for a while on a trained model.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        decay: float = 0.95,
        fast_lr: float = 0.5,
        inner_steps: int = 1,
        *,
        layer_norm: bool = True,
        memory: str = "attention",
    ):
        super().__init__()
        self.input_size = checks.integer("input_size", input_size)
        self.hidden_size = checks.integer("hidden_size", hidden_size)
        self.decay = _check_decay(decay)
        self.fast_lr = _check_fast_lr(fast_lr)
        self.inner_steps = _check_inner_steps(inner_steps)
        self.memory = _check_memory(memory)
        _check_flag("layer_norm", layer_norm)
        self.input_weights = nn.Linear(input_size, hidden_size)  # C (and the bias)
        self.recurrent_weights = nn.Linear(hidden_size, hidden_size, bias=False)  # W
        self.norm = nn.LayerNorm(hidden_size) if layer_norm else nn.Identity()
        with torch.no_grad():
            self.recurrent_weights.weight.copy_(0.5 * torch.eye(hidden_size))

    @contextmanager
    def settings(self, **changes) -> Iterator[FastWeightsRNN]:
        """Change decay, fast_lr, inner_steps and/or memory inside a `with` block."""
        validators = {
            "decay": _check_decay,
            "fast_lr": _check_fast_lr,
            "inner_steps": _check_inner_steps,
            "memory": _check_memory,
        }
        for name in changes:
            checks.one_of("setting", name, validators)
        new = {name: validators[name](value) for name, value in changes.items()}
        old = {name: getattr(self, name) for name in new}
        try:
            for name, value in new.items():
                setattr(self, name, value)
            yield self
        finally:
            for name, value in old.items():
                setattr(self, name, value)

    def step(self, slow: torch.Tensor, memory) -> tuple[torch.Tensor, torch.Tensor]:
        """One time step: from slow = W h(t) + C x(t) and the memory A(t) to h(t+1).

        Returns (h(t+1), h_0(t+1)); the memory becomes A(t+1).
        """
        preliminary = F.relu(slow)  # h_0(t+1) = f(W h(t) + C x(t))
        h = preliminary
        for _ in range(self.inner_steps):
            # h_{s+1}(t+1) = f(LN[W h(t) + C x(t) + A(t) h_s(t+1)]); with eta = 0, A(t) h is 0.
            fast = memory.read(h) if self.fast_lr > 0 else 0.0
            h = F.relu(self.norm(slow + fast))
        # Store the final h(t+1), not the loop's intermediate states, before the next step.
        if self.fast_lr > 0:
            memory.write(h)
        return h, preliminary

    def trace(self, x: torch.Tensor) -> FastWeightsTrace:
        """Run over x (B, T, input_size) from h(0) = 0 and A(0) = 0; keep every state."""
        checks.tensor("x", x, "(B, T, D)", dtype="floating", D=self.input_size)
        drive = self.input_weights(x)  # C x(t) + b for every t at once
        h = x.new_zeros(x.shape[0], self.hidden_size)
        memory = (StateMemory if self.memory == "attention" else MatrixMemory)(
            h, self.decay, self.fast_lr
        )
        hidden, preliminary = [], []
        for t in range(x.shape[1]):
            slow = torch.addmm(drive[:, t], h, self.recurrent_weights.weight.T)  # + W h(t)
            h, h0 = self.step(slow, memory)
            hidden.append(h)
            preliminary.append(h0)
        return FastWeightsTrace(torch.stack(hidden, 1), torch.stack(preliminary, 1))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.trace(x).hidden
        return hidden, hidden[:, -1]


# -- 4. Associative retrieval ---------------------------------------------------------------------

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
        validation=retrieval_batch(size, n_pairs, generator(seed, VALIDATION_STREAM)),
        test=retrieval_batch(size, n_pairs, generator(seed, TEST_STREAM)),
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


# -- 5. Three models on the task, trained alike ----------------------------------------------------


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
        _check_flag("lstm", lstm)
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
            self.core = FastWeightsRNN(embedding_size, hidden_size, **fast_weight_settings)
        self.readout = nn.Linear(hidden_size, len(VALUES))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        _check_tokens(tokens)
        outputs, _ = self.core(self.embedding(tokens))
        return self.readout(outputs[:, -1])


def retrieval_accuracy(model: RetrievalNet, sequences: tuple[torch.Tensor, torch.Tensor]) -> float:
    """Fraction of the sequences (tokens, answers) whose answer digit gets the largest logit."""
    tokens, answers = _check_sequences("sequences", sequences)
    with evaluating(model):
        return accuracy(model(tokens), answers)


def attention_at_query(model: RetrievalNet, tokens: torch.Tensor) -> torch.Tensor:
    """How the last step reads the memory: the weight of each earlier state h(1..T-1), (B, T-1).

    At the last step the network has just read the query key. Its preliminary vector h_0(T) is
    the query of the first inner-loop read, A(T-1) h_0(T) = sum_tau weight_tau h(tau).
    """
    if not isinstance(model.core, FastWeightsRNN):
        raise TypeError(
            f"attention_at_query needs a fast-weights core; got {type(model.core).__name__}"
        )
    _check_tokens(tokens)
    core = model.core
    with evaluating(model):
        trace = core.trace(model.embedding(tokens))
        return attention_weights(
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


@dataclass(frozen=True)
class RetrievalRun:
    """A trained network and the History of its training (loss and validation accuracy)."""

    model: RetrievalNet
    history: History


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
) -> RetrievalRun:
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
    with seeded(seed):
        model = RetrievalNet(**model_settings)
    batches = generator(seed, BATCH_STREAM)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    def loss_of_update(i: int) -> torch.Tensor:
        tokens, answers = retrieval_batch(batch_size, n_pairs, batches)
        return F.cross_entropy(model(tokens), answers)

    history = train(
        model,
        optimizer,
        loss_of_update,
        steps,
        evaluate=lambda: {"val_accuracy": retrieval_accuracy(model, validation)},
        eval_every=eval_every,
        clip=clip,
        desc="associative retrieval",
    )
    return RetrievalRun(model, history)
