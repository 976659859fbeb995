"""Observational dropout: a world model that nobody trains to predict.

Freeman, Metz & Ha 2019, *Learning to Predict Without Looking Ahead: World Models Without Forward
Prediction*, NeurIPS (arXiv:1910.13038). An agent that may look at the world only now and then
(it *peeks* with probability p) is shown, at the other steps, the output of its own world model;
trained on its task alone, with no loss that compares the model with the world, the model learns
to forecast the next observation because the task goes better when it does. The chapter
(chapters/observational_dropout.ipynb, "The idea") derives the set-up; this module holds the
agent (controller and world model), the peeks and the roll-out that cuts the agent off from the
world, and the task loss, in that order. The environment, the training runs and the
measurements of the emergent model are in `papernotes.observational_dropout.experiment`.

Entry points check their arguments (`WorldModel`, `peek_mask`, `rollout`); the helpers below
them (`unroll`, which the chapter shows, and `next_seen`) trust their input. Functions read each
other from the module's globals when called, and the experiment calls them through the module,
so a patched module (tests/mutants/observational_dropout.py) is seen everywhere.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from papernotes import checks

OBS = 2  # (position, velocity)

# -- the agent ------------------------------------------------------------------------------------


class Controller(nn.Module):
    """C: the agent's report of the position from the position it sees (the paper's C is a small
    tanh network of the cart-pole's whole observation)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(1, 1)
        with torch.no_grad():  # it starts by reporting the centre, whatever it sees
            self.linear.weight.zero_()
            self.linear.bias.zero_()

    def forward(self, seen: torch.Tensor) -> torch.Tensor:
        # a_t = w x^_t + b (the linear layer's one weight and bias, without its call overhead:
        # the roll-out calls this at every step)
        return seen[..., 0] * self.linear.weight[0, 0] + self.linear.bias[0]


class WorldModel(nn.Module):
    """M: an observation and an action to the next observation. Nothing in it or in its training
    says "predict"."""

    def __init__(self, hidden: int = 32):
        super().__init__()
        hidden = checks.integer("hidden", hidden)
        self.net = nn.Sequential(nn.Linear(OBS + 1, hidden), nn.Tanh(), nn.Linear(hidden, OBS))

    def forward(self, seen: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        first, second = self.net[0], self.net[2]
        # M(o, a) = o + W_2 tanh(W_1 [o, a] + b_1) + b_2 (the layers of `net`, called directly:
        # the roll-out calls this at every step)
        hidden = torch.tanh(
            F.linear(torch.cat([seen, action.unsqueeze(-1)], -1), *first.parameters())
        )
        return seen + F.linear(hidden, *second.parameters())


# -- observational dropout ------------------------------------------------------------------------


def peek_mask(n: int, steps: int, p: float, gen: torch.Generator) -> torch.Tensor:
    """Which steps the agent peeks at, (n, steps) booleans, from `gen`."""
    n, steps = checks.integer("n", n), checks.integer("steps", steps)
    p = checks.number("p", p, 0.0, 1.0)
    # every later step with probability p; step 0 always (the agent starts from a real
    # observation)
    peeks = torch.rand(n, steps, generator=gen) < p
    peeks[:, 0] = True
    return peeks


def rollout(controller, model, observations, peeks):
    """Run the agent through episodes; returns its actions (B, T) and what it saw (B, T, 2).

    `model=None` is the hold baseline: when it does not peek the agent sees the last real
    observation again. M is called only at steps where some episode does not peek.
    """
    b, t = checks.tensor("observations", observations, "(B, T, 2)", dtype="floating").values()
    checks.tensor("peeks", peeks, "(B, T)", B=b, T=t, dtype=torch.bool)
    return unroll(controller, model, observations, peeks)


def unroll(controller, model, observations, peeks):
    """`rollout` on checked episodes: the agent acts on what it sees, step by step."""
    t = observations.shape[1]
    # o^_0 = o_0
    seen = observations[:, 0]
    actions, inputs = [], []
    for i in range(t):
        # a_t = C(o^_t)
        action = controller(seen)
        actions.append(action)
        inputs.append(seen)
        if i + 1 < t:
            seen = next_seen(model, seen, action, observations[:, i + 1], peeks[:, i + 1])
    return torch.stack(actions, 1), torch.stack(inputs, 1)


def next_seen(model, seen, action, real_next, peek):
    """What the agent sees next: the real next observation where it peeks, else the model's
    output from what the agent saw and did (or, with no model, what it saw)."""
    if bool(peek.all()):
        return real_next  # p = 1, or every episode peeks here: the model is not consulted
    # o^_{t+1} = o_{t+1} if it peeks, else M(o^_t, a_t): the model is fed the agent's *own*
    # input, so that when the agent does not peek it is cut off from the world; neither C nor M
    # is told whether a step was a peek. The hold baseline: o^_{t+1} = o^_t.
    guess = seen if model is None else model(seen, action)
    return torch.where(peek.unsqueeze(-1), real_next, guess)


# -- the task, the only loss ----------------------------------------------------------------------


def task_loss(actions: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The agent's report against the real position."""
    # l = 1/(BT) sum (a_t - x_t)^2
    return (actions - positions).pow(2).mean()


def agent_loss(controller, model, positions, observations, peeks) -> torch.Tensor:
    """The loss the agent is trained on: the task loss of a roll-out, and nothing else (nothing
    compares M's output with the real observation)."""
    actions, _ = rollout(controller, model, observations, peeks)
    return task_loss(actions, positions)
