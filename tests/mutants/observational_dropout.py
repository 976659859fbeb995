"""Broken variants of observational dropout (papernotes.observational_dropout).

Each function patches the mechanism's module in place; the chapter, run with the patch, must
stop on its claim check. `papernotes.observational_dropout.experiment` calls `peek_mask`,
`agent_cost` and `rollout` through the module when called, `agent_cost` reads `rollout`,
`rollout` reads `unroll` and `unroll` reads `controller` and `next_seen`, and `next_seen` reads
`world_model`, all from the module's globals, so every agent searched with observational dropout
sees the patch. The baselines (agents without a world model, the network trained to predict,
the imagination) are the experiment's own code and never see it.
"""

import torch

from papernotes import observational_dropout as m


def model_never_consulted():
    """Where the agent does not peek it is shown what it saw last, not the model's output."""

    def next_seen(w, seen, action, real_next, peek, dt):
        return torch.where(peek.unsqueeze(-1), real_next, seen)

    m.next_seen = next_seen


def peek_mask_inverted():
    """The agent peeks where it should not and looks away where it should peek."""
    original = m.peek_mask

    def peek_mask(p, episodes, steps, gen):
        return ~original(p, episodes, steps, gen)

    m.peek_mask = peek_mask


def action_not_fed_to_model():
    """The world model is fed a zero action instead of the action the agent took."""
    original = m.world_model

    def world_model(w, seen, action, dt):
        return original(w, seen, torch.zeros_like(action), dt)

    m.world_model = world_model


def _unroll_showing(shown, score_what_it_sees=False):
    """The mechanism's roll-out with what the agent is shown next computed by `shown(w, seen,
    before, after, action, peek, dt, memory) -> (seen, memory)` (before and after: the real
    state around the step), its cost read off what it sees where `score_what_it_sees`."""

    def unroll(params, hidden, env, start, noise, peeks):
        w = m.unpack(params, hidden)
        state = seen = memory = start.expand(params.shape[0], -1, -1)
        costs, states, inputs = [], [], []
        for i in range(noise.shape[-2]):
            action = m.controller(w, seen, env.u_max) + noise[..., i, 1]
            inputs.append(seen)
            before, state = state, env.step(state, action, noise[..., i, 0])
            seen, memory = shown(w, seen, before, state, action, peeks[..., i], env.dt, memory)
            states.append(state)
            costs.append(env.cost(seen if score_what_it_sees else state))
        return torch.stack(costs, -1), torch.stack(states, -2), torch.stack(inputs, -2)

    return unroll


def model_output_one_step_late():
    """When the agent does not peek it is shown the model's output of the step before."""

    def shown(w, seen, before, after, action, peek, dt, late):
        guess = m.world_model(w, seen, action, dt)
        return torch.where(peek.unsqueeze(-1), after, late), guess

    m.unroll = _unroll_showing(shown)


def prediction_loss_added():
    """The agents are also scored on how well the model predicts the next real state."""
    original = m.agent_cost

    def agent_cost(params, hidden, env, start, noise, peeks):
        cost = original(params, hidden, env, start, noise, peeks)
        _, states, seen = m.rollout(params, hidden, env, start, noise, peeks)
        w = m.unpack(params, hidden)
        action = m.controller(w, states[..., :-1, :], env.u_max)
        guess = m.world_model(w, states[..., :-1, :], action, env.dt)
        return cost + (guess - states[..., 1:, :]).pow(2).sum(-1).mean((-2, -1))

    m.agent_cost = agent_cost


def model_fed_the_real_state():
    """The model computes its output from the real state even when the agent does not peek."""

    def shown(w, seen, before, after, action, peek, dt, memory):
        return torch.where(peek.unsqueeze(-1), after, m.world_model(w, before, action, dt)), memory

    m.unroll = _unroll_showing(shown)


def cost_of_what_it_sees():
    """The roll-out scores the angle the agent is shown instead of the real pendulum's."""

    def shown(w, seen, before, after, action, peek, dt, memory):
        return m.next_seen(w, seen, action, after, peek, dt), memory

    m.unroll = _unroll_showing(shown, score_what_it_sees=True)


# Four variants are not listed, because the search copes with them or they make the agent better, so
# every claim still holds (the chapter's measures cannot tell them from a well-searched agent): the
# roll-out scoring the angle the agent is shown instead of the real one (the experiment reads the
# agents' costs off the real states, so the headline sees the damage: it caught the variant on a
# design seed, and missed it on the chapter's seed 0, where the search found an agent that does well
# enough anyway), caught by test_the_score_is_the_task_cost_alone_and_ignores_an_unconsulted_model;
# the model's output shown a step late (the search learns a model that forecasts two steps ahead,
# and the agent still beats every null), caught by
# test_the_agent_sees_the_real_state_when_it_peeks_and_else_the_models_output; the model fed the
# real state (a leak), caught by test_with_p_zero_the_real_state_is_never_seen_after_the_start; and
# a prediction loss added to the score, caught by
# test_the_score_is_the_task_cost_alone_and_ignores_an_unconsulted_model.
MUTANTS = [
    model_never_consulted,
    peek_mask_inverted,
    action_not_fed_to_model,
]
