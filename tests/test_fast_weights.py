"""Unit tests of papernotes.fast_weights (the mechanism) and papernotes.fast_weights.experiment
(the retrieval task, the networks, their training and the read measurements), in float64 with
fixed seeds.

The reference below is written from the paper's equations, one sequence at a time with an
explicit matrix A per sequence, so that it shares no code with the module.
"""

import importlib.util
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conftest import gen, randn
from papernotes import fast_weights as fw
from papernotes import training
from papernotes.fast_weights import experiment
from papernotes.training import seeded


def make_rnn(seed=0, input_size=5, hidden_size=6, **settings):
    with seeded(seed):
        rnn = fw.FastWeightsRNN(input_size, hidden_size, **settings).double()
    with torch.no_grad():  # move W off 0.5 I and give LN a non-trivial gain and bias
        rnn.recurrent_weights.weight.add_(0.3 * randn(hidden_size, hidden_size, seed=seed + 1))
        if isinstance(rnn.norm, torch.nn.LayerNorm):
            rnn.norm.weight.copy_(1 + 0.2 * randn(hidden_size, seed=seed + 2))
            rnn.norm.bias.copy_(0.1 * randn(hidden_size, seed=seed + 3))
    return rnn


def reference_hidden(rnn, x, lag=False):
    """h(1..T) for each sequence from the paper's equations, with an explicit A per sequence:

        h_0(t+1) = f(W h(t) + C x(t)),
        h_{s+1}(t+1) = f(LN[W h(t) + C x(t) + A(t) h_s(t+1)]),  h(t+1) = h_S(t+1),
        A(t+1) = lambda A(t) + eta h(t+1) h(t+1)^T.

    lag=True stores h(t) one step late (the known bug; the tests check it would be caught).
    """
    W = rnn.recurrent_weights.weight
    C, b = rnn.input_weights.weight, rnn.input_weights.bias
    lam, eta, S = rnn.decay, rnn.fast_lr, rnn.inner_steps
    out = torch.zeros(x.shape[0], x.shape[1], rnn.hidden_size, dtype=x.dtype)
    for n in range(x.shape[0]):
        h = torch.zeros(rnn.hidden_size, dtype=x.dtype)
        A = torch.zeros(rnn.hidden_size, rnn.hidden_size, dtype=x.dtype)
        for t in range(x.shape[1]):
            slow = W @ h + C @ x[n, t] + b
            hs = torch.relu(slow)  # h_0(t+1): no layer normalisation
            for _ in range(S):
                hs = torch.relu(rnn.norm(slow + A @ hs))
            previous, h = h, hs
            stored = previous if lag else h
            A = lam * A + eta * torch.outer(stored, stored)
            out[n, t] = h
    return out


# -- 1. The fast-weight update -------------------------------------------------------------------


def test_fast_weight_update_is_decay_times_A_plus_outer_product_per_sequence():
    A, h = randn(4, 3, 3, seed=1), randn(4, 3, seed=2)
    new = fw.fast_weight_update(A, h, decay=0.9, fast_lr=0.3)
    for b in range(4):
        assert torch.allclose(new[b], 0.9 * A[b] + 0.3 * torch.outer(h[b], h[b]), atol=1e-14)


def test_fast_weight_update_keeps_sequences_apart():
    # A memory summed over the batch (h.T @ h) would put example 1's state into example 0's A.
    h = randn(2, 4, seed=3)
    new = fw.fast_weight_update(torch.zeros(2, 4, 4, dtype=torch.float64), h, 0.95, 0.5)
    assert torch.allclose(new[0], 0.5 * torch.outer(h[0], h[0]), atol=1e-14)
    assert not torch.allclose(new[0], 0.5 * h.T @ h)


@pytest.mark.parametrize("decay", [0.0, 0.5, 0.95, 1.0])
@pytest.mark.parametrize("fast_lr", [0.0, 0.5, 2.0])
def test_repeated_updates_applied_to_a_query_equal_the_attention_readout(decay, fast_lr):
    hs, query = randn(3, 7, 5, seed=4), randn(3, 5, seed=5)
    A = torch.zeros(3, 5, 5, dtype=torch.float64)
    for t in range(hs.shape[1]):
        A = fw.fast_weight_update(A, hs[:, t], decay, fast_lr)
    from_matrix = (A @ query.unsqueeze(2)).squeeze(2)
    readout = fw.attention_readout(hs, query, decay, fast_lr)
    assert readout.shape == (3, 5)
    assert torch.allclose(from_matrix, readout, rtol=0, atol=1e-10)


def test_attention_weights_are_decayed_dot_products_without_a_softmax():
    hs, query = randn(2, 4, 3, seed=6), randn(2, 3, seed=7)
    weights = fw.attention_weights(hs, query, decay=0.8, fast_lr=0.5)
    for b in range(2):
        for tau in range(4):
            expected = 0.5 * 0.8 ** (3 - tau) * hs[b, tau] @ query[b]
            assert weights[b, tau].item() == pytest.approx(expected.item(), abs=1e-14)
    assert (weights < 0).any()  # no softmax: weights can be negative and need not sum to one
    readout = fw.attention_readout(hs, query, 0.8, 0.5)
    assert torch.allclose(readout, (weights.unsqueeze(2) * hs).sum(1), atol=1e-14)


def test_zero_decay_remembers_only_the_newest_state():
    hs, query = randn(2, 5, 4, seed=8), randn(2, 4, seed=9)
    expected = 0.7 * hs[:, -1] * (hs[:, -1] * query).sum(1, keepdim=True)
    assert torch.allclose(fw.attention_readout(hs, query, 0.0, 0.7), expected, atol=1e-14)


# -- 3. The fast-weights RNN ----------------------------------------------------------------------


@pytest.mark.parametrize("memory", ["matrix", "attention"])
@pytest.mark.parametrize("inner_steps", [1, 2, 3])
def test_rnn_follows_the_papers_equations(memory, inner_steps):
    rnn = make_rnn(inner_steps=inner_steps, memory=memory, decay=0.9, fast_lr=0.6)
    x = randn(3, 6, 5, seed=10)
    outputs, final = rnn(x)
    assert outputs.shape == (3, 6, 6) and final.shape == (3, 6)
    assert torch.equal(final, outputs[:, -1])
    assert torch.allclose(outputs, reference_hidden(rnn, x), rtol=0, atol=1e-10)


def test_the_reference_would_catch_a_memory_that_lags_one_step():
    rnn = make_rnn(decay=0.9, fast_lr=0.6)
    x = randn(2, 6, 5, seed=11)
    outputs, _ = rnn(x)
    assert (outputs - reference_hidden(rnn, x, lag=True)).abs().max() > 1e-3


def test_the_matrix_used_for_h2_already_holds_h1():
    # Step 2 by hand: A(1) = eta h(1) h(1)^T, h_0(2) = f(slow), h(2) = f(LN[slow + A(1) h_0(2)]).
    rnn = make_rnn(decay=0.9, fast_lr=0.6)
    x = randn(1, 2, 5, seed=12)
    outputs, _ = rnn(x)
    h1 = outputs[0, 0]
    slow = rnn.recurrent_weights(h1) + rnn.input_weights(x[0, 1])
    h0 = torch.relu(slow)
    expected = torch.relu(rnn.norm(slow + 0.6 * h1 * (h1 @ h0)))
    assert torch.allclose(outputs[0, 1], expected, atol=1e-12)


def test_the_preliminary_vector_has_no_layer_norm_and_is_kept_by_the_trace():
    rnn = make_rnn()
    x = randn(2, 4, 5, seed=19)
    trace = rnn.trace(x)
    W, C, b = rnn.recurrent_weights.weight, rnn.input_weights.weight, rnn.input_weights.bias
    slow = trace.hidden[:, 1] @ W.T + x[:, 2] @ C.T + b
    assert torch.allclose(trace.preliminary[:, 2], torch.relu(slow), atol=1e-12)
    assert not torch.allclose(trace.preliminary[:, 2], torch.relu(rnn.norm(slow)), atol=1e-3)


def test_matrix_and_attention_memories_give_the_same_states_and_gradients():
    x = randn(3, 8, 5, seed=13)
    results = []
    for memory in ("matrix", "attention"):
        rnn = make_rnn(memory=memory, inner_steps=2)
        outputs, _ = rnn(x)
        outputs.square().sum().backward()
        results.append((outputs.detach(), rnn.recurrent_weights.weight.grad.clone()))
    assert torch.allclose(results[0][0], results[1][0], rtol=0, atol=1e-10)
    assert torch.allclose(results[0][1], results[1][1], rtol=0, atol=1e-9)


@pytest.mark.parametrize("memory", ["matrix", "attention"])
def test_changing_one_sequence_leaves_the_others_outputs_unchanged(memory):
    rnn = make_rnn(memory=memory)
    x = randn(4, 7, 5, seed=14)
    changed = x.clone()
    changed[2] = randn(7, 5, seed=15)
    before, _ = rnn(x)
    after, _ = rnn(changed)
    keep = [0, 1, 3]
    assert torch.allclose(before[keep], after[keep], rtol=0, atol=1e-12)
    assert (before[2] - after[2]).abs().max() > 1e-3
    # and each sequence alone gives what it gives inside the batch
    for b in range(4):
        alone, _ = rnn(x[b : b + 1])
        assert torch.allclose(alone[0], before[b], rtol=0, atol=1e-12)


def test_fast_lr_zero_is_the_same_rnn_without_fast_weights():
    rnn = make_rnn(fast_lr=0.0, decay=0.3, inner_steps=3)
    x = randn(2, 5, 5, seed=16)
    outputs, _ = rnn(x)
    W, C, b = rnn.recurrent_weights.weight, rnn.input_weights.weight, rnn.input_weights.bias
    h = torch.zeros(2, 6, dtype=torch.float64)
    for t in range(5):
        h = torch.relu(rnn.norm(h @ W.T + x[:, t] @ C.T + b))  # LN stays: only A is gone
        assert torch.allclose(outputs[:, t], h, atol=1e-12)
    assert torch.allclose(outputs, reference_hidden(rnn, x), rtol=0, atol=1e-12)
    with_memory, _ = make_rnn(fast_lr=0.5)(x)
    assert (with_memory - outputs).abs().max() > 1e-3  # the fast weights do change the states


def test_without_layer_norm_the_rnn_still_follows_the_equations():
    rnn = make_rnn(layer_norm=False, decay=0.8, fast_lr=0.1)
    assert isinstance(rnn.norm, torch.nn.Identity)
    x = 0.3 * randn(2, 5, 5, seed=17)
    outputs, _ = rnn(x)
    assert torch.allclose(outputs, reference_hidden(rnn, x), rtol=0, atol=1e-10)


def test_recurrent_weights_start_at_half_the_identity_with_the_papers_settings():
    rnn = fw.FastWeightsRNN(4, 6)
    assert torch.equal(rnn.recurrent_weights.weight, 0.5 * torch.eye(6))
    small = fw.FastWeightsRNN(4, 6, recurrent_init=0.05)
    assert torch.equal(small.recurrent_weights.weight, 0.05 * torch.eye(6))
    assert (rnn.decay, rnn.fast_lr, rnn.inner_steps, rnn.memory) == (0.95, 0.5, 1, "attention")


def test_settings_change_the_memory_for_a_while_and_restore_it():
    rnn = make_rnn()
    x = randn(2, 6, 5, seed=18)
    default, _ = rnn(x)
    with rnn.settings(decay=0.5, fast_lr=1.0, inner_steps=2, memory="matrix") as changed:
        assert (changed.decay, changed.fast_lr, changed.inner_steps) == (0.5, 1.0, 2)
        assert torch.allclose(changed(x)[0], reference_hidden(rnn, x), atol=1e-10)
    assert (rnn.decay, rnn.fast_lr, rnn.inner_steps, rnn.memory) == (0.95, 0.5, 1, "attention")
    assert torch.equal(rnn(x)[0], default)


def test_settings_reject_bad_changes_and_leave_everything_as_it_was():
    rnn = make_rnn()
    with pytest.raises(ValueError, match="decay"), rnn.settings(fast_lr=0.1, decay=2.0):
        pass
    with pytest.raises(ValueError, match="setting must be one of"), rnn.settings(lr=0.1):
        pass
    assert (rnn.decay, rnn.fast_lr) == (0.95, 0.5)


# -- 4. The task ----------------------------------------------------------------------------------


def test_retrieval_batch_has_the_papers_format():
    tokens, answers = experiment.retrieval_batch(500, n_pairs=4, generator=gen(20))
    assert tokens.shape == (500, 11) and answers.shape == (500,)
    assert tokens.dtype == torch.long
    for row, answer in zip(tokens, answers, strict=True):
        text = experiment.decode(row)
        assert re.fullmatch(r"([a-z][0-9]){4}\?\?[a-z]", text), text
        keys, values = text[0:8:2], text[1:8:2]
        assert len(set(keys)) == 4  # distinct keys
        assert text[-1] in keys
        assert int(values[keys.index(text[-1])]) == answer.item()
    # every value and every query position turns up
    assert set(answers.tolist()) == set(range(10))
    positions = {experiment.decode(row)[0:8:2].index(experiment.decode(row)[-1]) for row in tokens}
    assert positions == {0, 1, 2, 3}


def test_retrieval_batch_is_reproducible_and_sized_by_n_pairs():
    a = experiment.retrieval_batch(8, 2, gen(21))
    b = experiment.retrieval_batch(8, 2, gen(21))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert a[0].shape == (8, 7)
    assert len(experiment.VOCABULARY) == 37


def test_retrieval_sets_follow_the_seed_and_keep_validation_and_test_apart():
    first, again, other = (
        experiment.retrieval_sets(0, 50),
        experiment.retrieval_sets(0, 50),
        experiment.retrieval_sets(1, 50),
    )
    assert torch.equal(first.test[0], again.test[0])
    assert torch.equal(first.validation[0], again.validation[0])
    assert not torch.equal(first.test[0], first.validation[0])
    assert not torch.equal(first.test[0], other.test[0])


def test_retrieval_batch_rejects_bad_arguments():
    with pytest.raises(ValueError, match="n_pairs"):
        experiment.retrieval_batch(4, n_pairs=27)
    with pytest.raises(ValueError, match="batch_size"):
        experiment.retrieval_batch(0)


# -- 5. Models and training ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings",
    [{}, {"fast_lr": 0.0}, {"core": "no fast weights"}, {"core": "leaky memory"}, {"core": "LSTM"}],
)
def test_every_model_maps_tokens_to_ten_logits(settings):
    tokens, _ = experiment.retrieval_batch(5, 4, gen(22))
    with seeded(0):
        model = experiment.RetrievalNet(hidden_size=8, embedding_size=12, **settings)
    assert model(tokens).shape == (5, 10)


def test_every_core_has_the_same_hidden_size():
    for core in experiment.CORES:
        assert experiment.RetrievalNet(core=core).core.hidden_size == 32, core
    assert experiment.RetrievalNet(fast_lr=0.0).core.fast_lr == 0.0


def test_retrieval_net_rejects_bad_settings_and_tokens():
    with pytest.raises(ValueError, match="the 'LSTM' core does not take"):
        experiment.RetrievalNet(core="LSTM", decay=0.9)
    with pytest.raises(ValueError, match="core must be one of"):
        experiment.RetrievalNet(core="gru")
    model = experiment.RetrievalNet(hidden_size=4, embedding_size=5)
    with pytest.raises(TypeError, match="tokens must be a torch.int64 tensor"):
        model(torch.zeros(2, 11))
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 36\]"):
        experiment.retrieval_accuracy(model, (torch.full((2, 11), 37), torch.zeros(2).long()))


@pytest.mark.parametrize("core", list(experiment.CORES))
def test_the_token_table_gives_the_states_and_gradients_of_mapping_every_position(core):
    # C e + b computed once per token and looked up is C x(t) + b at every position: the same
    # hidden states and the same gradients as the core run on the embedded sequence.
    tokens, answers = experiment.retrieval_batch(6, 3, gen(70))
    with seeded(4):
        model = experiment.RetrievalNet(hidden_size=6, embedding_size=5, core=core).double()
    through_table = model.hidden_states(tokens)
    through_positions = model.core(model.embedding(tokens))[0]
    assert torch.allclose(through_table, through_positions, atol=1e-13)
    weights = randn(*through_table.shape, seed=71)
    grads = []
    for states in (through_table, through_positions):
        model.zero_grad()
        (states * weights).sum().backward(retain_graph=True)
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    for a, b in zip(*grads, strict=True):
        assert torch.allclose(a, b, atol=1e-12)


def test_retrieval_accuracy_counts_the_largest_logit_and_rejects_mismatched_answers():
    tokens, answers = experiment.retrieval_batch(64, 4, gen(26))
    with seeded(0):
        model = experiment.RetrievalNet(hidden_size=8, embedding_size=12)
    model.train()
    with torch.no_grad():
        expected = (model(tokens).argmax(1) == answers).float().mean().item()
    assert experiment.retrieval_accuracy(model, (tokens, answers)) == expected
    assert model.training  # the model's mode is restored
    with pytest.raises(ValueError, match="answers must have shape"):
        experiment.retrieval_accuracy(model, (tokens, answers[:5]))


def test_attention_at_query_recovers_the_memory_views_weights_from_the_modules_read():
    tokens, _ = experiment.retrieval_batch(3, 4, gen(23))
    with seeded(0):
        model = experiment.RetrievalNet(hidden_size=16, embedding_size=12).double()
    weights = experiment.attention_at_query(model, tokens)
    assert weights.shape == (3, 10)
    trace = model.core.trace(model.embedding(tokens))
    query = trace.preliminary[:, -1]
    expected = 0.5 * 0.95 ** torch.arange(9, -1, -1.0).double() * (trace.hidden[:, :-1] @ query[0])
    assert torch.allclose(weights[0], expected[0], atol=1e-12)
    formula = experiment.formula_weights_at_query(model, tokens)
    assert torch.allclose(weights, formula, atol=1e-12)
    # the weights are the read's: they combine the stored states into what the memory returns
    with torch.no_grad():
        before = model.core.trace(model.embedding(tokens)[:, :-1])
        read = before.memory.read(query)
    assert torch.allclose((weights.unsqueeze(2) * before.hidden).sum(1), read, atol=1e-12)


def test_the_nulls_read_by_the_equations_is_the_modules_read_and_no_patch_of_it_moves_it(
    monkeypatch,
):
    tokens, _ = experiment.retrieval_batch(3, 4, gen(24))
    with seeded(0):
        model = experiment.RetrievalNet(hidden_size=16, embedding_size=12).double()
    module_read = experiment.attention_at_query(model, tokens)
    by_hand = experiment.equation_weights_at_query(model, tokens)
    assert torch.allclose(by_hand, module_read, atol=1e-12)
    # a memory whose decay never fades changes the module's read, not the equations'
    monkeypatch.setattr(
        fw, "decay_weights", lambda t, decay, fast_lr, dtype: torch.full((t,), fast_lr, dtype=dtype)
    )
    assert not torch.allclose(experiment.attention_at_query(model, tokens), module_read)
    assert torch.equal(experiment.equation_weights_at_query(model, tokens), by_hand)


def test_attention_at_query_aligns_a_memory_that_holds_fewer_states_to_the_newest():
    class LateMemory(fw.StateMemory):
        def write(self, h):
            if getattr(self, "pending", None) is not None:
                self.states.append(self.pending)
            self.pending = h

    tokens, _ = experiment.retrieval_batch(2, 4, gen(46))
    with seeded(0):
        model = experiment.RetrievalNet(hidden_size=16, embedding_size=12).double()
    original = fw.StateMemory
    fw.StateMemory = LateMemory
    try:
        weights = experiment.attention_at_query(model, tokens)
    finally:
        fw.StateMemory = original
    assert torch.equal(weights[:, 0], torch.zeros(2, dtype=torch.float64))
    assert (weights[:, 1:].abs() > 0).all()


def test_attention_at_query_reads_with_the_memorys_own_decay():
    # A memory that forgets everything at once (decay 0) reads the newest state alone.
    tokens, _ = experiment.retrieval_batch(4, 4, gen(24))
    with seeded(0):
        model = experiment.RetrievalNet(hidden_size=16, embedding_size=12).double()
    with model.core.settings(decay=0.0):
        weights = experiment.attention_at_query(model, tokens)
    assert torch.allclose(weights[:, :-1], torch.zeros(4, 9, dtype=torch.float64), atol=1e-9)
    assert (weights[:, -1].abs() > 1e-6).all()


def test_the_trace_keeps_the_memory_its_steps_wrote():
    rnn = make_rnn(memory="matrix")
    x = randn(3, 4, 5, seed=40)
    trace = rnn.trace(x)
    A = torch.zeros(3, 6, 6, dtype=torch.float64)
    for t in range(4):
        A = 0.95 * A + 0.5 * trace.hidden[:, t].unsqueeze(2) * trace.hidden[:, t].unsqueeze(1)
    assert torch.allclose(trace.memory.A, A, atol=1e-12)


def test_the_ablation_is_the_fast_weights_network_with_fast_lr_zero_written_apart():
    x = randn(4, 6, 5, seed=41)
    with seeded(2):
        rnn = fw.FastWeightsRNN(5, 7, fast_lr=0.0).double()
    ablation = experiment.LayerNormRNN(5, 7).double()
    with torch.no_grad():
        rnn.recurrent_weights.weight.add_(0.2 * randn(7, 7, seed=42))
        rnn.norm.weight.copy_(1 + 0.1 * randn(7, seed=43))
        ablation.load_state_dict(rnn.state_dict(), strict=False)  # its memory stays off
        assert torch.allclose(ablation(x)[0], rnn(x)[0], atol=1e-12)
    assert torch.equal(experiment.LayerNormRNN(3, 4).recurrent_weights.weight, 0.5 * torch.eye(4))
    net = experiment.RetrievalNet(core="no fast weights", recurrent_init=0.05)
    assert isinstance(net.core, experiment.LayerNormRNN) and net.core.memory_rate == 0
    assert torch.equal(net.core.recurrent_weights.weight, 0.05 * torch.eye(32))
    with pytest.raises(ValueError, match="does not take"):
        experiment.RetrievalNet(core="no fast weights", decay=0.9)


def test_pair_weights_and_the_bootstrap_by_hand():
    tokens = torch.tensor([[0, 30, 1, 31, 2, 32, 3, 33, 36, 36, 2]])  # a3b4c5d6??c, c asked
    weights = torch.tensor([[1.0, 1.0, 2.0, 2.0, 8.0, 6.0, 3.0, 3.0, 0.0, 0.0]])
    queried, others = experiment.pair_weights(weights, tokens)
    assert queried.item() == 7.0 and others.item() == 2.0
    g = gen(44)
    first = (torch.rand(50, generator=g) + 1, torch.rand(50, generator=g) + 1)
    assert experiment.ratio_gap_standard_error(first, first, gen(45)) == 0.0
    second = (torch.rand(50, generator=g) + 1, torch.rand(50, generator=g) + 1)
    assert experiment.ratio_gap_standard_error(first, second, gen(45)) > 0.0


def test_attention_at_query_rejects_a_model_without_fast_weights():
    with pytest.raises(TypeError, match="fast-weights core"):
        experiment.attention_at_query(
            experiment.RetrievalNet(core="LSTM"), experiment.retrieval_batch(2)[0]
        )


def test_training_is_reproducible_and_lowers_the_loss():
    validation = experiment.retrieval_batch(200, 2, gen(24))
    train = experiment.retrieval_batch(2000, 2, gen(23))
    runs = [
        experiment.train_retrieval(train, validation, seed=3, steps=80, eval_every=40)
        for _ in range(2)
    ]
    history, again = runs[0].history, runs[1].history
    assert history.steps == [40, 80]
    assert history.metrics == again.metrics
    assert all(0.0 <= a <= 1.0 for a in history["val_accuracy"])
    assert not runs[0].model.training
    tokens, answers = experiment.retrieval_batch(256, 2, gen(25))
    with seeded(3):
        untrained = experiment.RetrievalNet()
    with torch.no_grad():
        loss_before = F.cross_entropy(untrained(tokens), answers)
        loss_after = F.cross_entropy(runs[0].model(tokens), answers)
    assert loss_after < loss_before


def test_another_seed_gives_another_run():
    validation = experiment.retrieval_batch(100, 2, gen(27))
    train = experiment.retrieval_batch(500, 2, gen(28))
    a, b = (
        experiment.train_retrieval(train, validation, seed=s, steps=5, batch_size=64)
        for s in (0, 1)
    )
    assert a.history["loss"] != b.history["loss"]


# -- bad input at the other entry points -----------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"decay": 1.5}, ValueError, "decay"),
        ({"fast_lr": True}, TypeError, "fast_lr"),
        ({"inner_steps": 0}, ValueError, "inner_steps"),
        ({"layer_norm": 1}, TypeError, "layer_norm"),
        ({"memory": "tape"}, ValueError, "memory"),
        ({"recurrent_init": -0.1}, ValueError, "recurrent_init"),
    ],
)
def test_the_rnn_rejects_bad_settings(kwargs, error, match):
    with pytest.raises(error, match=match):
        fw.FastWeightsRNN(3, 4, **kwargs)


def test_the_rnn_rejects_inputs_of_the_wrong_shape_or_type():
    rnn = fw.FastWeightsRNN(3, 4)
    with pytest.raises(ValueError, match=r"x must have shape \(B, T, D\) with D = 3"):
        rnn(torch.zeros(2, 5, 4))
    with pytest.raises(TypeError, match="floating-point"):
        rnn(torch.zeros(2, 5, 3, dtype=torch.long))


def test_train_retrieval_rejects_bad_arguments():
    validation = experiment.retrieval_batch(10)
    with pytest.raises(ValueError, match="lr"):
        experiment.train_retrieval(validation, validation, seed=0, steps=1, lr=0.0)
    with pytest.raises(ValueError, match="validation answers must have shape"):
        experiment.train_retrieval(validation, (validation[0], validation[1][:5]), seed=0, steps=1)
    with pytest.raises(ValueError, match="train answers must have shape"):
        experiment.train_retrieval((validation[0], validation[1][:5]), validation, seed=0, steps=1)
    with pytest.raises(TypeError, match="train must be a pair"):
        experiment.train_retrieval(validation[0], validation, seed=0, steps=1)


# -- the chapter's measurements --------------------------------------------------------------------


def test_written_out_read_is_the_sum_and_its_shared_form_pools_the_batch():
    hs, query = randn(3, 5, 4, seed=30), randn(3, 4, seed=31)
    read = experiment.written_out_read(hs, query, 0.8, 0.5)
    for b in range(3):
        expected = sum(
            0.5 * 0.8 ** (4 - tau) * hs[b, tau] * (hs[b, tau] @ query[b]) for tau in range(5)
        )
        assert torch.allclose(read[b], expected, atol=1e-12)
    assert torch.allclose(read, fw.attention_readout(hs, query, 0.8, 0.5), atol=1e-12)
    shared = experiment.written_out_read(hs, query, 0.8, 0.5, shared=True)
    pooled = sum(
        experiment.written_out_read(hs[c : c + 1].expand(3, -1, -1), query, 0.8, 0.5)
        for c in range(3)
    )
    assert torch.allclose(shared, pooled, atol=1e-12)


def test_by_the_equations_matches_the_reference_and_the_module():
    rnn = make_rnn(decay=0.9, fast_lr=0.6, inner_steps=2)
    x = randn(3, 6, 5, seed=32)
    with torch.no_grad():
        states = experiment.by_the_equations(rnn, x)
        assert torch.allclose(states, reference_hidden(rnn, x), rtol=0, atol=1e-10)
        assert torch.allclose(states, rnn(x)[0], rtol=0, atol=1e-10)
        late = experiment.by_the_equations(rnn, x, late=True)
        assert torch.allclose(late, reference_hidden(rnn, x, lag=True), rtol=0, atol=1e-10)
        assert (late - states).abs().max() > 1e-3


def test_queried_over_others_and_relative_to_other_pairs_by_hand():
    by_role = {
        "queried key": 4.0,
        "its value": 2.0,
        "other keys": 1.0,
        "other values": 3.0,
        "'?' marks": 6.0,
    }
    assert experiment.relative_to_other_pairs(by_role) == [2.0, 1.0, 0.5, 1.5, 3.0]
    tokens, _ = experiment.retrieval_batch(16, 4, gen(33))
    with seeded(0):
        model = experiment.RetrievalNet(hidden_size=16, embedding_size=12)
    roles = experiment.mean_weight_by_role(experiment.attention_at_query(model, tokens), tokens)
    ratio = experiment.queried_over_others(model, tokens)
    relative = experiment.relative_to_other_pairs(roles)
    assert ratio == pytest.approx((relative[0] + relative[1]) / 2)


def test_read_with_settings_reads_at_the_settings_and_restores_them():
    sequences = experiment.retrieval_batch(32, 4, gen(34))
    with seeded(0):
        model = experiment.RetrievalNet(hidden_size=16, embedding_size=12)
    accuracy, weights, by_role = experiment.read_with_settings(
        model, sequences, decay=0.5, fast_lr=0.25, inner_steps=2
    )
    assert (model.core.decay, model.core.fast_lr, model.core.inner_steps) == (0.95, 0.5, 1)
    with model.core.settings(decay=0.5, fast_lr=0.25, inner_steps=2):
        assert torch.equal(weights, experiment.attention_at_query(model, sequences[0]))
        assert accuracy == experiment.retrieval_accuracy(model, sequences)
    assert by_role == experiment.mean_weight_by_role(weights, sequences[0])
    assert (
        experiment.read_with_settings(
            model, sequences, decay=0.5, fast_lr=0.25, inner_steps=2, accuracy=False
        )[0]
        is None
    )


def test_train_retrieval_returns_a_training_run():
    validation = experiment.retrieval_batch(20, 2, gen(35))
    train = experiment.retrieval_batch(64, 2, gen(36))
    run = experiment.train_retrieval(
        train, validation, seed=0, steps=2, batch_size=16, eval_every=1
    )
    assert isinstance(run, training.Run) and run.history.steps == [1, 2]


def test_training_draws_its_minibatches_from_the_fixed_training_set():
    # Every update reads sequences of the training set, and nothing else: a training set whose
    # answers are all 3 teaches the network to answer 3.
    tokens, _ = experiment.retrieval_batch(256, 2, gen(37))
    train = (tokens, torch.full((256,), 3))
    validation = experiment.retrieval_batch(50, 2, gen(38))
    run = experiment.train_retrieval(train, validation, seed=0, steps=30, batch_size=32, lr=3e-2)
    with torch.no_grad():
        assert (run.model(validation[0]).argmax(1) == 3).all()


def test_retrieval_sets_have_a_fixed_training_set_of_the_papers_size():
    sets = experiment.retrieval_sets(0, 50)
    assert sets.train[0].shape == (100_000, 11) and sets.train[1].shape == (100_000,)
    small = experiment.retrieval_sets(0, 50, train_size=300)
    assert torch.equal(small.validation[0], sets.validation[0])
    assert not torch.equal(small.train[0][:50], sets.validation[0])


def test_the_readout_is_linear_or_a_hidden_layer_of_relus():
    model = experiment.RetrievalNet(hidden_size=8, embedding_size=4, readout_size=100)
    linear, relu, out = model.readout
    assert (linear.in_features, linear.out_features, out.out_features) == (8, 100, 10)
    assert isinstance(relu, torch.nn.ReLU)
    flat = experiment.RetrievalNet(hidden_size=8, embedding_size=4)
    assert isinstance(flat.readout, torch.nn.Linear) and flat.readout.in_features == 8


def test_retrieval_scores_are_the_accuracy_and_the_cross_entropy_of_one_pass():
    sequences = experiment.retrieval_batch(40, 2, gen(54))
    with seeded(0):
        model = experiment.RetrievalNet(hidden_size=8, embedding_size=6)
    scores = experiment.retrieval_scores(model, sequences)
    with torch.no_grad():
        logits = model(sequences[0])
    expected = torch.nn.functional.cross_entropy(logits, sequences[1]).item()
    assert scores["val_loss"] == pytest.approx(expected, rel=1e-6)
    assert scores["val_accuracy"] == experiment.retrieval_accuracy(model, sequences)
    with pytest.raises(ValueError, match="answers must have shape"):
        experiment.retrieval_scores(model, (sequences[0], sequences[1][:5]))


def test_tuning_ranks_a_diverged_run_last():
    assert experiment._finite(float("nan")) == float("inf")
    assert experiment._finite(1.5) == 1.5


@pytest.mark.parametrize("inner_steps", [1, 2])
def test_the_gradients_are_those_of_the_papers_equations(inner_steps):
    # Backpropagation through the module's memory gives the gradients of the equations written
    # out one sequence at a time with an explicit matrix A (the reference above).
    rnn = make_rnn(inner_steps=inner_steps)
    x = randn(3, 5, 5, seed=47)
    weights = randn(3, 5, 6, seed=48)
    (rnn(x)[0] * weights).sum().backward()
    ours = {name: p.grad.clone() for name, p in rnn.named_parameters()}
    rnn.zero_grad()
    (reference_hidden(rnn, x) * weights).sum().backward()
    for name, p in rnn.named_parameters():
        assert torch.allclose(ours[name], p.grad, atol=1e-10), name


def test_by_the_equations_sees_the_gain_the_orientation_of_W_and_S():
    # The chapter's equations check writes LN out from its gain and bias and reads W as W h:
    # with a non-trivial gain and bias and a W that is not symmetric (make_rnn), a network
    # that drops the gain, transposes W or runs one inner step at S = 2 is told apart.
    x = randn(4, 6, 5, seed=49)
    rnn = make_rnn(inner_steps=2)
    with torch.no_grad():
        exact = experiment.by_the_equations(rnn, x)
        assert torch.allclose(rnn(x)[0], exact, atol=1e-12)
        for change in ("gain", "transpose", "once"):
            broken = make_rnn(inner_steps=2)
            if change == "gain":
                broken.norm.weight.fill_(1.0)
                broken.norm.bias.zero_()
            elif change == "transpose":
                broken.recurrent_weights.weight.copy_(rnn.recurrent_weights.weight.T)
            else:
                broken.inner_steps = 1
            assert not torch.allclose(broken(x)[0], exact, atol=1e-6), change


def test_a_run_advanced_twice_is_the_run_of_the_sum():
    validation = experiment.retrieval_batch(30, 2, gen(50))
    train = experiment.retrieval_batch(300, 2, gen(51))
    settings = dict(seed=1, batch_size=16, eval_every=2, hidden_size=8, embedding_size=6)
    whole = experiment.RetrievalTraining(train, validation, **settings).advance(6)
    parts = experiment.RetrievalTraining(train, validation, **settings).advance(2).advance(4)
    assert parts.history.steps == whole.history.steps == [2, 4, 6]
    assert parts.history.metrics == whole.history.metrics
    for a, b in zip(whole.model.parameters(), parts.model.parameters(), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="multiple of eval_every"):
        parts.advance(3)


SMALL = dict(hidden_size=8, embedding_size=6)


def small_tuning(arms, lrs=(1e-4, 3e-3, 1e-2, 10.0)):
    validation = experiment.retrieval_batch(40, 2, gen(52))
    train = experiment.retrieval_batch(400, 2, gen(53))
    grids = experiment.tune_together(
        train, validation, seed=0, arms=arms, lrs=lrs, rung=4, steps=8, batch_size=16, eval_every=2
    )
    return grids, train, validation


def test_successive_halving_keeps_each_networks_best_rates_and_chooses_among_them():
    arms = {"no fast weights": {**SMALL, "core": "no fast weights"}}
    arms["leaky memory"] = {**SMALL, "core": "leaky memory"}
    grids, _, _ = small_tuning(arms)
    for grid in grids.values():
        at_rung = [sum(h["val_loss"][:2]) / 2 for h in grid.histories]
        kept = sorted(range(4), key=lambda i: experiment._finite(at_rung[i]))[:2]
        assert {i for i, h in enumerate(grid.histories) if h.steps[-1] == 8} == set(kept)
        assert all(h.steps == [2, 4] for i, h in enumerate(grid.histories) if i not in kept)
        assert set(grid.models) == set(kept)
        assert grid.chosen in [grid.lrs[i] for i in kept]
        assert grid.run.history.final("val_loss") == min(
            grid.histories[i].final("val_loss") for i in kept
        )
        assert 3 not in kept  # the rate of 10 diverges (or trails): it ranks last


@pytest.mark.parametrize(
    "arms",
    [
        {"fast weights": SMALL},
        {
            "no fast weights": {**SMALL, "core": "no fast weights"},
            "leaky memory": {**SMALL, "core": "leaky memory"},
        },
        {"LSTM": {**SMALL, "core": "LSTM"}},
    ],
    ids=["fast weights", "ablation and leaky memory", "LSTM"],
)
def test_each_member_trained_together_takes_the_steps_of_its_own_run(arms):
    # The stack (and the stack of the kept rates, with the optimizer's state carried over) gives
    # every member the run it would have alone: the same weights and validation losses, to float
    # rounding (the batched kernels sum in another order).
    grids, train, validation = small_tuning(arms, lrs=(1e-3, 1e-2, 3e-2))
    for name, grid in grids.items():
        for i, model in grid.models.items():
            alone = experiment.RetrievalTraining(
                train, validation, seed=0, batch_size=16, lr=grid.lrs[i], eval_every=2, **arms[name]
            ).advance(8)
            for a, b in zip(model.parameters(), alone.model.parameters(), strict=True):
                assert torch.allclose(a, b, atol=1e-5), name
            assert grid.histories[i]["val_loss"] == pytest.approx(
                alone.history["val_loss"], abs=1e-5
            )


def test_tune_together_rejects_bad_arguments():
    validation = experiment.retrieval_batch(20, 2, gen(55))
    train = experiment.retrieval_batch(100, 2, gen(56))
    common = dict(seed=0, lrs=(1e-2,), batch_size=8, eval_every=2)
    with pytest.raises(ValueError, match="rung"):
        experiment.tune_together(train, validation, arms={"a": SMALL}, rung=4, steps=4, **common)
    with pytest.raises(TypeError, match="arms must map"):
        experiment.tune_together(train, validation, arms={}, rung=2, steps=4, **common)
    with pytest.raises(ValueError, match="must differ only in tensors"):
        decays = {"a": SMALL, "b": {**SMALL, "decay": 0.5}}  # a stack would run both at 0.95
        experiment.tune_together(train, validation, arms=decays, rung=2, steps=4, **common)
    with pytest.raises(ValueError, match="must share a core class"):
        both = {"a": SMALL, "b": {**SMALL, "core": "LSTM"}}
        experiment.tune_together(train, validation, arms=both, rung=2, steps=4, **common)


def test_the_leaky_memory_adds_a_decayed_sum_of_the_past_states_inside_ln():
    # m(t) = lambda m(t-1) + eta h(t), h(t+1) = ReLU(LN[W h(t) + C x(t) + m(t)]), one sequence
    # at a time by hand; m(t) is the fast weights' read with every dot product set to 1.
    x = randn(3, 5, 4, seed=72)
    with seeded(5):
        core = experiment.LayerNormRNN(4, 6, memory_rate=0.5, memory_decay=0.9).double()
    with torch.no_grad():
        core.recurrent_weights.weight.add_(0.3 * randn(6, 6, seed=73))
        hidden, last = core(x)
    W, C, b = core.recurrent_weights.weight, core.input_weights.weight, core.input_weights.bias
    for n in range(3):
        h, states = torch.zeros(6, dtype=x.dtype), []
        for t in range(5):
            past = sum((0.5 * 0.9 ** (t - 1 - s) * states[s] for s in range(t)), torch.zeros(6))
            h = torch.relu(core.norm(W @ h + C @ x[n, t] + b + past))
            states.append(h)
            assert torch.allclose(hidden[n, t], h, atol=1e-12)
    assert torch.equal(last, hidden[:, -1])
    ablation = experiment.LayerNormRNN(4, 6).double()
    ablation.load_state_dict({**core.state_dict(), "memory_rate": torch.tensor(0.0)})
    with torch.no_grad():
        assert not torch.allclose(ablation(x)[0], hidden, atol=1e-3)  # the memory matters


def test_the_written_out_lstm_is_torchs_lstm_with_its_forget_bias_set():
    x = randn(3, 5, 4, seed=74)
    with seeded(6):
        ours = experiment.LSTM(4, 6, forget_bias=1.0).double()
    theirs = torch.nn.LSTM(4, 6, batch_first=True).double()
    with torch.no_grad():
        theirs.weight_ih_l0.copy_(ours.input_weights.weight)
        theirs.bias_ih_l0.copy_(ours.input_weights.bias)
        theirs.weight_hh_l0.copy_(ours.recurrent_weights.weight)
        theirs.bias_hh_l0.zero_()
        assert torch.allclose(ours(x)[0], theirs(x)[0], atol=1e-12)
    assert torch.equal(ours.input_weights.bias[6:12], torch.ones(6, dtype=torch.float64))
    bound = 1 / 6**0.5
    assert ours.recurrent_weights.weight.abs().max() <= bound  # torch's draw, +-1/sqrt(H)
    assert ours.input_weights.bias[:6].abs().max() <= bound


def test_capacity_sets_and_the_pairs_a_network_remembers():
    sets = experiment.capacity_sets(0, (2, 5), size=30)
    assert sets[2][0].shape == (30, 7) and sets[5][0].shape == (30, 13)
    again = experiment.capacity_sets(0, (2, 5), size=30)
    assert torch.equal(sets[5][0], again[5][0])
    assert experiment.pairs_remembered(0.1, 8) == pytest.approx(0.0)  # chance: no pair
    assert experiment.pairs_remembered(1.0, 8) == pytest.approx(8.0)  # every pair
    assert experiment.pairs_remembered(0.1 + 0.9 * 3 / 8, 8) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="accuracy"):
        experiment.pairs_remembered(1.5, 8)


def test_the_slow_networks_read_is_the_papers_read_on_their_own_states():
    tokens, _ = experiment.retrieval_batch(4, 3, gen(75))
    with seeded(7):
        model = experiment.RetrievalNet(hidden_size=6, embedding_size=5, core="leaky memory")
    weights = experiment.slow_weights_at_query(model, tokens, decay=0.9, fast_lr=0.5)
    core = model.core
    with torch.no_grad():
        x = model.embedding(tokens)
        states, _ = core(x[:, :-1])
        W, C, b = core.recurrent_weights.weight, core.input_weights.weight, core.input_weights.bias
        for n in range(4):
            query = torch.relu(W @ states[n, -1] + C @ x[n, -1] + b)  # h_0(T)
            for tau in range(states.shape[1]):
                expected = 0.5 * 0.9 ** (states.shape[1] - 1 - tau) * states[n, tau] @ query
                assert weights[n, tau] == pytest.approx(expected.item(), rel=1e-5, abs=1e-7)
    with pytest.raises(TypeError, match="LayerNormRNN core"):
        experiment.slow_weights_at_query(experiment.RetrievalNet(**SMALL), tokens)


# -- The module against the paper's equations, through a retrieval network ------------------------


def _mutants():
    """tests/mutants/fast_weights.py, loaded by path: the broken memories the chapter catches."""
    path = Path(__file__).parent / "mutants" / "fast_weights.py"
    spec = importlib.util.spec_from_file_location("fast_weights_mutants", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# what a mutant of tests/mutants/fast_weights.py may replace: saved and restored around each test
PATCHED = [
    (fw, "fast_weight_update"),
    (fw, "attention_readout"),
    (fw, "decay_weights"),
    (fw.FastWeightsRNN, "step"),
    (fw.FastWeightsRNN, "trace"),
    (fw.FastWeightsRNN, "run"),
    (fw, "attention_weights"),
]


def retrieval_net_off_its_start(seed=0, hidden_size=12):
    """A float64 RetrievalNet at S = 2 with W moved off 0.5 I (no longer symmetric) and LN given a
    gain and bias other than 1 and 0, so that nothing of the inner loop is hidden by its start."""
    with seeded(seed):
        model = experiment.RetrievalNet(
            hidden_size=hidden_size, embedding_size=7, inner_steps=2
        ).double()
    core = model.core
    with torch.no_grad():
        core.recurrent_weights.weight.add_(0.3 * randn(hidden_size, hidden_size, seed=seed + 1))
        core.norm.weight.copy_(1 + 0.2 * randn(hidden_size, seed=seed + 2))
        core.norm.bias.copy_(0.1 * randn(hidden_size, seed=seed + 3))
    return model


def gaps_from_the_equations(model, tokens, answers):
    """How far the module's network is from the paper's equations written out
    (`experiment.by_the_equations`, which shares no code with the module), as two numbers: the
    largest difference between the module's read at the query (`attention_at_query`) and the
    read computed from the equations (`equation_weights_at_query`), and the largest difference
    between the gradients of the cross-entropy with respect to every parameter (embedding, C, W,
    LN's gain and bias, read-out) through the module and through the equations."""
    module_read = experiment.attention_at_query(model, tokens)
    read_gap = (module_read - experiment.equation_weights_at_query(model, tokens)).abs().max()

    def gradients(logits):  # a parameter that the loss does not reach has a zero gradient
        model.zero_grad()
        F.cross_entropy(logits, answers).backward()
        return [
            torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in model.parameters()
        ]

    through_module = gradients(model(tokens))
    states = experiment.by_the_equations(model.core, model.embedding(tokens))
    through_equations = gradients(model.readout(states[:, -1]))
    grad_gap = max(
        (a - b).abs().max() for a, b in zip(through_module, through_equations, strict=True)
    )
    return read_gap.item(), grad_gap.item()


def test_the_modules_read_and_gradients_through_the_inner_loop_are_the_papers_equations():
    tokens, answers = experiment.retrieval_batch(5, 4, gen(60))
    model = retrieval_net_off_its_start()
    read_gap, grad_gap = gaps_from_the_equations(model, tokens, answers)
    assert read_gap < 1e-12
    assert grad_gap < 1e-10
    assert all(p.grad.abs().sum() > 0 for p in model.core.parameters())  # every slow weight is seen


@pytest.mark.parametrize("mutant", [m.__name__ for m in _mutants().MUTANTS])
def test_a_broken_inner_loop_or_memory_is_told_apart_from_the_papers_equations(mutant, monkeypatch):
    tokens, answers = experiment.retrieval_batch(5, 4, gen(60))
    model = retrieval_net_off_its_start()
    for owner, name in PATCHED:  # undone after the test, whatever the mutant replaced
        monkeypatch.setattr(owner, name, getattr(owner, name))
    getattr(_mutants(), mutant)()
    read_gap, grad_gap = gaps_from_the_equations(model, tokens, answers)
    assert read_gap > 1e-6, mutant
    assert grad_gap > 1e-6, mutant


# -- the mutation survivors (tests/mutation/fast_weights.yml) -------------------------------------


def test_without_layer_norm_or_fast_weights_the_core_is_the_plain_relu_rnn():
    # fast_lr = 0 adds nothing to W h + C x + b (LN would hide a constant; without LN it shows)
    rnn = make_rnn(fast_lr=0.0, layer_norm=False)
    x = randn(2, 4, 5, seed=80)
    W, C, b = rnn.recurrent_weights.weight, rnn.input_weights.weight, rnn.input_weights.bias
    h, states = torch.zeros(2, 6, dtype=torch.float64), []
    for t in range(4):
        h = torch.relu(h @ W.T + x[:, t] @ C.T + b)
        states.append(h)
    with torch.no_grad():
        assert torch.allclose(rnn(x)[0], torch.stack(states, 1), atol=1e-12)


def test_the_lstms_forget_gate_starts_at_one_by_default_and_forward_returns_the_last_state():
    with seeded(7):
        lstm = experiment.LSTM(4, 6).double()  # the chapter's LSTM core takes the default
    bias = lstm.input_weights.bias.detach()
    assert torch.equal(bias[6:12], torch.ones(6, dtype=torch.float64))  # i, f, g, o: f is 1
    assert (bias[12:] != 1).all() and bias[12:].abs().max() <= 1 / 6**0.5
    x = randn(3, 4, 4, seed=81)
    with torch.no_grad():
        hidden, last = lstm(x)
    assert torch.equal(last, hidden[:, 3])


def test_the_chapters_retrieval_net_embeds_each_token_in_100_dimensions():
    assert experiment.RetrievalNet().embedding.embedding_dim == 100


def tiny_sets():
    return experiment.retrieval_batch(300, 2, gen(82)), experiment.retrieval_batch(30, 2, gen(83))


def moved(model, seed, settings):
    with seeded(seed):
        start = experiment.RetrievalNet(**settings)
    return max(
        (a - b).abs().max().item()
        for a, b in zip(model.parameters(), start.parameters(), strict=True)
    )


def test_a_training_clips_the_gradient_before_adam():
    # Clipped at 1e-12, every gradient coordinate is far below Adam's eps (1e-8): the first
    # update moves no weight by more than lr * 1e-4, where the unclipped one moves some by lr.
    train, validation = tiny_sets()
    common = dict(seed=2, batch_size=16, eval_every=1, lr=1e-2, **SMALL)
    clipped = experiment.RetrievalTraining(train, validation, clip=1e-12, **common).advance(1)
    assert moved(clipped.model, 2, SMALL) < 1e-6
    free = experiment.RetrievalTraining(train, validation, clip=1e6, **common).advance(1)
    assert moved(free.model, 2, SMALL) > 5e-3


def tune_tiny(**options):
    """tune_together on the tiny sets: one arm, two rungs of two steps, one kept."""
    train, validation = tiny_sets()
    common = dict(seed=2, arms={"a": SMALL}, rung=2, steps=4, keep=1, batch_size=16, eval_every=1)
    return experiment.tune_together(train, validation, **common, **options)


def test_tune_together_clips_every_members_gradient_in_both_rungs():
    grids = tune_tiny(lrs=(1e-2, 3e-2), clip=1e-12)
    (model,) = grids["a"].models.values()
    assert moved(model, 2, SMALL) < 1e-5


def test_successive_halving_keeps_the_lowest_validation_loss_not_the_first_rate():
    # here the rate of 3e-2 overshoots at first: the rate of 1e-9, second in the grid, has the
    # lower mean validation loss at the rung, and it is the one that goes on
    grids = tune_tiny(lrs=(3e-2, 1e-9))
    histories = grids["a"].histories
    at_rung = [sum(h["val_loss"][:2]) / 2 for h in histories]
    assert at_rung[1] < at_rung[0]
    assert [h.steps[-1] for h in histories] == [2, 4]


def test_a_run_advanced_three_times_counts_every_update_and_keeps_a_divergence():
    train, validation = tiny_sets()
    run = experiment.RetrievalTraining(train, validation, seed=2, batch_size=16, eval_every=1)
    run.advance(1).advance(1).advance(1)
    assert run.history.steps == [1, 2, 3] and not run.history.diverged
    with torch.no_grad():
        run.model.readout.weight.fill_(float("nan"))  # the loss stops being finite
    run.advance(1)
    assert run.history.diverged is True
    run.advance(1)
    assert run.history.diverged is True


def small_group(nan_first=False):
    train, validation = tiny_sets()
    members = []
    for _ in range(2):
        with seeded(2):
            members.append(experiment.RetrievalNet(**SMALL))
    if nan_first:
        with torch.no_grad():
            members[0].readout.weight.fill_(float("nan"))
    batches = experiment.minibatches(300, 16, gen(84))
    return experiment._Group(members, [0, 1], [1e-2, 3e-2], batches), train, validation


def test_a_group_logs_each_members_validation_scores_counts_its_updates_and_divergence():
    group, train, validation = small_group(nan_first=True)
    histories = [training.History(), training.History()]
    for _ in range(3):
        group.advance(1, train, validation, histories, 1, 5.0)
    assert histories[1].steps == [1, 2, 3]
    assert histories[0].diverged is True and histories[1].diverged is False
    # the logged validation accuracy is the member's accuracy on the validation set
    model = group.stack.member(1)
    assert histories[1]["val_accuracy"][-1] == pytest.approx(
        experiment.retrieval_accuracy(model, validation), abs=1e-6
    )


def test_a_group_clips_each_members_gradient():
    group, train, validation = small_group()
    histories = [training.History(), training.History()]
    group.advance(1, train, validation, histories, 1, 1e-12)
    for k in range(2):
        assert moved(group.stack.member(k), 2, SMALL) < 1e-6


def test_the_sets_follow_their_streams_of_the_seed():
    sets = experiment.retrieval_sets(3, size=5, n_pairs=2, train_size=7, validation_size=4)
    for part, size, stream in (
        (sets.train, 7, experiment.TRAIN),
        (sets.validation, 4, experiment.VALIDATION),
        (sets.test, 5, experiment.TEST),
    ):
        expected = experiment.retrieval_batch(size, 2, training.generator(3, stream))
        assert torch.equal(part[0], expected[0]) and torch.equal(part[1], expected[1])
    # 2,000 test sequences of each number of pairs by default, in order from stream CAPACITY
    capacity = experiment.capacity_sets(3, (2, 5))
    g = training.generator(3, experiment.CAPACITY)
    for n in (2, 5):
        expected = experiment.retrieval_batch(2000, n, g)
        assert torch.equal(capacity[n][0], expected[0]) and torch.equal(capacity[n][1], expected[1])


def test_mean_weight_by_role_by_hand_with_a_weight_of_its_own_for_each_role():
    tokens = torch.tensor([[0, 30, 1, 31, 2, 32, 3, 33, 36, 36, 2]])  # a3b4c5d6??c, c asked
    weights = torch.tensor([[1.0, 10.0, 2.0, 20.0, 8.0, 6.0, 3.0, 30.0, 0.5, 0.5]])
    assert experiment.mean_weight_by_role(weights, tokens) == {
        "queried key": 8.0,
        "its value": 6.0,
        "other keys": 2.0,
        "other values": 20.0,
        "'?' marks": 0.5,
    }


def test_the_ratio_bootstrap_by_hand_500_rounds_of_the_sequences_from_its_generator():
    g = gen(85)
    first = (torch.rand(20, generator=g) + 1, torch.rand(20, generator=g) + 1)
    second = (torch.rand(20, generator=g) + 1, torch.rand(20, generator=g) + 1)
    index = torch.randint(20, (500, 20), generator=gen(86))

    def ratio(pair):
        return pair[0][index].mean(1) / pair[1][index].mean(1)

    by_hand = (ratio(first) - ratio(second)).std().item()
    found = experiment.ratio_gap_standard_error(first, second, gen(86))
    assert found == pytest.approx(by_hand, rel=1e-6)
    with pytest.raises(ValueError, match=r"^first others must have shape"):
        experiment.ratio_gap_standard_error((first[0], first[1][:5]), second, gen(86))
    with pytest.raises(ValueError, match=r"^second queried must have shape"):
        experiment.ratio_gap_standard_error(first, (second[0][:5], second[1]), gen(86))


def test_a_bad_sequences_argument_is_named_in_the_error():
    model = experiment.RetrievalNet(**SMALL)
    train, validation = tiny_sets()
    with pytest.raises(TypeError, match=r"^sequences must be a pair"):
        experiment.retrieval_accuracy(model, train[0])
    with pytest.raises(TypeError, match=r"^sequences must be a pair"):
        experiment.retrieval_scores(model, train[0])
    with pytest.raises(TypeError, match=r"^sequences must be a pair"):
        experiment.read_with_settings(model, train[0], decay=0.9, fast_lr=0.5, inner_steps=1)
    common = dict(seed=0, arms={"a": SMALL}, lrs=(1e-2,), rung=1, steps=2)
    with pytest.raises(TypeError, match=r"^train must be a pair"):
        experiment.tune_together(train[0], validation, **common)
    with pytest.raises(TypeError, match=r"^validation must be a pair"):
        experiment.tune_together(train, validation[0], **common)


def test_the_slow_networks_are_read_with_the_fast_weights_decay_and_rate_by_default():
    with seeded(3):
        model = experiment.RetrievalNet(core="no fast weights", **SMALL)
    tokens = experiment.retrieval_batch(5, 2, gen(87))[0]
    core = fw.FastWeightsRNN(3, 4)  # the fast-weights network's defaults, as the chapter trains it
    by_default = experiment.slow_weights_at_query(model, tokens)
    assert torch.equal(
        by_default,
        experiment.slow_weights_at_query(model, tokens, decay=core.decay, fast_lr=core.fast_lr),
    )
    assert not torch.allclose(
        by_default, experiment.slow_weights_at_query(model, tokens, decay=0.5, fast_lr=0.5)
    )


def test_the_written_out_read_is_exact_in_float64():
    hs = randn(2, 30, 4, seed=88)
    query = randn(2, 4, seed=89)
    expected = fw.attention_readout(hs, query, 0.95, 0.5)
    assert torch.allclose(experiment.written_out_read(hs, query, 0.95, 0.5), expected, rtol=1e-13)
