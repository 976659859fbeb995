"""Observational dropout: a world model that nobody trains to predict.

Freeman, Metz & Ha 2019, *Learning to Predict Without Looking Ahead: World Models Without Forward
Prediction*, NeurIPS (arXiv:1910.13038). An agent that may look at the world only now and then
(it *peeks* with probability p) is shown, at the other steps, the output of its own world model
M, fed what the agent saw and did the step before; the controller C and M are searched together
on the task's reward alone, with no loss that compares M with the world. The chapter
(chapters/observational_dropout.ipynb, "The idea") derives the set-up; this module holds the
agent (its parameters, C and M), the peeks, the roll-out that cuts the agent off from the world
and the score the search ranks agents by, in that order. The environment, the evolution strategy
and the measurements are in `papernotes.observational_dropout.experiment`.

An agent is a flat vector of parameters, and a population of agents a (B, P) tensor, so that a
whole population runs through the world at once (the search scores every member on the same
episodes). Entry points check their arguments (`n_params`, `unpack`, `peek_mask`, `rollout`,
`agent_cost`); the helpers below them (`unroll`, which the chapter shows, `controller`,
`world_model`, `next_seen`) trust their input. Functions read each other from the module's
globals when called, and the experiment calls them through the module, so a patched module
(tests/mutants/observational_dropout.py) is seen everywhere.
"""

from __future__ import annotations

import torch

from papernotes import checks

OBS = 2  # (angle, angular velocity)

# -- the agent ------------------------------------------------------------------------------------


def n_params(hidden: int) -> int:
    """The length of an agent's parameter vector: C's gains and bias (3), then M's two layers."""
    hidden = checks.integer("hidden", hidden)
    return 3 + (OBS + 1) * hidden + hidden + hidden * OBS + OBS


def unpack(params: torch.Tensor, hidden: int) -> dict[str, torch.Tensor]:
    """A population's parameters (B, P) as named views: k (B, 2) and b (B,) of C; W1 (B, 3, H),
    b1 (B, H), W2 (B, H, 2) and b2 (B, 2) of M."""
    b = checks.tensor("params", params, "(B, P)", P=n_params(hidden), dtype="floating")["B"]
    sizes = {"k": OBS, "b": 1, "W1": (OBS + 1) * hidden, "b1": hidden, "W2": hidden * OBS}
    shapes = {"k": (b, OBS), "b": (b,), "W1": (b, OBS + 1, hidden), "W2": (b, hidden, OBS)}
    parts, start = {}, 0
    for name, size in {**sizes, "b2": OBS}.items():
        parts[name] = params[:, start : start + size].reshape(shapes.get(name, (b, size)))
        start += size
    return parts


def controller(w, seen, u_max):
    """C: the action from what the agent sees, (B, E, 2) -> (B, E)."""
    # a_t = u_max tanh(k . o^_t + b)
    return u_max * torch.tanh((seen * w["k"][:, None]).sum(-1) + w["b"][:, None])


def world_model(w, seen, action, dt):
    """M: what the agent saw and did, (B, E, 2) and (B, E), to the observation it is shown next.
    Nothing in M or in its search says "predict"."""
    # M(o^, a) = o^ + dt (W2 tanh(W1 [o^, a] + b1) + b2): a generic network of one hidden layer
    # whose output is a change per unit of time
    inputs = torch.cat([seen, action.unsqueeze(-1)], -1)
    hidden = torch.tanh(torch.matmul(inputs, w["W1"]) + w["b1"][:, None])
    return seen + dt * (torch.matmul(hidden, w["W2"]) + w["b2"][:, None])


# -- observational dropout ------------------------------------------------------------------------


def peek_mask(p: torch.Tensor, episodes: int, steps: int, gen: torch.Generator) -> torch.Tensor:
    """Which steps each run peeks at: (R, episodes, steps) booleans for the R peek probabilities
    `p` (R,), from `gen`. Step 0 is the start, which the agent always sees."""
    r = checks.tensor("p", p, "(R)", dtype="floating")["R"]
    if r and not bool(((p >= 0) & (p <= 1)).all()):
        raise ValueError(f"p must lie in [0, 1]; got {p.tolist()}")
    episodes, steps = checks.integer("episodes", episodes), checks.integer("steps", steps)
    # peek at o_{t+1} with probability p, independently at each step
    return torch.rand(r, episodes, steps, generator=gen) < p[:, None, None]


def rollout(params, hidden, env, start, noise, peeks):
    """Run a population through episodes of `env`; returns the per-step costs (B, E, T), the
    real states (B, E, T, 2) and what the agent saw when it acted (B, E, T, 2).

    `params` (B, P); `start` (B, E, 2) or (1, E, 2); `noise` (B or 1, E, T, 2), at each step the
    world's kick and the policy's exploration noise; `peeks` (B, E, T): whether the agent sees
    the real state after step t.
    """
    b = unpack(params, hidden)["k"].shape[0]
    e = checks.tensor("start", start, "(S, E, 2)", dtype="floating")["E"]
    t = checks.tensor("noise", noise, "(S, E, T, 2)", E=e, dtype="floating")["T"]
    checks.tensor("peeks", peeks, "(B, E, T)", B=b, E=e, T=t, dtype=torch.bool)
    return unroll(params, hidden, env, start, noise, peeks)


def unroll(params, hidden, env, start, noise, peeks):
    """`rollout` on checked input: the agent acts on what it sees, step by step."""
    w = unpack(params, hidden)
    state = seen = start.expand(params.shape[0], -1, -1)
    costs, states, inputs = [], [], []
    for i in range(noise.shape[-2]):
        # a_t = C(o^_t) + eps_t (a Gaussian policy: eps_t, its exploration noise, is part of the
        # action the agent takes and knows); the world moves: s_{t+1} = f(s_t, a_t, kick_t)
        action = controller(w, seen, env.u_max) + noise[..., i, 1]
        inputs.append(seen)
        state = env.step(state, action, noise[..., i, 0])
        seen = next_seen(w, seen, action, state, peeks[..., i], env.dt)
        states.append(state)
        costs.append(env.cost(state))
    return torch.stack(costs, -1), torch.stack(states, -2), torch.stack(inputs, -2)


def next_seen(w, seen, action, real_next, peek, dt):
    """What the agent sees next: the real state where it peeks, else M's output from what it saw
    and did."""
    # o^_{t+1} = o_{t+1} with probability p, else M(o^_t, a_t): M is fed the agent's *own* last
    # input, so that a run of missed peeks chains M on its own outputs; neither C nor M is told
    # whether a step was a peek
    guess = world_model(w, seen, action, dt)
    return torch.where(peek.unsqueeze(-1), real_next, guess)


# -- the task's score, the only thing the search sees ------------------------------------------


def agent_cost(params, hidden, env, start, noise, peeks) -> torch.Tensor:
    """Each agent's score, (B,): the task's cost of its roll-outs, averaged over steps and
    episodes, and nothing else (nothing compares M's output with the real state)."""
    costs, _, _ = rollout(params, hidden, env, start, noise, peeks)
    # J = 1/(ET) sum_e sum_t cost(s_t): for the pendulum, the squared angle
    return costs.mean((-2, -1))
