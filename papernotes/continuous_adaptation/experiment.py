"""The chapter's experiment on continuous adaptation (chapters/continuous_adaptation.ipynb).

Chains of tasks in which one actuator of a linear agent weakens over the episodes; meta-training
on them (Algorithm 1, through the book's one training loop, the runs of a grid of meta learning
rates trained together as one stacked model by `papernotes.together`), MAML-style and
no-adaptation baselines, execution along held-out chains (Algorithm 2), the reactive baselines
(tracking, the exact refit of the last episode, the restarted fine-tuner, and their hand-made
extrapolations), and the measurements of what the adapted parameters fit. The mechanism is
`papernotes.continuous_adaptation`, called through the module so that a patched mechanism
(tests/mutants/continuous_adaptation.py) reaches every run.

The claims' nulls stay out of a mutant's reach: the MAML-style baselines, the ablations, are
trained and run by this module's own copy of the adaptation (`same_task_meta_train`,
`meta_train_together(own_copy=True)`, `run_chains(..., adaptation="maml")`), and the
no-adaptation and reactive baselines never call the mechanism's adaptation. Unbroken, the copy
computes what the mechanism computes (the unit tests compare them).

Arguments are checked where they enter (`task_chains`, `meta_train_together` and its one-run
forms, `train_no_adaptation`, `run_chains`, `extrapolated`, `adapted_fit`, `step_size_summary`,
`lag_one_floor`).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from papernotes import checks, together
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


# -- meta-training through the book's loop (Algorithm 1), arms trained together -----------------


def meta_train(*, seed: int, lr: float = 0.03, **settings) -> Run:
    """Algorithm 1 for one meta learning rate: `meta_train_together` with `lrs=(lr,)`; the
    settings are its."""
    return meta_train_together(seed=seed, lrs=(lr,), **settings)[0]


def same_task_meta_train(*, seed: int, lr: float = 0.03, **settings) -> Run:
    """MAML (Finn et al. 2017) on the same training chains as `meta_train`: adapt on episode i,
    judged on fresh goals of the same task T_i, theta and alpha meta-learned through the inner
    steps. The headline's ablation, trained and run by the experiment's own copy of the
    adaptation (`_adapt_again`) so that no mutant of the mechanism reaches it; unbroken it is
    `meta_train(next_task=False)`. The settings are `meta_train_together`'s."""
    return meta_train_together(seed=seed, lrs=(lr,), next_task=False, own_copy=True, **settings)[0]


def meta_train_together(
    *,
    seed: int,
    lrs: Sequence[float],
    next_task: bool = True,
    learn_step_sizes: bool = True,
    own_copy: bool = False,
    per_coordinate: bool = True,
    inner_steps: int = 3,
    step_size: float = 0.3,
    drift: float = 0.75,
    goals: int = GOALS,
    iterations: int = 1000,
    chains_per_update: int = 8,
    eval_every: int = 50,
) -> list[Run]:
    """Algorithm 1, one run per meta learning rate in `lrs`, trained together: Adam on
    (theta, alpha) against the meta-loss of fresh training chains, the meta learning rate
    falling linearly from each run's rate towards 0 (`decayed`), each run's gradient clipped at
    norm 10 on its own. Returns one Run per rate.

    Every run starts from the same learner (drawn under `seed`) and sees the same training
    chains (the run's generator stream TRAINING_CHAINS, which no held-out chain is drawn from),
    as separate runs would. Trained together (`papernotes.together`), the learners' theta and
    alpha are stacked (K, ...) and one update evaluates the mechanism's meta-loss once on every
    run's copy of the batch (`_Learners.rows`): the mean over every consecutive pair of every
    run, so that K times it gives each run exactly the gradient of its own meta-loss (runs share
    no parameter and hold equal shares of the batch). Each run's History logs that mean over the
    runs as its "loss".

    `next_task=False` judges on the same task (MAML); `learn_step_sizes=False` keeps alpha at
    `step_size`; `per_coordinate=False` learns one step size per inner step (the paper's form)
    instead of one per coordinate of theta (Meta-SGD's). `own_copy=True` trains MAML-style by
    the experiment's own copy of the adaptation (`same_task_meta_train`)."""
    checks.integer("seed", seed, 0)
    lrs = [checks.number(f"lrs[{k}]", lr, 0.0, low_open=True) for k, lr in enumerate(lrs)]
    if not lrs:
        raise ValueError("lrs must hold one meta learning rate at least")
    checks.boolean("next_task", next_task)
    checks.boolean("learn_step_sizes", learn_step_sizes)
    checks.boolean("own_copy", own_copy)
    if own_copy and (next_task or not learn_step_sizes):
        raise ValueError(
            "own_copy trains the MAML-style baseline: next_task=False, step sizes learned"
        )
    checks.integer("iterations", iterations)
    checks.integer("chains_per_update", chains_per_update)
    with seeded(seed):
        learner = ca.MetaLearner(inner_steps, step_size, per_coordinate=per_coordinate)
    stack = together.Stack([copy.deepcopy(learner) for _ in lrs])
    learners = _Learners(stack)
    if own_copy:  # out of a mutant's reach: the baseline learns theta and alpha
        parameters = [learners.W, learners.b, learners.alpha]
    else:
        parameters = ca.meta_parameters(learners, learn_step_sizes)
    optimizer = together.Adam(parameters, lr=lrs)
    rates = torch.tensor(lrs, dtype=torch.float64)
    batches = generator(seed, stream=TRAINING_CHAINS)

    def losses_of_update(i):
        decayed(optimizer, rates, i, iterations)
        chains = task_chains(chains_per_update, drift=drift, goals=goals, generator=batches)
        every = _copies(chains, len(lrs))  # each run's copy of the batch, run by run
        pairs = chains_per_update * (chains.scales.shape[1] - 1)
        if own_copy:
            loss = _same_task_meta_loss(learners.rows(pairs), every)
        else:
            loss = ca.meta_loss(learners.rows(pairs), every, next_task=next_task)
        # the mean over the K runs' pairs; K times it sums the runs' own meta-losses
        return loss.expand(len(lrs))

    histories = together.train(
        stack,
        optimizer,
        losses_of_update,
        iterations,
        eval_every=eval_every,
        clip=10.0,
        desc="MAML-style" if own_copy else "meta-training",
    )
    return together.runs(stack, histories)


class _Learners:
    """K meta-learners of one shape, their tensors stacked (K, ...) by `together.Stack`: theta
    (W, b) and alpha, the attributes `ca.meta_parameters` reads."""

    def __init__(self, stack: together.Stack):
        self.W, self.b, self.alpha = stack.stacked  # a MetaLearner's parameters, in its order
        self.per_coordinate = self.alpha.shape[-1] > 1

    def rows(self, n: int) -> _Rows:
        """The learners as one learner for K * n tasks, run k's tensors on rows k n .. (k+1) n."""
        return _Rows(self, n)


class _Rows:
    """What `ca.adapt` reads of a learner (W, b, alpha_W, alpha_b, inner_steps), for a batch of
    K * n tasks whose rows k n .. (k + 1) n belong to run k: theta already has one row a task
    (its `expand` to the batch is then a no-op), and step m's sizes one row a task too."""

    def __init__(self, learners: _Learners, n: int):
        self.W = learners.W.repeat_interleave(n, 0)
        self.b = learners.b.repeat_interleave(n, 0)
        self.alpha = learners.alpha.repeat_interleave(n, 0).transpose(0, 1)  # (M, K n, ...)
        self.per_coordinate = learners.per_coordinate
        self.inner_steps = self.alpha.shape[0]

    @property
    def alpha_W(self) -> torch.Tensor:
        return self.alpha[..., : ca.ACTUATORS] if self.per_coordinate else self.alpha

    @property
    def alpha_b(self) -> torch.Tensor:
        return self.alpha[..., ca.ACTUATORS] if self.per_coordinate else self.alpha[..., 0]


def _copies(chains: ca.Chains, k: int) -> ca.Chains:
    """k copies of a batch of chains, one after another (copy j on chains j C .. (j + 1) C)."""
    return ca.Chains(chains.scales.repeat(k, 1, 1), chains.goals.repeat(k, 1, 1, 1))


def decayed(optimizer: torch.optim.Optimizer, lr, i: int, iterations: int) -> None:
    """Set the learning rate of update i (from 0) to lr (1 - i / iterations): a linear decay,
    the same for every trained agent of the chapter, so that each run ends on small steps (`lr`
    one rate, or a tensor of them, one a run trained together)."""
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


def _same_task_meta_loss(learner, chains: ca.Chains) -> torch.Tensor:
    """MAML's meta-loss written again: adapt on episode i by `_adapt_again`, judged on the goals
    of episode i + 1 under the scales of episode i (the same task), averaged over the pairs."""
    c, e, g, a = chains.goals.shape
    W, b = _adapt_again(
        learner, chains.goals[:, :-1].reshape(-1, g, a), chains.scales[:, :-1].reshape(-1, a)
    )
    # L_{T_i}(phi_i) on the goals of episode i + 1, under the scales of episode i
    judged = chains.goals[:, 1:].reshape(-1, g, a), chains.scales[:, :-1].reshape(-1, a)
    return ca.task_loss(W, b, *judged).mean()


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


# -- execution along held-out chains (Algorithm 2) and the reactive baselines -------------------

ADAPTATIONS = ("meta", "maml", "tracking", "restarted", "refit", "none")


@dataclass(frozen=True)
class Episodes:
    """What an agent lived through: `losses` (C, E), the loss of each episode of each chain, and
    the policy it ran in each episode, `weights` (C, E, A, A) and `biases` (C, E, A) (None
    where a caller records only W)."""

    losses: torch.Tensor
    weights: torch.Tensor
    biases: torch.Tensor | None = None


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
    - `"restarted"`: the same steps, always from the policy's own parameters: the paper's
      adaptation with nothing meta-learned (a fixed start and a fixed, tuned step size);
    - `"refit"`: episode i + 1 runs the minimiser of episode i's loss nearest the parameters of
      episode i (`_refit`): tracking run to convergence, the best that fitting the last
      episode can do;
    - `"none"`: the same parameters in every episode.
    """
    checks.one_of("adaptation", adaptation, ADAPTATIONS)
    checks.number("tracking_lr", tracking_lr, 0.0, low_open=True)
    checks.integer("tracking_steps", tracking_steps)
    if adaptation in ("meta", "maml") and not isinstance(policy, ca.MetaLearner):
        raise TypeError(
            f"adaptation={adaptation!r} needs a MetaLearner; got {type(policy).__name__}"
        )
    checks.tensor("chains.goals", chains.goals, "(C, E, G, A)", A=ca.ACTUATORS)
    checks.tensor("chains.scales", chains.scales, "(C, E, A)", C=len(chains), A=ca.ACTUATORS)
    c, e = chains.scales.shape[:2]
    losses, weights, biases = [], [], []
    start = policy.W.detach().expand(c, -1, -1), policy.b.detach().expand(c, -1)
    W, b = start
    for i in range(e):
        seen = chains.goals[:, i - 1], chains.scales[:, i - 1]  # episode i's experience
        if i > 0 and adaptation == "meta":
            # phi_i from theta, on the experience of episode i (again from theta every time)
            W, b = ca.adapt(policy, *seen, create_graph=False)
        elif i > 0 and adaptation == "maml":
            W, b = _adapt_again(policy, *seen, create_graph=False)
        elif i > 0 and adaptation == "tracking":
            W, b = _gradient_steps(W, b, *seen, tracking_lr, tracking_steps)
        elif i > 0 and adaptation == "restarted":
            W, b = _gradient_steps(*start, *seen, tracking_lr, tracking_steps)
        elif i > 0 and adaptation == "refit":
            W, b = _refit(W, b, *seen)
        W, b = W.detach(), b.detach()
        losses.append(ca.task_loss(W, b, chains.goals[:, i], chains.scales[:, i]))
        weights.append(W)
        biases.append(b)
    return Episodes(torch.stack(losses, 1), torch.stack(weights, 1), torch.stack(biases, 1))


def extrapolated(run: Episodes, chains: ca.Chains, beta: float, *, since: str = "last") -> Episodes:
    """A reacting agent that aims ahead by a hand-made rule, from the policies P_i that `run`
    ran (P_i fitted on episode i - 1's experience): it runs P_i + beta (P_i - P_ref) instead.

    - `since="last"`, for an agent that carries its parameters (tracking, refit): P_ref =
      P_(i-1), the trend of its last two fits, from episode 3 on (episodes 1 and 2 as `run`);
      with the refit and beta = 1, W_(i+1) = 2 W_i - W_(i-1): a linear extrapolation;
    - `since="start"`, for an agent that restarts every episode (restarted): P_ref = P_1, its
      start, from episode 2 on: it overshoots its fit of the last episode, away from its start.
    """
    checks.number("beta", beta, 0.0)
    checks.one_of("since", since, ("last", "start"))
    checks.tensor("run.weights", run.weights, "(C, E, A, A)", C=len(chains), A=ca.ACTUATORS)
    if run.biases is None:
        raise ValueError("run.biases is None: extrapolate a run of run_chains, which records b")
    W, b = run.weights.clone(), run.biases.clone()
    if since == "last":  # P_i + beta (P_i - P_(i-1)), episodes 3..E
        W[:, 2:] += beta * (run.weights[:, 2:] - run.weights[:, 1:-1])
        b[:, 2:] += beta * (run.biases[:, 2:] - run.biases[:, 1:-1])
    else:  # P_i + beta (P_i - P_1), episodes 2..E
        W[:, 1:] += beta * (run.weights[:, 1:] - run.weights[:, :1])
        b[:, 1:] += beta * (run.biases[:, 1:] - run.biases[:, :1])
    c, e, g, a = chains.goals.shape
    losses = ca.task_loss(
        W.reshape(-1, a, a),
        b.reshape(-1, a),
        chains.goals.reshape(-1, g, a),
        chains.scales.reshape(-1, a),
    )
    return Episodes(losses.view(c, e), W, b)


def _gradient_steps(W, b, goals, scales, lr, steps):
    """Plain gradient descent from (W, b): the tracking baseline's update."""
    with torch.enable_grad():
        for _ in range(steps):
            W, b = W.detach().requires_grad_(True), b.detach().requires_grad_(True)
            loss = ca.task_loss(W, b, goals, scales).sum()
            grad_W, grad_b = torch.autograd.grad(loss, (W, b))
            W, b = W - lr * grad_W, b - lr * grad_b
    return W.detach(), b.detach()


def _refit(W, b, goals, scales):
    """The minimiser of each task's loss nearest (W, b): one Newton step with the pseudo-inverse
    of the Hessian, exact because the loss is quadratic in theta = (W, b), computed in float64.
    Where the episode's goals do not pin theta down (fewer than A + 1 goals), it moves theta
    only as far as they ask."""
    a = W.shape[-1]

    def loss(theta, g, s):
        return ca.task_loss(
            theta[: a * a].view(1, a, a), theta[a * a :].view(1, a), g[None], s[None]
        )[0]

    theta = torch.cat([W.flatten(1), b], 1).double()
    found = theta, goals.double(), scales.double()
    with torch.enable_grad():
        grad = torch.func.vmap(torch.func.grad(loss))(*found)
        hessian = torch.func.vmap(torch.func.hessian(loss))(*found)
    # theta* = theta - H^+ grad L(theta): of the minimisers of a quadratic L, the one nearest theta
    step = torch.linalg.pinv(hessian, rtol=1e-10, hermitian=True) @ grad.unsqueeze(-1)
    fitted = (theta - step.squeeze(-1)).to(W.dtype)
    return fitted[:, : a * a].view(-1, a, a), fitted[:, a * a :]


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
