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


# -- The task: bAbI-15-style deduction, with a distractor relation ---------------------------

N_SYMBOLS = 16  # names for entities and species
N_ENTITIES = N_SPECIES = 4
N_NODES = N_ENTITIES + N_SPECIES  # a graph's nodes: its entities first, then its species
IS, HAS_FEAR, LIKES = 0, 1, 2  # edge types
EDGE_TYPES = ("is", "has_fear", "likes")
N_FACTS = N_ENTITIES + 2 * N_SPECIES  # an "is" per entity, a "fears" and a "likes" per species
# The sequence model's vocabulary: the symbols, then the three relations and the question mark.
IS_TOKEN, FEAR_TOKEN, LIKE_TOKEN, QUESTION_TOKEN = range(N_SYMBOLS, N_SYMBOLS + 4)
VOCABULARY = N_SYMBOLS + 4
NAMES = "ABCDEFGHIJKLMNOP"  # how a story prints its symbols


@dataclass(frozen=True)
class Deduction:
    """n deduction stories, each as a graph and as a token sequence.

    Graphs, per story: annotation (n, 8, 1) (1 at the queried entity), edges (n, 12, 2) (source,
    target, local node numbers: the four "is" edges, then the four "has fear", then the four
    "likes"), edge_type (n, 12), answer (n,) (the local number of the feared species).
    Sequences: tokens (n, 38) (the twelve facts as triples in a random order, then "?" and the
    entity) and answer_symbol (n,). symbols (n, 8) names each node.
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
    species (drawn at random, so a species may have several entities or none); every species
    fears one of the other three and likes one of the remaining two. The question asks what
    one entity is afraid of. "Likes" is the distractor: from the entity's species one edge of
    each kind leads on, so the direction of the edges alone does not tell the answer, and
    swapping the two relations' names maps a story onto another story, as likely, whose answer
    is the other species: a model blind to edge types is right at most half the time.
    """
    checks.integer("n", n)
    g = training.generator(seed, stream)
    symbols = torch.stack([torch.randperm(N_SYMBOLS, generator=g)[:N_NODES] for _ in range(n)])
    species_of = torch.randint(N_SPECIES, (n, N_ENTITIES), generator=g)
    # Another species than itself: an offset of 1-3 around the circle of four; the liked one
    # is at another of the three offsets.
    fear_offset = torch.randint(1, N_SPECIES, (n, N_SPECIES), generator=g)
    like_offset = fear_offset - 1 + torch.randint(1, N_SPECIES - 1, (n, N_SPECIES), generator=g)
    like_offset = like_offset % (N_SPECIES - 1) + 1
    fears = (torch.arange(N_SPECIES) + fear_offset) % N_SPECIES
    likes = (torch.arange(N_SPECIES) + like_offset) % N_SPECIES
    query = torch.randint(N_ENTITIES, (n,), generator=g)
    rows = torch.arange(n)

    entity_nodes = torch.arange(N_ENTITIES).expand(n, -1)
    species_nodes = torch.arange(N_SPECIES).expand(n, -1) + N_ENTITIES
    is_edges = torch.stack([entity_nodes, species_of + N_ENTITIES], dim=2)
    fear_edges = torch.stack([species_nodes, fears + N_ENTITIES], dim=2)
    like_edges = torch.stack([species_nodes, likes + N_ENTITIES], dim=2)
    edges = torch.cat([is_edges, fear_edges, like_edges], dim=1)
    edge_type = torch.cat(
        [
            torch.full((n, N_ENTITIES), IS),
            torch.full((n, N_SPECIES), HAS_FEAR),
            torch.full((n, N_SPECIES), LIKES),
        ],
        dim=1,
    )
    annotation = torch.zeros(n, N_NODES, 1)
    annotation[rows, query, 0] = 1.0
    # The answer is two hops from the question: entity -is-> species -has fear-> answer.
    answer = fears[rows, species_of[rows, query]] + N_ENTITIES

    # The same story as text: "<entity> is <species>", "<species> fears <species>",
    # "<species> likes <species>", shuffled, then "? <entity>".
    relation = torch.tensor([IS_TOKEN, FEAR_TOKEN, LIKE_TOKEN])[edge_type]
    triples = torch.stack(
        [symbols.gather(1, edges[..., 0]), relation, symbols.gather(1, edges[..., 1])], dim=2
    )
    order = torch.stack([torch.randperm(N_FACTS, generator=g) for _ in range(n)])
    triples = triples[rows.unsqueeze(1), order].reshape(n, -1)
    question = torch.stack([torch.full((n,), QUESTION_TOKEN), symbols[rows, query]], dim=1)
    tokens = torch.cat([triples, question], dim=1)
    return Deduction(annotation, edges, edge_type, answer, symbols, tokens, symbols[rows, answer])


def relations_swapped(task: Deduction) -> Deduction:
    """The same stories with "has fear" and "likes" swapped, in the graphs and in the text:
    each becomes another story of the task, as likely, whose answer is the species that was
    liked. The two graphs differ only in the names of their edges' types."""
    is_edges, fear_edges, like_edges = task.edges.split([N_ENTITIES, N_SPECIES, N_SPECIES], 1)
    # The liked species' edges become the "has fear" edges (edge_type's layout is unchanged).
    edges = torch.cat([is_edges, like_edges, fear_edges], dim=1)
    rows = torch.arange(len(task))
    species = task.edges[rows, task.annotation[:, :, 0].argmax(1), 1]  # the queried entity's
    answer = like_edges[rows, species - N_ENTITIES, 1]
    tokens = task.tokens.clone()
    tokens[task.tokens == FEAR_TOKEN] = LIKE_TOKEN
    tokens[task.tokens == LIKE_TOKEN] = FEAR_TOKEN
    return Deduction(
        task.annotation,
        edges,
        task.edge_type,
        answer,
        task.symbols,
        tokens,
        task.symbols[rows, answer],
    )


def story_text(task: Deduction, i: int) -> str:
    """Story i as the sequence model reads it, in words, with its answer: "A is E, ... What is
    A afraid of? G"."""
    words = {IS_TOKEN: "is", FEAR_TOKEN: "fears", LIKE_TOKEN: "likes", QUESTION_TOKEN: "?"}
    tokens = [words.get(t, NAMES[t] if t < N_SYMBOLS else "") for t in task.tokens[i].tolist()]
    facts = [" ".join(tokens[j : j + 3]) for j in range(0, 3 * N_FACTS, 3)]
    return ", ".join(facts) + f". What is {tokens[-1]} afraid of? {NAMES[task.answer_symbol[i]]}"


# -- The GG-NN: node selection, trained and measured --------------------------------------------


def node_probabilities(
    model: nn.Module, task: Deduction, index: torch.Tensor | None = None
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


def ggnn_accuracy(model: nn.Module, task: Deduction) -> float:
    """Fraction of stories whose answer node the model selects (a tie of k nodes at the top
    that includes the answer counts 1/k: the accuracy of breaking ties at random)."""
    annotation, edge_index, edge_type, batch, answer = task.graphs()
    with training.evaluating(model):
        scores = model(annotation, edge_index, edge_type)
    return selection_credit(scores, batch, answer, len(task)).mean().item()


class OneMatrixForEveryType(nn.Module):
    """The ablation of typed edges: the same node-selecting GG-NN with a single edge type, so
    that one pair of matrices (W_in, W_out) carries every relation; it still knows each edge's
    direction. Called like a NodeSelector; the edge types it is given are read as type 0."""

    def __init__(self, annotation_size: int, hidden_size: int, steps: int):
        super().__init__()
        self.selector = ggnn.NodeSelector(annotation_size, hidden_size, 1, steps)

    @property
    def ggnn(self) -> ggnn.GGNN:
        return self.selector.ggnn

    def forward(self, annotation, edge_index, edge_type):
        return self.selector(annotation, edge_index, torch.zeros_like(edge_type))


def train_ggnn(
    train_set: Deduction,
    val_set: Deduction,
    *,
    steps: int = 5,
    typed: bool = True,
    hidden_size: int = 16,
    seed: int = 0,
    updates: int = 200,
    lr: float = 1e-2,
    batch_size: int = 50,
    eval_every: int = 50,
) -> training.Run:
    """Train a node-selecting GG-NN with T = `steps` on `train_set` (Adam, minibatches of at
    most `batch_size` stories); validation accuracy is logged every `eval_every` updates.
    `typed=False` trains the ablation OneMatrixForEveryType instead, drawn from the same seed
    and trained on the same batches."""
    checks.integer("steps", steps)
    checks.boolean("typed", typed)
    checks.integer("updates", updates)
    checks.number("lr", lr, 0.0, low_open=True)
    checks.integer("batch_size", batch_size)
    with training.seeded(seed):
        if typed:
            model = ggnn.NodeSelector(1, hidden_size, len(EDGE_TYPES), steps)
        else:
            model = OneMatrixForEveryType(1, hidden_size, steps)
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

    def __init__(self, hidden_size: int = 32, embedding_size: int = 32):
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
    hidden_size: int = 32,
    seed: int = 0,
    updates: int = 400,
    lr: float = 1e-2,
    batch_size: int = 50,
    eval_every: int = 50,
) -> training.Run:
    """Train the LSTM baseline on the token sequences (Adam, cross-entropy over the symbols),
    validating every `eval_every` updates; the run ends with the weights of its best validation
    accuracy (early stopping: the first evaluation that reached it), its History complete."""
    checks.integer("updates", updates)
    checks.number("lr", lr, 0.0, low_open=True)
    checks.integer("batch_size", batch_size)
    with training.seeded(seed):
        model = FactsLSTM(hidden_size)
    n = len(train_set)
    batches = minibatches(n, min(batch_size, n), training.generator(seed, BATCHES))
    best = {"accuracy": -1.0, "state": None}

    def evaluate():
        accuracy = training.accuracy_of(model, val_set.tokens, val_set.answer_symbol)
        if accuracy > best["accuracy"]:
            best["accuracy"] = accuracy
            best["state"] = {k: v.clone() for k, v in model.state_dict().items()}
        return {"val_accuracy": accuracy}

    history = training.train_classifier(
        model,
        train_set.answer_symbol,
        torch.optim.Adam(model.parameters(), lr=lr),
        updates,
        batches=batches,
        logits_of=lambda index: model(train_set.tokens[index]),
        evaluate=evaluate,
        eval_every=eval_every,
        desc="LSTM",
    )
    model.load_state_dict(best["state"])
    return training.Run(model, history)


def best_validation(run: training.Run) -> tuple[float, int]:
    """The run's best validation accuracy and the update count that first reached it (the
    weights an early-stopped run ends with)."""
    values = run.history["val_accuracy"]
    i = max(range(len(values)), key=lambda j: (values[j], -j))
    return values[i], run.history.steps[i]


def lstm_grid(
    train_set: Deduction, val_set: Deduction, lrs, *, seed: int = 0, **settings
) -> dict[float, training.Run]:
    """One early-stopped LSTM run per learning rate, same seed, batches and budget."""
    return {lr: train_lstm(train_set, val_set, lr=lr, seed=seed, **settings) for lr in lrs}


def chosen_on_validation(runs: dict[float, training.Run]) -> float:
    """The setting whose run reached the best validation accuracy (the first, on a tie)."""
    return max(runs, key=lambda lr: best_validation(runs[lr])[0])


def names_a_species(model: nn.Module, task: Deduction) -> float:
    """Fraction of the stories whose answer from the sequence model is one of the story's four
    species (a right answer always is one), in eval mode."""
    with training.evaluating(model):
        guess = model(task.tokens).argmax(1, keepdim=True)
    return (task.symbols[:, N_ENTITIES:] == guess).any(1).float().mean().item()
