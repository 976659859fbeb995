r"""Fast weights: a recurrent network with a short-term memory in its weights.

Ba, Hinton, Mnih, Leibo & Ionescu 2016, *Using Fast Weights to Attend to the Recent Past*
(arXiv:1610.06258). Besides its slow weights, learned by backpropagation, every sequence carries
a matrix A of fast weights, reset at its start and changed at every step by a decaying Hebbian
rule; reading A with a query is attention over the recent hidden states without a softmax; the
next hidden state settles for a few inner steps under the fast weights, with layer normalisation
inside the loop. The chapter (chapters/fast_weights.ipynb, "The idea") derives it; each equation
is written again below, above the lines that compute it, in the paper's order: the write, the
memory view, the network.

The associative-retrieval task the chapter trains on, the three networks trained on it and the
measurements of the memory's read are in `papernotes.fast_weights.experiment`.

Arguments are checked where they enter (the constructor, `settings` and the forward pass); the
equations trust their input.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

from papernotes import checks

MEMORIES = ("attention", "matrix")  # two ways to compute A(t) h, with the same result


# -- 1. The fast-weight memory --------------------------------------------------------------------


def fast_weight_update(
    A: torch.Tensor, h: torch.Tensor, decay: float, fast_lr: float
) -> torch.Tensor:
    """A(t) = decay * A(t-1) + fast_lr * h(t) h(t)^T, for each sequence: A (B, H, H), h (B, H).

    Example b's outer product h_b h_b^T goes into A_b only (a single `h.T @ h` would add up every
    example's outer product into one memory shared by the batch).
    """
    # A(t) = lambda A(t-1) + eta h(t) h(t)^T, A(0) = 0: baddbmm is beta * A + alpha * (h as a
    # column) @ (h as a row), batched over b, so each sequence has its own A
    return torch.baddbmm(A, h.unsqueeze(2), h.unsqueeze(1), beta=decay, alpha=fast_lr)


# -- 2. The memory view: attention over past hidden states, without a softmax --------------------


def attention_weights(
    hs: torch.Tensor, query: torch.Tensor, decay: float, fast_lr: float
) -> torch.Tensor:
    """The weight of each past state in A(t) q: fast_lr * decay^(t - tau) * h(tau)^T q.

    hs holds the past hidden states h(1) .. h(t), shape (B, t, H); query is (B, H); returns
    (B, t). Unlike softmax attention the weights need not be positive or sum to one.
    """
    # eta lambda^(t - tau) h(tau)^T q: a dot-product score, decayed by age, and no softmax
    scores = (hs * query.unsqueeze(1)).sum(2)  # h(tau)^T q, (B, t)
    return scores * decay_weights(hs.shape[1], decay, fast_lr, hs.dtype)


@lru_cache(maxsize=64)
def decay_weights(t: int, decay: float, fast_lr: float, dtype: torch.dtype) -> torch.Tensor:
    """fast_lr * decay^(t - tau) for tau = 1 .. t, the newest state last (computed once)."""
    age = torch.arange(t - 1, -1, -1, dtype=torch.float64)  # t - tau
    return (fast_lr * decay**age).to(dtype)


def attention_readout(
    hs: torch.Tensor, query: torch.Tensor, decay: float, fast_lr: float
) -> torch.Tensor:
    """fast_lr * sum_tau decay^(t - tau) h(tau) (h(tau)^T q), shape (B, H): the same vector as
    A(t) q after t fast-weight updates with h(1) .. h(t), computed from the stored states."""
    # A(t) q = eta sum_{tau <= t} lambda^(t - tau) h(tau) (h(tau)^T q): the rule unrolled
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
        self.A = like.new_zeros(batch, hidden, hidden)  # A(0) = 0
        self.decay, self.fast_lr = decay, fast_lr

    def write(self, h: torch.Tensor) -> None:
        self.A = fast_weight_update(self.A, h, self.decay, self.fast_lr)

    def read(self, query: torch.Tensor) -> torch.Tensor:
        return (self.A * query.unsqueeze(1)).sum(2)  # A q, batched (faster than bmm on a CPU)


@dataclass(frozen=True)
class FastWeightsTrace:
    """What a forward pass saw: the hidden states h(1..T) and the preliminary vectors
    h_0(1..T), both (B, T, H), and the memory as the last step left it, A(T) (a StateMemory or
    a MatrixMemory: `memory.read(q)` is A(T) q)."""

    hidden: torch.Tensor
    preliminary: torch.Tensor
    memory: StateMemory | MatrixMemory


class FastWeightsRNN(nn.Module):
    """A ReLU RNN with a per-sequence fast-weight memory and layer normalisation in its inner loop.

    forward(x) takes x of shape (B, T, input_size) and returns the hidden states (B, T, H) and
    the final hidden state (B, H). The slow weights are C (input, with a bias) and W
    (recurrent), which starts at recurrent_init * I (0.5 by default, the book's choice; the
    paper's equations do not fix the start). fast_lr = 0 switches the fast weights off;
    layer_norm=False drops LN; the preliminary vector h_0 has no LN, as the paper's equations
    write it.

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
        recurrent_init: float = 0.5,
    ):
        super().__init__()
        self.input_size = checks.integer("input_size", input_size)
        self.hidden_size = checks.integer("hidden_size", hidden_size)
        checked = self._checked_settings(
            decay=decay, fast_lr=fast_lr, inner_steps=inner_steps, memory=memory
        )
        self.decay, self.fast_lr = checked["decay"], checked["fast_lr"]
        self.inner_steps, self.memory = checked["inner_steps"], checked["memory"]
        checks.boolean("layer_norm", layer_norm)
        checks.number("recurrent_init", recurrent_init, 0.0)
        self.input_weights = nn.Linear(input_size, hidden_size)  # C (and the bias)
        self.recurrent_weights = nn.Linear(hidden_size, hidden_size, bias=False)  # W
        self.norm = nn.LayerNorm(hidden_size) if layer_norm else nn.Identity()
        with torch.no_grad():
            self.recurrent_weights.weight.copy_(recurrent_init * torch.eye(hidden_size))

    @staticmethod
    def _checked_settings(**settings) -> dict:
        """The settings given, checked (each setting's allowed values are written here once, for
        the constructor and `settings()`): decay in [0, 1], fast_lr >= 0, inner_steps >= 1,
        memory one of MEMORIES."""
        allowed = {
            "decay": lambda value: checks.number("decay", value, 0.0, 1.0),
            "fast_lr": lambda value: checks.number("fast_lr", value, 0.0),
            "inner_steps": lambda value: checks.integer("inner_steps", value),
            "memory": lambda value: checks.one_of("memory", value, MEMORIES),
        }
        for name in settings:
            checks.one_of("setting", name, allowed)
        return {name: allowed[name](value) for name, value in settings.items()}

    @contextmanager
    def settings(self, **changes) -> Iterator[FastWeightsRNN]:
        """Change decay, fast_lr, inner_steps and/or memory inside a `with` block."""
        new = self._checked_settings(**changes)
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
        # h_0(t+1) = f(W h(t) + C x(t)), f = ReLU, without layer normalisation
        preliminary = F.relu(slow)
        h = preliminary
        for _ in range(self.inner_steps):
            # h_{s+1}(t+1) = f(LN[W h(t) + C x(t) + A(t) h_s(t+1)]), s = 0 .. S-1; the slow part
            # is computed once. With eta = 0, A(t) h is 0: the same RNN without fast weights.
            fast = memory.read(h) if self.fast_lr > 0 else 0.0
            h = F.relu(self.norm(slow + fast))
        # h(t+1) = h_S(t+1). A(t+1) stores the final h(t+1), not the loop's intermediate
        # states, before the next step reads it: the matrix that produces h(t+1) holds h(t).
        if self.fast_lr > 0:
            memory.write(h)
        return h, preliminary

    def trace(self, x: torch.Tensor) -> FastWeightsTrace:
        """Run over x (B, T, input_size) from h(0) = 0 and A(0) = 0; keep every state."""
        checks.tensor("x", x, "(B, T, D)", dtype="floating", D=self.input_size)
        return self.run(self.input_weights(x))  # C x(t) + b for every t at once

    def run(self, drive: torch.Tensor) -> FastWeightsTrace:
        """The same from the slow input drive(t) = C x(t) + b (B, T, H), computed already (a
        network that reads tokens computes C e + b once for each token's embedding e and looks
        it up); the paper's time steps from h(0) = 0 and A(0) = 0."""
        h = drive.new_zeros(drive.shape[0], self.hidden_size)
        memory = (StateMemory if self.memory == "attention" else MatrixMemory)(
            h, self.decay, self.fast_lr
        )
        hidden, preliminary = [], []
        # step by step with unbind (its gradient is one stack; indexing drive[:, t] would fill
        # a zero tensor of drive's size at every step)
        for slow_input in drive.unbind(1):
            slow = torch.addmm(slow_input, h, self.recurrent_weights.weight.T)  # + W h(t)
            h, h0 = self.step(slow, memory)
            hidden.append(h)
            preliminary.append(h0)
        return FastWeightsTrace(torch.stack(hidden, 1), torch.stack(preliminary, 1), memory)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.trace(x).hidden
        return hidden, hidden[:, -1]
