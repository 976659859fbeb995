"""The chapter's experiment on continuous adaptation (chapters/continuous_adaptation.ipynb).

Chains of tasks in which one actuator of a linear agent weakens over the episodes; meta-training
on them (Algorithm 1, through the book's one training loop), MAML-style and no-adaptation
baselines, execution along held-out chains (Algorithm 2) with a tracking baseline, and the
measurements of what the adapted parameters fit. The mechanism is
`papernotes.continuous_adaptation`, called through the module so that a patched mechanism
(tests/mutants/continuous_adaptation.py) reaches every run.

The claims' nulls stay out of a mutant's reach: the MAML-style baseline, the headline's
ablation, is trained and run by this module's own copy of the adaptation (`same_task_meta_train`,
`run_chains(..., adaptation="maml")`), and the no-adaptation and tracking baselines never call
the mechanism's adaptation. Unbroken, the copy computes what the mechanism computes (the unit
tests compare them).

Arguments are checked where they enter (`task_chains`, `meta_train`, `same_task_meta_train`,
`train_no_adaptation`, `run_chains`, `adapted_fit`, `step_size_summary`, `lag_one_floor`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from papernotes import checks
from papernotes import continuous_adaptation as ca
from papernotes.training import Run, generator, seeded, train

EPISODES = 7
GOALS = 32

# The random stream the training chains are drawn from, generator(seed, TRAINING_CHAINS); the
# chapter draws its validation and held-out chains from other streams.
TRAINING_CHAINS = 1

# -- chains of tasks ------------------------------------------------------------------------------


def task_chains(
    n_chains: int,
    *,
    drift: float = 0.75,
    episodes: int = EPISODES,
    goals: int = GOALS,
    generator: torch.Generator,
) -> ca.Chains:
    """Draw `n_chains` chains: in each, one random actuator's scale falls linearly from 1 in the
    first episode to 1 - drift in the last; every episode has `goals` goals from N(0, I)."""
    checks.integer("n_chains", n_chains)
    checks.number("drift", drift, 0.0, 1.0, high_open=True)
    checks.integer("episodes", episodes, 2)
    checks.integer("goals", goals)
    crippled = torch.randint(ca.ACTUATORS, (n_chains,), generator=generator)
    # s_j = 1 - drift * i / (E - 1) in episode i for the crippled actuator j, 1 for the others
    fraction = 1.0 - drift * torch.arange(episodes, dtype=torch.float32) / (episodes - 1)
    scales = torch.ones(n_chains, episodes, ca.ACTUATORS)
    scales[torch.arange(n_chains), :, crippled] = fraction
    goal_draws = torch.randn(n_chains, episodes, goals, ca.ACTUATORS, generator=generator)
    return ca.Chains(scales, goal_draws)


# -- meta-training through the book's loop (Algorithm 1) ----------------------------------------


def meta_train(
    *,
    seed: int,
    next_task: bool = True,
    learn_step_sizes: bool = True,
    per_coordinate: bool = True,
    inner_steps: int = 3,
    step_size: float = 0.3,
    drift: float = 0.75,
    goals: int = GOALS,
    iterations: int = 1000,
    chains_per_update: int = 8,
    lr: float = 0.03,
    eval_every: int = 50,
) -> Run:
    """Algorithm 1: Adam on (theta, alpha) against the meta-loss of fresh training chains, through
    `pn.train` (its update loss is the meta-loss of a batch of chains; the history logs it). The
    meta learning rate falls linearly from `lr` towards 0 over the updates (`decayed`).

    `next_task=False` trains MAML-style (adapt and judge on the same task);
    `learn_step_sizes=False` keeps alpha at `step_size`; `per_coordinate=False` learns one step
    size per inner step (the paper's form) instead of one per coordinate of theta (Meta-SGD's).
    The training chains come from the run's generator stream TRAINING_CHAINS, a stream no
    held-out chain is drawn from."""
    checks.integer("seed", seed, 0)
    checks.boolean("next_task", next_task)
    checks.boolean("learn_step_sizes", learn_step_sizes)
    checks.integer("iterations", iterations)
    checks.integer("chains_per_update", chains_per_update)
    checks.number("lr", lr, 0.0, low_open=True)
    with seeded(seed):
        learner = ca.MetaLearner(inner_steps, step_size, per_coordinate=per_coordinate)
    parameters = ca.meta_parameters(learner, learn_step_sizes)
    optimizer = torch.optim.Adam(parameters, lr=lr)
    batches = generator(seed, stream=TRAINING_CHAINS)

    def loss_of_update(i):
        decayed(optimizer, lr, i, iterations)
        chains = task_chains(chains_per_update, drift=drift, goals=goals, generator=batches)
        return ca.meta_loss(learner, chains, next_task=next_task)

    history = train(
        learner,
        optimizer,
        loss_of_update,
        iterations,
        eval_every=eval_every,
        clip=10.0,
        desc="meta-training",
    )
    return Run(learner, history)


def decayed(optimizer: torch.optim.Optimizer, lr: float, i: int, iterations: int) -> None:
    """Set the learning rate of update i (from 0) to lr (1 - i / iterations): a linear decay,
    the same for every trained agent of the chapter, so that each run ends on small steps."""
    for group in optimizer.param_groups:
        group["lr"] = lr * (1.0 - i / iterations)


class Policy(nn.Module):
    """A plain policy a = W g + b, for the baselines."""

    def __init__(self):
        super().__init__()
        linear = nn.Linear(ca.ACTUATORS, ca.ACTUATORS)
        self.W = nn.Parameter(linear.weight.detach().clone())
        self.b = nn.Parameter(linear.bias.detach().clone())


def train_no_adaptation(
    *,
    seed: int,
    drift: float = 0.75,
    goals: int = GOALS,
    iterations: int = 1000,
    chains_per_update: int = 8,
    lr: float = 0.01,
) -> Run:
    """The no-adaptation baseline: one policy fitted by Adam to every episode of the training
    chains (the same stream as meta-training), then never changed. Its learning rate decays as
    meta-training's does."""
    checks.integer("seed", seed, 0)
    checks.integer("iterations", iterations)
    checks.integer("chains_per_update", chains_per_update)
    checks.number("lr", lr, 0.0, low_open=True)
    with seeded(seed):
        policy = Policy()
    batches = generator(seed, stream=TRAINING_CHAINS)

    def loss_of_update(i):
        decayed(optimizer, lr, i, iterations)
        chains = task_chains(chains_per_update, drift=drift, goals=goals, generator=batches)
        c, e, g, a = chains.goals.shape
        W, b = policy.W.expand(c * e, -1, -1), policy.b.expand(c * e, -1)
        goals_, scales = chains.goals.reshape(-1, g, a), chains.scales.reshape(-1, a)
        return ca.task_loss(W, b, goals_, scales).mean()

    optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
    history = train(policy, optimizer, loss_of_update, iterations, desc="no adaptation")
    return Run(policy, history)


# -- the MAML-style baseline, by code of its own -------------------------------------------------


def same_task_meta_train(
    *,
    seed: int,
    per_coordinate: bool = True,
    inner_steps: int = 3,
    step_size: float = 0.3,
    drift: float = 0.75,
    goals: int = GOALS,
    iterations: int = 1000,
    chains_per_update: int = 8,
    lr: float = 0.03,
    eval_every: int = 50,
) -> Run:
    """MAML (Finn et al. 2017) on the same training chains as `meta_train`: adapt on episode i,
    judged on fresh goals of the same task T_i, with theta and alpha meta-learned through the
    inner steps. The headline's ablation, written apart from the mechanism (its own inner loop,
    `_adapt_again`) so that no mutant of the mechanism reaches it; unbroken it is
    `meta_train(next_task=False)`."""
    checks.integer("seed", seed, 0)
    checks.integer("iterations", iterations)
    checks.integer("chains_per_update", chains_per_update)
    checks.number("lr", lr, 0.0, low_open=True)
    with seeded(seed):
        learner = ca.MetaLearner(inner_steps, step_size, per_coordinate=per_coordinate)
    optimizer = torch.optim.Adam([learner.W, learner.b, learner.alpha], lr=lr)
    batches = generator(seed, stream=TRAINING_CHAINS)

    def loss_of_update(i):
        decayed(optimizer, lr, i, iterations)
        chains = task_chains(chains_per_update, drift=drift, goals=goals, generator=batches)
        c, e, g, a = chains.goals.shape
        W, b = _adapt_again(
            learner, chains.goals[:, :-1].reshape(-1, g, a), chains.scales[:, :-1].reshape(-1, a)
        )
        # L_{T_i}(phi_i) on the goals of episode i + 1, under the scales of episode i
        judged = chains.goals[:, 1:].reshape(-1, g, a), chains.scales[:, :-1].reshape(-1, a)
        return ca.task_loss(W, b, *judged).mean()

    history = train(
        learner,
        optimizer,
        loss_of_update,
        iterations,
        eval_every=eval_every,
        clip=10.0,
        desc="MAML-style",
    )
    return Run(learner, history)


def _adapt_again(learner, goals, scales, create_graph=True):
    """The inner loop of `continuous_adaptation.adapt`, written again for the baseline: M steps
    from theta, phi^m = phi^(m-1) - alpha_m * grad L_T(phi^(m-1))."""
    n = goals.shape[0]
    with torch.enable_grad():
        W, b = learner.W.expand(n, -1, -1), learner.b.expand(n, -1)
        if not create_graph:
            W, b = W.detach().requires_grad_(True), b.detach().requires_grad_(True)
        for m in range(learner.inner_steps):
            loss = ca.task_loss(W, b, goals, scales).sum()
            grad_W, grad_b = torch.autograd.grad(loss, (W, b), create_graph=create_graph)
            W = W - learner.alpha_W[m] * grad_W
            b = b - learner.alpha_b[m] * grad_b
    return W, b


# -- execution along held-out chains (Algorithm 2) ----------------------------------------------


@dataclass(frozen=True)
class Episodes:
    """What an agent lived through: `losses` (C, E), the loss of each episode of each chain, and
    `weights` (C, E, A, A), the W it ran in each episode."""

    losses: torch.Tensor
    weights: torch.Tensor


def run_chains(
    policy: nn.Module,
    chains: ca.Chains,
    *,
    adaptation: str = "meta",
    tracking_lr: float = 0.1,
    tracking_steps: int = 3,
) -> Episodes:
    """Live through every chain, episode by episode, and record each episode's loss.

    - `adaptation="meta"` (a MetaLearner): episode 1 runs theta; episode i + 1 runs phi_i,
      adapted from theta on episode i's experience (Algorithm 2);
    - `"maml"`: the same, by the MAML-style baseline's own copy of the adaptation;
    - `"tracking"`: episode i + 1 runs the parameters of episode i after `tracking_steps` plain
      gradient steps of size `tracking_lr` on its experience (never reset);
    - `"none"`: the same parameters in every episode.
    """
    checks.one_of("adaptation", adaptation, ("meta", "maml", "tracking", "none"))
    checks.number("tracking_lr", tracking_lr, 0.0, low_open=True)
    checks.integer("tracking_steps", tracking_steps)
    if adaptation in ("meta", "maml") and not isinstance(policy, ca.MetaLearner):
        raise TypeError(
            f"adaptation={adaptation!r} needs a MetaLearner; got {type(policy).__name__}"
        )
    checks.tensor("chains.goals", chains.goals, "(C, E, G, A)", A=ca.ACTUATORS)
    checks.tensor("chains.scales", chains.scales, "(C, E, A)", C=len(chains), A=ca.ACTUATORS)
    c, e = chains.scales.shape[:2]
    losses, weights = [], []
    W, b = policy.W.detach().expand(c, -1, -1), policy.b.detach().expand(c, -1)
    for i in range(e):
        if i > 0 and adaptation == "meta":
            # phi_i from theta, on the experience of episode i (again from theta every time)
            W, b = ca.adapt(
                policy, chains.goals[:, i - 1], chains.scales[:, i - 1], create_graph=False
            )
        elif i > 0 and adaptation == "maml":
            W, b = _adapt_again(
                policy, chains.goals[:, i - 1], chains.scales[:, i - 1], create_graph=False
            )
        elif i > 0 and adaptation == "tracking":
            W, b = _gradient_steps(
                W, b, chains.goals[:, i - 1], chains.scales[:, i - 1], tracking_lr, tracking_steps
            )
        W, b = W.detach(), b.detach()
        losses.append(ca.task_loss(W, b, chains.goals[:, i], chains.scales[:, i]))
        weights.append(W)
    return Episodes(torch.stack(losses, 1), torch.stack(weights, 1))


def _gradient_steps(W, b, goals, scales, lr, steps):
    """Plain gradient descent from (W, b): the tracking baseline's update."""
    with torch.enable_grad():
        for _ in range(steps):
            W, b = W.detach().requires_grad_(True), b.detach().requires_grad_(True)
            loss = ca.task_loss(W, b, goals, scales).sum()
            grad_W, grad_b = torch.autograd.grad(loss, (W, b))
            W, b = W - lr * grad_W, b - lr * grad_b
    return W.detach(), b.detach()


# -- measurements -------------------------------------------------------------------------------


def adapted_fit(learner: ca.MetaLearner, chains: ca.Chains) -> tuple[float, float]:
    """How the adapted parameters phi_i fit the task they were adapted on (T_i) and the next one
    (T_{i+1}), both on episode i + 1's goals, averaged over every consecutive pair."""
    same, following = adapted_fit_per_chain(learner, chains)
    return same.mean().item(), following.mean().item()


def adapted_fit_per_chain(
    learner: ca.MetaLearner, chains: ca.Chains
) -> tuple[torch.Tensor, torch.Tensor]:
    """`adapted_fit` chain by chain: each chain's mean over its consecutive pairs of the loss of
    phi_i under T_i and under T_{i+1}, on episode i + 1's goals; two (C,) tensors."""
    if not isinstance(learner, ca.MetaLearner):
        raise TypeError(f"learner must be a MetaLearner; got {type(learner).__name__}")
    checks.tensor("chains.goals", chains.goals, "(C, E, G, A)", A=ca.ACTUATORS)
    c, e, g, a = chains.goals.shape
    W, b = ca.adapt(
        learner,
        chains.goals[:, :-1].reshape(-1, g, a),
        chains.scales[:, :-1].reshape(-1, a),
        create_graph=False,
    )
    W, b = W.detach(), b.detach()
    goals = chains.goals[:, 1:].reshape(-1, g, a)
    same = ca.task_loss(W, b, goals, chains.scales[:, :-1].reshape(-1, a))
    following = ca.task_loss(W, b, goals, chains.scales[:, 1:].reshape(-1, a))
    return same.view(c, e - 1).mean(1), following.view(c, e - 1).mean(1)


def crippled_gain(episodes: Episodes, chains: ca.Chains) -> torch.Tensor:
    """The gain W_jj the agent gave the weakening actuator j in each episode, (C, E): the
    ideal is 1 / s_j of that episode."""
    crippled = chains.scales[:, -1].argmin(-1)
    rows = torch.arange(len(chains))
    return episodes.weights[rows, :, crippled, crippled]


def lag_one_floor(drift: float = 0.75, episodes: int = EPISODES) -> tuple[float, torch.Tensor]:
    """The loss of an agent that only reacts, at its best: it fits each episode exactly, W =
    diag(1 / s_i), b = 0, and acts on that fit in the next episode. Under s_{i+1} the weakening
    actuator j then misses by (s_{i+1,j} / s_{i,j} - 1) g_j, and E[g_j^2] = 1, so episode
    i + 1 costs (s_{i+1,j} / s_{i,j} - 1)^2 in expectation. Returns the mean over episodes
    2..E and the per-episode terms (E - 1,)."""
    checks.number("drift", drift, 0.0, 1.0, high_open=True)
    checks.integer("episodes", episodes, 2)
    # s_i = 1 - drift (i - 1) / (E - 1), the weakening actuator's scale in episode i
    s = 1.0 - drift * torch.arange(episodes, dtype=torch.float64) / (episodes - 1)
    # (s_{i+1} / s_i - 1)^2, episodes 2..E
    terms = (s[1:] / s[:-1] - 1.0) ** 2
    return terms.mean().item(), terms


def later_per_chain(episodes: Episodes) -> torch.Tensor:
    """Each chain's mean loss over episodes 2..E (C,): the episodes where adaptation can act."""
    return episodes.losses[:, 1:].mean(1)


def paired_difference(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """mean(a) - mean(b) over the same chains, and its standard error from sampling them: the
    standard deviation of the per-chain differences over sqrt(C). a, b are (C,)."""
    n = checks.tensor("a", a, "(C,)")["C"]
    checks.tensor("b", b, "(C,)", C=n)
    if n < 2:
        raise ValueError("a paired difference needs two chains at least")
    d = a.double() - b.double()
    return d.mean().item(), (d.std() / n**0.5).item()


def step_size_parts(learner: ca.MetaLearner) -> list[tuple[float, float, float]]:
    """The mean learned step size on each part of theta, per inner step: (the diagonal of W, the
    rest of W, b). One shared step size gives the same number three times."""
    if not isinstance(learner, ca.MetaLearner):
        raise TypeError(f"learner must be a MetaLearner; got {type(learner).__name__}")
    parts = []
    for m in range(learner.inner_steps):
        alpha_W = learner.alpha_W[m].detach().expand(ca.ACTUATORS, ca.ACTUATORS)
        diagonal = torch.eye(ca.ACTUATORS, dtype=torch.bool)
        parts.append(
            (
                alpha_W[diagonal].mean().item(),
                alpha_W[~diagonal].mean().item(),
                learner.alpha_b[m].detach().mean().item(),
            )
        )
    return parts


def step_size_summary(learner: ca.MetaLearner) -> list[float]:
    """The mean learned step size on the diagonal of W (each actuator's own gain), per inner
    step (the one step size of each inner step, where it is shared by every coordinate)."""
    if not isinstance(learner, ca.MetaLearner):
        raise TypeError(f"learner must be a MetaLearner; got {type(learner).__name__}")
    return [learner.alpha_W[m].diagonal().mean().item() for m in range(learner.inner_steps)]
