"""The chapter's experiment on observational dropout (chapters/observational_dropout.ipynb).

An environment with simple physics (the paper uses cart-pole swing-up; we use a smaller task of
the same structure, the chapter says why): a point moving at constant speed in [-1, 1] that
bounces off the walls. Agents trained at each peek probability by backpropagation through time
on the task loss alone (the paper uses an evolution strategy, PEPG), through the book's one
training loop; then the emergent model measured: its one-step error from real observations
against repeating the observation, and its roll-outs on its own outputs. The mechanism is
`papernotes.observational_dropout`, called through the module so that a patched mechanism
(tests/mutants/observational_dropout.py) reaches every run.

Entry points check their arguments (`BouncingPoint`, `train_agent`, `one_step_error`,
`hold_error`, `task_error`, `imagine`, `imagination_error`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from papernotes import checks, observational_dropout
from papernotes.training import Run, evaluating, generator, seeded, train

# The random streams of a training run, each drawn from generator(seed, stream).
WORLD, DROPOUT = 1, 2

# -- the environment ------------------------------------------------------------------------------


@dataclass(frozen=True)
class BouncingPoint:
    """A point moving at constant speed in [-1, 1], reflected at the walls, in steps of `dt`.

    Speeds are drawn uniformly from [`min_speed`, `max_speed`] with a random sign, starting
    positions uniformly in [-1, 1].
    """

    min_speed: float = 0.3
    max_speed: float = 1.0
    dt: float = 0.1

    def __post_init__(self):
        checks.number("min_speed", self.min_speed, 0.0, low_open=True)
        checks.number("max_speed", self.max_speed, self.min_speed)
        checks.number("dt", self.dt, 0.0, 1.0 / self.max_speed, low_open=True)

    def episodes(self, n: int, steps: int, gen: torch.Generator):
        """`n` episodes of `steps` steps: positions x (n, steps) and observations (n, steps, 2)."""
        n, steps = checks.integer("n", n), checks.integer("steps", steps)
        x = 2 * torch.rand(n, generator=gen) - 1
        speed = self.min_speed + (self.max_speed - self.min_speed) * torch.rand(n, generator=gen)
        v = torch.where(torch.rand(n, generator=gen) < 0.5, -speed, speed)
        times = torch.arange(steps + 1) * self.dt  # one step more than kept: o_0 needs x_{-1}
        # x_t = bounce(x_0 + v_0 t dt)
        xs = bounce(x.unsqueeze(1) + v.unsqueeze(1) * times)
        # o_t = (x_t, (x_t - x_{t-1}) / dt)
        observations = torch.stack([xs[:, 1:], (xs[:, 1:] - xs[:, :-1]) / self.dt], -1)
        return xs[:, 1:], observations


def bounce(free: torch.Tensor) -> torch.Tensor:
    """Where a point that would be at `free` without walls is, with walls at +-1.

    x_{t+1} = x_t + v_t dt, reflected (x <- 2 sign(x) - x, v <- -v) when |x| > 1, unfolds into
    a triangle wave of period 4 in the free position.
    """
    # y = (x_free + 1) mod 4; x = y - 1 for y <= 2, else 3 - y
    y = torch.remainder(free + 1, 4.0)
    return torch.where(y <= 2, y - 1, 3 - y)


# -- training on the task alone ----------------------------------------------------------------


@dataclass
class Agent(Run):
    """A trained agent: its world model (None for the hold baseline), the History of its
    training, its controller and the peek probability it was trained at."""

    model: observational_dropout.WorldModel | None
    controller: observational_dropout.Controller
    p: float


def train_agent(
    p: float,
    *,
    seed: int,
    hold: bool = False,
    updates: int = 300,
    episodes: int = 32,
    steps: int = 60,
    lr: float = 1e-2,
    hidden: int = 32,
    env: BouncingPoint | None = None,
) -> Agent:
    """Train a controller and a world model (none with `hold=True`) at peek probability `p` by
    backpropagation through time of the task loss, Adam (its step size decaying linearly from `lr`
    to a tenth of it) and gradient-norm clipping at 1.

    Each update draws `episodes` fresh episodes of `steps` steps and a fresh peek pattern, from
    the streams WORLD and DROPOUT of `seed`; the weights start from `seed`.
    """
    p = checks.number("p", p, 0.0, 1.0)
    checks.integer("seed", seed, 0)
    checks.boolean("hold", hold)
    updates, episodes = checks.integer("updates", updates), checks.integer("episodes", episodes)
    steps, lr = checks.integer("steps", steps, 2), checks.number("lr", lr, 0.0, low_open=True)
    env = BouncingPoint() if env is None else env
    with seeded(seed):
        controller = observational_dropout.Controller()
        model = None if hold else observational_dropout.WorldModel(hidden)
    agent = nn.ModuleDict({"controller": controller, **({} if hold else {"model": model})})
    world, dropout = generator(seed, WORLD), generator(seed, DROPOUT)

    optimizer = torch.optim.Adam(agent.parameters(), lr=lr)

    def loss_of_update(i):
        for group in optimizer.param_groups:  # the step size decays linearly to a tenth
            group["lr"] = lr * (1 - 0.9 * i / updates)
        positions, observations = env.episodes(episodes, steps, world)
        peeks = observational_dropout.peek_mask(episodes, steps, p, dropout)
        return observational_dropout.agent_loss(controller, model, positions, observations, peeks)

    history = train(agent, optimizer, loss_of_update, updates, clip=1.0, desc=f"p = {p:g}")
    return Agent(model=model, history=history, controller=controller, p=p)


def train_predictor(
    *,
    seed: int,
    updates: int = 300,
    episodes: int = 32,
    steps: int = 60,
    lr: float = 1e-2,
    hidden: int = 32,
    env: BouncingPoint | None = None,
) -> Agent:
    """The reference the emergent model is measured against: the same world model trained with
    an explicit forward-prediction loss on real transitions, the paper's usual way to get one.

    Same optimiser, schedule, clipping, episodes and streams as `train_agent`; the action fed to
    the model is the real position (what a perfect controller reports; the world ignores it).
    Returned as an Agent whose controller reports what it sees (a = x^), trained at p = 1.
    """
    checks.integer("seed", seed, 0)
    updates, episodes = checks.integer("updates", updates), checks.integer("episodes", episodes)
    steps, lr = checks.integer("steps", steps, 2), checks.number("lr", lr, 0.0, low_open=True)
    env = BouncingPoint() if env is None else env
    with seeded(seed):
        controller = observational_dropout.Controller()
        model = observational_dropout.WorldModel(hidden)
    with torch.no_grad():
        controller.linear.weight.fill_(1.0)
    controller.requires_grad_(False)
    world = generator(seed, WORLD)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    def loss_of_update(i):
        for group in optimizer.param_groups:
            group["lr"] = lr * (1 - 0.9 * i / updates)
        _, observations = env.episodes(episodes, steps, world)
        seen = observations[:, :-1]
        # l = E || M(o_t, a_t) - o_{t+1} ||^2, a_t = x_t
        return (model(seen, seen[..., 0]) - observations[:, 1:]).pow(2).mean()

    history = train(model, optimizer, loss_of_update, updates, clip=1.0, desc="predictor")
    return Agent(model=model, history=history, controller=controller, p=1.0)


# -- measuring the emergent model --------------------------------------------------------------


def one_step_error(agent: Agent, positions, observations) -> float:
    """The model's one-step forecast of the position from real observations."""
    _check_episodes(positions, observations)
    if agent.model is None:
        return hold_error(positions, observations)
    with evaluating(agent.controller), evaluating(agent.model):
        seen = observations[:, :-1]
        guess = agent.model(seen, agent.controller(seen))
    # E[(M(o_t, a_t)_x - x_{t+1})^2], a_t = C(o_t)
    return (guess[..., 0] - positions[:, 1:]).pow(2).mean().item()


def forecasts(agent: Agent, positions, observations) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's one-step forecasts from real observations, (B, T-1, 2), and the controller's
    read-out of them, C(M(o_t, a_t)) (B, T-1); for the hold baseline, the observation itself."""
    _check_episodes(positions, observations)
    seen = observations[:, :-1]
    with evaluating(agent.controller), torch.no_grad():
        if agent.model is None:
            guess = seen
        else:
            with evaluating(agent.model):
                guess = agent.model(seen, agent.controller(seen))
        return guess, agent.controller(guess)


def readout_error(agent: Agent, positions, observations) -> float:
    """The one-step forecast as the task reads it, through the agent's own controller."""
    _, readout = forecasts(agent, positions, observations)
    # E[(C(M(o_t, a_t)) - x_{t+1})^2]
    return (readout - positions[:, 1:]).pow(2).mean().item()


def motion_correlation(agent: Agent, positions, observations) -> float:
    """Pearson's correlation of the forecast motion, M(o_t, a_t)_x - x_t, with the real one,
    x_{t+1} - x_t, over every step of every episode: a score of the forecast that no scale or
    offset of its position channel changes (0 for holding, 1 for a perfect forecast)."""
    guess, _ = forecasts(agent, positions, observations)
    now = observations[:, :-1, 0]
    forecast, real = (guess[..., 0] - now).flatten(), (positions[:, 1:] - now).flatten()
    forecast, real = forecast - forecast.mean(), real - real.mean()
    scale = forecast.norm() * real.norm()
    return 0.0 if scale == 0 else (forecast @ real / scale).item()


def constant_velocity_error(positions, observations, dt: float = 0.1) -> float:
    """The one-step error of the rule x_{t+1} = x_t + v_t dt from real observations: exact but
    for the steps that cross a bounce."""
    _check_episodes(positions, observations)
    dt = checks.number("dt", dt, 0.0, low_open=True)
    # E[(x_t + v_t dt - x_{t+1})^2]
    guess = observations[:, :-1, 0] + dt * observations[:, :-1, 1]
    return (guess - positions[:, 1:]).pow(2).mean().item()


def hold_error(positions, observations) -> float:
    """The same error for repeating the observation."""
    _check_episodes(positions, observations)
    # E[(x_t - x_{t+1})^2]
    return (observations[:, :-1, 0] - positions[:, 1:]).pow(2).mean().item()


def task_error(agent: Agent, positions, observations, peeks) -> float:
    """The task loss of the trained agent on given episodes and peek pattern."""
    _check_episodes(positions, observations)
    with evaluating(agent.controller):
        model = agent.model
        if model is not None:
            model.eval()
        with torch.no_grad():
            actions, _ = observational_dropout.rollout(agent.controller, model, observations, peeks)
    return observational_dropout.task_loss(actions, positions).item()


def imagine(agent: Agent, observations) -> torch.Tensor:
    """The model run on its own outputs from the first real observation (p = 0): the positions
    it imagines, (B, T)."""
    b, t = checks.tensor("observations", observations, "(B, T, 2)", dtype="floating").values()
    peeks = torch.zeros(b, t, dtype=torch.bool)
    peeks[:, 0] = True
    with torch.no_grad():
        _, seen = observational_dropout.rollout(agent.controller, agent.model, observations, peeks)
    return seen[..., 0]


def imagination_error(imagined: torch.Tensor, positions: torch.Tensor, horizon: int) -> float:
    """The mean squared error of imagined positions (B, T) against the real ones (B, T) over the
    first `horizon` steps."""
    b, t = checks.tensor("positions", positions, "(B, T)", dtype="floating").values()
    checks.tensor("imagined", imagined, "(B, T)", B=b, T=t, dtype="floating")
    horizon = checks.integer("horizon", horizon)
    return (imagined[:, :horizon] - positions[:, :horizon]).pow(2).mean().item()


def _check_episodes(positions, observations) -> None:
    b, t = checks.tensor("observations", observations, "(B, T, 2)", dtype="floating").values()
    checks.tensor("positions", positions, "(B, T)", B=b, T=t, dtype="floating")
