r"""Observational dropout: a world model that nobody trains to predict.

Freeman, Metz & Ha 2019, *Learning to Predict Without Looking Ahead: World Models Without Forward
Prediction*, NeurIPS (arXiv:1910.13038). The module follows the paper's set-up in order.

1. **An environment with simple physics.** The paper uses cart-pole swing-up; we use a smaller
   task of the same structure (the chapter says why): a point that moves at a constant speed
   $v$ inside $[-1, 1]$ and bounces off the walls,

   $$x_{t+1} = x_t + v_t\,\Delta t,\quad\text{and if } |x_{t+1}| > 1:\ x_{t+1} \leftarrow
     2\,\mathrm{sign}(x_{t+1}) - x_{t+1},\ v_{t+1} = -v_t ,$$

   which unfolds into a closed form (`bounce`): the position is a triangle wave of the free
   motion $x_0 + v_0 t\,\Delta t$.

   The agent observes $o_t = (x_t,\ (x_t - x_{t-1}) / \Delta t)$, a position and a velocity.

2. **The agent.** A controller $C$ acts on what the agent sees, $a_t = C(\hat o_t)$; its task is
   to say where the point is now, with the loss $\ell = \frac1T \sum_t (a_t - x_t)^2$, always
   measured against the real position. Ours reads the position it sees, $a_t = w\,\hat x_t + b$,
   and starts from $w = b = 0$. A world model $M$ maps what the agent saw and did to an
   observation, $M(\hat o_t, a_t)$; ours is a residual MLP,
   $M(o, a) = o + W_2 \tanh(W_1 [o, a] + b_1) + b_2$.

3. **Observational dropout.** At every step after the first the agent *peeks* with probability
   $p$: it sees the real observation, and otherwise its own model's output,

   $$\hat o_0 = o_0,\qquad \hat o_{t+1} = \begin{cases} o_{t+1} & \text{with probability } p
     \\ M(\hat o_t, a_t) & \text{otherwise.} \end{cases}$$

   $M$ is fed the agent's *own* previous input $\hat o_t$ (not the real $o_t$), so that when the
   agent does not peek it is cut off from the world; neither $C$ nor $M$ is told whether a
   step was a peek; and nothing in the loss compares $M$'s output with the real observation. $M$
   learns only because the controller's task goes better when the model's output is a good
   guess of the next observation.

   The baseline agent has no model: when it does not peek it sees the last real observation
   again ("hold", $\hat o_{t+1} = \hat o_t$).

4. **Training.** The paper trains $C$ and $M$ together on the task's reward with an evolution
   strategy (PEPG). We train them by backpropagation through time on the task loss $\ell$ alone,
   through the book's one training loop, each update on fresh episodes and a fresh peek pattern,
   with Adam, a step size decaying linearly to a tenth, and gradient-norm clipping.

5. **Measuring the emergent model.** Its one-step error: from a *real* observation and the
   controller's action, how far $M$'s guess of the next position is from the real one,
   $\mathbb E\,[(M(o_t, a_t)_x - x_{t+1})^2]$, against the same error of repeating the
   observation, $\mathbb E\,[(x_t - x_{t+1})^2]$. And its roll-outs: $M$ run on its own outputs
   from a real first observation ($p = 0$), beside the real trajectory.

Entry points check their arguments (`BouncingPoint`, `WorldModel`, `peek_mask`,
`rollout`, `train_agent`, `one_step_error`, `hold_error`, `task_error`, `imagine`); the helpers
below them trust their input. Functions read each other from the module's globals when called,
so a patched module (tests/mutants/observational_dropout.py) is seen everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from papernotes import checks
from papernotes.training import History, evaluating, generator, seeded, train

OBS = 2  # (position, velocity)

# -- 1. the environment ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BouncingPoint:
    r"""A point moving at constant speed in $[-1, 1]$, reflected at the walls, in steps of `dt`.

    Speeds are drawn uniformly from [`min_speed`, `max_speed`] with a random sign, starting
    positions uniformly in $[-1, 1]$.
    """

    min_speed: float = 0.3
    max_speed: float = 1.0
    dt: float = 0.1

    def __post_init__(self):
        checks.number("min_speed", self.min_speed, 0.0, low_open=True)
        checks.number("max_speed", self.max_speed, self.min_speed)
        checks.number("dt", self.dt, 0.0, 1.0 / self.max_speed, low_open=True)

    def episodes(self, n: int, steps: int, gen: torch.Generator):
        r"""`n` episodes of `steps` steps: positions $x$ (n, steps) and observations
        $o_t = (x_t, (x_t - x_{t-1}) / \Delta t)$ (n, steps, 2)."""
        n, steps = checks.integer("n", n), checks.integer("steps", steps)
        x = 2 * torch.rand(n, generator=gen) - 1
        speed = self.min_speed + (self.max_speed - self.min_speed) * torch.rand(n, generator=gen)
        v = torch.where(torch.rand(n, generator=gen) < 0.5, -speed, speed)
        times = torch.arange(steps + 1) * self.dt  # one step more than kept: o_0 needs x_{-1}
        xs = bounce(x.unsqueeze(1) + v.unsqueeze(1) * times)
        observations = torch.stack([xs[:, 1:], (xs[:, 1:] - xs[:, :-1]) / self.dt], -1)
        return xs[:, 1:], observations


def bounce(free: torch.Tensor) -> torch.Tensor:
    r"""Where a point that would be at `free` without walls is, with walls at $\pm 1$.

    Reflections unfold the motion: the position is a triangle wave of period 4 in the free
    position, $y = (x_{\text{free}} + 1) \bmod 4$, $x = y - 1$ for $y \le 2$, else $3 - y$.
    """
    y = torch.remainder(free + 1, 4.0)
    return torch.where(y <= 2, y - 1, 3 - y)


# -- 2. the agent ---------------------------------------------------------------------------------


class Controller(nn.Module):
    r"""$C$: the agent's report of the position from the position it sees, $a_t = w\,\hat x_t + b$
    (the paper's C is a small tanh network of the cart-pole's whole observation)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(1, 1)
        with torch.no_grad():  # it starts by reporting the centre, whatever it sees
            self.linear.weight.zero_()
            self.linear.bias.zero_()

    def forward(self, seen: torch.Tensor) -> torch.Tensor:
        return self.linear(seen[..., :1]).squeeze(-1)


class WorldModel(nn.Module):
    r"""$M(o, a) = o + W_2 \tanh(W_1 [o, a] + b_1) + b_2$: an observation and an action to the
    next observation. Nothing in it or in its training says "predict"."""

    def __init__(self, hidden: int = 32):
        super().__init__()
        hidden = checks.integer("hidden", hidden)
        self.net = nn.Sequential(nn.Linear(OBS + 1, hidden), nn.Tanh(), nn.Linear(hidden, OBS))

    def forward(self, seen: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return seen + self.net(torch.cat([seen, action.unsqueeze(-1)], -1))


# -- 3. observational dropout ---------------------------------------------------------------------


def peek_mask(n: int, steps: int, p: float, gen: torch.Generator) -> torch.Tensor:
    r"""Which steps the agent peeks at, (n, steps) booleans: step 0 always (the agent starts
    from a real observation), every later step with probability $p$, from `gen`."""
    n, steps = checks.integer("n", n), checks.integer("steps", steps)
    p = checks.number("p", p, 0.0, 1.0)
    peeks = torch.rand(n, steps, generator=gen) < p
    peeks[:, 0] = True
    return peeks


def rollout(controller, model, observations, peeks):
    r"""Run the agent through episodes; returns its actions (B, T) and what it saw (B, T, 2).

    $\hat o_0 = o_0$, $a_t = C(\hat o_t)$, and $\hat o_{t+1}$ is the real $o_{t+1}$ where
    `peeks` says so and otherwise $M(\hat o_t, a_t)$, the model fed the agent's own input.
    `model=None` is the hold baseline: $\hat o_{t+1} = \hat o_t$. $M$ is called only at steps
    where some episode does not peek.
    """
    b, t = checks.tensor("observations", observations, "(B, T, 2)", dtype="floating").values()
    checks.tensor("peeks", peeks, "(B, T)", B=b, T=t, dtype=torch.bool)
    seen = observations[:, 0]
    actions, inputs = [], []
    for i in range(t):
        action = controller(seen)
        actions.append(action)
        inputs.append(seen)
        if i + 1 < t:
            seen = next_seen(model, seen, action, observations[:, i + 1], peeks[:, i + 1])
    return torch.stack(actions, 1), torch.stack(inputs, 1)


def next_seen(model, seen, action, real_next, peek):
    r"""$\hat o_{t+1}$: the real next observation where the agent peeks, else the model's
    output from what the agent saw and did (or, with no model, what it saw)."""
    if bool(peek.all()):
        return real_next  # p = 1, or every episode peeks here: the model is not consulted
    guess = seen if model is None else model(seen, action)
    return torch.where(peek.unsqueeze(-1), real_next, guess)


def task_loss(actions: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    r"""$\ell = \frac1{BT}\sum (a_t - x_t)^2$: the agent's guess against the real position."""
    return (actions - positions).pow(2).mean()


# -- 4. training on the task alone ----------------------------------------------------------------


@dataclass
class Agent:
    controller: Controller
    model: WorldModel | None
    history: History
    p: float


def agent_loss(controller, model, positions, observations, peeks) -> torch.Tensor:
    """The loss the agent is trained on: the task loss of a roll-out, and nothing else."""
    actions, _ = rollout(controller, model, observations, peeks)
    return task_loss(actions, positions)


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
    r"""Train a controller and a world model (none with `hold=True`) at peek probability `p` by
    backpropagation through time of the task loss, Adam (its step size decaying linearly from `lr`
    to a tenth of it) and gradient-norm clipping at 1.

    Each update draws `episodes` fresh episodes of `steps` steps and a fresh peek pattern, from
    the streams (seed, 1) and (seed, 2); the weights start from `seed`.
    """
    p = checks.number("p", p, 0.0, 1.0)
    checks.integer("seed", seed, 0)
    updates, episodes = checks.integer("updates", updates), checks.integer("episodes", episodes)
    steps, lr = checks.integer("steps", steps, 2), checks.number("lr", lr, 0.0, low_open=True)
    env = BouncingPoint() if env is None else env
    with seeded(seed):
        controller = Controller()
        model = None if hold else WorldModel(hidden)
    agent = nn.ModuleDict({"controller": controller, **({} if hold else {"model": model})})
    world, dropout = generator(seed, 1), generator(seed, 2)

    optimizer = torch.optim.Adam(agent.parameters(), lr=lr)

    def loss_of_update(i):
        for group in optimizer.param_groups:  # the step size decays linearly to a tenth
            group["lr"] = lr * (1 - 0.9 * i / updates)
        positions, observations = env.episodes(episodes, steps, world)
        peeks = peek_mask(episodes, steps, p, dropout)
        return agent_loss(controller, model, positions, observations, peeks)

    history = train(agent, optimizer, loss_of_update, updates, clip=1.0, desc=f"p = {p:g}")
    return Agent(controller, model, history, p)


# -- 5. measuring the emergent model --------------------------------------------------------------


def one_step_error(agent: Agent, positions, observations) -> float:
    r"""$\mathbb E[(M(o_t, a_t)_x - x_{t+1})^2]$ over real observations, $a_t = C(o_t)$."""
    _check_episodes(positions, observations)
    if agent.model is None:
        return hold_error(positions, observations)
    with evaluating(agent.controller), evaluating(agent.model):
        seen = observations[:, :-1]
        guess = agent.model(seen, agent.controller(seen))
    return (guess[..., 0] - positions[:, 1:]).pow(2).mean().item()


def hold_error(positions, observations) -> float:
    r"""The same error for repeating the observation: $\mathbb E[(x_t - x_{t+1})^2]$."""
    _check_episodes(positions, observations)
    return (observations[:, :-1, 0] - positions[:, 1:]).pow(2).mean().item()


def task_error(agent: Agent, positions, observations, peeks) -> float:
    """The task loss of the trained agent on given episodes and peek pattern."""
    _check_episodes(positions, observations)
    with evaluating(agent.controller):
        model = agent.model
        if model is not None:
            model.eval()
        with torch.no_grad():
            actions, _ = rollout(agent.controller, model, observations, peeks)
    return task_loss(actions, positions).item()


def imagine(agent: Agent, observations) -> torch.Tensor:
    r"""The model run on its own outputs from the first real observation ($p = 0$): the
    positions it imagines, (B, T)."""
    b, t = checks.tensor("observations", observations, "(B, T, 2)", dtype="floating").values()
    peeks = torch.zeros(b, t, dtype=torch.bool)
    peeks[:, 0] = True
    with torch.no_grad():
        _, seen = rollout(agent.controller, agent.model, observations, peeks)
    return seen[..., 0]


def _check_episodes(positions, observations) -> None:
    b, t = checks.tensor("observations", observations, "(B, T, 2)", dtype="floating").values()
    checks.tensor("positions", positions, "(B, T)", B=b, T=t, dtype="floating")
