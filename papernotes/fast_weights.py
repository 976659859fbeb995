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
   $W h(t) + C x(t)$, is computed once; a preliminary state
   $h_0(t+1) = f(\mathrm{LN}[W h(t) + C x(t)])$ then settles for $S$ steps under the fast weights,

   $$h_{s+1}(t+1) = f\big(\mathrm{LN}[\, W h(t) + C x(t) + A(t)\, h_s(t+1) \,]\big),$$

   and $h(t+1) = h_S(t+1)$, with $f$ = ReLU and LN layer normalisation. The matrix $A(t)$ used
   for $h(t+1)$ already holds $h(t)$, and the memory stores the final $h(t+1)$, not the inner
   loop's intermediate states. With $\eta = 0$ the fast weights vanish and what is left is the
   same recurrent network without them (our ablation).

4. **Associative retrieval**, the paper's first task: read key-value pairs such as ``c9k8j3f1``,
   then ``??`` and one of the keys, and answer its value: ``c9k8j3f1??c`` -> ``9``.

5. **Training** the fast-weights RNN, the ablation and an LSTM of the same size on that task,
   for the same number of updates.
"""

from __future__ import annotations

import math
import numbers
import string
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

from papernotes import checks
from papernotes.training import fit

# -- checks shared by the public functions ------------------------------------------------------


def _check_tensor(name: str, value, dims: int, what: str) -> None:
    if not isinstance(value, torch.Tensor) or not torch.is_floating_point(value):
        raise TypeError(f"{name} must be a floating-point tensor; got {type(value).__name__}")
    if value.dim() != dims:
        raise ValueError(f"{name} must have shape {what}; got {tuple(value.shape)}")


def _check_decay(decay) -> float:
    return checks.number("decay (lambda)", decay, 0.0, 1.0)


def _check_fast_lr(fast_lr) -> float:
    return checks.number("fast_lr (eta)", fast_lr, 0.0)


# -- 1. The fast-weight memory --------------------------------------------------------------------


def fast_weight_update(
    A: torch.Tensor, h: torch.Tensor, decay: float, fast_lr: float
) -> torch.Tensor:
    """One step of the Hebbian rule, A <- decay * A + fast_lr * h h^T, for each sequence.

    A is (B, H, H) and h is (B, H): example b's outer product h_b h_b^T goes into A_b only.
    (A single `h.T @ h` would add up every example's outer product into one shared memory.)
    """
    _check_tensor("A", A, 3, "(B, H, H)")
    _check_tensor("h", h, 2, "(B, H)")
    if A.shape != (h.shape[0], h.shape[1], h.shape[1]):
        raise ValueError(
            f"A must have shape (B, H, H) = {(h.shape[0], h.shape[1], h.shape[1])} for h of "
            f"shape {tuple(h.shape)}; got {tuple(A.shape)}"
        )
    decay, fast_lr = _check_decay(decay), _check_fast_lr(fast_lr)
    # baddbmm: beta * A + alpha * (h as a column) @ (h as a row), batched over b.
    return torch.baddbmm(A, h.unsqueeze(2), h.unsqueeze(1), beta=decay, alpha=fast_lr)


# -- 2. The memory view: attention over past hidden states, without a softmax --------------------


def attention_weights(
    hs: torch.Tensor, query: torch.Tensor, decay: float, fast_lr: float
) -> torch.Tensor:
    """The weight of each past state in A(t) query: fast_lr * decay^(t - tau) * h_tau^T query.

    hs holds the past hidden states h_1 .. h_t, shape (B, t, H); query is (B, H).
    Returns (B, t). Unlike softmax attention the weights need not be positive or sum to one.
    """
    _check_tensor("hs", hs, 3, "(B, t, H)")
    _check_tensor("query", query, 2, "(B, H)")
    if query.shape != (hs.shape[0], hs.shape[2]):
        raise ValueError(
            f"query must have shape (B, H) = {(hs.shape[0], hs.shape[2])} to match hs of shape "
            f"{tuple(hs.shape)}; got {tuple(query.shape)}"
        )
    decay, fast_lr = _check_decay(decay), _check_fast_lr(fast_lr)
    scores = (hs * query.unsqueeze(1)).sum(2)  # h_tau^T query, (B, t)
    return scores * _decay_weights(hs.shape[1], decay, fast_lr, hs.dtype, hs.device)


@lru_cache(maxsize=64)
def _decay_weights(t: int, decay: float, fast_lr: float, dtype, device) -> torch.Tensor:
    """fast_lr * decay^(t - tau) for tau = 1..t (the newest state last), computed once."""
    age = torch.arange(t - 1, -1, -1, dtype=torch.float64)
    return (fast_lr * decay**age).to(dtype=dtype, device=device)


def attention_readout(
    hs: torch.Tensor, query: torch.Tensor, decay: float, fast_lr: float
) -> torch.Tensor:
    """fast_lr * sum_tau decay^(t - tau) h_tau (h_tau^T query), shape (B, H): the same vector
    as A(t) query after t fast-weight updates with h_1 .. h_t, computed from the stored states."""
    weights = attention_weights(hs, query, decay, fast_lr)
    return (weights.unsqueeze(2) * hs).sum(1)  # sum_tau weight_tau h_tau, (B, H)


# -- 3. The fast-weights RNN ----------------------------------------------------------------------


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


class StateMemory:
    """The same memory kept as the list of past hidden states and read by attention.

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
        if not self.states:
            return torch.zeros_like(query)
        return attention_readout(torch.stack(self.states, 1), query, self.decay, self.fast_lr)


MEMORIES = {"matrix": MatrixMemory, "attention": StateMemory}


@dataclass(frozen=True)
class FastWeightsTrace:
    """What a forward pass saw: the hidden states h(1..T) and the inner loop's preliminary
    states h_0(1..T), both (B, T, H)."""

    hidden: torch.Tensor
    preliminary: torch.Tensor


class FastWeightsRNN(nn.Module):
    """A ReLU RNN with layer normalisation and a per-sequence fast-weight memory.

    forward(x) takes x of shape (B, T, input_size) and returns the hidden states (B, T, H) and
    the final hidden state (B, H). The slow weights are C (input, with a bias) and W
    (recurrent), which starts at 0.5 * I: an identity-like start lets the state carry
    information across steps from the first update (0.05 * I learned far slower in the
    book's pilot). fast_lr = 0 switches the fast weights off.

    memory chooses how A(t) h is computed, with the same result: "matrix" keeps A itself,
    "attention" (the default, faster here) keeps the past states and uses the memory view.
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
        layer_norm: bool = True,
        *,
        memory: str = "attention",
    ):
        super().__init__()
        self.input_size = checks.integer("input_size", input_size)
        self.hidden_size = checks.integer("hidden_size", hidden_size)
        self.decay = _check_decay(decay)
        self.fast_lr = _check_fast_lr(fast_lr)
        self.inner_steps = checks.integer("inner_steps", inner_steps)
        self.memory = _check_memory(memory)
        if not isinstance(layer_norm, bool):
            raise TypeError(f"layer_norm must be True or False; got {layer_norm!r}")
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
            "inner_steps": lambda v: checks.integer("inner_steps", v),
            "memory": _check_memory,
        }
        unknown = sorted(set(changes) - set(validators))
        if unknown:
            raise ValueError(f"unknown setting(s) {unknown}; the settings are {sorted(validators)}")
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
        preliminary = F.relu(self.norm(slow))  # h_0(t+1)
        h = preliminary
        if self.fast_lr > 0:  # with eta = 0, A stays 0 and the loop would return h_0 unchanged
            for _ in range(self.inner_steps):
                h = F.relu(self.norm(slow + memory.read(h)))  # A(t) h_s: attention to the past
            # Store the final h(t+1), not the loop's intermediate states, before the next step.
            memory.write(h)
        return h, preliminary

    def trace(self, x: torch.Tensor) -> FastWeightsTrace:
        """Run over x (B, T, input_size) from h(0) = 0 and A(0) = 0; keep every state."""
        _check_tensor("x", x, 3, f"(B, T, {self.input_size})")
        if x.shape[2] != self.input_size or x.shape[1] < 1:
            raise ValueError(
                f"x must have shape (B, T, {self.input_size}) with T >= 1; got {tuple(x.shape)}"
            )
        drive = self.input_weights(x)  # C x(t) + b for every t at once
        h = x.new_zeros(x.shape[0], self.hidden_size)
        memory = MEMORIES[self.memory](h, self.decay, self.fast_lr)  # empty: A(0) = 0
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


def _check_memory(memory) -> str:
    if memory not in MEMORIES:
        raise ValueError(f"memory must be one of {', '.join(MEMORIES)}; got {memory!r}")
    return memory


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
    if n_pairs > len(KEYS):
        raise ValueError(f"n_pairs must be at most {len(KEYS)} (distinct keys); got {n_pairs}")
    keys = torch.rand(batch_size, len(KEYS), generator=generator).argsort(1)[:, :n_pairs]
    values = torch.randint(len(VALUES), (batch_size, n_pairs), generator=generator)
    asked = torch.randint(n_pairs, (batch_size, 1), generator=generator)
    pairs = torch.stack([keys, len(KEYS) + values], dim=2).flatten(1)  # k1 v1 k2 v2 ...
    mark = torch.full((batch_size, 2), VOCABULARY.index(QUERY_MARK))
    tokens = torch.cat([pairs, mark, keys.gather(1, asked)], dim=1)
    return tokens, values.gather(1, asked).squeeze(1)


def decode(tokens: torch.Tensor) -> str:
    """Token ids (T,) back to text, e.g. "c9k8j3f1??c"."""
    return "".join(VOCABULARY[i] for i in tokens.tolist())


# -- 5. Three models on the task, trained alike ----------------------------------------------------

MODELS = ("fast weights", "no fast weights", "LSTM")


class RetrievalNet(nn.Module):
    """Token ids (B, T) -> embedding -> a recurrent core -> the last hidden state -> 10 logits.

    core is one of MODELS: the fast-weights RNN, the same RNN with fast_lr = 0, or an LSTM with
    the same number of hidden units. Everything but the core is shared.
    """

    def __init__(
        self,
        core: str = "fast weights",
        hidden_size: int = 32,
        embedding_size: int = 100,
        **fast_weight_settings,
    ):
        super().__init__()
        if core not in MODELS:
            raise ValueError(f"core must be one of {', '.join(MODELS)}; got {core!r}")
        self.kind = core
        self.embedding = nn.Embedding(len(VOCABULARY), embedding_size)
        if core == "LSTM":
            if fast_weight_settings:
                raise ValueError(
                    f"an LSTM takes no fast-weight settings; got {fast_weight_settings}"
                )
            self.core = nn.LSTM(embedding_size, hidden_size, batch_first=True)
        else:
            if core == "no fast weights":
                if fast_weight_settings.get("fast_lr", 0.0) != 0.0:
                    raise ValueError("'no fast weights' means fast_lr = 0; do not pass another")
                fast_weight_settings["fast_lr"] = 0.0
            self.core = FastWeightsRNN(embedding_size, hidden_size, **fast_weight_settings)
        self.readout = nn.Linear(hidden_size, len(VALUES))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        _check_tokens(tokens)
        outputs, _ = self.core(self.embedding(tokens))
        return self.readout(outputs[:, -1])


def _check_tokens(tokens) -> None:
    if not isinstance(tokens, torch.Tensor) or tokens.dtype != torch.long or tokens.dim() != 2:
        got = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
        raise ValueError(f"tokens must be a (B, T) tensor of token ids (torch.long); got {got}")
    if tokens.numel() and (tokens.min() < 0 or tokens.max() >= len(VOCABULARY)):
        raise ValueError(f"token ids must lie in [0, {len(VOCABULARY) - 1}]")


@torch.no_grad()
def retrieval_accuracy(model: RetrievalNet, tokens: torch.Tensor, answers: torch.Tensor) -> float:
    """Fraction of sequences whose answer digit gets the largest logit."""
    was_training = model.training
    model.eval()
    try:
        return (model(tokens).argmax(-1) == answers).float().mean().item()
    finally:
        model.train(was_training)


@torch.no_grad()
def attention_at_query(model: RetrievalNet, tokens: torch.Tensor) -> torch.Tensor:
    """How the last step reads the memory: the weight of each earlier state h(1..T-1), (B, T-1).

    At the last step the network has just read the query key. Its preliminary state h_0(T) is
    the query of the first inner-loop read, A(T-1) h_0(T) = sum_tau weight_tau h(tau).
    """
    if not isinstance(model.core, FastWeightsRNN):
        raise TypeError(f"attention_at_query needs a fast-weights core; got {model.kind!r}")
    _check_tokens(tokens)
    core = model.core
    trace = core.trace(model.embedding(tokens))
    return attention_weights(
        trace.hidden[:, :-1], trace.preliminary[:, -1], core.decay, core.fast_lr
    )


def train_retrieval(
    core: str,
    test: tuple[torch.Tensor, torch.Tensor],
    steps: int = 1000,
    batch_size: int = 128,
    lr: float = 1e-2,
    clip: float = 5.0,
    n_pairs: int = 4,
    eval_every: int = 250,
    seed: int = 0,
    **fast_weight_settings,
) -> tuple[RetrievalNet, dict[str, list[float]]]:
    """Build a RetrievalNet with this core and train it with Adam on fresh batches of the task.

    The seed fixes the initial weights and the batches, so models trained with the same seed
    see the same sequences in the same order. Returns the model and its history: the training
    loss and the test accuracy every `eval_every` updates.
    """
    test_tokens, test_answers = test
    if test_tokens.dim() != 2 or test_answers.shape != test_tokens.shape[:1]:
        shapes = f"{tuple(test_tokens.shape)} and {tuple(test_answers.shape)}"
        raise ValueError(f"test must be (tokens (N, T), answers (N,)); got {shapes}")
    if not (isinstance(lr, numbers.Real) and lr > 0 and math.isfinite(lr)):
        raise ValueError(f"lr must be a finite number > 0; got {lr}")
    torch.manual_seed(seed)
    model = RetrievalNet(core, **fast_weight_settings)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    def step(i: int):
        tokens, answers = retrieval_batch(batch_size, n_pairs, generator)
        loss = F.cross_entropy(model(tokens), answers)
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        if (i + 1) % eval_every == 0:
            accuracy = retrieval_accuracy(model, test_tokens, test_answers)
            return {"loss": loss.item(), "test_accuracy": accuracy}
        return None

    return model, fit(step, steps, desc=core)
