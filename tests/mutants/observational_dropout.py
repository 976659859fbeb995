"""Broken variants of observational dropout (papernotes.observational_dropout).

Each function patches the mechanism's module in place; the chapter, run with the patch, must
stop on its claim check. `papernotes.observational_dropout.experiment` calls `peek_mask`,
`agent_loss` and `rollout` through the module when called, `agent_loss` reads `rollout` and
`rollout` reads `next_seen` from the module's globals, so the training runs, the measures and
the roll-outs all see the patch.
"""

import torch

from papernotes import observational_dropout as m


def peek_mask_inverted():
    """The agent peeks where it should not and looks away where it should peek (first step kept)."""
    original = m.peek_mask

    def peek_mask(n, steps, p, gen):
        peeks = ~original(n, steps, p, gen)
        peeks[:, 0] = True
        return peeks

    m.peek_mask = peek_mask


def model_output_one_step_late():
    """When the agent does not peek it is shown the model's output of the step before."""

    def rollout(controller, model, observations, peeks):
        t = observations.shape[1]
        seen = late = observations[:, 0]
        actions, inputs = [], []
        for i in range(t):
            action = controller(seen)
            actions.append(action)
            inputs.append(seen)
            if i + 1 < t:
                if model is None:  # the hold baseline is left as it is
                    seen = m.next_seen(None, seen, action, observations[:, i + 1], peeks[:, i + 1])
                    continue
                guess = model(seen, action)
                seen = torch.where(peeks[:, i + 1, None], observations[:, i + 1], late)
                late = guess
        return torch.stack(actions, 1), torch.stack(inputs, 1)

    m.rollout = rollout


def prediction_loss_added():
    """The model is also trained to predict the next observation (a forward-prediction loss)."""
    original = m.agent_loss

    def agent_loss(controller, model, positions, observations, peeks):
        loss = original(controller, model, positions, observations, peeks)
        if model is None:
            return loss
        seen = observations[:, :-1]
        guess = model(seen, controller(seen))
        return loss + (guess - observations[:, 1:]).pow(2).mean()

    m.agent_loss = agent_loss


def model_fed_the_real_observation():
    """The model computes its output from the real observation even when the agent does not peek."""

    def rollout(controller, model, observations, peeks):
        t = observations.shape[1]
        seen = observations[:, 0]
        actions, inputs = [], []
        for i in range(t):
            action = controller(seen)
            actions.append(action)
            inputs.append(seen)
            if i + 1 < t:
                real = observations[:, i]
                guess = seen if model is None else model(real, controller(real))
                seen = torch.where(peeks[:, i + 1, None], observations[:, i + 1], guess)
        return torch.stack(actions, 1), torch.stack(inputs, 1)

    m.rollout = rollout


# The leak above is not listed: it makes the agent better at every p, so it passes every claim
# (the chapter's measures cannot tell a leaking agent from a very good one). The unit test
# test_with_p_zero_the_real_observation_is_never_seen_after_the_first_step catches it.
MUTANTS = [
    peek_mask_inverted,
    model_output_one_step_late,
    prediction_loss_added,
]
