"""Broken gated graph networks: each patches the mechanism, papernotes.ggnn, where the chapter's
models compute their messages, their initial state or their propagation loop (the experiment,
papernotes.ggnn.experiment, builds its models through the module, so it runs the patched code)."""

import torch

from papernotes import ggnn as m

_messages = m.messages


def incoming_messages_dropped():
    """A node hears only the targets of its own edges (W_out): nothing travels along an edge."""

    def messages(h, edge_index, edge_type, incoming, outgoing):
        return _messages(h, edge_index, edge_type, torch.zeros_like(incoming), outgoing)

    m.messages = messages


def outgoing_messages_dropped():
    """A node hears only the sources of the edges that point at it (W_in): nothing travels
    against an edge."""

    def messages(h, edge_index, edge_type, incoming, outgoing):
        return _messages(h, edge_index, edge_type, incoming, torch.zeros_like(outgoing))

    m.messages = messages


def edges_treated_as_undirected():
    """One matrix per edge type for both directions, and the two directions summed: the model
    no longer knows which way an edge points."""

    def messages(h, edge_index, edge_type, incoming, outgoing):
        a = _messages(h, edge_index, edge_type, incoming, incoming)
        both = a[:, : h.shape[1]] + a[:, h.shape[1] :]
        return torch.cat([both, both], dim=1)

    m.messages = messages


def edge_types_ignored():
    """Every edge passes through the first type's matrices: the model no longer knows which
    relation an edge is, only its direction (the chapter's ablation, as a bug)."""

    def messages(h, edge_index, edge_type, incoming, outgoing):
        return _messages(h, edge_index, torch.zeros_like(edge_type), incoming, outgoing)

    m.messages = messages


def annotation_not_in_the_initial_state():
    """h(1) is all zeros: the annotation marking the question never enters the propagation."""

    def initial_state(annotation, hidden_size):
        return annotation.new_zeros(annotation.shape[0], hidden_size)

    m.initial_state = initial_state


def one_propagation_step_whatever_T():
    """The forward pass makes a single propagation round, whatever `steps` says."""

    def forward(self, annotation, edge_index, edge_type):
        m.check_graph(annotation, edge_index, edge_type, self.annotation_size)
        h = m.initial_state(annotation, self.hidden_size)
        return self.propagate(h, edge_index, edge_type)

    m.GGNN.forward = forward


MUTANTS = [
    incoming_messages_dropped,
    outgoing_messages_dropped,
    edges_treated_as_undirected,
    edge_types_ignored,
    annotation_not_in_the_initial_state,
    one_propagation_step_whatever_T,
]
