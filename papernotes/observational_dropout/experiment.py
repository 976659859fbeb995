"""The chapter's experiment on observational dropout (chapters/observational_dropout.ipynb).

A swinging pendulum near the bottom of its swing, theta'' = -omega^2 theta + u, that the agent
must bring to rest (the paper swings a cart-pole up; the chapter says why we damp a swing). The
agents are searched with an evolution strategy on the task's cost alone, a whole population and
several runs at once (the paper uses PEPG, another evolution strategy). Then the emerged world
model is measured: its one-step forecast under an action, against holding the state and against
the same network trained to predict; and controllers are searched inside it, with every step
imagined, and deployed in the real pendulum.

The mechanism is `papernotes.observational_dropout`, called through the module so that a
patched mechanism (tests/mutants/observational_dropout.py) reaches every agent trained with
observational dropout; the agents' costs are read off the real states the roll-out went
through, by this module's code. The baselines, the agents without a world model (holding,
zeros, shrinking the last observation), the agents at the two ends of the peek probability (the
blind agent of p = 0, never a peek after the start, and the agent of p = 1, whose model is never
consulted), the network trained to predict, the exact pendulum blind to the action, the double
integrator and the imagination in which controllers are searched, are computed by this module's
own code, which no mutant reaches. Every searched arm picks its step size by one rule
(`choose`): the lowest validation cost, ties within a standard error going to the grid's middle.

Entry points check their arguments (`Pendulum`, `evolve`, `Search`, `train_agents`,
`train_rule_agents`, `train_extreme_agents`, `initial_rules`, `train_predictor`,
`train_in_imagination`, `train_in_double_integrator`, `costs_of_agents`, `costs_of_rules`,
`costs_of_extreme_agents`, `costs_of_controllers`, `transitions`, `action_pairs`,
`one_step_errors`, `response_errors`, `response_signs`, `on_policy_transitions`,
`dream_and_reality`, `choose`, `study`, `beats_by`); `rule_rollout`, `extreme_rollout`,
`forward_model`, `imagine`, `imagine_in`, `imagined_costs`, `search_inside`, `double_integrator`,
`hold_errors`, `free_pendulum_errors` and `blind_response_errors` are their unchecked cores.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from papernotes import checks, observational_dropout, training
from papernotes.training import generator

# The random streams of a run, each drawn from generator(seed, stream).
INIT, EPISODES, PEEKS, SEARCH, TRANSITIONS = 1, 2, 3, 4, 5

RULES = ("hold", "zeros", "shrink")


# -- the environment -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pendulum:
    """A pendulum near the bottom of its swing: theta'' = -omega^2 theta + u, semi-implicit Euler
    steps of `dt`, actions bounded by `u_max`, a random kick of standard deviation `noise` to the
    angular velocity at each step; episodes of `steps` steps start at angles uniform in
    [-`theta0`, `theta0`] and angular velocities uniform in [-omega theta0, omega theta0]."""

    omega: float = 3.0
    dt: float = 0.1
    u_max: float = 4.0
    noise: float = 0.15
    explore: float = 2.5
    theta0: float = 0.5
    steps: int = 45

    def __post_init__(self):
        checks.number("omega", self.omega, 0.0, low_open=True)
        checks.number("dt", self.dt, 0.0, 1.0 / self.omega, low_open=True)
        checks.number("u_max", self.u_max, 0.0, low_open=True)
        checks.number("noise", self.noise, 0.0)
        checks.number("explore", self.explore, 0.0)
        checks.number("theta0", self.theta0, 0.0, low_open=True)
        checks.integer("steps", self.steps, 2)

    def episodes(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """`n` episodes from `gen`: their start states (1, n, 2) and noise (1, n, steps, 2), at
        each step the kick and the policy's exploration noise (standard deviation `explore`)."""
        n = checks.integer("n", n)
        scale = torch.tensor([self.theta0, self.omega * self.theta0])
        start = (2 * torch.rand(1, n, 2, generator=gen) - 1) * scale
        noise = torch.randn(1, n, self.steps, 2, generator=gen)
        return start, noise * torch.tensor([self.noise, self.explore])

    def step(self, state: torch.Tensor, action: torch.Tensor, kick: torch.Tensor) -> torch.Tensor:
        """The next state (..., 2) from a state (..., 2), an action and a kick (...)."""
        theta, velocity = state[..., 0], state[..., 1]
        # v_{t+1} = v_t + dt (-omega^2 theta_t + u_t) + kick; theta_{t+1} = theta_t + dt v_{t+1}
        velocity = velocity + self.dt * (-(self.omega**2) * theta + action) + kick
        return torch.stack([theta + self.dt * velocity, velocity], -1)

    def cost(self, state: torch.Tensor) -> torch.Tensor:
        """The cost of a state, its squared angle (the reward is its negative)."""
        return state[..., 0].pow(2)


# -- the evolution strategy ------------------------------------------------------------------------


def evolve(
    cost_of: Callable[[torch.Tensor, int], torch.Tensor],
    mean: torch.Tensor,
    lrs: torch.Tensor,
    *,
    generations: int,
    pairs: int,
    sigma: float,
    gen: torch.Generator,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Search R independent runs at once; returns their final means (R, P).

    Each generation draws `pairs` Gaussian perturbations per run, scores the population
    mean +- sigma * perturbation (antithetic pairs) by `cost_of(population (R, 2 pairs, P),
    generation)` -> costs (R, 2 pairs), turns the costs into centred ranks within each run and
    moves each run's mean along the rank-weighted perturbations with Adam at its step size
    `lrs` (R,). `mask` (R, P) of 0/1 freezes parameters (they are never perturbed or moved).
    """
    r, p = checks.tensor("mean", mean, "(R, P)", dtype="floating").values()
    checks.tensor("lrs", lrs, "(R)", R=r, dtype="floating")
    generations, pairs = (
        checks.integer("generations", generations),
        checks.integer("pairs", pairs),
    )
    sigma = checks.number("sigma", sigma, 0.0, low_open=True)
    mask = torch.ones(r, p) if mask is None else mask
    checks.tensor("mask", mask, "(R, P)", R=r, P=p)
    mean, first, second = mean.clone(), torch.zeros(r, p), torch.zeros(r, p)
    n = 2 * pairs
    for i in range(generations):
        eps = torch.randn(r, pairs, p, generator=gen) * mask[:, None]
        population = torch.cat([mean[:, None] + sigma * eps, mean[:, None] - sigma * eps], 1)
        costs = cost_of(population, i)
        # f = centred rank of -cost, in [-1/2, 1/2]; g = sum_pairs (f+ - f-) eps / (pairs sigma)
        fitness = 0.5 - costs.argsort(1).argsort(1).float() / (n - 1)
        grad = ((fitness[:, :pairs] - fitness[:, pairs:])[..., None] * eps).sum(1)
        grad = grad / (pairs * sigma)
        # Adam ascent on the estimated gradient of the fitness
        first = 0.9 * first + 0.1 * grad
        second = 0.999 * second + 0.001 * grad.pow(2)
        step = (first / (1 - 0.9 ** (i + 1))) / ((second / (1 - 0.999 ** (i + 1))).sqrt() + 1e-8)
        mean = mean + lrs[:, None] * step * mask
    return mean


@dataclass(frozen=True)
class Search:
    """The evolution strategy's settings, the same for every family of agents."""

    generations: int = 200
    pairs: int = 16
    episodes: int = 8
    sigma: float = 0.1

    def __post_init__(self):
        checks.integer("generations", self.generations)
        checks.integer("pairs", self.pairs)
        checks.integer("episodes", self.episodes)
        checks.number("sigma", self.sigma, 0.0, low_open=True)


def _search(cost_of, mean, lrs, search: Search, seed: int, mask=None) -> torch.Tensor:
    """`evolve` with the search's settings from the seed's stream SEARCH: every family of agents
    and controllers is searched by this one call."""
    return evolve(
        cost_of,
        mean,
        lrs,
        generations=search.generations,
        pairs=search.pairs,
        sigma=search.sigma,
        gen=generator(seed, SEARCH),
        mask=mask,
    )


def _flat(population: torch.Tensor) -> torch.Tensor:
    return population.reshape(-1, population.shape[-1])


def _each_member(peeks: torch.Tensor, members: int) -> torch.Tensor:
    """Peek patterns (R, E, T) repeated for every member of each run: (R * members, E, T)."""
    return peeks.repeat_interleave(members, 0)


# -- agents with observational dropout (the mechanism) ---------------------------------------------


def initial_agents(runs: int, hidden: int, seed: int) -> torch.Tensor:
    """The agents' starting parameters (runs, P): C zero (no action), M a random network of small
    output weights (nearly the identity), the same for every run."""
    runs, hidden = checks.integer("runs", runs), checks.integer("hidden", hidden)
    gen = generator(seed, INIT)
    params = torch.zeros(1, observational_dropout.n_params(hidden))
    w = observational_dropout.unpack(params, hidden)
    w["W1"].copy_(torch.randn(w["W1"].shape, generator=gen))
    w["W2"].copy_(0.1 * torch.randn(w["W2"].shape, generator=gen))
    return params.repeat(runs, 1)


def train_agents(
    ps, lrs, *, seed: int, env: Pendulum, hidden: int = 8, search: Search | None = None
) -> torch.Tensor:
    """Search agents (C and M together) at the peek probabilities `ps` with the ES step sizes
    `lrs` (one run per pair), on the task's cost alone; returns their parameters (R, P).

    Every generation draws fresh episodes (stream EPISODES) that every member of every run
    plays, and a fresh peek pattern per run (stream PEEKS) that all its members share.
    """
    ps, lrs = _runs(ps, lrs)
    search = Search() if search is None else search
    episodes, peeks_gen = generator(seed, EPISODES), generator(seed, PEEKS)

    def cost_of(population, i):
        start, noise = env.episodes(search.episodes, episodes)
        peeks = observational_dropout.peek_mask(ps, search.episodes, env.steps, peeks_gen)
        members = population.shape[1]
        costs = observational_dropout.agent_cost(
            _flat(population), hidden, env, start, noise, _each_member(peeks, members)
        )
        return costs.reshape(len(ps), members)

    return _search(cost_of, initial_agents(len(ps), hidden, seed), lrs, search, seed)


def costs_of_agents(params, *, p: float, hidden: int, env: Pendulum, start, noise, peek_gen):
    """The cost of each agent (R, P) on given episodes, at peek probability `p`: (R, E), read
    off the real states the roll-out went through by this module's own code (the pendulum's
    squared angle), not off the costs the mechanism reports."""
    p = checks.number("p", p, 0.0, 1.0)
    r = checks.tensor("params", params, "(R, P)", dtype="floating")["R"]
    e = start.shape[1]
    peeks = observational_dropout.peek_mask(torch.full((1,), p), e, env.steps, peek_gen)
    with torch.no_grad():
        _, states, _ = observational_dropout.rollout(
            params, hidden, env, start, noise, peeks.expand(r, -1, -1)
        )
    return env.cost(states).mean(-1)


# -- the agents of p = 0 and p = 1, by code of their own ------------------------------------------


def extreme_rollout(params, hidden: int, env: Pendulum, start, noise, always) -> torch.Tensor:
    """Agents (B, P), C and M as the mechanism's, at the two ends of the peek probability, by
    code of their own: where `always` (B,) is False the agent never sees the pendulum after the
    start (p = 0, the blind agent: it acts on M's chain from the start, whatever happens); where
    True it sees it at every step (p = 1: M is never consulted). Returns per-step costs
    (B, E, T)."""
    model = params[:, 3:]

    def shown(i, seen, action, state):
        # o^_{t+1} = o_{t+1} (p = 1) or M(o^_t, a_t), never the real o_{t+1} (p = 0)
        guess = forward_model(model, hidden, seen, action, env.dt)
        return torch.where(always[:, None, None], state, guess)

    return _own_rollout(params[:, :2], params[:, 2], env, start, noise, shown)


def _own_rollout(k, b, env: Pendulum, start, noise, shown) -> torch.Tensor:
    """Agents whose controller (gains k (B, 2), bias b (B,)) acts on what they are shown,
    `shown(i, seen, action, next_state)` giving what they see after step i, by the experiment's
    own code: per-step costs (B, E, T)."""
    state = seen = start.expand(k.shape[0], -1, -1)
    costs = []
    for i in range(noise.shape[-2]):
        # a_t = u_max tanh(k . o^_t + b) + eps_t; s_{t+1} = f(s_t, a_t, kick_t)
        action = env.u_max * torch.tanh((seen * k[:, None]).sum(-1) + b[:, None])
        action = action + noise[..., i, 1]
        state = env.step(state, action, noise[..., i, 0])
        seen = shown(i, seen, action, state)
        costs.append(env.cost(state))
    return torch.stack(costs, -1)


def _always(always, r: int) -> torch.Tensor:
    always = torch.as_tensor(always, dtype=torch.bool)
    checks.tensor("always", always, "(R)", R=r, dtype=torch.bool)
    return always


def train_extreme_agents(
    always, lrs, *, seed: int, env: Pendulum, hidden: int = 8, search: Search | None = None
) -> torch.Tensor:
    """Search agents of p = 0 (`always` False) or p = 1 (True), C and M together from the agents'
    start, with the ES step sizes `lrs`, on the same episodes and with the same strategy as
    `train_agents`; returns (R, P)."""
    _, lrs = _runs([0.0] * len(lrs), lrs)
    always = _always(always, len(lrs))
    search = Search() if search is None else search
    episodes = generator(seed, EPISODES)

    def cost_of(population, i):
        start, noise = env.episodes(search.episodes, episodes)
        members = population.shape[1]
        each = always.repeat_interleave(members)
        costs = extreme_rollout(_flat(population), hidden, env, start, noise, each)
        return costs.mean((-2, -1)).reshape(len(lrs), members)

    return _search(cost_of, initial_agents(len(lrs), hidden, seed), lrs, search, seed)


def costs_of_extreme_agents(
    params, always, *, hidden: int, env: Pendulum, start, noise
) -> torch.Tensor:
    """The cost of each agent of p = 0 or p = 1 (R, P) on given episodes: (R, E)."""
    r = checks.tensor("params", params, "(R, P)", dtype="floating")["R"]
    always = _always(always, r)
    with torch.no_grad():
        return extreme_rollout(params, hidden, env, start, noise, always).mean(-1)


# -- the baselines: the same controller, no world model --------------------------------------------


def rule_rollout(params, env, start, noise, peeks):
    """Agents without a world model: C as above, and where it does not peek it is shown
    lambda * (what it saw last) (params (B, 5): k, b, lambda): holding (lambda = 1), zeros
    (lambda = 0) or shrinking towards the centre (lambda searched). Returns per-step costs."""
    lam = params[:, 3:5]

    def shown(i, seen, action, state):
        # o^_{t+1} = o_{t+1} if it peeks, else lambda * o^_t
        return torch.where(peeks[..., i, None], state, lam[:, None] * seen)

    return _own_rollout(params[:, :2], params[:, 2], env, start, noise, shown)


def _rule_peeks(ps: torch.Tensor, episodes: int, steps: int, gen: torch.Generator):
    # the same draw as the mechanism's peek pattern, by code of its own
    return torch.rand(len(ps), episodes, steps, generator=gen) < ps[:, None, None]


def initial_rules(kinds) -> tuple[torch.Tensor, torch.Tensor]:
    """Starting parameters (R, 5) and the mask of searched ones for rule agents of `kinds`."""
    for kind in kinds:
        checks.one_of("kind", kind, RULES)
    params, mask = torch.zeros(len(kinds), 5), torch.ones(len(kinds), 5)
    for i, kind in enumerate(kinds):
        params[i, 3:] = 0.0 if kind == "zeros" else 1.0
        if kind != "shrink":
            mask[i, 3:] = 0.0
    return params, mask


def train_rule_agents(
    kinds, ps, lrs, *, seed: int, env: Pendulum, search: Search | None = None
) -> torch.Tensor:
    """Search the controllers (and, for "shrink", lambda) of agents without a world model, one
    run per (kind, p, step size), exactly as `train_agents` searches agents with one: the same
    strategy, generations, population, episodes and peek patterns."""
    ps, lrs = _runs(ps, lrs)
    if len(kinds) != len(ps):
        raise ValueError(f"kinds must give one kind per run ({len(ps)}); got {len(kinds)}")
    search = Search() if search is None else search
    episodes, peeks_gen = generator(seed, EPISODES), generator(seed, PEEKS)

    def cost_of(population, i):
        start, noise = env.episodes(search.episodes, episodes)
        peeks = _rule_peeks(ps, search.episodes, env.steps, peeks_gen)
        members = population.shape[1]
        costs = rule_rollout(_flat(population), env, start, noise, _each_member(peeks, members))
        return costs.mean((-2, -1)).reshape(len(ps), members)

    mean, mask = initial_rules(kinds)
    return _search(cost_of, mean, lrs, search, seed, mask=mask)


def costs_of_rules(params, *, p: float, env: Pendulum, start, noise, peek_gen):
    """The cost of each rule agent (R, 5) on given episodes at peek probability `p`: (R, E)."""
    p = checks.number("p", p, 0.0, 1.0)
    r = checks.tensor("params", params, "(R, 5)", dtype="floating")["R"]
    peeks = _rule_peeks(torch.full((1,), p), start.shape[1], env.steps, peek_gen)
    with torch.no_grad():
        return rule_rollout(params, env, start, noise, peeks.expand(r, -1, -1)).mean(-1)


# -- the world model on its own: forecasts and imagination -----------------------------------------


def model_of(params: torch.Tensor, hidden: int) -> torch.Tensor:
    """The world-model part (R, P - 3) of agents' parameters (R, P)."""
    checks.tensor("params", params, "(R, P)", dtype="floating")
    return params[:, 3:]


def forward_model(model: torch.Tensor, hidden: int, seen, action, dt: float) -> torch.Tensor:
    """M's forward pass from its parameters (R, P - 3), by code of its own (the same formula as
    the mechanism's world model)."""
    h = hidden
    w1 = model[:, : 3 * h].reshape(-1, 3, h)
    b1 = model[:, 3 * h : 4 * h]
    w2 = model[:, 4 * h : 6 * h].reshape(-1, h, 2)
    b2 = model[:, 6 * h : 6 * h + 2]
    inputs = torch.cat([seen, action.unsqueeze(-1)], -1)
    hidden_layer = torch.tanh(torch.matmul(inputs, w1) + b1[:, None])
    return seen + dt * (torch.matmul(hidden_layer, w2) + b2[:, None])


def transitions(n: int, env: Pendulum, gen: torch.Generator):
    """`n` real transitions: states from the region the pendulum swings in, uniform actions in
    [-u_max, u_max], their next states: (1, n, 2), (1, n), (1, n, 2)."""
    n = checks.integer("n", n)
    scale = torch.tensor([env.theta0, env.omega * env.theta0])
    states = (2 * torch.rand(1, n, 2, generator=gen) - 1) * scale
    actions = env.u_max * (2 * torch.rand(1, n, generator=gen) - 1)
    kicks = env.noise * torch.randn(1, n, generator=gen)
    return states, actions, env.step(states, actions, kicks)


def one_step_errors(model, hidden: int, env: Pendulum, states, actions, next_states):
    """Each model's (R, P - 3) mean squared one-step error on transitions, (R, n): per
    transition, the squared distance of M(s, a) from the real next state, each channel divided
    by its range (theta0 and omega theta0)."""
    checks.tensor("model", model, "(R, M)", dtype="floating")
    n = checks.tensor("states", states, "(1, N, 2)", dtype="floating")["N"]
    checks.tensor("actions", actions, "(1, N)", N=n, dtype="floating")
    checks.tensor("next_states", next_states, "(1, N, 2)", N=n, dtype="floating")
    scale = torch.tensor([env.theta0, env.omega * env.theta0])
    with torch.no_grad():
        guess = forward_model(model, hidden, states, actions, env.dt)
    return ((guess - next_states) / scale).pow(2).sum(-1)


def hold_errors(env: Pendulum, states, next_states) -> torch.Tensor:
    """The same error for holding the state (the forecast of an agent with no model), (1, n)."""
    scale = torch.tensor([env.theta0, env.omega * env.theta0])
    return ((states - next_states) / scale).pow(2).sum(-1)


def free_pendulum_errors(env: Pendulum, states, next_states) -> torch.Tensor:
    """The same error for the exact pendulum that ignores the action (and the kick): the
    forecast of a model that knows the physics and not what a push does, (1, n)."""
    scale = torch.tensor([env.theta0, env.omega * env.theta0])
    guess = env.step(states, torch.zeros_like(states[..., 0]), torch.zeros_like(states[..., 0]))
    return ((guess - next_states) / scale).pow(2).sum(-1)


def action_pairs(n: int, env: Pendulum, gen: torch.Generator):
    """`n` states from the region the pendulum swings in and two uniform actions each in
    [-u_max, u_max]: (1, n, 2), (1, n), (1, n)."""
    n = checks.integer("n", n)
    scale = torch.tensor([env.theta0, env.omega * env.theta0])
    states = (2 * torch.rand(1, n, 2, generator=gen) - 1) * scale
    actions = env.u_max * (2 * torch.rand(2, 1, n, generator=gen) - 1)
    return states, actions[0], actions[1]


def response_errors(model, hidden: int, env: Pendulum, states, first, second) -> torch.Tensor:
    """How far each model's (R, P - 3) response to a change of action, M(s, a1) - M(s, a2), is
    from the pendulum's, f(s, a1) - f(s, a2) = (dt^2 (a1 - a2), dt (a1 - a2)): the squared
    distance, channels scaled as in `one_step_errors`, (R, n). A model blind to the action
    responds with zero."""
    checks.tensor("model", model, "(R, M)", dtype="floating")
    n = checks.tensor("states", states, "(1, N, 2)", dtype="floating")["N"]
    checks.tensor("first", first, "(1, N)", N=n, dtype="floating")
    checks.tensor("second", second, "(1, N)", N=n, dtype="floating")
    scale = torch.tensor([env.theta0, env.omega * env.theta0])
    zero = torch.zeros_like(first)
    real = env.step(states, first, zero) - env.step(states, second, zero)
    with torch.no_grad():
        guess = forward_model(model, hidden, states, first, env.dt)
        guess = guess - forward_model(model, hidden, states, second, env.dt)
    return ((guess - real) / scale).pow(2).sum(-1)


def response_signs(model, hidden: int, env: Pendulum, states, first, second) -> torch.Tensor:
    """Whether each model's (R, P - 3) velocity response to a change of action has the sign of
    the pendulum's, dt (a1 - a2): 1.0 where it has, 0.0 elsewhere (a zero response included),
    (R, n)."""
    checks.tensor("model", model, "(R, M)", dtype="floating")
    n = checks.tensor("states", states, "(1, N, 2)", dtype="floating")["N"]
    checks.tensor("first", first, "(1, N)", N=n, dtype="floating")
    checks.tensor("second", second, "(1, N)", N=n, dtype="floating")
    with torch.no_grad():
        guess = forward_model(model, hidden, states, first, env.dt)
        guess = guess - forward_model(model, hidden, states, second, env.dt)
    return (guess[..., 1] * (first - second) > 0).float()


def blind_response_errors(env: Pendulum, states, first, second) -> torch.Tensor:
    """The same error for a model blind to the action, whose response is zero, (1, n)."""
    scale = torch.tensor([env.theta0, env.omega * env.theta0])
    zero = torch.zeros_like(first)
    real = env.step(states, first, zero) - env.step(states, second, zero)
    return (real / scale).pow(2).sum(-1)


def on_policy_transitions(agent, hidden: int, env: Pendulum, start, noise, peeks):
    """The real transitions an agent (1, P) went through on given episodes at a peek pattern
    (1, E, T): states, the actions it took and the next states, (1, E T, 2), (1, E T) and
    (1, E T, 2), by code of their own (the mechanism's roll-out, written out)."""
    checks.tensor("agent", agent, "(1, P)", dtype="floating")
    k, b, model = agent[:, :2], agent[:, 2], agent[:, 3:]
    state = seen = start
    states, actions, nexts = [], [], []
    with torch.no_grad():
        for i in range(noise.shape[-2]):
            action = env.u_max * torch.tanh((seen * k[:, None]).sum(-1) + b[:, None])
            action = action + noise[..., i, 1]
            states.append(state)
            actions.append(action)
            state = env.step(state, action, noise[..., i, 0])
            nexts.append(state)
            guess = forward_model(model, hidden, seen, action, env.dt)
            seen = torch.where(peeks[..., i, None], state, guess)
    return (
        torch.stack(states, -2).reshape(1, -1, 2),
        torch.stack(actions, -1).reshape(1, -1),
        torch.stack(nexts, -2).reshape(1, -1, 2),
    )


def train_predictor(
    *,
    seed: int,
    env: Pendulum,
    hidden: int = 8,
    updates: int = 300,
    batch: int = 256,
    lr=1e-2,
) -> torch.Tensor:
    """The paper's comparison: the same network as M, from the same start, trained to predict
    the next state of real transitions (mean squared error, channels scaled as in
    `one_step_errors`) with Adam; returns its parameters (1, P - 3)."""
    updates, batch = checks.integer("updates", updates), checks.integer("batch", batch)
    lr = checks.number("lr", lr, 0.0, low_open=True)
    net = _FlatModel(model_of(initial_agents(1, hidden, seed), hidden))
    data = generator(seed, TRANSITIONS)
    scale = torch.tensor([env.theta0, env.omega * env.theta0])

    def loss_of_update(i):
        states, actions, next_states = transitions(batch, env, data)
        guess = forward_model(net.params, hidden, states, actions, env.dt)
        # l = E || (M(s, a) - s') / scale ||^2
        return ((guess - next_states) / scale).pow(2).sum(-1).mean()

    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    training.train(net, optimizer, loss_of_update, updates, desc="predictor")
    return net.params.detach().clone()


class _FlatModel(nn.Module):
    """A world model's flat parameter vector (1, P - 3) as a module, for the book's one training
    loop (`training.train`), which updates modules."""

    def __init__(self, params: torch.Tensor):
        super().__init__()
        self.params = nn.Parameter(params.clone())


def imagine(controllers, models, hidden: int, env: Pendulum, start) -> torch.Tensor:
    """Controllers (B, 3) run inside world models (B, P - 3), every step imagined from the real
    start, without noise: the imagined costs (B, E, T)."""
    return imagine_in(
        controllers,
        lambda seen, action: forward_model(models, hidden, seen, action, env.dt),
        env,
        start,
    )


def double_integrator(seen, action, dt: float) -> torch.Tensor:
    """A world without the pendulum: the push moves the velocity and the velocity the angle,
    v' = v + dt a, theta' = theta + dt v' (no restoring force)."""
    velocity = seen[..., 1] + dt * action
    return torch.stack([seen[..., 0] + dt * velocity, velocity], -1)


def imagine_in(controllers, world, env: Pendulum, start) -> torch.Tensor:
    """Controllers (B, 3) run inside an imagined world, `world(seen, action)` -> next seen,
    every step imagined from the real start, without noise: the imagined costs (B, E, T)."""
    k, b = controllers[:, :2], controllers[:, 2]
    seen = start.expand(controllers.shape[0], -1, -1)
    costs = []
    for _ in range(env.steps):
        # a_t = C(o^_t); o^_{t+1} = M(o^_t, a_t); the cost is read off the imagined state
        action = env.u_max * torch.tanh((seen * k[:, None]).sum(-1) + b[:, None])
        seen = world(seen, action)
        costs.append(env.cost(seen))
    return torch.stack(costs, -1)


def imagined_costs(controllers, world, env: Pendulum, start) -> torch.Tensor:
    """Each controller's imagined cost from each start (B, E), an imagined state that left the
    world (not finite) scoring worst."""
    costs = imagine_in(controllers, world, env, start).mean(-1)
    return torch.nan_to_num(costs, nan=1e6, posinf=1e6).clamp(max=1e6)


def train_in_imagination(
    models,
    lrs,
    *,
    seed: int,
    env: Pendulum,
    hidden: int = 8,
    search: Search | None = None,
) -> torch.Tensor:
    """Search a controller inside each world model (R, P - 3), all steps imagined from real
    start states, with the same evolution strategy; returns the controllers (R, 3)."""
    r = checks.tensor("models", models, "(R, M)", dtype="floating")["R"]
    checks.tensor("lrs", lrs, "(R)", R=r, dtype="floating")
    members = 2 * (Search() if search is None else search).pairs
    inside = models.repeat_interleave(members, 0)

    def world(seen, action):
        return forward_model(inside, hidden, seen, action, env.dt)

    return search_inside(world, lrs, seed=seed, env=env, search=search)


def search_inside(world, lrs, *, seed: int, env: Pendulum, search: Search | None = None):
    """Search a controller inside an imagined world (`world(seen, action)` for the whole
    population, (R * 2 pairs, E, 2) and (R * 2 pairs, E)) for each step size of `lrs` (R,),
    all steps imagined from real start states; returns the controllers (R, 3)."""
    r = checks.tensor("lrs", lrs, "(R)", dtype="floating")["R"]
    search = Search() if search is None else search
    episodes = generator(seed, EPISODES)

    def cost_of(population, i):
        start, _ = env.episodes(search.episodes, episodes)
        costs = imagined_costs(_flat(population), world, env, start).mean(-1)
        return costs.reshape(r, population.shape[1])

    return _search(cost_of, torch.zeros(r, 3), lrs, search, seed)


def train_in_double_integrator(
    lrs, *, seed: int, env: Pendulum, search: Search | None = None
) -> torch.Tensor:
    """Search a controller inside the double integrator (`double_integrator`: the push's sign,
    no pendulum) for each step size of `lrs`, exactly as `train_in_imagination`; (R, 3)."""
    lrs = torch.as_tensor(lrs, dtype=torch.float32)

    def world(seen, action):
        return double_integrator(seen, action, env.dt)

    return search_inside(world, lrs, seed=seed, env=env, search=search)


def dream_and_reality(controller, model, hidden: int, env: Pendulum, start, noise):
    """A controller (1, 3) inside a world model (1, P - 3) and in the real pendulum from the same
    starts: the imagined angles and the real ones (E, T), for the figures."""
    checks.tensor("controller", controller, "(1, 3)", dtype="floating")
    checks.tensor("model", model, "(1, M)", dtype="floating")
    k, b = controller[:, :2], controller[:, 2]
    seen, state, dream, real = start, start, [], []
    with torch.no_grad():
        for i in range(env.steps):
            action = env.u_max * torch.tanh((seen * k[:, None]).sum(-1) + b[:, None])
            seen = forward_model(model, hidden, seen, action, env.dt)
            action = env.u_max * torch.tanh((state * k[:, None]).sum(-1) + b[:, None])
            state = env.step(state, action + noise[..., i, 1], noise[..., i, 0])
            dream.append(seen[0, :, 0])
            real.append(state[0, :, 0])
    return torch.stack(dream, -1), torch.stack(real, -1)


def costs_of_controllers(controllers, *, env: Pendulum, start, noise) -> torch.Tensor:
    """Controllers (R, 3) deployed in the real pendulum, always seeing it: costs (R, E)."""
    r = checks.tensor("controllers", controllers, "(R, 3)", dtype="floating")["R"]
    params = torch.cat([controllers, torch.ones(r, 2)], 1)  # lambda = 1, never used at p = 1
    peeks = torch.ones(r, start.shape[1], env.steps, dtype=torch.bool)
    with torch.no_grad():
        return rule_rollout(params, env, start, noise, peeks).mean(-1)


# -- helpers ---------------------------------------------------------------------------------------


def _runs(ps, lrs) -> tuple[torch.Tensor, torch.Tensor]:
    ps = torch.as_tensor(ps, dtype=torch.float32)
    lrs = torch.as_tensor(lrs, dtype=torch.float32)
    checks.tensor("ps", ps, "(R)", dtype="floating")
    checks.tensor("lrs", lrs, "(R)", R=len(ps), dtype="floating")
    if not bool(((ps >= 0) & (ps <= 1)).all()):
        raise ValueError(f"ps must lie in [0, 1]; got {ps.tolist()}")
    if not bool((lrs > 0).all()):
        raise ValueError(f"lrs must be positive; got {lrs.tolist()}")
    return ps, lrs


# -- the chapter's study ---------------------------------------------------------------------------

LRS = (0.003, 0.01, 0.03, 0.1, 0.3)  # the ES step sizes every searched arm is tuned over
PEEK = 0.05  # the headline's peek probability (the paper's cart-pole video)
SWEEP = (0.0, 0.05, 0.5, 1.0)  # the peek probabilities of the sweep, each tuned on LRS
VALID, TEST, VALID_PEEKS, TEST_PEEKS, TEST_TRANSITIONS, TEST_RESPONSES = 10, 11, 12, 13, 14, 15
MODELS = ("emerged", "predictor", "untrained")  # the world models controllers are searched in


def choose(costs: torch.Tensor) -> int:
    """The step size chosen from validation costs (n, E), a row per step size of a grid and a
    column per validation episode: the lowest mean cost, unless other step sizes tie with it
    (their mean cost above the lowest by no more than one standard error of the paired
    difference over the episodes); of the tied, the one nearest the middle of the grid (the
    smaller of two as near). Where the validation cannot tell step sizes apart, their noise would
    pick one at random, an edge of the grid as readily as any other; the rule keeps the middle."""
    n = checks.tensor("costs", costs, "(N, E)", dtype="floating")["N"]
    means = costs.mean(1)
    best = int(means.argmin())
    if costs.shape[1] < 2:  # one episode: no standard error to tie within
        return best
    difference = costs - costs[best]
    se = difference.std(1) / costs.shape[1] ** 0.5
    tied = [i for i in range(n) if i == best or bool(difference[i].mean() <= se[i])]
    middle = (n - 1) / 2
    return min(tied, key=lambda i: (abs(i - middle), i))


def sweep_name(p: float) -> str:
    """The name of the world model (and of its controller) that emerged at peek probability p."""
    return "emerged" if p == PEEK else f"p = {p:g}"


def agent_name(p: float) -> str:
    """The name of the agent searched at peek probability p: the headline's, the blind agent of
    p = 0, or the sweep's."""
    return {PEEK: "model", 0.0: "blind"}.get(p, f"p = {p:g}")


@dataclass
class Study:
    """Everything the chapter reads. `validation`: each searched arm's validation cost at each
    step size of LRS; `chosen`: the step size it chose (`choose`); `test`: the chosen arms' test
    costs per episode (E,) at p = PEEK ("model", "hold", "zeros", "shrink", "blind"), the
    controllers searched inside each world model and deployed ("inside emerged", ...,
    "inside p = 0", ..., "inside none" for no action at all), and the one-step forecast errors
    per transition ("forecast emerged", ...); `sweep`: for each p of SWEEP, the test costs per
    episode of the agent with a world model and of the hold agent at that p, of the controller
    searched inside its model, and its forecast errors."""

    validation: dict
    chosen: dict
    test: dict
    sweep: dict
    agent: torch.Tensor  # the chosen agent with a world model (1, P)
    models: dict  # name -> world model (1, P - 3), with the sweep's as "p = ..."
    controllers: dict  # name -> controller searched inside that model (1, 3), sweep's included
    shrink: torch.Tensor  # the chosen shrink agent's lambda (2,)


def study(
    seed: int,
    *,
    env: Pendulum | None = None,
    hidden: int = 8,
    search: Search | None = None,
    n_valid: int = 256,
    n_test: int = 512,
) -> Study:
    """The chapter's experiment from one seed: agents with a world model and without one,
    searched alike at p = PEEK over the step sizes LRS; agents with a world model at every other
    p of SWEEP, tuned alike (those of p = 0 and p = 1 by code of their own), and hold agents there
    at the middle step size; the network trained to predict; controllers searched inside the
    world models, tuned alike on their imagined cost; all scored on validation episodes
    (choices, `choose`) and test episodes (claims), each from a stream of its own."""
    checks.integer("seed", seed, 0)
    env = Pendulum() if env is None else env
    search = Search() if search is None else search
    n, mid = len(LRS), LRS[len(LRS) // 2]
    middle = [PEEK] + [p for p in SWEEP if p not in (0.0, 1.0, PEEK)]  # searched as the mechanism
    others = [p for p in SWEEP if p != PEEK]
    valid = env.episodes(n_valid, generator(seed, VALID))
    test = env.episodes(n_test, generator(seed, TEST))

    def agent_costs(params, p, episodes, stream):
        if p in (0.0, 1.0):  # the agents of the two ends, by code of their own
            return costs_of_extreme_agents(
                params,
                [p == 1.0] * len(params),
                hidden=hidden,
                env=env,
                start=episodes[0],
                noise=episodes[1],
            )
        return costs_of_agents(
            params,
            p=p,
            hidden=hidden,
            env=env,
            start=episodes[0],
            noise=episodes[1],
            peek_gen=generator(seed, stream),
        )

    def rule_costs(params, p, episodes, stream):
        return costs_of_rules(
            params,
            p=p,
            env=env,
            start=episodes[0],
            noise=episodes[1],
            peek_gen=generator(seed, stream),
        )

    def deployed(controllers, episodes):
        return costs_of_controllers(controllers, env=env, start=episodes[0], noise=episodes[1])

    # agents with a world model: one run per (p, step size); the ends of the sweep apart
    options = {"seed": seed, "env": env, "hidden": hidden, "search": search}
    searched = train_agents([p for p in middle for _ in LRS], list(LRS) * len(middle), **options)
    ends = train_extreme_agents([False] * n + [True] * n, list(LRS) * 2, **options)
    grids = {p: searched[j * n : (j + 1) * n] for j, p in enumerate(middle)}
    grids.update({0.0: ends[:n], 1.0: ends[n:]})
    # agents without a world model at p = PEEK, tuned alike; hold at the sweep's other p's
    kinds = [kind for kind in RULES for _ in LRS] + ["hold"] * len(others)
    rules = train_rule_agents(
        kinds,
        [PEEK] * (n * len(RULES)) + others,
        list(LRS) * len(RULES) + [mid] * len(others),
        seed=seed,
        env=env,
        search=search,
    )

    costs = {agent_name(p): agent_costs(grids[p], p, valid, VALID_PEEKS) for p in SWEEP}
    rule_validation = rule_costs(rules[: n * len(RULES)], PEEK, valid, VALID_PEEKS)
    for i, kind in enumerate(RULES):
        costs[kind] = rule_validation[i * n : (i + 1) * n]
    pick = {arm: choose(c) for arm, c in costs.items()}
    chosen_agents = {p: grids[p][pick[agent_name(p)]][None] for p in SWEEP}
    agent = chosen_agents[PEEK]
    chosen_rules = {kind: rules[i * n + pick[kind]][None] for i, kind in enumerate(RULES)}
    test_costs = {"model": agent_costs(agent, PEEK, test, TEST_PEEKS)[0]}
    for kind in RULES:
        test_costs[kind] = rule_costs(chosen_rules[kind], PEEK, test, TEST_PEEKS)[0]
    test_costs["blind"] = agent_costs(chosen_agents[0.0], 0.0, test, TEST_PEEKS)[0]

    # the world models and their one-step forecasts under uniform actions
    models = {
        "emerged": model_of(agent, hidden),
        "predictor": train_predictor(seed=seed, env=env, hidden=hidden),
        "untrained": model_of(initial_agents(1, hidden, seed), hidden),
    }
    models.update({sweep_name(p): model_of(chosen_agents[p], hidden) for p in others})
    states, actions, next_states = transitions(2048, env, generator(seed, TEST_TRANSITIONS))
    errors = one_step_errors(
        torch.cat(list(models.values())), hidden, env, states, actions, next_states
    )
    for i, name in enumerate(models):
        test_costs[f"forecast {name}"] = errors[i]
    shrink = chosen_rules["shrink"][0, 3:]
    test_costs["forecast hold"] = hold_errors(env, states, next_states)[0]
    test_costs["forecast shrink"] = hold_errors(env, shrink * states, next_states)[0]
    test_costs["forecast free pendulum"] = free_pendulum_errors(env, states, next_states)[0]

    # how each model responds to a change of action, against the pendulum's response
    pairs = action_pairs(2048, env, generator(seed, TEST_RESPONSES))
    three = torch.cat([models[name] for name in MODELS])
    responses = response_errors(three, hidden, env, *pairs)
    signs = response_signs(three, hidden, env, *pairs)
    for i, name in enumerate(MODELS):
        test_costs[f"response {name}"] = responses[i]
        test_costs[f"sign {name}"] = signs[i]
    test_costs["response blind"] = blind_response_errors(env, *pairs)[0]

    # the emerged model's forecast on the transitions its own agent went through at p = PEEK
    peeks = _rule_peeks(torch.full((1,), PEEK), n_test, env.steps, generator(seed, TEST_PEEKS))
    own = on_policy_transitions(agent, hidden, env, test[0], test[1], peeks)
    test_costs["own forecast emerged"] = one_step_errors(models["emerged"], hidden, env, *own)[0]
    test_costs["own forecast hold"] = hold_errors(env, own[0], own[2])[0]

    # controllers searched inside each world model at every step size, deployed in the real
    # pendulum; each chosen on its imagined cost inside the world it was searched in, on the
    # validation starts: the real pendulum is never consulted (the paper keeps the dream's best)
    inside = torch.cat([m.repeat(n, 1) for m in models.values()])
    controllers = train_in_imagination(inside, torch.tensor(list(LRS) * len(models)), **options)

    def in_models(seen, action):
        return forward_model(inside, hidden, seen, action, env.dt)

    inside_validation = imagined_costs(controllers, in_models, env, valid[0])
    chosen_controllers = {}
    for i, name in enumerate(models):
        costs[f"inside {name}"] = inside_validation[i * n : (i + 1) * n]
        pick[f"inside {name}"] = choose(costs[f"inside {name}"])
        chosen_controllers[name] = controllers[i * n + pick[f"inside {name}"]][None]
    integrator = train_in_double_integrator(LRS, seed=seed, env=env, search=search)
    costs["inside integrator"] = imagined_costs(
        integrator,
        lambda seen, action: double_integrator(seen, action, env.dt),
        env,
        valid[0],
    )
    pick["inside integrator"] = choose(costs["inside integrator"])
    chosen_controllers["integrator"] = integrator[pick["inside integrator"]][None]
    chosen_controllers["none"] = torch.zeros(1, 3)
    for name, controller in chosen_controllers.items():
        test_costs[f"inside {name}"] = deployed(controller, test)[0]

    # the sweep over p, each agent on the test episodes at its own p
    sweep = {}
    for p in SWEEP:
        hold = chosen_rules["hold"] if p == PEEK else rules[n * len(RULES) + others.index(p)][None]
        sweep[p] = {
            "model": agent_costs(chosen_agents[p], p, test, TEST_PEEKS)[0],
            "hold": rule_costs(hold, p, test, TEST_PEEKS)[0],
            "inside": test_costs[f"inside {sweep_name(p)}"],
            "forecast": test_costs[f"forecast {sweep_name(p)}"],
        }
    return Study(
        validation={
            arm: dict(zip(LRS, c.mean(1).tolist(), strict=True)) for arm, c in costs.items()
        },
        chosen={arm: LRS[i] for arm, i in pick.items()},
        test=test_costs,
        sweep=sweep,
        agent=agent,
        models=models,
        controllers=chosen_controllers,
        shrink=shrink,
    )


def beats_by(ours: torch.Tensor, nulls: dict, k: float = 3.0) -> tuple[str, float, float]:
    """The bound a cost (or error) of ours must go below to beat every null by k paired standard
    errors: the best null, its mean minus k times the standard error of the paired difference
    (ours - that null, over the same episodes or transitions), and that standard error."""
    n = checks.tensor("ours", ours, "(N)", dtype="floating")["N"]
    for name, values in nulls.items():
        checks.tensor(name, values, "(N)", N=n, dtype="floating")
    best = min(nulls, key=lambda name: nulls[name].mean().item())
    se = ((ours - nulls[best]).std() / n**0.5).item()
    return best, nulls[best].mean().item() - k * se, se
