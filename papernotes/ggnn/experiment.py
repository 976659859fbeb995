"""The ggnn chapter's experiment: bAbI-15-style deduction stories, as graphs and as text; the
GG-NN that selects the answer node and the LSTM that reads the facts; their training runs and
measurements.

The task: four entities and four species (eight of sixteen symbols); each entity *is* a
species, each species *has fear of* another species and *likes* a third; the question "what is
entity e afraid of?" marks e in the annotations and is answered by selecting a node: the species
feared by e's species, two hops from e. In the graph an *is* fact is an edge from the species to
its entity (a *has member* edge), so the path from the question to the answer runs once against
an edge and once along one. A sequence model reads the same facts as a token sequence and
answers with a symbol.

The ablations of the paper's choices (one matrix for every edge type, an ungated update,
gradients through the last round only) are a second implementation of the equations,
`AblatedGGNN`, with code of its own, so that a bug in the mechanism cannot reach them.

The mechanism is `papernotes.ggnn`, called through the module (`ggnn.NodeSelector(...)`) so that
a mutant patched onto it reaches these runs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from papernotes import checks, ggnn, training
from papernotes.data import minibatches

# The random streams of a run (papernotes.training.generator(seed, stream)).
TRAIN, VALIDATION, TEST, BATCHES = 1, 2, 3, 4


# -- The task: bAbI-15-style deduction, with a distractor relation ---------------------------

N_SYMBOLS = 16  # names for entities and species
N_ENTITIES = N_SPECIES = 4
N_NODES = N_ENTITIES + N_SPECIES  # a graph's nodes: its entities first, then its species
MEMBER, HAS_FEAR, LIKES = 0, 1, 2  # edge types: species -> entity, species -> species (twice)
EDGE_TYPES = ("has member", "has fear", "likes")
N_FACTS = N_ENTITIES + 2 * N_SPECIES  # an "is" per entity, a "fears" and a "likes" per species
# The sequence model's vocabulary: the symbols, then the three relations and the question mark.
IS_TOKEN, FEAR_TOKEN, LIKE_TOKEN, QUESTION_TOKEN = range(N_SYMBOLS, N_SYMBOLS + 4)
VOCABULARY = N_SYMBOLS + 4
NAMES = "ABCDEFGHIJKLMNOP"  # how a story prints its symbols


@dataclass(frozen=True)
class Deduction:
    """n deduction stories, each as a graph and as a token sequence.

    Graphs, per story: annotation (n, 8, 1) (1 at the queried entity), edges (n, 12, 2) (source,
    target, local node numbers: the four "has member" edges, species to entity, one per entity
    in the entities' order, then the four "has fear", then the four "likes"), edge_type (n, 12),
    answer (n,) (the local number of the feared species).
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
    # "e is s" as an edge s -has member-> e: the question's entity reaches its species against
    # the edge, and the species its fear along one.
    member_edges = torch.stack([species_of + N_ENTITIES, entity_nodes], dim=2)
    fear_edges = torch.stack([species_nodes, fears + N_ENTITIES], dim=2)
    like_edges = torch.stack([species_nodes, likes + N_ENTITIES], dim=2)
    edges = torch.cat([member_edges, fear_edges, like_edges], dim=1)
    edge_type = torch.cat(
        [
            torch.full((n, N_ENTITIES), MEMBER),
            torch.full((n, N_SPECIES), HAS_FEAR),
            torch.full((n, N_SPECIES), LIKES),
        ],
        dim=1,
    )
    annotation = torch.zeros(n, N_NODES, 1)
    annotation[rows, query, 0] = 1.0
    # The answer is two hops from the question: entity <-has member- species -has fear-> answer.
    answer = fears[rows, species_of[rows, query]] + N_ENTITIES

    # The same story as text: "<entity> is <species>", "<species> fears <species>",
    # "<species> likes <species>", shuffled, then "? <entity>".
    # A fact's subject and object: the edge's ends, an "is" fact's read against its edge.
    relation = torch.tensor([IS_TOKEN, FEAR_TOKEN, LIKE_TOKEN])[edge_type]
    subject, object_ = edges[..., 0].clone(), edges[..., 1].clone()
    subject[:, :N_ENTITIES], object_[:, :N_ENTITIES] = entity_nodes, species_of + N_ENTITIES
    triples = torch.stack([symbols.gather(1, subject), relation, symbols.gather(1, object_)], dim=2)
    order = torch.stack([torch.randperm(N_FACTS, generator=g) for _ in range(n)])
    triples = triples[rows.unsqueeze(1), order].reshape(n, -1)
    question = torch.stack([torch.full((n,), QUESTION_TOKEN), symbols[rows, query]], dim=1)
    tokens = torch.cat([triples, question], dim=1)
    return Deduction(annotation, edges, edge_type, answer, symbols, tokens, symbols[rows, answer])


def relations_swapped(task: Deduction) -> Deduction:
    """The same stories with "has fear" and "likes" swapped, in the graphs and in the text:
    each becomes another story of the task, as likely, whose answer is the species that was
    liked. The two graphs differ only in the names of their edges' types."""
    member_edges, fear_edges, like_edges = task.edges.split([N_ENTITIES, N_SPECIES, N_SPECIES], 1)
    # The liked species' edges become the "has fear" edges (edge_type's layout is unchanged).
    edges = torch.cat([member_edges, like_edges, fear_edges], dim=1)
    rows = torch.arange(len(task))
    species = species_of_query(task)
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


def edges_reversed(task: Deduction) -> Deduction:
    """The same stories with every edge of their graphs pointing the other way (types, answers
    and text unchanged): a model blind to direction scores them exactly as the originals."""
    return dataclasses.replace(task, edges=task.edges.flip(2))


def species_of_query(task: Deduction) -> torch.Tensor:
    """The local node number of the queried entity's species, per story (n,): the source of the
    entity's "has member" edge."""
    rows = torch.arange(len(task))
    return task.edges[rows, task.annotation[:, :, 0].argmax(1), 0]


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


def selection_credits(model: nn.Module, task: Deduction) -> torch.Tensor:
    """Per story, the credit of the model's selection (n,): 1 if the answer alone gets the top
    score, 1/k if it is among k nodes tied at the top, 0 otherwise; in eval mode."""
    annotation, edge_index, edge_type, batch, answer = task.graphs()
    with training.evaluating(model):
        scores = model(annotation, edge_index, edge_type)
    return selection_credit(scores, batch, answer, len(task))


def ggnn_accuracy(model: nn.Module, task: Deduction) -> float:
    """Fraction of stories whose answer node the model selects (a tie of k nodes at the top
    that includes the answer counts 1/k: the accuracy of breaking ties at random)."""
    return selection_credits(model, task).mean().item()


def paired_standard_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """The standard error of mean(a) - mean(b) for per-story scores of two models on the same
    stories (n,): the standard deviation of the differences over sqrt(n)."""
    n = checks.tensor("a", a, "(N,)")["N"]
    checks.tensor("b", b, "(N,)", N=n)
    if n < 2:
        raise ValueError("a paired standard error needs at least two stories")
    return ((a - b).double().std() / n**0.5).item()


class BestWeights:
    """Keeps a copy of the model's weights at its best validation score so far (the first
    evaluation that reached it): early stopping, as the authors' released code keeps the
    checkpoint of its best validation error."""

    def __init__(self, model: nn.Module):
        self.model, self.score, self.state = model, -float("inf"), None

    def __call__(self, score: float) -> float:
        if score > self.score:
            self.score = score
            self.state = {k: v.clone() for k, v in self.model.state_dict().items()}
        return score

    def restore(self) -> None:
        self.model.load_state_dict(self.state)


def train_node_selector(
    model: nn.Module,
    train_set: Deduction,
    val_set: Deduction,
    log_softmax,
    *,
    seed: int,
    updates: int,
    lr: float,
    batch_size: int,
    eval_every: int,
    desc: str,
) -> training.Run:
    """Train a node-selecting model on `train_set` (Adam, minibatches of at most `batch_size`
    stories drawn from generator(seed, BATCHES)); validation accuracy is logged every
    `eval_every` updates, and the run ends with the weights of its best validation accuracy
    (BestWeights), its History complete. `log_softmax(scores, batch, num_graphs)` normalises
    the scores over each story's nodes; the loss is the cross-entropy of that softmax at the
    answer (over a story's nodes, not over a fixed set of classes, hence training.train rather
    than train_classifier)."""
    checks.integer("updates", updates)
    checks.number("lr", lr, 0.0, low_open=True)
    checks.integer("batch_size", batch_size)
    n = len(train_set)
    batches = minibatches(n, min(batch_size, n), training.generator(seed, BATCHES))

    def loss_of_update(_):
        annotation, edge_index, edge_type, batch, answer = train_set.graphs(next(batches))
        scores = model(annotation, edge_index, edge_type)
        return -log_softmax(scores, batch, answer.shape[0])[answer].mean()

    best = BestWeights(model)
    history = training.train(
        model,
        torch.optim.Adam(model.parameters(), lr=lr),
        loss_of_update,
        updates,
        eval_every=eval_every,
        evaluate=lambda: {"val_accuracy": best(ggnn_accuracy(model, val_set))},
        desc=desc,
    )
    best.restore()
    return training.Run(model, history)


def train_ggnn(
    train_set: Deduction,
    val_set: Deduction,
    *,
    steps: int = 5,
    hidden_size: int = 16,
    seed: int = 0,
    updates: int = 100,
    lr: float = 1e-2,
    batch_size: int = 50,
    eval_every: int = 50,
) -> training.Run:
    """Train the paper's node-selecting GG-NN (papernotes.ggnn.NodeSelector) with T = `steps`
    rounds on `train_set`, its initial weights drawn from `seed`."""
    checks.integer("steps", steps)
    with training.seeded(seed):
        model = ggnn.NodeSelector(1, hidden_size, len(EDGE_TYPES), steps)
    return train_node_selector(
        model,
        train_set,
        val_set,
        ggnn.per_graph_log_softmax,
        seed=seed,
        updates=updates,
        lr=lr,
        batch_size=batch_size,
        eval_every=eval_every,
        desc="GG-NN",
    )


# -- The ablations: the equations written a second time, with the dense matrix A ---------------


class AblatedGGNN(nn.Module):
    """A node-selecting GG-NN written apart from papernotes.ggnn, for the chapter's ablations:
    the messages go through the dense matrix A of the paper's Figure 1 (one adjacency matrix per
    edge type and direction), with its own GRU, output network and softmax, so that a bug of the
    mechanism cannot reach it. With every setting at True it computes what ggnn.NodeSelector
    computes (a unit test gives both the same weights); each False removes one of the paper's
    choices:

    - typed=False: one pair of matrices (W_in, W_out) for every edge type, directions kept;
    - gated=False: the update h(t) = tanh(W a(t) + U h(t-1)) instead of the GRU's gates;
    - every_round=False: gradients through the last round only, the earlier rounds run as
      constants (the paper trains by backpropagation through all T rounds).
    """

    def __init__(
        self,
        hidden_size: int,
        steps: int,
        *,
        typed: bool = True,
        gated: bool = True,
        every_round: bool = True,
    ):
        super().__init__()
        self.hidden_size = D = checks.integer("hidden_size", hidden_size)
        self.steps = checks.integer("steps", steps)
        self.typed = checks.boolean("typed", typed)
        self.gated = checks.boolean("gated", gated)
        self.every_round = checks.boolean("every_round", every_round)
        K = len(EDGE_TYPES) if typed else 1
        self.incoming = nn.Parameter(torch.randn(K, D, D) / D**0.5)
        self.outgoing = nn.Parameter(torch.randn(K, D, D) / D**0.5)
        self.bias = nn.Parameter(torch.zeros(2 * D))
        gates = ("z", "r", "candidate") if gated else ("candidate",)
        self.from_messages = nn.ModuleDict({g: nn.Linear(2 * D, D) for g in gates})
        self.from_state = nn.ModuleDict({g: nn.Linear(D, D, bias=False) for g in gates})
        self.output = nn.Sequential(nn.Linear(D + 1, D), nn.Tanh(), nn.Linear(D, 1))

    def adjacency(self, n: int, edge_index, edge_type) -> torch.Tensor:
        """(G, K, 8, 8), one block per story of N_NODES nodes (the stories of a batch are
        numbered in blocks, as Deduction.graphs numbers them): entry [g, k, v, u] counts the
        edges u -k-> v of story g, the blocks of the paper's matrix A that are not zero."""
        source, target = edge_index
        kinds = edge_type if self.typed else torch.zeros_like(edge_type)
        A = self.bias.new_zeros(n // N_NODES, self.incoming.shape[0], N_NODES, N_NODES)
        ones = self.bias.new_ones(source.shape[0])
        index = (source // N_NODES, kinds, target % N_NODES, source % N_NODES)
        return A.index_put_(index, ones, accumulate=True)

    def round(self, h, A):
        # a_v = [sum_k sum_u A_k[v, u] W_in_k h_u ; sum_k sum_u A_k[u, v] W_out_k h_u] + b,
        # story by story (h: (G, 8, D)): the same messages as eq. 2
        spread = torch.stack([h @ W.T for W in self.incoming], 1)  # (G, K, 8, D)
        a_in = (A @ spread).sum(1)
        spread = torch.stack([h @ W.T for W in self.outgoing], 1)
        a_out = (A.transpose(2, 3) @ spread).sum(1)
        a = torch.cat([a_in, a_out], dim=2) + self.bias
        W, U = self.from_messages, self.from_state
        if not self.gated:
            return torch.tanh(W["candidate"](a) + U["candidate"](h))
        z = torch.sigmoid(W["z"](a) + U["z"](h))
        r = torch.sigmoid(W["r"](a) + U["r"](h))
        return (1 - z) * h + z * torch.tanh(W["candidate"](a) + U["candidate"](r * h))

    def forward(self, annotation, edge_index, edge_type):
        n = annotation.shape[0]
        if n % N_NODES:
            raise ValueError(f"the ablation reads stories of {N_NODES} nodes; got {n} nodes")
        A = self.adjacency(n, edge_index, edge_type)
        x = annotation.view(n // N_NODES, N_NODES, -1)
        h = torch.cat([x, x.new_zeros(*x.shape[:2], self.hidden_size - x.shape[2])], dim=2)
        for t in range(self.steps):
            with torch.set_grad_enabled(torch.is_grad_enabled() and self.through(t)):
                h = self.round(h, A)
        return self.output(torch.cat([h, x], dim=2)).reshape(n)

    def through(self, t: int) -> bool:
        """Whether gradients flow through round t (0-based)."""
        return self.every_round or t == self.steps - 1


def story_log_softmax(scores, batch, num_graphs: int):
    """log softmax over each story's eight nodes, written apart from the mechanism's (stories
    are numbered in blocks of N_NODES)."""
    return scores.view(num_graphs, N_NODES).log_softmax(1).reshape(-1)


def train_ablation(
    train_set: Deduction,
    val_set: Deduction,
    *,
    steps: int = 5,
    typed: bool = True,
    gated: bool = True,
    every_round: bool = True,
    hidden_size: int = 16,
    seed: int = 0,
    updates: int = 100,
    lr: float = 1e-2,
    batch_size: int = 50,
    eval_every: int = 50,
) -> training.Run:
    """Train an AblatedGGNN as train_ggnn trains the paper's, on the same batches."""
    with training.seeded(seed):
        model = AblatedGGNN(hidden_size, steps, typed=typed, gated=gated, every_round=every_round)
    return train_node_selector(
        model,
        train_set,
        val_set,
        story_log_softmax,
        seed=seed,
        updates=updates,
        lr=lr,
        batch_size=batch_size,
        eval_every=eval_every,
        desc="ablation",
    )


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
    best = BestWeights(model)

    def evaluate():
        return {"val_accuracy": best(lstm_accuracy(model, val_set))}

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
    best.restore()
    return training.Run(model, history)


def lstm_correct(model: nn.Module, task: Deduction) -> torch.Tensor:
    """Per story, 1.0 if the sequence model names the answer's symbol, else 0.0 (n,)."""
    with training.evaluating(model):
        return (model(task.tokens).argmax(1) == task.answer_symbol).float()


def lstm_accuracy(model: nn.Module, task: Deduction) -> float:
    """Fraction of stories whose answer symbol the sequence model names, in eval mode."""
    return lstm_correct(model, task).mean().item()


def most_frequent_answer(train_set: Deduction, task: Deduction) -> float:
    """The accuracy on `task` of always naming the symbol that answers most training stories
    (the first, on a tie): a rule that reads nothing of the story."""
    counts = torch.bincount(train_set.answer_symbol, minlength=N_SYMBOLS)
    return (task.answer_symbol == counts.argmax()).float().mean().item()


def best_validation(run: training.Run) -> tuple[float, int]:
    """The run's best validation accuracy and the update count that first reached it (the
    weights an early-stopped run ends with)."""
    values = run.history["val_accuracy"]
    i = max(range(len(values)), key=lambda j: (values[j], -j))
    return values[i], run.history.steps[i]


def chosen_on_validation(runs: dict[float, training.Run]) -> float:
    """The setting whose run reached the best validation accuracy; on a tie, the one whose
    validation accuracy is higher on average over the run's evaluations (the faster learner),
    then the first."""
    return max(
        runs, key=lambda lr: (best_validation(runs[lr])[0], runs[lr].history.mean("val_accuracy"))
    )


def names_a_species(model: nn.Module, task: Deduction) -> float:
    """Fraction of the stories whose answer from the sequence model is one of the story's four
    species (a right answer always is one), in eval mode."""
    with training.evaluating(model):
        guess = model(task.tokens).argmax(1, keepdim=True)
    return (task.symbols[:, N_ENTITIES:] == guess).any(1).float().mean().item()


# -- What a sequence output would cost: multiply-adds of one training update ------------------


def multiply_adds(loss_of) -> int:
    """The multiply-adds of one training update's forward and backward pass, `loss_of()`
    returning the scalar loss: the matrix products torch's FLOP counter sees (two FLOPs a
    multiply-add), a count that is the same on every CPU; element-wise work (gates, softmax,
    index sums) is left out."""
    with FlopCounterMode(display=False) as counter:
        loss_of().backward()
    return counter.get_total_flops() // 2


def update_multiply_adds(model: nn.Module, task: Deduction, batch_size: int, log_softmax) -> int:
    """Multiply-adds of one training update of a node-selecting model (train_node_selector's
    loss) on the first `batch_size` stories of the task (its backward pass fills the model's
    gradients: give it a network of the run's shape, not a trained one)."""
    batch_size = checks.integer("batch_size", batch_size)
    if batch_size > len(task):
        raise ValueError(f"batch_size must be at most the task's {len(task)} stories")
    annotation, edge_index, edge_type, batch, answer = task.graphs(torch.arange(batch_size))

    def loss():
        scores = model(annotation, edge_index, edge_type)
        return -log_softmax(scores, batch, answer.shape[0])[answer].mean()

    return multiply_adds(loss)


def ring_graphs(graphs: int, nodes: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`graphs` rings of `nodes` nodes as one disconnected graph, every edge listed both ways
    (the released graph tasks list each edge of their Watts-Strogatz graphs, a ring before
    rewiring, in both directions): edge_index (2, E), edge_type (E,) zeros, batch (N,)."""
    graphs, nodes = checks.integer("graphs", graphs), checks.integer("nodes", nodes)
    node = torch.arange(graphs * nodes)
    succ = node // nodes * nodes + (node + 1) % nodes
    edge_index = torch.cat([torch.stack([node, succ]), torch.stack([succ, node])], dim=1)
    return edge_index, torch.zeros(edge_index.shape[1], dtype=torch.long), node // nodes


def ggsnn_update_multiply_adds(
    *,
    graphs: int,
    nodes: int,
    output_steps: int,
    steps: int,
    hidden_size: int,
    annotation_size: int,
) -> int:
    """A lower bound on the multiply-adds of one GGS-NN training update (the paper's section
    4): every output step is a propagation of `steps` rounds followed by the node-selection
    output F_o, here `graphs` ring graphs of `nodes` nodes with one edge type, counted as
    `output_steps` updates of ggnn.NodeSelector. The annotation network F_x, which a GGS-NN runs
    after every output step but the last, is left out, so the true count is higher."""
    output_steps = checks.integer("output_steps", output_steps)
    edge_index, edge_type, batch = ring_graphs(graphs, nodes)
    with training.seeded(0):  # the initial weights do not change the count
        model = ggnn.NodeSelector(annotation_size, hidden_size, 1, steps)
    annotation = torch.zeros(graphs * nodes, annotation_size)
    answer = torch.arange(graphs) * nodes

    def loss():
        scores = model(annotation, edge_index, edge_type)
        return -ggnn.per_graph_log_softmax(scores, batch, graphs)[answer].mean()

    return output_steps * multiply_adds(loss)


def run_cost(
    task: Deduction, *, steps: int, stories: int, updates: int, hidden_size: int = 16, **removed
) -> tuple[int, int]:
    """(sequential propagation rounds, multiply-adds) of one training run of `updates` updates
    on batches of `stories` stories of the task: train_ggnn's network, or with `removed` (typed,
    gated or every_round set to False) train_ablation's. Evaluations are not counted."""
    updates = checks.integer("updates", updates)
    with training.seeded(0):  # a network of the run's shape; its weights do not change the count
        if removed:
            model = AblatedGGNN(hidden_size, steps, **removed)
            log_softmax = story_log_softmax
        else:
            model = ggnn.NodeSelector(1, hidden_size, len(EDGE_TYPES), steps)
            log_softmax = ggnn.per_graph_log_softmax
    return updates * steps, updates * update_multiply_adds(model, task, stories, log_softmax)
