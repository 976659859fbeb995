r"""Continuous adaptation via meta-learning: MAML turned to a world that changes as it goes.

Al-Shedivat, Bansal, Burda, Sutskever, Mordatch & Abbeel 2018, *Continuous Adaptation via
Meta-Learning in Nonstationary and Competitive Environments*, ICLR (arXiv:1710.03641). The
module follows the paper's section 3 and its Algorithms 1 (meta-training) and 2 (adaptation at
execution time) in order, on a small supervised analog of its crippled-leg agent.

1. **A nonstationary world: chains of tasks.** The tasks do not come independently; they come
   as a Markov chain $T_1 \to T_2 \to \dots$ of small changes. Here an agent has $A = 4$
   actuators and must reach goals $g \in \mathbb R^A$. Its policy is linear, $a = Wg + b$ with
   parameters $\theta = (W, b)$, and actuator $j$ delivers only a fraction $s_j$ of its command:
   the outcome is $s \odot a$. The loss of task $T$ (scales $s$) on goals $g_1, \dots, g_G$ is

   $$\mathcal L_T(\theta) = \frac1G \sum_{n=1}^{G} \lVert s \odot (W g_n + b) - g_n \rVert^2 .$$

   In a chain one actuator, drawn at random, weakens linearly over $E = 7$ episodes, from
   $s_j = 1$ in the first to $s_j = 1 - \delta$ in the last ($\delta$, the drift, is 0.75 by
   default); each episode brings $G = 32$ fresh goals (`task_chains`).

2. **Adaptation (the inner loop).** From the meta-parameters $\theta$, $M$ gradient steps on the
   experience of task $T_i$ (its goals and its loss) with meta-learned step sizes $\alpha_m$, one
   per step and per coordinate of $\theta$:

   $$\phi_i^0 = \theta,\qquad
     \phi_i^m = \phi_i^{m-1} - \alpha_m \odot \nabla_{\phi}\, \mathcal L_{T_i}(\phi_i^{m-1}),
     \quad m = 1, \dots, M,\qquad \phi_i = \phi_i^M .$$

   Every adaptation starts from $\theta$, never from the previous episode's $\phi_{i-1}$
   (`adapt`).

3. **The meta-loss over consecutive tasks.** The adapted parameters are judged on the
   *next* task, on experience that was not used to adapt:

   $$\min_{\theta, \alpha}\ \mathbb E_{\mathcal P(T_0),\, \mathcal P(T_{i+1} \mid T_i)}
     \Big[ \sum_{i} \mathcal L_{T_i, T_{i+1}}(\theta, \alpha) \Big],\qquad
     \mathcal L_{T_i, T_{i+1}}(\theta, \alpha) = \mathcal L_{T_{i+1}}(\phi_i(\theta, \alpha)).$$

   MAML (Finn et al. 2017) is the same with $T_{i+1}$ replaced by $T_i$ (fresh goals of the task the
   parameters were adapted on): `meta_loss(..., next_task=False)`, the baseline of the chapter.

4. **The meta-gradient** goes through the $M$ inner steps, second derivatives included
   ($\partial\phi_i/\partial\theta = \prod_{m=M}^{1} \big(I - \mathrm{diag}(\alpha_m)\,
   \nabla^2 \mathcal L_{T_i}(\phi_i^{m-1})\big)$: truncated back-propagation through the
   chain with a one-step lag), and reaches the step sizes
   ($\partial\phi_i^m / \partial\alpha_m = -\nabla\mathcal L_{T_i}(\phi_i^{m-1})$ and through
   the later steps). Algorithm 1 samples batches of chains and takes Adam steps on
   $(\theta, \alpha)$; here those steps are the book's one training loop, `pn.train`, whose
   update loss is the meta-loss (`meta_train`).

5. **Execution (Algorithm 2).** On a new chain: episode 1 runs $\theta$ itself; episode $i + 1$
   runs $\phi_i$, adapted from $\theta$ on the experience of episode $i$, and its own
   experience feeds the next adaptation (`run_chains`), again from $\theta$. The baselines:
   *no adaptation* (one policy fitted to all the training chains' tasks, never changed) and
   *tracking* (that policy fine-tuned with $M$ plain gradient steps on each episode's
   experience, carried from episode to episode: the paper's tracking baseline in kind).

The paper's agents are policies trained with policy gradients; its loss is an expectation over
trajectories, its meta-gradient (eq. 8) holds a score-function term for the trajectories that
$\pi_\theta$ collected, and at execution time it reweights old experience with importance
weights (eq. 9). Here the loss is a known function of the parameters and of goals that do not
depend on the policy, so neither is needed: the gradients are exact.

Every function reads the module's globals (`adapt`, `task_loss`, `next_task_targets`,
`meta_parameters`) when called, so that a patched module (tests/mutants/continuous_adaptation.py)
is seen everywhere. Arguments are checked where they enter (`task_chains`, `MetaLearner`,
`meta_train`, `train_no_adaptation`, `run_chains`); the math below them trusts its input.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from papernotes import checks
from papernotes.training import History, generator, seeded, train

ACTUATORS = 4
EPISODES = 7
GOALS = 32


# -- 1. chains of tasks ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Chains:
    """A batch of task chains: `scales` (C, E, A), each actuator's fraction per episode, and
    `goals` (C, E, G, A), the goals of each episode (its experience)."""

    scales: torch.Tensor
    goals: torch.Tensor

    def __len__(self) -> int:
        return self.scales.shape[0]


def task_chains(
    n_chains: int,
    *,
    drift: float = 0.75,
    episodes: int = EPISODES,
    goals: int = GOALS,
    generator: torch.Generator,
) -> Chains:
    """Draw `n_chains` chains: in each, one random actuator's scale falls linearly from 1 in the
    first episode to 1 - drift in the last; every episode has `goals` goals from N(0, I)."""
    checks.integer("n_chains", n_chains)
    checks.number("drift", drift, 0.0, 1.0, high_open=True)
    checks.integer("episodes", episodes, 2)
    checks.integer("goals", goals)
    crippled = torch.randint(ACTUATORS, (n_chains,), generator=generator)
    fraction = 1.0 - drift * torch.arange(episodes, dtype=torch.float32) / (episodes - 1)
    scales = torch.ones(n_chains, episodes, ACTUATORS)
    scales[torch.arange(n_chains), :, crippled] = fraction
    goal_draws = torch.randn(n_chains, episodes, goals, ACTUATORS, generator=generator)
    return Chains(scales, goal_draws)


def task_loss(W: torch.Tensor, b: torch.Tensor, goals: torch.Tensor, scales: torch.Tensor):
    r"""$\mathcal L_T(\theta) = \frac1G\sum_n \lVert s \odot (W g_n + b) - g_n\rVert^2$, one per
    task of a batch: W (N, A, A), b (N, A), goals (N, G, A), scales (N, A) -> (N,)."""
    actions = goals @ W.transpose(-1, -2) + b.unsqueeze(-2)
    outcome = scales.unsqueeze(-2) * actions
    return (outcome - goals).pow(2).sum(-1).mean(-1)


# -- 2. adaptation from the meta-parameters ------------------------------------------------------


class MetaLearner(nn.Module):
    """The meta-parameters: the policy's theta = (W, b) and the step sizes alpha, one per inner
    step and per coordinate of theta (`alpha_W` (M, A, A), `alpha_b` (M, A))."""

    def __init__(self, inner_steps: int = 3, step_size: float = 0.1):
        super().__init__()
        checks.integer("inner_steps", inner_steps)
        checks.number("step_size", step_size, 0.0, low_open=True)
        linear = nn.Linear(ACTUATORS, ACTUATORS)  # initial weights: torch's default, seeded
        self.W = nn.Parameter(linear.weight.detach().clone())
        self.b = nn.Parameter(linear.bias.detach().clone())
        self.alpha_W = nn.Parameter(torch.full((inner_steps, ACTUATORS, ACTUATORS), step_size))
        self.alpha_b = nn.Parameter(torch.full((inner_steps, ACTUATORS), step_size))

    @property
    def inner_steps(self) -> int:
        return self.alpha_W.shape[0]


def adapt(learner: MetaLearner, goals, scales, *, create_graph: bool = True):
    r"""$\phi^0 = \theta$, $\phi^m = \phi^{m-1} - \alpha_m \odot \nabla\mathcal L_{T}(\phi^{m-1})$
    for $m = 1..M$, for a batch of N tasks at once (goals (N, G, A), scales (N, A)).

    Always from theta. With `create_graph` the steps stay differentiable, second derivatives
    included, so that the meta-loss reaches theta and alpha through them."""
    n = goals.shape[0]
    with torch.enable_grad():  # adaptation needs gradients, also where the caller has none
        W = learner.W.expand(n, -1, -1)
        b = learner.b.expand(n, -1)
        if not create_graph:
            W, b = W.detach().requires_grad_(True), b.detach().requires_grad_(True)
        for m in range(learner.inner_steps):
            loss = task_loss(W, b, goals, scales).sum()  # independent tasks: per-task gradients
            grad_W, grad_b = torch.autograd.grad(loss, (W, b), create_graph=create_graph)
            W = W - learner.alpha_W[m] * grad_W
            b = b - learner.alpha_b[m] * grad_b
    return W, b


# -- 3. the meta-loss over consecutive tasks -------------------------------------------------------


def next_task_targets(chains: Chains, next_task: bool):
    """What the parameters adapted on episode i are judged on: the goals of episode i + 1, under
    the scales of episode i + 1 (continuous adaptation) or of episode i itself (MAML: the same
    task, on goals not used to adapt). Returns goals (C, E-1, G, A), scales (C, E-1, A)."""
    later = slice(1, None) if next_task else slice(None, -1)
    return chains.goals[:, 1:], chains.scales[:, later]


def meta_loss(learner: MetaLearner, chains: Chains, *, next_task: bool = True) -> torch.Tensor:
    r"""$\frac{1}{C(E-1)}\sum_{c,i} \mathcal L_{T_{i+1}}(\phi_i)$: adapt on episode i of every
    chain (all consecutive pairs at once), judge on the next task."""
    c, e, g, a = chains.goals.shape
    goals = chains.goals[:, :-1].reshape(-1, g, a)
    scales = chains.scales[:, :-1].reshape(-1, a)
    W, b = adapt(learner, goals, scales)
    target_goals, target_scales = next_task_targets(chains, next_task)
    return task_loss(W, b, target_goals.reshape(-1, g, a), target_scales.reshape(-1, a)).mean()


# -- 4. meta-training through the book's loop ----------------------------------------------------


@dataclass
class Run:
    learner: nn.Module
    history: History


def meta_parameters(learner: MetaLearner, learn_step_sizes: bool) -> list[nn.Parameter]:
    """What the meta-optimizer updates: theta, and alpha when the step sizes are learned."""
    learner.alpha_W.requires_grad_(learn_step_sizes)
    learner.alpha_b.requires_grad_(learn_step_sizes)
    step_sizes = [learner.alpha_W, learner.alpha_b] if learn_step_sizes else []
    return [learner.W, learner.b, *step_sizes]


def meta_train(
    *,
    seed: int,
    next_task: bool = True,
    learn_step_sizes: bool = True,
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
    `pn.train` (its update loss is the meta-loss of a batch of chains; the history logs it).

    `next_task=False` trains MAML-style (adapt and judge on the same task);
    `learn_step_sizes=False` keeps alpha at `step_size`. The training chains come from the run's
    generator stream 1, a stream no held-out chain is drawn from."""
    checks.integer("seed", seed, 0)
    checks.boolean("next_task", next_task)
    checks.boolean("learn_step_sizes", learn_step_sizes)
    checks.integer("iterations", iterations)
    checks.integer("chains_per_update", chains_per_update)
    checks.number("lr", lr, 0.0, low_open=True)
    with seeded(seed):
        learner = MetaLearner(inner_steps, step_size)
    optimizer = torch.optim.Adam(meta_parameters(learner, learn_step_sizes), lr=lr)
    batches = generator(seed, stream=1)

    def loss_of_update(_i):
        chains = task_chains(chains_per_update, drift=drift, goals=goals, generator=batches)
        return meta_loss(learner, chains, next_task=next_task)

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


class Policy(nn.Module):
    """A plain policy a = W g + b, for the baselines."""

    def __init__(self):
        super().__init__()
        linear = nn.Linear(ACTUATORS, ACTUATORS)
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
    chains (the same stream as meta-training), then never changed."""
    checks.integer("seed", seed, 0)
    checks.integer("iterations", iterations)
    checks.integer("chains_per_update", chains_per_update)
    checks.number("lr", lr, 0.0, low_open=True)
    with seeded(seed):
        policy = Policy()
    batches = generator(seed, stream=1)

    def loss_of_update(_i):
        chains = task_chains(chains_per_update, drift=drift, goals=goals, generator=batches)
        c, e, g, a = chains.goals.shape
        W, b = policy.W.expand(c * e, -1, -1), policy.b.expand(c * e, -1)
        return task_loss(W, b, chains.goals.reshape(-1, g, a), chains.scales.reshape(-1, a)).mean()

    optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
    history = train(policy, optimizer, loss_of_update, iterations, desc="no adaptation")
    return Run(policy, history)


# -- 5. execution along held-out chains (Algorithm 2) ----------------------------------------------


@dataclass(frozen=True)
class Episodes:
    """What an agent lived through: `losses` (C, E), the loss of each episode of each chain, and
    `weights` (C, E, A, A), the W it ran in each episode."""

    losses: torch.Tensor
    weights: torch.Tensor


def run_chains(
    policy: nn.Module,
    chains: Chains,
    *,
    adaptation: str = "meta",
    tracking_lr: float = 0.1,
    tracking_steps: int = 3,
) -> Episodes:
    """Live through every chain, episode by episode, and record each episode's loss.

    - `adaptation="meta"` (a MetaLearner): episode 1 runs theta; episode i + 1 runs phi_i,
      adapted from theta on episode i's experience (Algorithm 2);
    - `"tracking"`: episode i + 1 runs the parameters of episode i after `tracking_steps` plain
      gradient steps of size `tracking_lr` on its experience (never reset);
    - `"none"`: the same parameters in every episode.
    """
    checks.one_of("adaptation", adaptation, ("meta", "tracking", "none"))
    checks.number("tracking_lr", tracking_lr, 0.0, low_open=True)
    checks.integer("tracking_steps", tracking_steps)
    if adaptation == "meta" and not isinstance(policy, MetaLearner):
        raise TypeError(f"adaptation='meta' needs a MetaLearner; got {type(policy).__name__}")
    checks.tensor("chains.goals", chains.goals, "(C, E, G, A)", A=ACTUATORS)
    checks.tensor("chains.scales", chains.scales, "(C, E, A)", C=len(chains), A=ACTUATORS)
    c, e = chains.scales.shape[:2]
    losses, weights = [], []
    W, b = policy.W.detach().expand(c, -1, -1), policy.b.detach().expand(c, -1)
    for i in range(e):
        if i > 0 and adaptation == "meta":
            W, b = adapt(
                policy, chains.goals[:, i - 1], chains.scales[:, i - 1], create_graph=False
            )
        elif i > 0 and adaptation == "tracking":
            W, b = _gradient_steps(
                W, b, chains.goals[:, i - 1], chains.scales[:, i - 1], tracking_lr, tracking_steps
            )
        W, b = W.detach(), b.detach()
        losses.append(task_loss(W, b, chains.goals[:, i], chains.scales[:, i]))
        weights.append(W)
    return Episodes(torch.stack(losses, 1), torch.stack(weights, 1))


def _gradient_steps(W, b, goals, scales, lr, steps):
    """Plain gradient descent from (W, b): the tracking baseline's update."""
    with torch.enable_grad():
        for _ in range(steps):
            W, b = W.detach().requires_grad_(True), b.detach().requires_grad_(True)
            grad_W, grad_b = torch.autograd.grad(task_loss(W, b, goals, scales).sum(), (W, b))
            W, b = W - lr * grad_W, b - lr * grad_b
    return W.detach(), b.detach()


def adapted_fit(learner: MetaLearner, chains: Chains) -> tuple[float, float]:
    """How the adapted parameters phi_i fit the task they were adapted on (T_i) and the next one
    (T_{i+1}), both on episode i + 1's goals, averaged over every consecutive pair."""
    checks.tensor("chains.goals", chains.goals, "(C, E, G, A)", A=ACTUATORS)
    c, e, g, a = chains.goals.shape
    W, b = adapt(
        learner,
        chains.goals[:, :-1].reshape(-1, g, a),
        chains.scales[:, :-1].reshape(-1, a),
        create_graph=False,
    )
    W, b = W.detach(), b.detach()
    goals = chains.goals[:, 1:].reshape(-1, g, a)
    same = task_loss(W, b, goals, chains.scales[:, :-1].reshape(-1, a)).mean().item()
    following = task_loss(W, b, goals, chains.scales[:, 1:].reshape(-1, a)).mean().item()
    return same, following


def crippled_gain(episodes: Episodes, chains: Chains) -> torch.Tensor:
    """The gain W_jj the agent gave the weakening actuator j in each episode, (C, E): the
    ideal is 1 / s_j of that episode."""
    crippled = chains.scales[:, -1].argmin(-1)
    rows = torch.arange(len(chains))
    return episodes.weights[rows, :, crippled, crippled]
