"""Unit tests of papernotes.ggnn (the mechanism) and papernotes.ggnn.experiment (the chapter's
task, runs and measurements), in float64 with fixed seeds.

The reference below is written from the paper's equations 1-6, one node at a time with the
dense block matrix A = [A_in, A_out] of the paper's Figure 1, so that it shares no code with the
module's edge-list computation.
"""

import pytest
import torch

from conftest import gen, randn
from papernotes import ggnn, training
from papernotes.ggnn import experiment
from papernotes.training import seeded


def make_ggnn(seed=0, annotation_size=2, hidden_size=5, num_edge_types=2, steps=3):
    with seeded(seed):
        model = ggnn.GGNN(annotation_size, hidden_size, num_edge_types, steps).double()
    with torch.no_grad():  # a non-zero bias, so that the test sees it
        model.bias.copy_(0.1 * randn(2 * hidden_size, seed=seed + 1))
    return model


def small_graph(seed=0, n=6, e=9, annotation_size=2, num_edge_types=2):
    g = gen(seed)
    annotation = randn(n, annotation_size, seed=seed)
    edge_index = torch.randint(n, (2, e), generator=g)
    edge_type = torch.randint(num_edge_types, (e,), generator=g)
    return annotation, edge_index, edge_type


def reference_states(model, annotation, edge_index, edge_type):
    """h(T) from the paper's equations, node by node, with the dense matrix A of Figure 1:
    block (v, u) of A_in is W_in[k] for each edge u -k-> v, block (v, u) of A_out is W_out[k]
    for each edge v -k-> u."""
    n, D = annotation.shape[0], model.hidden_size
    A_in = torch.zeros(n, n, D, D, dtype=torch.float64)
    A_out = torch.zeros(n, n, D, D, dtype=torch.float64)
    for (u, v), k in zip(edge_index.T.tolist(), edge_type.tolist(), strict=True):
        A_in[v, u] += model.incoming[k]
        A_out[u, v] += model.outgoing[k]
    h = torch.zeros(n, D, dtype=torch.float64)
    h[:, : annotation.shape[1]] = annotation  # eq. 1
    gru = model.update
    for _ in range(model.steps):
        new = torch.empty_like(h)
        for v in range(n):
            a_in = sum(A_in[v, u] @ h[u] for u in range(n))
            a_out = sum(A_out[v, u] @ h[u] for u in range(n))
            a = torch.cat([a_in, a_out]) + model.bias  # eq. 2
            z = torch.sigmoid(gru.W_z.weight @ a + gru.W_z.bias + gru.U_z.weight @ h[v])
            r = torch.sigmoid(gru.W_r.weight @ a + gru.W_r.bias + gru.U_r.weight @ h[v])
            candidate = torch.tanh(gru.W.weight @ a + gru.W.bias + gru.U.weight @ (r * h[v]))
            new[v] = (1 - z) * h[v] + z * candidate  # eqs. 3-6
        h = new
    return h


# -- 1-3. The propagation model --------------------------------------------------------------------


def test_initial_state_is_the_annotation_padded_with_zeros():
    x = randn(3, 2, seed=1)
    h = ggnn.initial_state(x, 5)
    assert torch.equal(h[:, :2], x) and torch.equal(h[:, 2:], torch.zeros(3, 3, dtype=x.dtype))


def test_messages_on_a_hand_made_graph_follow_type_and_direction():
    # Edges 0 -type 0-> 1 and 2 -type 1-> 1: node 1 hears 0 and 2 through W_in; 0 and 2 hear 1
    # through W_out of the edge's type; nothing else is non-zero.
    h = randn(3, 4, seed=2)
    incoming, outgoing = randn(2, 4, 4, seed=3), randn(2, 4, 4, seed=4)
    edge_index, edge_type = torch.tensor([[0, 2], [1, 1]]), torch.tensor([0, 1])
    a = ggnn.messages(h, edge_index, edge_type, incoming, outgoing)
    a_in, a_out = a[:, :4], a[:, 4:]
    assert torch.allclose(a_in[1], incoming[0] @ h[0] + incoming[1] @ h[2], atol=1e-12)
    assert torch.allclose(a_in[[0, 2]], torch.zeros(2, 4, dtype=torch.float64))
    assert torch.allclose(a_out[0], outgoing[0] @ h[1], atol=1e-12)
    assert torch.allclose(a_out[2], outgoing[1] @ h[1], atol=1e-12)
    assert torch.allclose(a_out[1], torch.zeros(4, dtype=torch.float64))


def test_forward_matches_the_papers_equations_with_the_dense_matrix_A():
    model = make_ggnn()
    graph = small_graph()
    with torch.no_grad():
        assert torch.allclose(model(*graph), reference_states(model, *graph), atol=1e-10)


@pytest.mark.parametrize("steps", [1, 2, 4])
def test_forward_makes_exactly_steps_propagation_rounds(steps):
    model = make_ggnn(steps=steps)
    annotation, edge_index, edge_type = small_graph(seed=5)
    with torch.no_grad():
        h = ggnn.initial_state(annotation, model.hidden_size)
        for _ in range(steps):
            h = model.propagate(h, edge_index, edge_type)
        assert torch.allclose(model(annotation, edge_index, edge_type), h, atol=1e-12)
        fewer = make_ggnn(steps=steps + 1)
        assert not torch.allclose(fewer(annotation, edge_index, edge_type), h, atol=1e-6)


def test_the_gru_update_uses_the_papers_gates():
    # z = 1 takes the candidate, z = 0 keeps h: the paper's convention (torch's GRUCell has the
    # opposite one), checked by saturating the update gate through its bias.
    model = make_ggnn()
    h, a = randn(4, 5, seed=6), randn(4, 10, seed=7)
    gru = model.update
    with torch.no_grad():
        gru.W_z.bias.fill_(50.0)
        r = torch.sigmoid(gru.W_r(a) + gru.U_r(h))
        assert torch.allclose(gru(h, a), torch.tanh(gru.W(a) + gru.U(r * h)), atol=1e-12)
        gru.W_z.bias.fill_(-50.0)
        assert torch.allclose(gru(h, a), h, atol=1e-12)


def test_permuting_the_nodes_permutes_the_states():
    model = make_ggnn().float()
    annotation, edge_index, edge_type = (
        t.float() if t.is_floating_point() else t for t in small_graph(seed=8, n=7, e=12)
    )
    perm = torch.randperm(7, generator=gen(9))
    inverse = torch.argsort(perm)  # node v of the original graph is node inverse[v] of the new
    with torch.no_grad():
        h = model(annotation, edge_index, edge_type)
        h_perm = model(annotation[perm], inverse[edge_index], edge_type)
    assert torch.allclose(h_perm, h[perm], atol=1e-6)


def test_graphs_batched_together_do_not_influence_one_another():
    model = make_ggnn()
    first, second = small_graph(seed=10, n=5, e=7), small_graph(seed=11, n=4, e=6)
    other = small_graph(seed=12, n=4, e=6)

    def batched(a, b):
        return (
            torch.cat([a[0], b[0]]),
            torch.cat([a[1], b[1] + a[0].shape[0]], dim=1),
            torch.cat([a[2], b[2]]),
        )

    with torch.no_grad():
        alone = model(*first)
        together = model(*batched(first, second))
        with_other = model(*batched(first, other))
    assert torch.allclose(together[:5], alone, atol=1e-12)
    assert torch.allclose(with_other[:5], alone, atol=1e-12)
    assert not torch.allclose(together[5:], with_other[5:], atol=1e-6)


def test_incoming_and_outgoing_parameters_are_distinct():
    model = make_ggnn()
    assert model.incoming is not model.outgoing
    assert not torch.allclose(model.incoming, model.outgoing)
    names = {name for name, _ in model.named_parameters()}
    assert {"incoming", "outgoing"} <= names
    # On a chain 0 -> 1 -> 2, zeroing W_out silences what 0 hears from 1 only; 2 hears nothing
    # against the edges anyway, so its state does not move.
    annotation = randn(3, 2, seed=13)
    edge_index, edge_type = torch.tensor([[0, 1], [1, 2]]), torch.tensor([0, 0])
    model.steps = 1
    with torch.no_grad():
        before = model(annotation, edge_index, edge_type)
        model.outgoing.zero_()
        after = model(annotation, edge_index, edge_type)
    assert torch.allclose(before[2], after[2], atol=1e-12)
    assert not torch.allclose(before[0], after[0], atol=1e-6)


def test_reversing_every_edge_changes_the_states_of_a_directed_chain():
    model = make_ggnn(steps=2)
    annotation = torch.zeros(3, 2, dtype=torch.float64)
    annotation[0, 0] = 1.0
    edge_index, edge_type = torch.tensor([[0, 1], [1, 2]]), torch.tensor([0, 0])
    with torch.no_grad():
        forward = model(annotation, edge_index, edge_type)
        reverse = model(annotation, edge_index.flip(0), edge_type)
    assert not torch.allclose(forward, reverse, atol=1e-6)


# -- 4. Outputs ------------------------------------------------------------------------------------


def test_per_graph_log_softmax_normalises_each_graph_separately():
    scores = randn(7, seed=14)
    batch = torch.tensor([0, 0, 0, 1, 1, 2, 2])
    out = ggnn.per_graph_log_softmax(scores, batch, 3)
    for g, (lo, hi) in enumerate([(0, 3), (3, 5), (5, 7)]):
        assert torch.allclose(out[lo:hi], torch.log_softmax(scores[lo:hi], 0), atol=1e-12), g


def test_gated_readout_matches_the_papers_equation_and_ignores_node_order():
    with seeded(0):
        readout = ggnn.GatedReadout(4, 2, 3).double()
    h, x = randn(5, 4, seed=15), randn(5, 2, seed=16)
    batch = torch.tensor([0, 0, 1, 1, 1])
    out = readout(h, x, batch, 2)
    hx = torch.cat([h, x], 1)
    gated = torch.sigmoid(readout.i(hx)) * torch.tanh(readout.j(hx))
    expected = torch.tanh(torch.stack([gated[:2].sum(0), gated[2:].sum(0)]))
    assert torch.allclose(out, expected, atol=1e-12)
    perm = torch.tensor([1, 0, 4, 2, 3])
    assert torch.allclose(readout(h[perm], x[perm], batch, 2), out, atol=1e-12)


def test_selection_credit_counts_ties_as_a_random_pick():
    scores = torch.tensor([1.0, 3.0, 3.0, 0.0, 2.0, 5.0])
    batch = torch.tensor([0, 0, 0, 1, 1, 1])
    credit = experiment.selection_credit(scores, batch, torch.tensor([1, 4]), 2)
    assert torch.allclose(credit, torch.tensor([0.5, 0.0]))
    credit = experiment.selection_credit(scores, batch, torch.tensor([0, 5]), 2)
    assert torch.allclose(credit, torch.tensor([0.0, 1.0]))


# -- 5. The task ----------------------------------------------------------------------------------


def test_the_answer_is_the_species_feared_by_the_queried_entitys_species():
    task = experiment.deduction_task(40, seed=0, stream=1)
    for i in range(len(task)):
        edges, types = task.edges[i], task.edge_type[i]
        query = int(task.annotation[i, :, 0].argmax())
        assert task.annotation[i, :, 0].sum() == 1 and query < experiment.N_ENTITIES
        # "e is s" is the edge s -has member-> e: the path starts against an edge
        species = int(edges[(edges[:, 1] == query) & (types == experiment.MEMBER), 0])
        assert species == experiment.species_of_query(task)[i]
        feared = int(edges[(edges[:, 0] == species) & (types == experiment.HAS_FEAR), 1])
        liked = int(edges[(edges[:, 0] == species) & (types == experiment.LIKES), 1])
        assert feared == task.answer[i] and feared != species
        # the distractor: another species leads on from the entity's species, by another type
        assert liked not in (feared, species)
        # two hops: the answer is never a neighbour of the queried entity
        assert not ((edges[:, 0] == query) & (edges[:, 1] == feared)).any()
        assert task.answer_symbol[i] == task.symbols[i, feared]
        # the text tells the same story: the question names the entity, a fact names its fear
        assert task.tokens[i, -2] == experiment.QUESTION_TOKEN
        assert task.tokens[i, -1] == task.symbols[i, query]
        triples = task.tokens[i, :-2].view(-1, 3).tolist()
        fact = [int(task.symbols[i, species]), experiment.FEAR_TOKEN, int(task.answer_symbol[i])]
        assert fact in triples


def test_the_task_follows_the_seed_and_the_stream():
    a, b = experiment.deduction_task(20, 0, 1), experiment.deduction_task(20, 0, 1)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.edges, b.edges)
    assert not torch.equal(a.tokens, experiment.deduction_task(20, 1, 1).tokens)
    assert not torch.equal(a.tokens, experiment.deduction_task(20, 0, 2).tokens)


def test_graphs_of_a_task_are_numbered_as_one_disconnected_graph():
    task = experiment.deduction_task(5, 0, 1)
    annotation, edge_index, edge_type, batch, answer = task.graphs(torch.tensor([3, 1]))
    assert annotation.shape == (16, 1) and edge_index.shape == (2, 24)
    assert torch.equal(batch, torch.tensor([0] * 8 + [1] * 8))
    assert torch.equal(answer, torch.stack([task.answer[3], task.answer[1] + 8]))
    assert (batch[edge_index[0]] == batch[edge_index[1]]).all()
    assert torch.equal(edge_index[:, 12:] - 8, task.edges[1].T)


def test_the_lstm_reads_batch_first_sequences():
    with seeded(0):
        model = experiment.FactsLSTM(hidden_size=8, embedding_size=4)
    task = experiment.deduction_task(3, 0, 1)
    assert model(task.tokens).shape == (3, experiment.N_SYMBOLS)


def test_first_keeps_the_first_n_stories_of_every_field():
    task = experiment.deduction_task(10, 0, 1)
    head = task.first(4)
    assert len(head) == 4
    for name, field in vars(task).items():
        assert torch.equal(getattr(head, name), field[:4]), name
    with pytest.raises(ValueError, match="n"):
        task.first(0)


def test_story_text_reads_the_tokens_as_facts_question_and_answer():
    task = experiment.deduction_task(6, 0, 1)
    names = experiment.NAMES
    for i in range(len(task)):
        facts, question = experiment.story_text(task, i).split(". What is ")
        facts = facts.split(", ")
        assert len(facts) == experiment.N_FACTS
        query = int(task.annotation[i, :, 0].argmax())
        species = int(task.edges[i, query, 0])
        symbol = task.symbols[i]
        assert question == f"{names[symbol[query]]} afraid of? {names[task.answer_symbol[i]]}"
        assert f"{names[symbol[query]]} is {names[symbol[species]]}" in facts
        assert f"{names[symbol[species]]} fears {names[task.answer_symbol[i]]}" in facts
        # the facts in the order of the tokens
        first = task.tokens[i, :3].tolist()
        relation = {
            experiment.IS_TOKEN: "is",
            experiment.FEAR_TOKEN: "fears",
            experiment.LIKE_TOKEN: "likes",
        }[first[1]]
        assert facts[0] == f"{names[first[0]]} {relation} {names[first[2]]}"


def test_node_probabilities_are_each_storys_own_softmax_in_eval_mode():
    with seeded(0):
        model = ggnn.NodeSelector(1, 8, len(experiment.EDGE_TYPES), 2)
    task = experiment.deduction_task(5, 0, 1)
    index = torch.tensor([3, 0])
    probabilities = experiment.node_probabilities(model, task, index)
    assert probabilities.shape == (2 * experiment.N_NODES,) and model.training
    for j, i in enumerate(index.tolist()):
        annotation, edge_index, edge_type, _, _ = task.graphs(torch.tensor([i]))
        with torch.no_grad():
            alone = torch.softmax(model(annotation, edge_index, edge_type), 0)
        assert torch.allclose(probabilities[8 * j : 8 * (j + 1)], alone, atol=1e-6)
    assert torch.allclose(
        experiment.node_probabilities(model, task).view(5, 8).sum(1), torch.ones(5)
    )


class FixedGuess(torch.nn.Module):
    """A sequence model that answers story i with symbol guesses[i], whatever it reads."""

    def __init__(self, guesses):
        super().__init__()
        self.guesses = guesses

    def forward(self, tokens):
        return torch.nn.functional.one_hot(self.guesses, experiment.N_SYMBOLS).float()


def test_names_a_species_counts_the_answers_among_the_storys_species():
    task = experiment.deduction_task(4, 0, 1)
    species = task.symbols[:, experiment.N_ENTITIES]  # a species of each story
    entity = task.symbols[:, 0]  # an entity: never an answer
    guesses = torch.stack([species[0], entity[1], task.answer_symbol[2], entity[3]])
    assert experiment.names_a_species(FixedGuess(guesses), task) == 0.5
    assert experiment.names_a_species(FixedGuess(task.answer_symbol), task) == 1.0


def test_the_lstm_run_logs_its_validation_accuracy_and_ends_at_its_best():
    train_set, val_set = experiment.deduction_task(40, 0, 1), experiment.deduction_task(60, 0, 2)
    run = experiment.train_lstm(
        train_set, val_set, hidden_size=8, updates=40, eval_every=5, lr=0.05
    )
    assert run.history.steps == list(range(5, 45, 5)) and not run.model.training
    best, at = experiment.best_validation(run)
    values = run.history["val_accuracy"]
    assert best == max(values) and values[run.history.steps.index(at)] == best
    assert values.index(best) == run.history.steps.index(at)  # the first to reach it
    # the weights it ends with are the early-stopped ones, not the last update's
    assert training.accuracy_of(run.model, val_set.tokens, val_set.answer_symbol) == best
    assert experiment.lstm_accuracy(run.model, val_set) == best
    assert experiment.lstm_correct(run.model, val_set).mean().item() == best


def test_the_ggnn_run_ends_with_its_best_validation_weights():
    train_set, val_set = experiment.deduction_task(20, 0, 1), experiment.deduction_task(40, 0, 2)
    run = experiment.train_ggnn(
        train_set, val_set, steps=2, hidden_size=8, updates=12, eval_every=2, lr=0.3
    )
    best, _ = experiment.best_validation(run)
    assert experiment.ggnn_accuracy(run.model, val_set) == pytest.approx(best)
    assert experiment.selection_credits(run.model, val_set).shape == (40,)


def test_the_setting_chosen_on_validation_is_the_best_run():
    class Fake:
        def __init__(self, values):
            self.history = training.History()
            for step, value in enumerate(values, 1):
                self.history.log(step, {"val_accuracy": value})

    runs = {0.1: Fake([0.2, 0.3]), 0.01: Fake([0.1, 0.5, 0.4]), 0.001: Fake([0.5, 0.2])}
    assert experiment.best_validation(runs[0.01]) == (0.5, 2)
    # two runs reach 0.5: the one higher on average over its evaluations (the faster) wins
    assert experiment.chosen_on_validation(runs) == 0.001
    runs[0.001] = Fake([0.5, 0.1])
    assert experiment.chosen_on_validation(runs) == 0.01


def test_swapping_the_two_relations_makes_a_story_of_the_task_with_the_other_answer():
    task = experiment.deduction_task(30, 0, 1)
    swapped = experiment.relations_swapped(task)
    for i in range(len(task)):
        species = int(experiment.species_of_query(task)[i])
        liked = task.edges[i, (task.edges[i, :, 0] == species) & (task.edge_type[i] == 2), 1]
        assert swapped.answer[i] == liked and swapped.answer[i] != task.answer[i]
        # the same edges, each with the other relation's name
        pairs = zip(task.edges[i].tolist(), task.edge_type[i].tolist(), strict=True)
        old = {(u, v, k) for (u, v), k in pairs}
        pairs = zip(swapped.edges[i].tolist(), swapped.edge_type[i].tolist(), strict=True)
        new = {(u, v, {1: 2, 2: 1}.get(k, k)) for (u, v), k in pairs}
        assert old == new
        assert swapped.answer_symbol[i] == task.symbols[i, swapped.answer[i]]
    # the text tells the swapped story
    assert torch.equal(experiment.relations_swapped(swapped).tokens, task.tokens)
    assert (swapped.tokens == experiment.FEAR_TOKEN).sum() == (
        task.tokens == experiment.LIKE_TOKEN
    ).sum()


def test_a_type_blind_ggnn_is_right_on_at_most_one_of_a_story_and_its_swap():
    # The derivation behind the chapter's bound of 1/2: a model that reads every edge as one
    # type sees the same graph in a story and in its swap, whose answers differ.
    task = experiment.deduction_task(200, 0, 1)
    swapped = experiment.relations_swapped(task)
    with seeded(3):
        blind = experiment.AblatedGGNN(8, steps=3, typed=False)
        typed = ggnn.NodeSelector(1, 8, len(experiment.EDGE_TYPES), 3)

    def credit(model, t):
        annotation, edge_index, edge_type, batch, answer = t.graphs()
        with torch.no_grad():
            scores = model(annotation, edge_index, edge_type)
        return experiment.selection_credit(scores, batch, answer, len(t))

    assert (credit(blind, task) + credit(blind, swapped) <= 1 + 1e-6).all()
    # the typed model is not bound: its scores differ between a story and its swap
    annotation, edge_index, edge_type, _, _ = task.graphs()
    _, _, swapped_type, _, _ = swapped.graphs()
    with torch.no_grad():
        assert not torch.allclose(
            typed(annotation, swapped.graphs()[1], swapped_type),
            typed(annotation, edge_index, edge_type),
        )


def test_the_ablation_reads_every_edge_as_one_type():
    task = experiment.deduction_task(5, 0, 1)
    annotation, edge_index, edge_type, _, _ = task.graphs()
    with seeded(0):
        blind = experiment.AblatedGGNN(8, steps=2, typed=False)
    assert blind.incoming.shape == (1, 8, 8)
    with torch.no_grad():
        shuffled = edge_type[torch.randperm(edge_type.shape[0], generator=gen(1))]
        assert torch.equal(
            blind(annotation, edge_index, edge_type), blind(annotation, edge_index, shuffled)
        )


def ablation_with_the_mechanisms_weights(selector, **removed):
    """An AblatedGGNN holding the NodeSelector's weights (float64)."""
    D = selector.ggnn.hidden_size
    ablated = experiment.AblatedGGNN(D, selector.ggnn.steps, **removed).double()
    u = selector.ggnn.update
    with torch.no_grad():
        ablated.incoming.copy_(selector.ggnn.incoming)
        ablated.outgoing.copy_(selector.ggnn.outgoing)
        ablated.bias.copy_(selector.ggnn.bias)
        for gate, (W, U) in {
            "z": (u.W_z, u.U_z),
            "r": (u.W_r, u.U_r),
            "candidate": (u.W, u.U),
        }.items():
            if gate in ablated.from_messages:
                ablated.from_messages[gate].load_state_dict(W.state_dict())
                ablated.from_state[gate].load_state_dict(U.state_dict())
        ablated.output.load_state_dict(selector.output.g.state_dict())
    return ablated


def selector_with_a_bias(seed=0, hidden_size=6, steps=3):
    with seeded(seed):
        selector = ggnn.NodeSelector(1, hidden_size, len(experiment.EDGE_TYPES), steps).double()
    with torch.no_grad():
        selector.ggnn.bias.copy_(0.1 * randn(2 * hidden_size, seed=seed + 1))
    return selector


def test_the_ablations_second_implementation_computes_the_mechanisms_scores():
    # The ablations are written apart from the mechanism (dense matrix A, their own GRU): with
    # nothing removed and the same weights they give the same scores, so an ablation's result
    # differs from the GG-NN's only by what it removes.
    selector = selector_with_a_bias()
    ablated = ablation_with_the_mechanisms_weights(selector)
    task = experiment.deduction_task(7, 0, 1)
    annotation, edge_index, edge_type, _, _ = task.graphs()
    annotation = annotation.double()
    with torch.no_grad():
        assert torch.allclose(
            ablated(annotation, edge_index, edge_type),
            selector(annotation, edge_index, edge_type),
            atol=1e-12,
        )


def test_the_ungated_ablation_updates_with_tanh_of_messages_and_state():
    with seeded(1):
        ablated = experiment.AblatedGGNN(5, steps=1, gated=False).double()
    h, A = randn(2, 8, 5, seed=2), torch.rand(2, 3, 8, 8, generator=gen(3)).double()
    a_in = sum(A[:, k] @ h @ ablated.incoming[k].T for k in range(3))
    a_out = sum(A[:, k].transpose(1, 2) @ h @ ablated.outgoing[k].T for k in range(3))
    a = torch.cat([a_in, a_out], 2) + ablated.bias
    W, U = ablated.from_messages["candidate"], ablated.from_state["candidate"]
    with torch.no_grad():
        assert torch.allclose(ablated.round(h, A), torch.tanh(W(a) + U(h)), atol=1e-12)
    assert set(ablated.from_messages) == {"candidate"}


def test_gradients_flow_through_every_round_in_the_mechanism_and_the_last_in_the_ablation():
    # On a chain 0 -> 1 -> 2 -> 3 with T = 3, node 3's score depends on node 0's annotation
    # only through all three rounds: full backpropagation through time carries a gradient from
    # it back to the annotation, gradients through the last round only carry none to anything
    # before that round.
    task = experiment.deduction_task(1, 0, 1)
    edge_index = torch.tensor([[0, 1, 2], [1, 2, 3]])
    edge_type = torch.tensor([1, 1, 1])
    annotation = torch.zeros(8, 1, dtype=torch.float64)
    annotation[0] = 1.0
    selector = selector_with_a_bias(steps=3)
    last_only = ablation_with_the_mechanisms_weights(selector, every_round=False)
    for model, reaches in [(selector, True), (last_only, False)]:
        x = annotation.clone().requires_grad_(True)
        model(x, edge_index, edge_type)[3].backward()
        assert (x.grad[0].abs() > 1e-9).item() == reaches, model
    assert task is not None


def test_the_mechanisms_gradients_are_those_of_the_equations_through_every_round():
    # Backpropagation through all T rounds: the parameters' gradients of a loss on h(T) equal
    # those of the node-by-node reference (which keeps every round in the graph).
    model = make_ggnn(steps=3)
    graph = small_graph(seed=21)
    weights = randn(6, 5, seed=22)
    (model(*graph) * weights).sum().backward()
    ours = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    (reference_states(model, *graph) * weights).sum().backward()
    for name, p in model.named_parameters():
        assert torch.allclose(ours[name], p.grad, atol=1e-10), name


def test_the_ablation_refuses_graphs_that_are_not_stories_of_eight_nodes():
    with seeded(0):
        ablated = experiment.AblatedGGNN(4, steps=1)
    with pytest.raises(ValueError, match="8 nodes"):
        ablated(
            torch.zeros(7, 1), torch.zeros(2, 0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
        )
    with pytest.raises(TypeError, match="typed"):
        experiment.AblatedGGNN(4, steps=1, typed=1)


def test_train_ablation_trains_what_it_removes_on_the_same_seed():
    train_set, val_set = experiment.deduction_task(10, 0, 1), experiment.deduction_task(10, 0, 2)
    run = experiment.train_ablation(
        train_set, val_set, steps=2, hidden_size=8, updates=2, eval_every=1, gated=False
    )
    assert isinstance(run.model, experiment.AblatedGGNN) and not run.model.gated
    again = experiment.train_ablation(
        train_set, val_set, steps=2, hidden_size=8, updates=2, eval_every=1, gated=False
    )
    for a, b in zip(run.model.parameters(), again.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_the_story_softmax_of_the_ablation_matches_the_mechanisms():
    scores = randn(24, seed=30)
    batch = torch.arange(3).repeat_interleave(8)
    assert torch.allclose(
        experiment.story_log_softmax(scores, batch, 3),
        ggnn.per_graph_log_softmax(scores, batch, 3),
        atol=1e-12,
    )


def test_the_path_to_the_answer_needs_both_directions_of_the_messages():
    # The species hears its queried entity only against the has-member edge (W_out), the
    # answer hears the species only along the has-fear edge (W_in). With W_out zeroed nothing
    # hears the entity at all; with W_in zeroed the answer hears the species only where it
    # points at it itself (it fears or likes it). Either way, after two rounds the answer's
    # state is the one it has when no entity is asked about.
    task = experiment.deduction_task(40, 0, 1)
    annotation, edge_index, edge_type, _, answer = task.graphs()
    annotation = annotation.double()
    species = experiment.species_of_query(task)
    rows = torch.arange(len(task))
    points_back = (task.edges[rows, 4:, 0] == task.answer.unsqueeze(1)) & (
        task.edges[rows, 4:, 1] == species.unsqueeze(1)
    )
    apart = ~points_back.any(1)
    assert apart.sum() >= 10
    with torch.no_grad():
        for dropped, stories in (("outgoing", rows), ("incoming", rows[apart])):
            model = selector_with_a_bias(steps=2)
            getattr(model.ggnn, dropped).zero_()
            h = model.ggnn(annotation, edge_index, edge_type)
            untouched = model.ggnn(torch.zeros_like(annotation), edge_index, edge_type)
            assert torch.allclose(h[answer[stories]], untouched[answer[stories]], atol=1e-12)
        selector = selector_with_a_bias(steps=2)
        h = selector.ggnn(annotation, edge_index, edge_type)
        untouched = selector.ggnn(torch.zeros_like(annotation), edge_index, edge_type)
        assert not torch.allclose(h[answer], untouched[answer], atol=1e-6)


def test_paired_standard_error_is_the_spread_of_the_differences():
    a, b = torch.tensor([1.0, 1.0, 0.0, 1.0]), torch.tensor([1.0, 0.0, 0.0, 0.0])
    d = a - b
    assert experiment.paired_standard_error(a, b) == pytest.approx(d.std().item() / 2)
    assert experiment.paired_standard_error(a, a) == 0.0
    with pytest.raises(ValueError, match="two"):
        experiment.paired_standard_error(a[:1], b[:1])


def test_best_weights_keep_the_first_best_and_restore_it():
    model = torch.nn.Linear(2, 1)
    best = experiment.BestWeights(model)
    with torch.no_grad():
        model.weight.fill_(1.0)
        best(0.5)
        model.weight.fill_(2.0)
        best(0.5)  # a tie keeps the first
        model.weight.fill_(3.0)
        best(0.2)
    best.restore()
    assert torch.equal(model.weight, torch.ones(1, 2))


def test_the_most_frequent_answer_reads_nothing_of_the_story():
    train_set, task = experiment.deduction_task(200, 0, 1), experiment.deduction_task(300, 0, 3)
    counts = torch.bincount(train_set.answer_symbol, minlength=experiment.N_SYMBOLS)
    expected = (task.answer_symbol == counts.argmax()).float().mean().item()
    assert experiment.most_frequent_answer(train_set, task) == expected
    assert experiment.most_frequent_answer(train_set, task) < 0.2  # symbols are drawn at random


def test_a_short_training_run_learns_the_task():
    train_set, val_set = experiment.deduction_task(20, 0, 1), experiment.deduction_task(50, 0, 2)
    run = experiment.train_ggnn(
        train_set, val_set, steps=2, hidden_size=8, updates=40, eval_every=40
    )
    assert run.history.final("val_accuracy") >= 0.9


# -- Bad input is refused where it enters ------------------------------------------------------


def test_ggnn_constructor_rejects_a_hidden_size_below_the_annotation_size():
    with pytest.raises(ValueError, match="hidden_size"):
        ggnn.GGNN(annotation_size=4, hidden_size=3, num_edge_types=2, steps=2)
    with pytest.raises(ValueError, match="steps"):
        ggnn.GGNN(1, 4, 2, steps=0)


def test_ggnn_forward_rejects_bad_graph_tensors():
    model = make_ggnn()
    annotation, edge_index, edge_type = small_graph()
    with pytest.raises(ValueError, match="annotation"):
        model(annotation[:, :1], edge_index, edge_type)
    with pytest.raises(ValueError, match="edge_index"):
        model(annotation, edge_index.T, edge_type)
    with pytest.raises(ValueError, match="edge_index"):
        model(annotation, edge_index + 100, edge_type)
    with pytest.raises(TypeError, match="edge_type"):
        model(annotation, edge_index, edge_type.double())
    with pytest.raises(ValueError, match="edge_type"):
        model(annotation, edge_index, edge_type + 5)


def test_other_entry_points_reject_bad_arguments():
    with pytest.raises(ValueError, match="n"):
        experiment.deduction_task(0, seed=0, stream=1)
    task = experiment.deduction_task(5, 0, 1)
    with pytest.raises(ValueError, match="steps"):
        experiment.train_ggnn(task, task, steps=0)
    with pytest.raises(ValueError, match="lr"):
        experiment.train_lstm(task, task, lr=0.0)
    with pytest.raises(ValueError, match="tokens"):
        experiment.FactsLSTM(8, 4)(task.tokens[0])
    with pytest.raises(ValueError, match="batch"):
        ggnn.GatedReadout(4, 2, 3)(
            randn(5, 4).float(), randn(5, 2).float(), torch.zeros(4, dtype=torch.long), 1
        )


def test_reversed_stories_point_every_edge_the_other_way_and_keep_the_rest():
    task = experiment.deduction_task(6, 0, 1)
    reversed_ = experiment.edges_reversed(task)
    assert torch.equal(reversed_.edges[..., 0], task.edges[..., 1])
    assert torch.equal(reversed_.edges[..., 1], task.edges[..., 0])
    for name in ("annotation", "edge_type", "answer", "tokens", "symbols"):
        assert torch.equal(getattr(reversed_, name), getattr(task, name)), name
    # the GG-NN, which keeps the two directions apart, scores a story and its reverse apart
    selector = selector_with_a_bias(steps=2)
    annotation, edge_index, edge_type, _, _ = task.graphs()
    _, flipped, _, _, _ = reversed_.graphs()
    with torch.no_grad():
        assert not torch.allclose(
            selector(annotation.double(), edge_index, edge_type),
            selector(annotation.double(), flipped, edge_type),
        )


# -- the cost of a sequence output, counted -------------------------------------------------------


def test_multiply_adds_count_a_linear_layer_forward_and_backward():
    # y = W x on a batch of 5: 5 * 3 * 4 multiply-adds forward; backward the gradient of W
    # (the same count); the input needs no gradient, so nothing more
    layer = torch.nn.Linear(4, 3, bias=False)
    x = torch.randn(5, 4, generator=gen(1))
    assert experiment.multiply_adds(lambda: layer(x).sum()) == 2 * 5 * 3 * 4


def test_a_ggsnn_update_counts_one_propagation_per_output_step_and_grows_with_the_rounds():
    sizes = {"graphs": 2, "nodes": 5, "steps": 3, "hidden_size": 6, "annotation_size": 2}
    one = experiment.ggsnn_update_multiply_adds(output_steps=1, **sizes)
    assert one > 0
    assert experiment.ggsnn_update_multiply_adds(output_steps=4, **sizes) == 4 * one
    more_rounds = experiment.ggsnn_update_multiply_adds(output_steps=1, **{**sizes, "steps": 6})
    assert one < more_rounds < 2 * one + 1  # twice the rounds, one output network
    edge_index, edge_type, batch = experiment.ring_graphs(2, 5)
    assert edge_index.shape == (2, 20) and torch.equal(edge_type, torch.zeros(20).long())
    assert set(edge_index[:, batch[edge_index[0]] == 1].flatten().tolist()) == set(range(5, 10))
    assert torch.equal(torch.bincount(edge_index[0]), torch.full((10,), 2))  # a ring, both ways


def test_the_cost_of_a_run_is_its_updates_times_one_update():
    task = experiment.deduction_task(6, 0, 1)
    rounds, madds = experiment.run_cost(task, steps=3, stories=4, updates=10)
    with seeded(0):
        model = ggnn.NodeSelector(1, 16, len(experiment.EDGE_TYPES), 3)
    one = experiment.update_multiply_adds(model, task, 4, ggnn.per_graph_log_softmax)
    assert (rounds, madds) == (30, 10 * one)
    # the ablation with the gradient through the last round only costs less backward
    _, truncated = experiment.run_cost(task, steps=3, stories=4, updates=10, every_round=False)
    assert truncated < madds
    with pytest.raises(ValueError, match="batch_size"):
        experiment.update_multiply_adds(model, task, 7, ggnn.per_graph_log_softmax)


def test_propagation_matrices_start_with_standard_deviation_one_over_root_d():
    # W_in and W_out start as N(0, 1/D) entries, in the mechanism and in the ablations' copy.
    with seeded(0):
        models = [ggnn.GGNN(1, 64, 3, 2), experiment.AblatedGGNN(64, 2)]
    for model in models:
        for matrices in (model.incoming, model.outgoing):
            assert abs(matrices.std().item() - 64**-0.5) < 0.1 * 64**-0.5
            assert abs(matrices.mean().item()) < 0.01


def test_ablation_without_every_round_takes_its_gradient_through_the_last_round_only():
    task = experiment.deduction_task(3, seed=0, stream=experiment.TRAIN)
    annotation, edge_index, edge_type, _, _ = task.graphs()
    with seeded(1):
        truncated = experiment.AblatedGGNN(8, 3, every_round=False)
    full = experiment.AblatedGGNN(8, 3)  # every_round defaults to True
    full.load_state_dict(truncated.state_dict())
    assert [truncated.through(t) for t in range(3)] == [False, False, True]
    assert [full.through(t) for t in range(3)] == [True, True, True]

    def gradient(model):
        model.zero_grad()
        model(annotation, edge_index, edge_type).square().sum().backward()
        return model.incoming.grad.clone()

    # By hand: two rounds as constants, then the last round and the output with gradients.
    n = annotation.shape[0]
    A = truncated.adjacency(n, edge_index, edge_type)
    x = annotation.view(n // 8, 8, -1)
    h = torch.cat([x, x.new_zeros(*x.shape[:2], 7)], dim=2)
    with torch.no_grad():
        for _ in range(2):
            h = truncated.round(h, A)
    truncated.zero_grad()
    by_hand = truncated.output(torch.cat([truncated.round(h, A), x], dim=2)).reshape(n)
    by_hand.square().sum().backward()
    expected = truncated.incoming.grad.clone()
    assert torch.allclose(gradient(truncated), expected, atol=1e-6)
    assert expected.abs().sum() > 0
    assert not torch.allclose(gradient(full), expected, atol=1e-4)


# -- what the mutation survivors changed, pinned (tests/mutation/ggnn.yml) ------------------------


def test_check_graph_counts_nodes_and_edges_and_takes_any_annotation_width_unless_told():
    annotation = randn(4, 3, seed=40)
    edge_index, edge_type = torch.tensor([[0, 2], [1, 3]]), torch.tensor([0, 1])
    assert ggnn.check_graph(annotation, edge_index, edge_type) == (4, 2)
    assert ggnn.check_graph(annotation[:, :1], edge_index, edge_type) == (4, 2)
    assert ggnn.check_graph(annotation, edge_index, edge_type, annotation_size=3) == (4, 2)
    with pytest.raises(ValueError, match="annotation"):
        ggnn.check_graph(annotation, edge_index, edge_type, annotation_size=2)


def test_per_graph_log_softmax_stays_finite_for_scores_far_beyond_exps_range():
    # exp(800) overflows float64: only the shift by each graph's largest score keeps it finite,
    # and the shift does not change a softmax.
    scores = torch.tensor([800.0, 799.0, 797.0, -800.0, -801.0], dtype=torch.float64)
    batch = torch.tensor([0, 0, 0, 1, 1])
    out = ggnn.per_graph_log_softmax(scores, batch, 2)
    assert torch.isfinite(out).all()
    assert torch.allclose(out[:3], torch.log_softmax(scores[:3] - 800, 0), atol=1e-12)
    assert torch.allclose(out[3:], torch.log_softmax(scores[3:] + 800, 0), atol=1e-12)


def offsets_around_the_circle(task, edge_type):
    """Per story and species, (n, 4): how far around the circle of four species the species'
    edge of `edge_type` points (1, 2 or 3)."""
    rows = task.edge_type == edge_type
    edges = task.edges[rows].view(len(task), experiment.N_SPECIES, 2) - experiment.N_ENTITIES
    return (edges[..., 1] - edges[..., 0]) % experiment.N_SPECIES


def test_every_fear_and_every_other_like_is_drawn_for_a_species():
    # Each species fears one of the other three and likes one of the remaining two, each drawn
    # at random: over many stories all six (fear, like) offsets around the circle occur.
    task = experiment.deduction_task(300, seed=0, stream=1)
    fear = offsets_around_the_circle(task, experiment.HAS_FEAR)
    like = offsets_around_the_circle(task, experiment.LIKES)
    pairs = set(zip(fear.flatten().tolist(), like.flatten().tolist(), strict=True))
    assert pairs == {(f, k) for f in (1, 2, 3) for k in (1, 2, 3) if f != k}


def test_each_storys_facts_come_in_an_order_of_their_own():
    # The twelve facts are shuffled story by story (the question stays last): the LSTM cannot
    # read the answer off a fixed position.
    task = experiment.deduction_task(20, seed=0, stream=1)
    relations = {tuple(task.tokens[i, 1:-2:3].tolist()) for i in range(len(task))}
    assert len(relations) > 10
    for i in range(len(task)):
        assert sorted(task.tokens[i, 1:-2:3].tolist()) == sorted(
            [experiment.IS_TOKEN] * 4 + [experiment.FEAR_TOKEN] * 4 + [experiment.LIKE_TOKEN] * 4
        )


def test_the_chapters_example_story_is_the_one_its_seed_draws():
    # The story the chapter prints (chapter seed 0, the first test story): the task follows its
    # seed draw for draw (symbols, species, fears, likes, the question, the facts' order).
    test_set = experiment.deduction_task(1000, 0, experiment.TEST)
    assert experiment.story_text(test_set, 0) == (
        "M fears K, N fears O, G is M, N likes M, A is K, K likes M, O fears K, O likes M, "
        "P is K, K fears O, M likes N, C is N. What is P afraid of? O"
    )


class SpySelector(torch.nn.Module):
    """A node-selecting model that scores a node by its annotation and records the edges of the
    graphs it is trained on (in train mode)."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.trained_on = []

    def forward(self, annotation, edge_index, edge_type):
        if self.training:
            self.trained_on.append(edge_index.clone())
        return annotation[:, 0] * self.weight


def test_node_selection_trains_on_the_runs_batches_and_evaluates_every_eval_every_updates():
    train_set, val_set = experiment.deduction_task(12, 0, 1), experiment.deduction_task(4, 0, 2)
    model = SpySelector()
    run = experiment.train_node_selector(
        model,
        train_set,
        val_set,
        ggnn.per_graph_log_softmax,
        seed=3,
        updates=6,
        lr=0.1,
        batch_size=5,
        eval_every=2,
        desc="spy",
    )
    assert run.history.steps == [2, 4, 6]
    # the batches of generator(seed, BATCHES): the seed's own stream, shared by every model of a
    # run (the GG-NN, its ablations) trained on that seed
    expected = experiment.minibatches(12, 5, training.generator(3, experiment.BATCHES))
    assert len(model.trained_on) == 6
    for seen in model.trained_on:
        assert torch.equal(seen, train_set.graphs(next(expected))[1])


def test_the_runs_default_to_the_settings_the_chapter_states(monkeypatch):
    # The chapter's prose: the GG-NN has D = 16, 100 Adam updates on minibatches of up to 50
    # stories; the LSTM has size 32 (hidden state and embeddings), minibatches of 50, and its
    # validation logged every 50 updates. Its runs rely on these defaults.
    calls = {}

    def node_selector_spy(model, train_set, val_set, log_softmax, **settings):
        calls["node"] = (model, settings)
        return training.Run(model, training.History())

    monkeypatch.setattr(experiment, "train_node_selector", node_selector_spy)
    task = experiment.deduction_task(60, 0, 1)
    experiment.train_ggnn(task, task)
    model, settings = calls["node"]
    assert isinstance(model, ggnn.NodeSelector) and model.ggnn.hidden_size == 16
    assert (settings["updates"], settings["batch_size"], settings["eval_every"]) == (100, 50, 50)
    experiment.train_ggnn(task, task, eval_every=7)
    assert calls["node"][1]["eval_every"] == 7
    # the ablation gets what it removes and trains as the GG-NN does (the chapter: 50 stories,
    # 100 updates, the same batches, at 1e-2)
    experiment.train_ablation(task, task, typed=False, every_round=False, eval_every=9)
    model, settings = calls["node"]
    assert isinstance(model, experiment.AblatedGGNN) and model.incoming.shape[0] == 1
    assert (model.typed, model.gated, model.every_round) == (False, True, False)
    assert model.hidden_size == 16 and settings["eval_every"] == 9
    assert (settings["updates"], settings["batch_size"], settings["lr"]) == (100, 50, 1e-2)
    experiment.train_ablation(task, task, gated=False)
    assert (calls["node"][0].typed, calls["node"][0].every_round) == (True, True)

    def classifier_spy(model, train_y, optimizer, steps, *, batches, evaluate, eval_every, **_):
        calls["lstm"] = (model, optimizer, eval_every, [next(batches) for _ in range(3)])
        evaluate()  # the run restores its best weights: give it some
        return training.History()

    monkeypatch.setattr(training, "train_classifier", classifier_spy)
    experiment.train_lstm(task, task, seed=2, lr=0.03)
    model, optimizer, eval_every, batches = calls["lstm"]
    assert model.lstm.hidden_size == 32 and model.embedding.embedding_dim == 32
    assert eval_every == 50 and optimizer.param_groups[0]["lr"] == 0.03
    # the batches of generator(seed, BATCHES), 50 stories each
    expected = experiment.minibatches(60, 50, training.generator(2, experiment.BATCHES))
    for seen in batches:
        assert torch.equal(seen, next(expected))


def test_the_ablations_adjacency_counts_parallel_edges():
    # Entry [g, k, v, u] counts the edges u -k-> v: an edge listed twice is two messages, as in
    # the mechanism's sum over the edge list.
    with seeded(0):
        ablated = experiment.AblatedGGNN(4, steps=1).double()
    edge_index = torch.tensor([[4, 4, 5], [0, 0, 1]])
    edge_type = torch.tensor([0, 0, 2])
    A = ablated.adjacency(8, edge_index, edge_type)
    assert A[0, 0, 0, 4] == 2 and A[0, 2, 1, 5] == 1 and A.sum() == 3
    selector = selector_with_a_bias(hidden_size=4, steps=2)
    twin = ablation_with_the_mechanisms_weights(selector)
    annotation = torch.zeros(8, 1, dtype=torch.float64)
    annotation[4] = 1.0
    with torch.no_grad():
        assert torch.allclose(
            twin(annotation, edge_index, edge_type),
            selector(annotation, edge_index, edge_type),
            atol=1e-12,
        )


class ReadsTheTokens(torch.nn.Module):
    """A sequence model that answers each story with the symbol at one position of its tokens."""

    def __init__(self, position):
        super().__init__()
        self.position = position

    def forward(self, tokens):
        return torch.nn.functional.one_hot(tokens[:, self.position], experiment.N_SYMBOLS).float()


def test_names_a_species_judges_the_models_answer_to_each_storys_own_tokens():
    task = experiment.deduction_task(10, 0, 1)
    # every fact's object is a species ("e is s", "s fears s'", "s likes s'"); the question
    # names an entity
    assert experiment.names_a_species(ReadsTheTokens(2), task) == 1.0
    assert experiment.names_a_species(ReadsTheTokens(-1), task) == 0.0


def test_multiply_adds_are_a_whole_number_counted_silently(capsys):
    layer = torch.nn.Linear(4, 3, bias=False)
    x = torch.randn(5, 4, generator=gen(1))
    count = experiment.multiply_adds(lambda: layer(x).sum())
    assert type(count) is int and count == 2 * 5 * 3 * 4  # the chapter prints it with commas
    assert capsys.readouterr().out == ""


def test_an_update_is_counted_on_its_batch_only():
    task = experiment.deduction_task(6, 0, 1)
    with seeded(0):
        model = ggnn.NodeSelector(1, 8, len(experiment.EDGE_TYPES), 2)
    three = experiment.update_multiply_adds(model, task, 3, ggnn.per_graph_log_softmax)
    assert three == experiment.update_multiply_adds(
        model, task.first(3), 3, ggnn.per_graph_log_softmax
    )
    assert three < experiment.update_multiply_adds(model, task, 6, ggnn.per_graph_log_softmax)


def test_ring_graphs_join_each_node_to_its_neighbours_around_its_ring():
    edge_index, _, _ = experiment.ring_graphs(2, 4)
    ring = {(0, 1), (1, 2), (2, 3), (3, 0), (4, 5), (5, 6), (6, 7), (7, 4)}
    both_ways = ring | {(v, u) for u, v in ring}
    assert sorted(map(tuple, edge_index.T.tolist())) == sorted(both_ways)
