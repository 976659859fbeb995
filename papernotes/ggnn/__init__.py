r"""Gated graph neural networks: GRU updates that pass messages along typed, directed edges.

Li, Tarlow, Brockschmidt & Zemel 2015, *Gated Graph Sequence Neural Networks* (ICLR 2016,
arXiv:1511.05493). The module follows the paper's section 3 in order, then builds the bAbI-15
style deduction task the chapter trains on and the sequence model it is compared with.

1. **Initial state** (eq. 1). Every node $v$ carries an annotation $x_v \in \mathbb R^{A}$ (here:
   a bit marking the node the question asks about). The node's state starts as the annotation
   padded with zeros to the hidden size $D \ge A$:

   $$h_v^{(1)} = [\,x_v^\top,\ \mathbf 0\,]^\top.$$

2. **Propagation** (eq. 2). At each step a node gathers its neighbours' states through matrices
   chosen by the edge's type $k$ *and direction*: $A^{(\mathrm{in})}$ for the edges that point
   at $v$, $A^{(\mathrm{out})}$ for the edges that leave $v$ (so a message also travels
   backwards along an edge, with its own parameters),

   $$a_v^{(t)} = A_{v:}^\top\,[h_1^{(t-1)\top} \cdots h_{|V|}^{(t-1)\top}]^\top + b
     = \Big[\sum_{u \xrightarrow{k} v} W^{\mathrm{in}}_k h_u^{(t-1)} ;\
            \sum_{v \xrightarrow{k} u} W^{\mathrm{out}}_k h_u^{(t-1)}\Big] + b
     \ \in \mathbb R^{2D}.$$

3. **The GRU update** (eqs. 3-6), one per propagation step, with weights shared by all nodes:

   $$z_v = \sigma(W^z a_v + U^z h_v^{(t-1)}),\qquad r_v = \sigma(W^r a_v + U^r h_v^{(t-1)}),$$
   $$\tilde h_v = \tanh\big(W a_v + U (r_v \odot h_v^{(t-1)})\big),\qquad
     h_v^{(t)} = (1 - z_v) \odot h_v^{(t-1)} + z_v \odot \tilde h_v.$$

   $T$ steps, a fixed number, unrolled and trained by backpropagation through all of them.

4. **Outputs** (section 3.3). Per node, $o_v = g(h_v^{(T)}, x_v)$; for *node selection* the
   scores of one graph's nodes go through a softmax over that graph's nodes only. Per graph,
   the gated readout (eq. 7)

   $$h_{\mathcal G} = \tanh\Big(\sum_{v} \sigma\big(i(h_v^{(T)}, x_v)\big)
     \odot \tanh\big(j(h_v^{(T)}, x_v)\big)\Big),$$

   where $\sigma(i(\cdot))$ acts as a soft attention that decides which nodes matter.

Several graphs are one graph with several disconnected parts: their nodes are stacked, the
edges renumbered, and `batch` (N,) names the graph of each node; messages are sums over
edge_index (index_add), so graphs never see one another.

5. **The task**: bAbI-15-style deduction. Four entities and four species (eight of sixteen
   symbols); each entity *is* a species, each species *has fear of* another species; the
   question "what is entity e afraid of?" marks e in the annotations and is answered by
   selecting a node: the species feared by e's species, two hops from e. A sequence model
   reads the same facts as a token sequence and answers with a symbol.

Arguments are checked where they enter (constructors, forward passes, `deduction_task`,
`train_ggnn`, `train_lstm`); the equations trust their input.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from papernotes import checks
from papernotes.data import minibatches
from papernotes.training import History, accuracy, evaluating, generator, seeded, train

# The random streams of a run (papernotes.training.generator(seed, stream)).
TRAIN_STREAM, VALIDATION_STREAM, TEST_STREAM, BATCH_STREAM = 1, 2, 3, 4


# -- 1-3. The gated graph neural network -----------------------------------------------------------


def initial_state(annotation: torch.Tensor, hidden_size: int) -> torch.Tensor:
    """h_v(1) = [x_v, 0]: the annotation (N, A) padded with zeros to (N, D)."""
    return F.pad(annotation, (0, hidden_size - annotation.shape[1]))


def messages(
    h: torch.Tensor,
    edge_index: torch.Tensor,
    edge_type: torch.Tensor,
    incoming: torch.Tensor,
    outgoing: torch.Tensor,
) -> torch.Tensor:
    """[sum over u -k-> v of W_in[k] h_u ; sum over v -k-> u of W_out[k] h_u], shape (N, 2D).

    h (N, D); edge_index (2, E), source then target; edge_type (E,); incoming and outgoing
    (K, D, D), one matrix per edge type. The bias b is added by the caller.
    """
    source, target = edge_index
    # Every node's state through every type's matrices once, (N, K, D); then one row per edge.
    # Along the edge: the target v hears its source u through W_in of the edge's type.
    along = torch.einsum("nd,kod->nko", h, incoming)[source, edge_type]
    # Against the edge: the source v hears its target u through W_out of the edge's type.
    against = torch.einsum("nd,kod->nko", h, outgoing)[target, edge_type]
    a_in = h.new_zeros(h.shape).index_add(0, target, along)
    a_out = h.new_zeros(h.shape).index_add(0, source, against)
    return torch.cat([a_in, a_out], dim=1)


class GRUUpdate(nn.Module):
    """h(t) from h(t-1) (N, D) and a (N, 2D), eqs. 3-6 of the paper (its gate convention)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        D = hidden_size
        self.W_z, self.W_r, self.W = (nn.Linear(2 * D, D) for _ in range(3))
        self.U_z, self.U_r, self.U = (nn.Linear(D, D, bias=False) for _ in range(3))

    def forward(self, h: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        z = torch.sigmoid(self.W_z(a) + self.U_z(h))  # update gate
        r = torch.sigmoid(self.W_r(a) + self.U_r(h))  # reset gate
        candidate = torch.tanh(self.W(a) + self.U(r * h))
        return (1 - z) * h + z * candidate


def check_graph(annotation, edge_index, edge_type, annotation_size=None) -> tuple[int, int]:
    """Check a (batched) graph's tensors; return (number of nodes, number of edges)."""
    sizes = {} if annotation_size is None else {"A": annotation_size}
    n = checks.tensor("annotation", annotation, "(N, A)", dtype="floating", **sizes)["N"]
    e = checks.tensor("edge_index", edge_index, "(2, E)", dtype=torch.long)["E"]
    checks.tensor("edge_type", edge_type, "(E,)", dtype=torch.long, E=e)
    if e and (edge_index.min() < 0 or edge_index.max() >= n):
        raise ValueError(f"edge_index must name nodes in [0, {n - 1}]; got values outside it")
    return n, e


class GGNN(nn.Module):
    """The gated graph neural network: `steps` rounds of typed, directed messages and GRU updates.

    forward(annotation (N, A), edge_index (2, E) long, source then target, edge_type (E,) long)
    returns the node states h(T) (N, D). Each edge type k has two D x D matrices, `incoming[k]`
    (messages along the edge, to its target) and `outgoing[k]` (messages against it, to its
    source); `bias` is the paper's b (2D,).
    """

    def __init__(self, annotation_size: int, hidden_size: int, num_edge_types: int, steps: int):
        super().__init__()
        self.annotation_size = checks.integer("annotation_size", annotation_size)
        self.hidden_size = checks.integer("hidden_size", hidden_size)
        if hidden_size < annotation_size:
            raise ValueError(
                f"hidden_size must be at least annotation_size ({annotation_size}): h(1) is the "
                f"annotation padded with zeros; got {hidden_size}"
            )
        self.num_edge_types = checks.integer("num_edge_types", num_edge_types)
        self.steps = checks.integer("steps", steps)
        D, K = hidden_size, num_edge_types
        self.incoming = nn.Parameter(torch.randn(K, D, D) / D**0.5)
        self.outgoing = nn.Parameter(torch.randn(K, D, D) / D**0.5)
        self.bias = nn.Parameter(torch.zeros(2 * D))
        self.update = GRUUpdate(hidden_size)

    def propagate(self, h, edge_index, edge_type):
        """One propagation step: a(t) from h(t-1), then the GRU update."""
        a = messages(h, edge_index, edge_type, self.incoming, self.outgoing) + self.bias
        return self.update(h, a)

    def forward(self, annotation, edge_index, edge_type):
        check_graph(annotation, edge_index, edge_type, self.annotation_size)
        if edge_type.numel() and (edge_type.min() < 0 or edge_type.max() >= self.num_edge_types):
            raise ValueError(f"edge_type must lie in [0, {self.num_edge_types - 1}]")
        h = initial_state(annotation, self.hidden_size)
        for _ in range(self.steps):
            h = self.propagate(h, edge_index, edge_type)
        return h


# -- 4. Outputs: per node (node selection) and per graph (gated readout) -----------------------


class NodeOutput(nn.Module):
    """o_v = g(h_v(T), x_v): a score per node from its final state and its annotation, (N,)."""

    def __init__(self, hidden_size: int, annotation_size: int):
        super().__init__()
        checks.integer("hidden_size", hidden_size)
        checks.integer("annotation_size", annotation_size)
        self.g = nn.Sequential(
            nn.Linear(hidden_size + annotation_size, hidden_size),
            nn.Tanh(),
            nn.Linear(hidden_size, 1),
        )

    def forward(self, h, annotation):
        return self.g(torch.cat([h, annotation], dim=1)).squeeze(1)


def per_graph_log_softmax(scores: torch.Tensor, batch: torch.Tensor, num_graphs: int):
    """log softmax of node scores (N,) over the nodes of each graph (batch (N,) its graph id)."""
    top = scores.new_full((num_graphs,), -torch.inf).scatter_reduce(0, batch, scores, "amax")
    shifted = scores - top[batch].detach()
    total = scores.new_zeros(num_graphs).index_add(0, batch, shifted.exp())
    return shifted - total.log()[batch]


class GatedReadout(nn.Module):
    """h_G = tanh(sum_v sigmoid(i(h_v, x_v)) * tanh(j(h_v, x_v))) per graph (eq. 7), (G, O)."""

    def __init__(self, hidden_size: int, annotation_size: int, output_size: int):
        super().__init__()
        checks.integer("hidden_size", hidden_size)
        checks.integer("annotation_size", annotation_size)
        checks.integer("output_size", output_size)
        self.i = nn.Linear(hidden_size + annotation_size, output_size)
        self.j = nn.Linear(hidden_size + annotation_size, output_size)

    def forward(self, h, annotation, batch, num_graphs: int):
        n = checks.tensor("h", h, "(N, D)", dtype="floating")["N"]
        checks.tensor("annotation", annotation, "(N, A)", N=n)
        checks.tensor("batch", batch, "(N,)", dtype=torch.long, N=n)
        checks.integer("num_graphs", num_graphs)
        hx = torch.cat([h, annotation], dim=1)
        gated = torch.sigmoid(self.i(hx)) * torch.tanh(self.j(hx))
        summed = hx.new_zeros(num_graphs, gated.shape[1]).index_add(0, batch, gated)
        return torch.tanh(summed)


class NodeSelector(nn.Module):
    """A GG-NN with a node-selection output: scores (N,) for the nodes of a batch of graphs."""

    def __init__(self, annotation_size: int, hidden_size: int, num_edge_types: int, steps: int):
        super().__init__()
        self.ggnn = GGNN(annotation_size, hidden_size, num_edge_types, steps)
        self.output = NodeOutput(hidden_size, annotation_size)

    def forward(self, annotation, edge_index, edge_type):
        return self.output(self.ggnn(annotation, edge_index, edge_type), annotation)


# -- 5. The task: bAbI-15-style deduction ---------------------------------------------------------

N_SYMBOLS = 16  # names for entities and species
N_ENTITIES = N_SPECIES = 4
N_NODES = N_ENTITIES + N_SPECIES  # a graph's nodes: its entities first, then its species
IS, HAS_FEAR = 0, 1  # edge types
EDGE_TYPES = ("is", "has_fear")
# The sequence model's vocabulary: the symbols, then the two relations and the question mark.
IS_TOKEN, FEAR_TOKEN, QUESTION_TOKEN = N_SYMBOLS, N_SYMBOLS + 1, N_SYMBOLS + 2
VOCABULARY = N_SYMBOLS + 3


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

    def graphs(self, index: torch.Tensor | None = None):
        """Stories `index` (all by default) as one disconnected graph: annotation (N, 1),
        edge_index (2, E), edge_type (E,), batch (N,) and answer (G,) as node numbers."""
        index = torch.arange(len(self)) if index is None else index
        g = index.shape[0]
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
    g = generator(seed, stream)
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


def selection_credit(scores, batch, answer, num_graphs: int) -> torch.Tensor:
    """Per graph, the chance that picking the highest-scoring node, ties broken at random,
    picks the answer (G,): 1 / (number of nodes tied at the top) if the answer is among them."""
    top = scores.new_full((num_graphs,), -torch.inf).scatter_reduce(0, batch, scores, "amax")
    at_top = (scores == top[batch]).to(scores.dtype)
    tied = scores.new_zeros(num_graphs).index_add(0, batch, at_top)
    return at_top[answer] / tied


def ggnn_accuracy(model: NodeSelector, task: Deduction) -> float:
    """Fraction of stories whose answer node the model selects (a tie of k nodes at the top
    that includes the answer counts 1/k: the accuracy of breaking ties at random)."""
    annotation, edge_index, edge_type, batch, answer = task.graphs()
    with evaluating(model):
        scores = model(annotation, edge_index, edge_type)
    return selection_credit(scores, batch, answer, len(task)).mean().item()


@dataclass(frozen=True)
class Run:
    """A trained model and the History of its training."""

    model: nn.Module
    history: History


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
) -> Run:
    """Train a node-selecting GG-NN with T = `steps` on `train_set` (Adam, minibatches of at
    most `batch_size` stories); validation accuracy is logged every `eval_every` updates."""
    checks.integer("steps", steps)
    checks.integer("updates", updates)
    checks.number("lr", lr, 0.0, low_open=True)
    checks.integer("batch_size", batch_size)
    with seeded(seed):
        model = NodeSelector(1, hidden_size, len(EDGE_TYPES), steps)
    n = len(train_set)
    batches = minibatches(n, min(batch_size, n), generator(seed, BATCH_STREAM))

    def loss_of_update(_):
        annotation, edge_index, edge_type, batch, answer = train_set.graphs(next(batches))
        scores = model(annotation, edge_index, edge_type)
        return -per_graph_log_softmax(scores, batch, answer.shape[0])[answer].mean()

    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    history = train(
        model,
        optimizer,
        loss_of_update,
        updates,
        eval_every=eval_every,
        evaluate=lambda: {"val_accuracy": ggnn_accuracy(model, val_set)},
        desc="GG-NN",
    )
    return Run(model, history)


# -- 6. The sequence baseline: an LSTM over the facts as text ----------------------------------


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


def lstm_accuracy(model: FactsLSTM, task: Deduction) -> float:
    with evaluating(model):
        return accuracy(model(task.tokens), task.answer_symbol)


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
) -> Run:
    """Train the LSTM baseline on the token sequences (Adam, cross-entropy over the symbols)."""
    checks.integer("updates", updates)
    checks.number("lr", lr, 0.0, low_open=True)
    checks.integer("batch_size", batch_size)
    with seeded(seed):
        model = FactsLSTM(hidden_size)
    n = len(train_set)
    batches = minibatches(n, min(batch_size, n), generator(seed, BATCH_STREAM))

    def loss_of_update(_):
        index = next(batches)
        return F.cross_entropy(model(train_set.tokens[index]), train_set.answer_symbol[index])

    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    history = train(
        model,
        optimizer,
        loss_of_update,
        updates,
        eval_every=eval_every,
        evaluate=lambda: {"val_accuracy": lstm_accuracy(model, val_set)},
        desc="LSTM",
    )
    return Run(model, history)
