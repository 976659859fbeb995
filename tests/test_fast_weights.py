"""Unit tests of papernotes.fast_weights (the mechanism) and papernotes.fast_weights.experiment
(the retrieval task, the networks, their training and the read measurements), in float64 with
fixed seeds.

The reference below is written from the paper's equations, one sequence at a time with an
explicit matrix A per sequence, so that it shares no code with the module.
"""

import re

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


@pytest.mark.parametrize("settings", [{}, {"fast_lr": 0.0}, {"lstm": True}])
def test_every_model_maps_tokens_to_ten_logits(settings):
    tokens, _ = experiment.retrieval_batch(5, 4, gen(22))
    with seeded(0):
        model = experiment.RetrievalNet(hidden_size=8, embedding_size=12, **settings)
    assert model(tokens).shape == (5, 10)


def test_the_ablation_and_the_lstm_have_the_same_hidden_size():
    ablation = experiment.RetrievalNet(fast_lr=0.0)
    lstm = experiment.RetrievalNet(lstm=True)
    assert ablation.core.fast_lr == 0.0 and ablation.core.hidden_size == 32
    assert lstm.core.hidden_size == 32


def test_retrieval_net_rejects_bad_settings_and_tokens():
    with pytest.raises(ValueError, match="LSTM takes no fast-weight settings"):
        experiment.RetrievalNet(lstm=True, decay=0.9)
    with pytest.raises(TypeError, match="lstm must be True or False"):
        experiment.RetrievalNet(lstm="yes")
    model = experiment.RetrievalNet(hidden_size=4, embedding_size=5)
    with pytest.raises(TypeError, match="tokens must be a torch.int64 tensor"):
        model(torch.zeros(2, 11))
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 36\]"):
        model(torch.full((2, 11), 37))


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


def test_attention_at_query_reads_the_states_before_the_last_step():
    tokens, _ = experiment.retrieval_batch(3, 4, gen(23))
    with seeded(0):
        model = experiment.RetrievalNet(hidden_size=8, embedding_size=12).double()
    weights = experiment.attention_at_query(model, tokens)
    assert weights.shape == (3, 10)
    trace = model.core.trace(model.embedding(tokens))
    query = trace.preliminary[:, -1]
    expected = 0.5 * 0.95 ** torch.arange(9, -1, -1.0).double() * (trace.hidden[:, :-1] @ query[0])
    assert torch.allclose(weights[0], expected[0], atol=1e-12)


def test_attention_at_query_rejects_a_model_without_fast_weights():
    with pytest.raises(TypeError, match="fast-weights core"):
        experiment.attention_at_query(
            experiment.RetrievalNet(lstm=True), experiment.retrieval_batch(2)[0]
        )


def test_training_is_reproducible_and_lowers_the_loss():
    validation = experiment.retrieval_batch(200, 2, gen(24))
    runs = [
        experiment.train_retrieval(validation, seed=3, steps=40, n_pairs=2, eval_every=20)
        for _ in range(2)
    ]
    history, again = runs[0].history, runs[1].history
    assert history.steps == [20, 40]
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
    a, b = (experiment.train_retrieval(validation, seed=s, steps=5, n_pairs=2) for s in (0, 1))
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
        experiment.train_retrieval(validation, seed=0, steps=1, lr=0.0)
    with pytest.raises(ValueError, match="validation answers must have shape"):
        experiment.train_retrieval((validation[0], validation[1][:5]), seed=0, steps=1)


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
        model = experiment.RetrievalNet(hidden_size=8, embedding_size=12)
    roles = experiment.mean_weight_by_role(experiment.attention_at_query(model, tokens), tokens)
    ratio = experiment.queried_over_others(model, tokens)
    relative = experiment.relative_to_other_pairs(roles)
    assert ratio == pytest.approx((relative[0] + relative[1]) / 2)


def test_read_with_settings_reads_at_the_settings_and_restores_them():
    sequences = experiment.retrieval_batch(32, 4, gen(34))
    with seeded(0):
        model = experiment.RetrievalNet(hidden_size=8, embedding_size=12)
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
    run = experiment.train_retrieval(validation, seed=0, steps=2, n_pairs=2, eval_every=1)
    assert isinstance(run, training.Run) and run.history.steps == [1, 2]
