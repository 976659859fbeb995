"""Broken fast-weight memories: each patches the mechanism, papernotes.fast_weights, where the
chapter's training goes through it (the attention form of the memory, `StateMemory`, and
`FastWeightsRNN.step`), and the matrix form the same way wherever the bug has a matrix
counterpart, so that the two forms still agree with each other and only the paper's equations
can tell. The experiment (papernotes.fast_weights.experiment) builds its networks and reads the
memory through the module, so its runs see the patch.
"""

import torch
import torch.nn.functional as F

from papernotes import fast_weights as m


def memory_one_step_late():
    """h(t+1) reads a memory that lacks h(t): each state is written one step late."""

    def step(self, slow, memory):
        preliminary = F.relu(slow)
        h = preliminary
        for _ in range(self.inner_steps):
            fast = memory.read(h) if self.fast_lr > 0 else 0.0
            h = F.relu(self.norm(slow + fast))
        if self.fast_lr > 0:
            late = getattr(memory, "late", None)
            if late is not None:
                memory.write(late)
            memory.late = h
        return h, preliminary

    m.FastWeightsRNN.step = step


def one_memory_for_the_whole_batch():
    """Every sequence of a batch writes into and reads from one memory (A summed over the batch)."""

    def fast_weight_update(A, h, decay, fast_lr):
        return decay * A + fast_lr * (h.T @ h).expand_as(A)

    def attention_readout(hs, query, decay, fast_lr):
        ages = m.decay_weights(hs.shape[1], decay, fast_lr, hs.dtype)
        shared = torch.einsum("t,bth,btk->hk", ages, hs, hs)  # every sequence's states in one A
        return query @ shared

    m.fast_weight_update = fast_weight_update
    m.attention_readout = attention_readout


def decay_on_the_new_outer_product():
    """A(t) = A(t-1) + lambda * eta * h h^T: the decay scales the new outer product, so the old
    memory never fades."""

    def fast_weight_update(A, h, decay, fast_lr):
        return torch.baddbmm(A, h.unsqueeze(2), h.unsqueeze(1), alpha=decay * fast_lr)

    def decay_weights(t, decay, fast_lr, dtype):
        return torch.full((t,), fast_lr * decay, dtype=dtype)

    m.fast_weight_update = fast_weight_update
    m.decay_weights = decay_weights


def inner_loop_queries_with_the_slow_state():
    """The inner loop reads A(t) with the slow drive W h(t) + C x(t) instead of h_s(t+1)."""

    def step(self, slow, memory):
        preliminary = F.relu(slow)
        h = preliminary
        for _ in range(self.inner_steps):
            fast = memory.read(slow) if self.fast_lr > 0 else 0.0
            h = F.relu(self.norm(slow + fast))
        if self.fast_lr > 0:
            memory.write(h)
        return h, preliminary

    m.FastWeightsRNN.step = step


def recurrent_weights_transposed():
    """The slow drive uses h(t) W instead of W h(t): the recurrent matrix is read the wrong way
    round (invisible while W is the symmetric 0.5 I it starts at)."""

    def run(self, drive):
        h = drive.new_zeros(drive.shape[0], self.hidden_size)
        memory = (m.StateMemory if self.memory == "attention" else m.MatrixMemory)(
            h, self.decay, self.fast_lr
        )
        hidden, preliminary = [], []
        for slow_input in drive.unbind(1):
            slow = torch.addmm(slow_input, h, self.recurrent_weights.weight)  # h W, not W h
            h, h0 = self.step(slow, memory)
            hidden.append(h)
            preliminary.append(h0)
        return m.FastWeightsTrace(torch.stack(hidden, 1), torch.stack(preliminary, 1), memory)

    m.FastWeightsRNN.run = run


def layer_norm_without_its_gain_and_bias():
    """The inner loop normalises without LN's learned gain and bias (invisible while they sit
    at their start, 1 and 0)."""

    def step(self, slow, memory):
        preliminary = F.relu(slow)
        h = preliminary
        for _ in range(self.inner_steps):
            fast = memory.read(h) if self.fast_lr > 0 else 0.0
            h = F.relu(F.layer_norm(slow + fast, (self.hidden_size,)))
        if self.fast_lr > 0:
            memory.write(h)
        return h, preliminary

    m.FastWeightsRNN.step = step


def inner_loop_runs_once_whatever_S():
    """The inner loop makes one step whatever S says (invisible at S = 1)."""

    def step(self, slow, memory):
        preliminary = F.relu(slow)
        fast = memory.read(preliminary) if self.fast_lr > 0 else 0.0
        h = F.relu(self.norm(slow + fast))
        if self.fast_lr > 0:
            memory.write(h)
        return h, preliminary

    m.FastWeightsRNN.step = step


def read_ignores_the_query():
    """The memory's read drops its dot products: A(t) q becomes eta sum_tau lambda^(t - tau)
    h(tau), a leaky sum of the past states whatever the query (the chapter's leaky-memory null
    patched into the mechanism; a read that ignores q has no matrix counterpart)."""

    def attention_readout(hs, query, decay, fast_lr):
        ages = m.decay_weights(hs.shape[1], decay, fast_lr, hs.dtype)
        return (ages.unsqueeze(1) * hs).sum(1)  # every h(tau)^T q replaced by 1

    m.attention_readout = attention_readout


def attention_weights_through_a_softmax():
    """The read's weights go through a softmax over the stored states, as in the attention of
    sequence-to-sequence models, instead of the paper's raw decayed dot products (no matrix
    counterpart: a softmax of h(tau)^T q is not a linear map of q)."""

    def attention_weights(hs, query, decay, fast_lr):
        scores = (hs * query.unsqueeze(1)).sum(2)
        return torch.softmax(scores, 1) * m.decay_weights(hs.shape[1], decay, fast_lr, hs.dtype)

    m.attention_weights = attention_weights


MUTANTS = [
    memory_one_step_late,
    one_memory_for_the_whole_batch,
    decay_on_the_new_outer_product,
    inner_loop_queries_with_the_slow_state,
    recurrent_weights_transposed,
    layer_norm_without_its_gain_and_bias,
    inner_loop_runs_once_whatever_S,
    read_ignores_the_query,
    attention_weights_through_a_softmax,
]
