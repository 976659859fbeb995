"""Broken variants of continuous adaptation via meta-learning (papernotes.continuous_adaptation).

Each function patches the module where the name lives (the mechanism, or its experiment for
`run_chains`); the chapter, run with the patch, must stop on its claim check. The mechanism's
functions read `adapt` and `next_task_targets` from its globals, and the experiment calls
`adapt`, `meta_parameters` and `task_loss` through the module when called, so meta-training and
execution both see the patch.
"""

import torch

from papernotes import continuous_adaptation as m
from papernotes.continuous_adaptation import experiment


def judged_on_the_same_task():
    """The adapted parameters are judged on the task they were adapted on: MAML, not this paper."""

    def next_task_targets(chains, next_task):
        return chains.goals[:, 1:], chains.scales[:, :-1]

    m.next_task_targets = next_task_targets


def first_order_meta_gradient():
    """The inner gradients are detached: no second derivatives reach theta and alpha."""

    def adapt(learner, goals, scales, *, create_graph=True):
        n = goals.shape[0]
        W, b = learner.W.expand(n, -1, -1), learner.b.expand(n, -1)
        for step in range(learner.inner_steps):
            Wd, bd = W.detach().requires_grad_(True), b.detach().requires_grad_(True)
            with torch.enable_grad():
                loss = m.task_loss(Wd, bd, goals, scales).sum()
                grad_W, grad_b = torch.autograd.grad(loss, (Wd, bd))
            W = W - learner.alpha_W[step] * grad_W
            b = b - learner.alpha_b[step] * grad_b
        return W, b

    m.adapt = adapt


def chained_from_the_previous_phi():
    """At execution each episode adapts from the previous episode's phi instead of from theta."""
    original = experiment.run_chains

    def run_chains(policy, chains, *, adaptation="meta", **kwargs):
        if adaptation != "meta":
            return original(policy, chains, adaptation=adaptation, **kwargs)
        c, e = chains.scales.shape[:2]
        losses, weights, biases = [], [], []
        W, b = policy.W.detach().expand(c, -1, -1), policy.b.detach().expand(c, -1)
        for i in range(e):
            if i > 0:
                with torch.enable_grad():  # the last phi, not theta, is the starting point
                    W0, b0 = W.clone().requires_grad_(True), b.clone().requires_grad_(True)
                    for step in range(policy.inner_steps):
                        loss = m.task_loss(W0, b0, chains.goals[:, i - 1], chains.scales[:, i - 1])
                        grad_W, grad_b = torch.autograd.grad(loss.sum(), (W0, b0))
                        W0 = W0 - policy.alpha_W[step].detach() * grad_W
                        b0 = b0 - policy.alpha_b[step].detach() * grad_b
                W, b = W0.detach(), b0.detach()
            losses.append(m.task_loss(W, b, chains.goals[:, i], chains.scales[:, i]).detach())
            weights.append(W)
            biases.append(b)
        stacked = (torch.stack(x, 1) for x in (losses, weights, biases))
        return experiment.Episodes(*stacked)

    experiment.run_chains = run_chains


def step_sizes_never_learned():
    """The meta-optimizer updates theta only; the step sizes alpha stay at their initial value."""

    def meta_parameters(learner, learn_step_sizes):
        learner.alpha.requires_grad_(False)
        return [learner.W, learner.b]

    m.meta_parameters = meta_parameters


MUTANTS = [
    judged_on_the_same_task,
    first_order_meta_gradient,
    chained_from_the_previous_phi,
    step_sizes_never_learned,
]
