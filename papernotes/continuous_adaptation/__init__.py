"""Continuous adaptation via meta-learning: MAML turned to a world that changes as it goes.

Al-Shedivat, Bansal, Burda, Sutskever, Mordatch & Abbeel 2018, *Continuous Adaptation via
Meta-Learning in Nonstationary and Competitive Environments*, ICLR (arXiv:1710.03641). Tasks come
as a Markov chain of small changes; the agent adapts its policy to each task with a few gradient
steps of meta-learned sizes, always from the meta-parameters, and the meta-loss judges the
adapted parameters on the *next* task, with the meta-gradient through the inner steps. The
chapter (chapters/continuous_adaptation.ipynb, "The idea") derives it; this module follows the
paper's section 3 and its Algorithm 1 in order, on a small supervised analog of its
crippled-leg agent: the task loss, the adaptation, the meta-loss over consecutive tasks and what
the meta-optimizer updates. The task chains, meta-training (Algorithm 1's loop), the baselines,
execution along held-out chains (Algorithm 2) and the measurements are in
`papernotes.continuous_adaptation.experiment`.

The paper's agents are policies trained with policy gradients; its loss is an expectation over
trajectories, its meta-gradient (eq. 8) holds a score-function term for the trajectories that
the policy collected, and at execution time it reweights old experience with importance
weights (eq. 9). Here the loss is a known function of the parameters and of goals that do not
depend on the policy, so neither is needed: the gradients are exact.

Every function reads the module's globals (`adapt`, `task_loss`, `next_task_targets`) when
called, and the experiment calls `adapt`, `task_loss` and `meta_parameters` through the module,
so that a patched module (tests/mutants/continuous_adaptation.py) is seen everywhere. The
constructor checks its arguments (`MetaLearner`); the math below trusts its input.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from papernotes import checks

ACTUATORS = 4

# -- 1. a nonstationary world: chains of tasks ----------------------------------------------------


@dataclass(frozen=True)
class Chains:
    """A batch of task chains T_1 -> T_2 -> ...: `scales` (C, E, A), each actuator's fraction
    per episode, and `goals` (C, E, G, A), the goals of each episode (its experience)."""

    scales: torch.Tensor
    goals: torch.Tensor

    def __len__(self) -> int:
        return self.scales.shape[0]


def task_loss(W: torch.Tensor, b: torch.Tensor, goals: torch.Tensor, scales: torch.Tensor):
    """The loss of a linear policy a = W g + b whose actuator j delivers only a fraction s_j of
    its command, one per task of a batch: W (N, A, A), b (N, A), goals (N, G, A), scales (N, A)
    -> (N,)."""
    # L_T(theta) = 1/G sum_n || s * (W g_n + b) - g_n ||^2
    actions = goals @ W.transpose(-1, -2) + b.unsqueeze(-2)
    outcome = scales.unsqueeze(-2) * actions
    return (outcome - goals).pow(2).sum(-1).mean(-1)


# -- 2. adaptation from the meta-parameters ------------------------------------------------------


class MetaLearner(nn.Module):
    """The meta-parameters: the policy's theta = (W, b), the matrix [W b] of shape (A, A + 1),
    and the step sizes alpha, one set per inner step. `per_coordinate=False` gives each inner
    step one number, shared by every coordinate of theta: the paper's set {alpha_m}, `alpha`
    (M, 1, 1). `per_coordinate=True` gives each inner step a step size per coordinate, of
    theta's own shape, `alpha` (M, A, A + 1): Meta-SGD's (Li et al. 2017), the book's
    variant. `alpha_W` and `alpha_b` are the parts of `alpha` that step W and b."""

    def __init__(self, inner_steps: int = 3, step_size: float = 0.1, per_coordinate: bool = True):
        super().__init__()
        checks.integer("inner_steps", inner_steps)
        checks.number("step_size", step_size, 0.0, low_open=True)
        checks.boolean("per_coordinate", per_coordinate)
        linear = nn.Linear(ACTUATORS, ACTUATORS)  # initial weights: torch's default, seeded
        self.W = nn.Parameter(linear.weight.detach().clone())
        self.b = nn.Parameter(linear.bias.detach().clone())
        shape = (ACTUATORS, ACTUATORS + 1) if per_coordinate else (1, 1)
        self.alpha = nn.Parameter(torch.full((inner_steps, *shape), step_size))

    @property
    def inner_steps(self) -> int:
        return self.alpha.shape[0]

    @property
    def per_coordinate(self) -> bool:
        return self.alpha.shape[-1] > 1

    @property
    def alpha_W(self) -> torch.Tensor:
        """The step sizes of W, (M, A, A), or (M, 1, 1) broadcast over W."""
        return self.alpha[..., :ACTUATORS] if self.per_coordinate else self.alpha

    @property
    def alpha_b(self) -> torch.Tensor:
        """The step sizes of b, (M, A), or (M, 1) broadcast over b: the same number as W's."""
        return self.alpha[..., ACTUATORS] if self.per_coordinate else self.alpha[..., 0]


def adapt(learner: MetaLearner, goals, scales, *, create_graph: bool = True):
    """M gradient steps on a task's experience with meta-learned step sizes, for a batch of N
    tasks at once (goals (N, G, A), scales (N, A)).

    Always from theta, never from the previous episode's phi. With `create_graph` the steps
    stay differentiable, second derivatives included, so that the meta-loss reaches theta and
    alpha through them."""
    n = goals.shape[0]
    with torch.enable_grad():  # adaptation needs gradients, also where the caller has none
        # phi^0 = theta
        W = learner.W.expand(n, -1, -1)
        b = learner.b.expand(n, -1)
        if not create_graph:
            W, b = W.detach().requires_grad_(True), b.detach().requires_grad_(True)
        # phi^m = phi^(m-1) - alpha_m * grad L_T(phi^(m-1)), m = 1..M (alpha_m one number
        # broadcast over theta, or one per coordinate)
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
    """Adapt on episode i of every chain (all consecutive pairs at once), judge on the next task.

    `next_task=False` is MAML (Finn et al. 2017): judged on fresh goals of the task the
    parameters were adapted on, the chapter's baseline."""
    c, e, g, a = chains.goals.shape
    goals = chains.goals[:, :-1].reshape(-1, g, a)
    scales = chains.scales[:, :-1].reshape(-1, a)
    # phi_i = adapt(theta, alpha; T_i)
    W, b = adapt(learner, goals, scales)
    # L_{T_i, T_{i+1}}(theta, alpha) = L_{T_{i+1}}(phi_i(theta, alpha)), averaged over c and i
    target_goals, target_scales = next_task_targets(chains, next_task)
    return task_loss(W, b, target_goals.reshape(-1, g, a), target_scales.reshape(-1, a)).mean()


# -- 4. the meta-gradient: what the meta-optimizer updates ----------------------------------------


def meta_parameters(learner: MetaLearner, learn_step_sizes: bool) -> list[nn.Parameter]:
    """What the meta-optimizer updates: theta, and alpha when the step sizes are learned.

    The meta-gradient reaches theta through the M inner steps, second derivatives included
    (d phi / d theta = prod_m (I - diag(alpha_m) H_m)), and alpha through
    d phi^m / d alpha_m = -grad L_T(phi^(m-1)) and the later steps."""
    learner.alpha.requires_grad_(learn_step_sizes)
    return [learner.W, learner.b, *([learner.alpha] if learn_step_sizes else [])]
