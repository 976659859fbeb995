"""Gated graph neural networks: GRU updates that pass messages along typed, directed edges.

Li, Tarlow, Brockschmidt & Zemel 2015, *Gated Graph Sequence Neural Networks* (ICLR 2016,
arXiv:1511.05493). A node's state starts from its annotation; for a fixed number T of steps every
node gathers its neighbours' states through matrices chosen by the edge's type and direction and
updates its own state with a GRU; the final states give a score per node (node selection) or a
gated readout per graph. The chapter (chapters/ggnn.ipynb, "The idea") derives the equations;
each is written again below, above the lines that compute it, in the paper's order (section 3:
eqs. 1-6, then the outputs of section 3.3 and eq. 7).

Several graphs are one graph with several disconnected parts: their nodes are stacked, the
edges renumbered, and `batch` (N,) names the graph of each node; messages are sums over
edge_index (index_add), so graphs never see one another.

The deduction task the chapter trains on, its sequence baseline and the training runs are in
`papernotes.ggnn.experiment`. Arguments are checked where they enter (constructors and forward
passes); the equations trust their input.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from papernotes import checks

# -- 1-3. The gated graph neural network -----------------------------------------------------------


def initial_state(annotation: torch.Tensor, hidden_size: int) -> torch.Tensor:
    """h_v(1) = [x_v, 0]: the annotation (N, A) padded with zeros to (N, D)."""
    # eq. 1: h_v^(1) = [x_v^T, 0]^T, so the question's marks are where propagation starts
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
    # eq. 2: a_v = [sum_{u -k-> v} W_in_k h_u ; sum_{v -k-> u} W_out_k h_u] (+ b, by the caller),
    # the paper's A_v:^T [h_1 ... h_|V|] with the sparse block matrix A read off the edge list.
    # Every node's state through every type's matrices once, (N, K, D); then one row per edge.
    # Along the edge: the target v hears its source u through W_in of the edge's type.
    along = torch.einsum("nd,kod->nko", h, incoming)[source, edge_type]
    # Against the edge: the source v hears its target u through W_out of the edge's type, so a
    # message also travels backwards, with its own parameters.
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
        # eq. 3: z_v = sigma(W^z a_v + U^z h_v), the update gate
        z = torch.sigmoid(self.W_z(a) + self.U_z(h))
        # eq. 4: r_v = sigma(W^r a_v + U^r h_v), the reset gate
        r = torch.sigmoid(self.W_r(a) + self.U_r(h))
        # eq. 5: h~_v = tanh(W a_v + U (r_v * h_v))
        candidate = torch.tanh(self.W(a) + self.U(r * h))
        # eq. 6: h_v^(t) = (1 - z_v) * h_v^(t-1) + z_v * h~_v (z = 1 takes the candidate: the
        # paper's convention, the opposite of torch's GRUCell)
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
        # eq. 2 with its bias: a_v^(t) = A_v:^T [h^(t-1)] + b
        a = messages(h, edge_index, edge_type, self.incoming, self.outgoing) + self.bias
        # eqs. 3-6
        return self.update(h, a)

    def forward(self, annotation, edge_index, edge_type):
        check_graph(annotation, edge_index, edge_type, self.annotation_size)
        if edge_type.numel() and (edge_type.min() < 0 or edge_type.max() >= self.num_edge_types):
            raise ValueError(f"edge_type must lie in [0, {self.num_edge_types - 1}]")
        h = initial_state(annotation, self.hidden_size)
        # T steps, a fixed number (not run to convergence), unrolled and trained by
        # backpropagation through all of them
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
        # section 3.3: o_v = g(h_v^(T), x_v)
        return self.g(torch.cat([h, annotation], dim=1)).squeeze(1)


def per_graph_log_softmax(scores: torch.Tensor, batch: torch.Tensor, num_graphs: int):
    """log softmax of node scores (N,) over the nodes of each graph (batch (N,) its graph id)."""
    # Node selection: log softmax_{v in G} o_v, over one graph's nodes only. Shifted by each
    # graph's largest score (a constant of the graph, so no gradient) to keep exp finite.
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
        # eq. 7: h_G = tanh(sum_v sigma(i(h_v, x_v)) * tanh(j(h_v, x_v))); sigma(i(.)) is a soft
        # attention that decides which nodes matter to the graph
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
