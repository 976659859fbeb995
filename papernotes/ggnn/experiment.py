"""The ggnn chapter's experiment: bAbI-15-style deduction stories, as graphs and as text; the
GG-NN that selects the answer node and the LSTM that reads the facts; their training runs and
measurements.

The task: four entities and four species (eight of sixteen symbols); each entity *is* a
species, each species *has fear of* another species; the question "what is entity e afraid of?"
marks e in the annotations and is answered by selecting a node: the species feared by e's
species, two hops from e. A sequence model reads the same facts as a token sequence and answers
with a symbol.

The mechanism is `papernotes.ggnn`, called through the module (`ggnn.NodeSelector(...)`) so that
a mutant patched onto it reaches these runs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from papernotes import checks, ggnn, training
from papernotes.data import minibatches

# The random streams of a run (papernotes.training.generator(seed, stream)).
TRAIN, VALIDATION, TEST, BATCHES = 1, 2, 3, 4


# -- The task: bAbI-15-style deduction ---------------------------------------------------------

N_SYMBOLS = 16  # names for entities and species
N_ENTITIES = N_SPECIES = 4
N_NODES = N_ENTITIES + N_SPECIES  # a graph's nodes: its entities first, then its species
IS, HAS_FEAR = 0, 1  # edge types
EDGE_TYPES = ("is", "has_fear")
# The sequence model's vocabulary: the symbols, then the two relations and the question mark.
IS_TOKEN, FEAR_TOKEN, QUESTION_TOKEN = N_SYMBOLS, N_SYMBOLS + 1, N_SYMBOLS + 2
VOCABULARY = N_SYMBOLS + 3
NAMES = "ABCDEFGHIJKLMNOP"  # how a story prints its symbols


@dataclass(frozen=True)
class Deduction:
    """n deduction stories, each as a graph and as a token sequence.

    Graphs, per story: annotation (n, 8, 1) (1 at the queried entity), edges (n, 8, 2) (source,
    target, local node numbers), edge_type (n, 8), answer (n,) (the local number of the feared
    species). Sequences: tokens (n, 26) (the eight facts as triples in a random order, then "?"
    and the entity) and answer_symbol (n,). symbols (n, 8) names each node.
    """

    annotation: torch.Tensor
    edges: torch.Tensor
    edge_type: torch.Tensor
    answer: torch.Tensor
    symbols: torch.Tensor
    tokens: torch.Tensor
    answer_symbol: torch.Tensor

    def __len__(self) -> int:
        return self.answer.shape[0]

    def first(self, n: int) -> Deduction:
        """The first n stories (a smaller training set drawn from the same pool)."""
        checks.integer("n", n)
        return Deduction(*(getattr(self, f.name)[:n] for f in dataclasses.fields(self)))

    def graphs(self, index: torch.Tensor | None = None):
        """Stories `index` (all by default) as one disconnected graph: annotation (N, 1),
        edge_index (2, E), edge_type (E,), batch (N,) and answer (G,) as node numbers."""
        index = torch.arange(len(self)) if index is None else index
        g = index.shape[0]
        # Story i's nodes are numbered from 8i: the graphs are disconnected parts of one graph.
        offsets = (torch.arange(g) * N_NODES).view(g, 1, 1)
        edge_index = (self.edges[index] + offsets).reshape(-1, 2).T.contiguous()
        return (
            self.annotation[index].reshape(g * N_NODES, -1),
            edge_index,
            self.edge_type[index].reshape(-1),
            torch.arange(g).repeat_interleave(N_NODES),
            self.answer[index] + torch.arange(g) * N_NODES,
        )


def deduction_task(n: int, seed: int, stream: int) -> Deduction:
    """n stories drawn from generator(seed, stream).

    Each story names 4 entities and 4 species with 8 distinct symbols of 16. Every entity is a
    species (drawn at random, so a species may have several entities or none) and every species
    fears one of the other three. The question asks what one entity is afraid of.
    """
    checks.integer("n", n)
    g = training.generator(seed, stream)
    symbols = torch.stack([torch.randperm(N_SYMBOLS, generator=g)[:N_NODES] for _ in range(n)])
    species_of = torch.randint(N_SPECIES, (n, N_ENTITIES), generator=g)
    # Another species than itself: an offset of 1-3 around the circle of four.
    fears = torch.arange(N_SPECIES) + torch.randint(1, N_SPECIES, (n, N_SPECIES), generator=g)
    fears = fears % N_SPECIES
    query = torch.randint(N_ENTITIES, (n,), generator=g)
    rows = torch.arange(n)

    entity_nodes = torch.arange(N_ENTITIES).expand(n, -1)
    species_nodes = torch.arange(N_SPECIES).expand(n, -1) + N_ENTITIES
    is_edges = torch.stack([entity_nodes, species_of + N_ENTITIES], dim=2)
    fear_edges = torch.stack([species_nodes, fears + N_ENTITIES], dim=2)
    edges = torch.cat([is_edges, fear_edges], dim=1)
    edge_type = torch.cat(
        [torch.full((n, N_ENTITIES), IS), torch.full((n, N_SPECIES), HAS_FEAR)], dim=1
    )
    annotation = torch.zeros(n, N_NODES, 1)
    annotation[rows, query, 0] = 1.0
    # The answer is two hops from the question: entity -is-> species -has fear-> answer.
    answer = fears[rows, species_of[rows, query]] + N_ENTITIES

    # The same story as text: "<entity> is <species>", "<species> fears <species>", shuffled,
    # then "? <entity>".
    relation = torch.where(edge_type == IS, IS_TOKEN, FEAR_TOKEN)
    triples = torch.stack(
        [symbols.gather(1, edges[..., 0]), relation, symbols.gather(1, edges[..., 1])], dim=2
    )
    order = torch.stack([torch.randperm(N_NODES, generator=g) for _ in range(n)])
    triples = triples[rows.unsqueeze(1), order].reshape(n, -1)
    question = torch.stack([torch.full((n,), QUESTION_TOKEN), symbols[rows, query]], dim=1)
    tokens = torch.cat([triples, question], dim=1)
    return Deduction(annotation, edges, edge_type, answer, symbols, tokens, symbols[rows, answer])


def story_text(task: Deduction, i: int) -> str:
    """Story i as the sequence model reads it, in words, with its answer: "A is E, ... What is
    A afraid of? G"."""
    words = {IS_TOKEN: "is", FEAR_TOKEN: "fears", QUESTION_TOKEN: "?"}
    tokens = [words.get(t, NAMES[t] if t < N_SYMBOLS else "") for t in task.tokens[i].tolist()]
    facts = [" ".join(tokens[j : j + 3]) for j in range(0, 3 * N_NODES, 3)]
    return ", ".join(facts) + f". What is {tokens[-1]} afraid of? {NAMES[task.answer_symbol[i]]}"


# -- The GG-NN: node selection, trained and measured --------------------------------------------


def node_probabilities(
    model: ggnn.NodeSelector, task: Deduction, index: torch.Tensor | None = None
) -> torch.Tensor:
    """The probability the model gives each node of stories `index` (all by default), (N,):
    the softmax of its scores over each story's nodes, in eval mode."""
    annotation, edge_index, edge_type, batch, answer = task.graphs(index)
    with training.evaluating(model):
        scores = model(annotation, edge_index, edge_type)
    return ggnn.per_graph_log_softmax(scores, batch, answer.shape[0]).exp()


def selection_credit(scores, batch, answer, num_graphs: int) -> torch.Tensor:
    """Per graph, the chance that picking the highest-scoring node, ties broken at random,
    picks the answer (G,): 1 / (number of nodes tied at the top) if the answer is among them."""
    top = scores.new_full((num_graphs,), -torch.inf).scatter_reduce(0, batch, scores, "amax")
    at_top = (scores == top[batch]).to(scores.dtype)
    tied = scores.new_zeros(num_graphs).index_add(0, batch, at_top)
    return at_top[answer] / tied


def ggnn_accuracy(model: ggnn.NodeSelector, task: Deduction) -> float:
    """Fraction of stories whose answer node the model selects (a tie of k nodes at the top
    that includes the answer counts 1/k: the accuracy of breaking ties at random)."""
    annotation, edge_index, edge_type, batch, answer = task.graphs()
    with training.evaluating(model):
        scores = model(annotation, edge_index, edge_type)
    return selection_credit(scores, batch, answer, len(task)).mean().item()


def train_ggnn(
    train_set: Deduction,
    val_set: Deduction,
    *,
    steps: int = 4,
    hidden_size: int = 16,
    seed: int = 0,
    updates: int = 200,
    lr: float = 1e-2,
    batch_size: int = 50,
    eval_every: int = 50,
) -> training.Run:
    """Train a node-selecting GG-NN with T = `steps` on `train_set` (Adam, minibatches of at
    most `batch_size` stories); validation accuracy is logged every `eval_every` updates."""
    checks.integer("steps", steps)
    checks.integer("updates", updates)
    checks.number("lr", lr, 0.0, low_open=True)
    checks.integer("batch_size", batch_size)
    with training.seeded(seed):
        model = ggnn.NodeSelector(1, hidden_size, len(EDGE_TYPES), steps)
    n = len(train_set)
    batches = minibatches(n, min(batch_size, n), training.generator(seed, BATCHES))

    # The loss is the cross-entropy of the per-story softmax over nodes (not over a fixed set
    # of classes), so the loop is training.train with that loss rather than train_classifier.
    def loss_of_update(_):
        annotation, edge_index, edge_type, batch, answer = train_set.graphs(next(batches))
        scores = model(annotation, edge_index, edge_type)
        return -ggnn.per_graph_log_softmax(scores, batch, answer.shape[0])[answer].mean()

    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    history = training.train(
        model,
        optimizer,
        loss_of_update,
        updates,
        eval_every=eval_every,
        evaluate=lambda: {"val_accuracy": ggnn_accuracy(model, val_set)},
        desc="GG-NN",
    )
    return training.Run(model, history)


# -- The sequence baseline: an LSTM over the facts as text ----------------------------------


class FactsLSTM(nn.Module):
    """Embed the tokens (B, L), run an LSTM over them (batch first), and read the answer's
    symbol (B, 16 logits) from the last hidden state."""

    def __init__(self, hidden_size: int = 64, embedding_size: int = 32):
        super().__init__()
        checks.integer("hidden_size", hidden_size)
        checks.integer("embedding_size", embedding_size)
        self.embedding = nn.Embedding(VOCABULARY, embedding_size)
        self.lstm = nn.LSTM(embedding_size, hidden_size, batch_first=True)
        self.readout = nn.Linear(hidden_size, N_SYMBOLS)

    def forward(self, tokens):
        checks.tensor("tokens", tokens, "(B, L)", dtype=torch.long)
        _, (h, _) = self.lstm(self.embedding(tokens))
        return self.readout(h[-1])


def train_lstm(
    train_set: Deduction,
    val_set: Deduction,
    *,
    hidden_size: int = 64,
    seed: int = 0,
    updates: int = 300,
    lr: float = 1e-2,
    batch_size: int = 50,
    eval_every: int = 50,
) -> training.Run:
    """Train the LSTM baseline on the token sequences (Adam, cross-entropy over the symbols)."""
    checks.integer("updates", updates)
    checks.number("lr", lr, 0.0, low_open=True)
    checks.integer("batch_size", batch_size)
    with training.seeded(seed):
        model = FactsLSTM(hidden_size)
    n = len(train_set)
    batches = minibatches(n, min(batch_size, n), training.generator(seed, BATCHES))
    history = training.train_classifier(
        model,
        train_set.answer_symbol,
        torch.optim.Adam(model.parameters(), lr=lr),
        updates,
        batches=batches,
        logits_of=lambda index: model(train_set.tokens[index]),
        evaluate=lambda: {
            "val_accuracy": training.accuracy_of(model, val_set.tokens, val_set.answer_symbol)
        },
        eval_every=eval_every,
        desc="LSTM",
    )
    return training.Run(model, history)


def names_a_species(model: nn.Module, task: Deduction) -> float:
    """Fraction of the stories whose answer from the sequence model is one of the story's four
    species (a right answer always is one), in eval mode."""
    with training.evaluating(model):
        guess = model(task.tokens).argmax(1, keepdim=True)
    return (task.symbols[:, N_ENTITIES:] == guess).any(1).float().mean().item()
