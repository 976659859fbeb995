"""Unit tests of papernotes.observational_dropout: the pendulum against its equation, the peek
pattern against its generator and Monte Carlo, the roll-out against hand-made models (the agent
never sees the real world where it does not peek; the model never changes anything when it
always peeks), the score against the task's cost alone, the evolution strategy on a quadratic,
and the baselines' own code against the mechanism where they must agree."""

import pytest
import torch

from conftest import gen
from papernotes import observational_dropout as od
from papernotes.observational_dropout import experiment

H = 4


def agents(b=3, seed=0, hidden=H):
    """A population of random agents (their controllers act, their models move)."""
    return 0.5 * torch.randn(b, od.n_params(hidden), generator=gen(seed))


def identity_models(params, hidden=H):
    """The same agents with M the identity (no output weights)."""
    params = params.clone()
    w = od.unpack(params, hidden)
    w["W2"].zero_()
    w["b2"].zero_()
    return params


def episodes(n=6, seed=0, env=None):
    env = experiment.Pendulum() if env is None else env
    return env.episodes(n, gen(seed))


def pendulum_world():
    """The default pendulum, six of its episodes (start and noise) and three random agents."""
    env = experiment.Pendulum()
    return (env, *episodes(env=env), agents())


# -- the pendulum ----------------------------------------------------------------------------------


def test_the_pendulum_steps_by_semi_implicit_euler():
    env = experiment.Pendulum(omega=3.0, dt=0.1)
    state = torch.tensor([[0.2, -0.5]])
    action, kick = torch.tensor([1.5]), torch.tensor([0.01])
    velocity = -0.5 + 0.1 * (-9.0 * 0.2 + 1.5) + 0.01
    expected = torch.tensor([[0.2 + 0.1 * velocity, velocity]])
    assert torch.allclose(env.step(state, action, kick), expected)
    assert env.cost(expected).item() == pytest.approx(expected[0, 0].item() ** 2)


def test_left_alone_the_pendulum_swings_without_growing():
    env = experiment.Pendulum()
    state = torch.tensor([[0.5, 0.0]])
    peaks = []
    for _ in range(300):
        state = env.step(state, torch.zeros(1), torch.zeros(1))
        peaks.append(state[0, 0].abs().item())
    assert max(peaks) < 0.55 and max(peaks[-30:]) > 0.45  # it keeps swinging, it does not blow up


def test_episodes_have_their_shapes_ranges_and_follow_their_generator():
    env = experiment.Pendulum()
    start, noise = episodes(n=4000, env=env)
    assert start.shape == (1, 4000, 2) and noise.shape == (1, 4000, env.steps, 2)
    assert start[..., 0].abs().max() <= env.theta0
    assert start[..., 1].abs().max() <= env.omega * env.theta0
    assert noise[..., 0].std().item() == pytest.approx(env.noise, rel=0.05)
    assert noise[..., 1].std().item() == pytest.approx(env.explore, rel=0.05)
    assert torch.equal(episodes(seed=3)[1], episodes(seed=3)[1])
    assert not torch.equal(episodes(seed=3)[1], episodes(seed=4)[1])


# -- the agent and the peeks -------------------------------------------------------------------


def test_unpack_gives_views_of_every_parameter_once():
    params = torch.arange(2 * od.n_params(H), dtype=torch.float32).reshape(2, -1)
    w = od.unpack(params, H)
    assert w["k"].shape == (2, 2) and w["b"].shape == (2,)
    assert w["W1"].shape == (2, 3, H) and w["W2"].shape == (2, H, 2) and w["b2"].shape == (2, 2)
    flat = torch.cat([v.reshape(2, -1) for v in w.values()], 1)
    assert torch.equal(flat, params)


def test_the_controller_and_the_world_model_compute_their_formulas():
    params = agents(b=2)
    w = od.unpack(params, H)
    seen, action = torch.randn(2, 5, 2, generator=gen(1)), torch.randn(2, 5, generator=gen(2))
    expected_a = 4.0 * torch.tanh((seen * w["k"][:, None]).sum(-1) + w["b"][:, None])
    assert torch.allclose(od.controller(w, seen, 4.0), expected_a)
    x = torch.cat([seen, action[..., None]], -1)
    hidden = torch.tanh(torch.einsum("bei,bih->beh", x, w["W1"]) + w["b1"][:, None])
    change = torch.einsum("beh,bho->beo", hidden, w["W2"]) + w["b2"][:, None]
    assert torch.allclose(od.world_model(w, seen, action, 0.1), seen + 0.1 * change, atol=1e-6)
    model = experiment.model_of(params, H)
    assert torch.allclose(
        experiment.forward_model(model, H, seen, action, 0.1), od.world_model(w, seen, action, 0.1)
    )


def test_peeks_happen_with_each_runs_probability_and_follow_the_generator():
    ps = torch.tensor([0.0, 0.3, 1.0])
    peeks = od.peek_mask(ps, 2000, 30, gen(0))
    assert peeks.shape == (3, 2000, 30)
    assert not peeks[0].any() and peeks[2].all()
    rate = peeks[1].float().mean().item()
    assert abs(rate - 0.3) < 4 * (0.3 * 0.7 / peeks[1].numel()) ** 0.5
    assert torch.equal(od.peek_mask(ps, 5, 7, gen(5)), od.peek_mask(ps, 5, 7, gen(5)))
    assert not torch.equal(od.peek_mask(ps, 5, 7, gen(5)), od.peek_mask(ps, 5, 7, gen(6)))


# -- the roll-out --------------------------------------------------------------------------------


def test_when_it_always_peeks_the_model_changes_nothing():
    env, start, noise, params = pendulum_world()
    peeks = torch.ones(3, 6, env.steps, dtype=torch.bool)
    a = od.rollout(params, H, env, start, noise, peeks)
    b = od.rollout(identity_models(params), H, env, start, noise, peeks)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)
    _, states, seen = a
    assert torch.equal(seen[..., 1:, :], states[..., :-1, :])  # it acts on the real state


def test_with_p_zero_the_real_state_is_never_seen_after_the_start():
    env, start, noise, params = pendulum_world()
    peeks = torch.zeros(3, 6, env.steps, dtype=torch.bool)
    _, _, seen = od.rollout(params, H, env, start, noise, peeks)
    kicked = noise.clone()
    kicked[..., 0] = torch.randn(kicked[..., 0].shape, generator=gen(9))  # another world
    _, states, seen_kicked = od.rollout(params, H, env, start, kicked, peeks)
    # What the agent sees depends on its start and its own actions, never on the world after.
    assert torch.allclose(seen, seen_kicked)
    assert not torch.allclose(states, od.rollout(params, H, env, start, noise, peeks)[1])


def test_the_agent_sees_the_real_state_when_it_peeks_and_else_the_models_output():
    env = experiment.Pendulum()
    start, noise = episodes(n=8, seed=2)
    params = agents(b=2, seed=1)
    peeks = od.peek_mask(torch.tensor([0.4, 0.4]), 8, env.steps, gen(3))
    w = od.unpack(params, H)
    _, states, seen = od.rollout(params, H, env, start, noise, peeks)
    assert torch.equal(seen[..., 0, :], start.expand(2, -1, -1))
    for t in range(env.steps - 1):
        action = od.controller(w, seen[..., t, :], env.u_max) + noise[..., t, 1]
        guess = od.world_model(w, seen[..., t, :], action, env.dt)
        expected = torch.where(peeks[..., t, None], states[..., t, :], guess)
        assert torch.allclose(seen[..., t + 1, :], expected)


def test_the_score_is_the_task_cost_alone_and_ignores_an_unconsulted_model():
    env, start, noise, params = pendulum_world()
    peeks = od.peek_mask(torch.full((3,), 0.3), 6, env.steps, gen(4))
    costs, states, _ = od.rollout(params, H, env, start, noise, peeks)
    assert torch.equal(costs, states[..., 0].pow(2))
    assert torch.allclose(od.agent_cost(params, H, env, start, noise, peeks), costs.mean((1, 2)))
    # No prediction loss: when the model is never consulted, no model can change the score.
    always = torch.ones_like(peeks)
    other = params.clone()
    other[:, 3:] = torch.randn(other[:, 3:].shape, generator=gen(8))
    assert torch.equal(
        od.agent_cost(params, H, env, start, noise, always),
        od.agent_cost(other, H, env, start, noise, always),
    )


def test_the_rule_agents_code_agrees_with_the_mechanism_where_they_must():
    # Holding (lambda = 1) is the mechanism with an identity model; C's formula is shared.
    env = experiment.Pendulum()
    start, noise = episodes(n=5)
    params = identity_models(agents(b=2, seed=5))
    peeks = od.peek_mask(torch.tensor([0.2, 0.2]), 5, env.steps, gen(6))
    costs, _, _ = od.rollout(params, H, env, start, noise, peeks)
    rules = torch.cat([params[:, :3], torch.ones(2, 2)], 1)
    assert torch.allclose(experiment.rule_rollout(rules, env, start, noise, peeks), costs)
    zeros = torch.cat([params[:, :3], torch.zeros(2, 2)], 1)
    assert not torch.allclose(experiment.rule_rollout(zeros, env, start, noise, peeks), costs)


def test_the_rule_agents_start_and_search_as_their_kind_says():
    params, mask = experiment.initial_rules(["hold", "zeros", "shrink"])
    assert params[:, 3:].tolist() == [[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]]
    assert mask[:, 3:].tolist() == [[0.0, 0.0], [0.0, 0.0], [1.0, 1.0]]
    assert (mask[:, :3] == 1).all()


# -- the evolution strategy --------------------------------------------------------------------


def test_the_evolution_strategy_finds_the_minimum_of_a_quadratic_and_respects_its_mask():
    target = torch.tensor([[1.0, -2.0, 0.5]])

    def cost_of(population, i):
        return (population - target).pow(2).sum(-1)

    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0]])
    mean = experiment.evolve(
        cost_of,
        torch.zeros(2, 3),
        torch.tensor([0.1, 0.1]),
        generations=300,
        pairs=8,
        sigma=0.1,
        gen=gen(0),
        mask=mask,
    )
    assert torch.allclose(mean[0], target[0], atol=0.1)
    assert mean[1, 1] == 0.0 and abs(mean[1, 0] - 1.0) < 0.1


def test_training_follows_the_seed_and_an_unconsulted_model_is_never_moved():
    env = experiment.Pendulum(steps=8)
    search = experiment.Search(generations=3, pairs=2, episodes=2)
    a = experiment.train_agents([0.3, 1.0], [0.1, 0.1], seed=1, env=env, hidden=H, search=search)
    b = experiment.train_agents([0.3, 1.0], [0.1, 0.1], seed=1, env=env, hidden=H, search=search)
    c = experiment.train_agents([0.3, 1.0], [0.1, 0.1], seed=2, env=env, hidden=H, search=search)
    assert torch.equal(a, b) and not torch.equal(a, c)
    start = experiment.initial_agents(1, H, 1)
    assert not torch.equal(a[0, 3:], start[0, 3:])  # consulted at p = 0.3, M moves


# -- the references: the network trained to predict, the imagination ---------------------------


def test_the_predictor_is_the_same_network_trained_to_predict_and_learns_to():
    env = experiment.Pendulum(noise=0.02)  # gentle kicks: the error left is the model's own
    model = experiment.train_predictor(seed=0, env=env, hidden=H, updates=150)
    assert model.shape == (1, od.n_params(H) - 3)
    states, actions, next_states = experiment.transitions(1000, env, gen(11))
    error = experiment.one_step_errors(model, H, env, states, actions, next_states).mean()
    assert error < experiment.hold_errors(env, states, next_states).mean() / 5


def test_imagination_runs_the_model_on_its_own_outputs():
    env = experiment.Pendulum(steps=5)
    start, _ = episodes(n=3, env=env)
    controllers = torch.tensor([[0.3, -0.2, 0.1]])
    model = experiment.model_of(agents(b=1, seed=3), H)
    costs = experiment.imagine(controllers, model, H, env, start)
    seen, expected = start, []
    for _ in range(5):
        action = 4.0 * torch.tanh((seen * controllers[:, :2][:, None]).sum(-1) + 0.1)
        seen = experiment.forward_model(model, H, seen, action, env.dt)
        expected.append(seen[..., 0].pow(2))
    assert torch.allclose(costs, torch.stack(expected, -1))
    # Inside an identity model nothing moves, whatever the controller does.
    frozen = experiment.imagine(controllers, torch.zeros_like(model), H, env, start)
    assert torch.allclose(frozen, start[..., 0, None].pow(2).expand(1, 3, 5))


def test_the_forecast_errors_are_scaled_squared_distances():
    env = experiment.Pendulum()
    states, actions, next_states = experiment.transitions(50, env, gen(12))
    scale = torch.tensor([env.theta0, env.omega * env.theta0])
    expected = ((states - next_states) / scale).pow(2).sum(-1)
    assert torch.allclose(experiment.hold_errors(env, states, next_states), expected)
    identity = torch.zeros(1, od.n_params(H) - 3)
    held = experiment.one_step_errors(identity, H, env, states, actions, next_states)
    assert torch.allclose(held, expected)


def test_a_deployed_controller_always_sees_the_real_pendulum():
    env = experiment.Pendulum(steps=6)
    start, noise = episodes(n=4, env=env)
    controller = torch.tensor([[0.5, -1.0, 0.0]])
    costs = experiment.costs_of_controllers(controller, env=env, start=start, noise=noise)
    state, expected = start, []
    for t in range(6):
        action = 4.0 * torch.tanh((state * controller[:, :2][:, None]).sum(-1)) + noise[..., t, 1]
        state = env.step(state, action, noise[..., t, 0])
        expected.append(state[..., 0].pow(2))
    assert torch.allclose(costs, torch.stack(expected, -1).mean(-1))


# -- the stronger nulls: the blind agent, the free pendulum, the double integrator ----------------


def test_the_agents_of_p_zero_and_one_are_the_mechanism_there_by_code_of_their_own():
    env, start, noise, params = pendulum_world()
    never = torch.zeros(3, 6, env.steps, dtype=torch.bool)
    costs, _, _ = od.rollout(params, H, env, start, noise, never)
    blind = experiment.extreme_rollout(params, H, env, start, noise, torch.zeros(3, dtype=bool))
    assert torch.allclose(blind, costs, atol=1e-6)
    # the blind agent acts on M's chain, not on the real state: at p = 1 it would differ
    always = torch.ones(3, 6, env.steps, dtype=torch.bool)
    seeing = od.rollout(params, H, env, start, noise, always)[0]
    assert not torch.allclose(blind, seeing)
    mixed = experiment.extreme_rollout(params, H, env, start, noise, torch.tensor([0, 1, 0]) > 0)
    assert torch.allclose(mixed[1], seeing[1], atol=1e-6)
    assert torch.allclose(mixed[[0, 2]], blind[[0, 2]], atol=1e-6)
    shown = experiment.costs_of_extreme_agents(
        params, [False, True, False], hidden=H, env=env, start=start, noise=noise
    )
    assert torch.allclose(shown, mixed.mean(-1))
    with pytest.raises(ValueError, match="always"):
        experiment.costs_of_extreme_agents(
            params, [True], hidden=H, env=env, start=start, noise=noise
        )


def test_the_agents_of_the_two_ends_are_searched_as_the_mechanisms_agents_are():
    env = experiment.Pendulum(steps=8)
    search = experiment.Search(generations=3, pairs=2, episodes=2)
    options = dict(seed=1, env=env, hidden=H, search=search)
    ends = experiment.train_extreme_agents([False, True], [0.1, 0.1], **options)
    mechanism = experiment.train_agents([0.0, 1.0], [0.1, 0.1], **options)
    assert torch.allclose(ends, mechanism, atol=1e-5)


def test_the_rule_for_step_sizes_takes_the_lowest_cost_and_the_middle_of_ties():
    episodes = 0.01 * torch.randn(1, 400, generator=gen(40))  # what every step size shares
    swing = torch.tensor([1.0, -1.0]).repeat(200)  # a paired difference of mean 0, sd 1
    clear = torch.tensor([0.5, 0.4, 0.3, 0.2, 0.25])[:, None] + episodes
    assert experiment.choose(clear) == 3  # the lowest, the others above it on every episode
    flat = 0.2 + episodes + 0.01 * torch.arange(5.0)[:, None] * swing
    flat[4] -= 1e-4  # the lowest, by far less than a standard error (5e-4 or more): all tie
    assert experiment.choose(flat) == 2  # the middle of the grid
    edge = torch.tensor([0.5, 0.4, 0.3, 0.2001, 0.2])[:, None] + episodes
    edge[3] += 0.01 * swing  # ties with the lowest, at the edge
    assert experiment.choose(edge) == 3  # of two tied, the one nearer the middle
    edge[3] = 0.2001 + episodes  # 1e-4 above on every episode: no tie
    assert experiment.choose(edge) == 4
    assert experiment.choose(torch.tensor([[0.3], [0.1], [0.2]])) == 1  # one episode: no ties
    with pytest.raises(ValueError, match="costs"):
        experiment.choose(torch.zeros(5))


def test_the_free_pendulum_forecast_ignores_the_action_and_the_kick():
    env = experiment.Pendulum()
    states, _, next_states = experiment.transitions(50, env, gen(13))
    theta, velocity = states[..., 0], states[..., 1]
    # v' = v - dt omega^2 theta; theta' = theta + dt v'
    v = velocity - env.dt * env.omega**2 * theta
    guess = torch.stack([theta + env.dt * v, v], -1)
    scale = torch.tensor([env.theta0, env.omega * env.theta0])
    expected = ((guess - next_states) / scale).pow(2).sum(-1)
    assert torch.allclose(experiment.free_pendulum_errors(env, states, next_states), expected)


def test_action_responses_are_measured_against_the_pendulums():
    env = experiment.Pendulum()
    states, first, second = experiment.action_pairs(40, env, gen(14))
    assert states.shape == (1, 40, 2) and first.shape == second.shape == (1, 40)
    assert first.abs().max() <= env.u_max and not torch.equal(first, second)
    scale = torch.tensor([env.theta0, env.omega * env.theta0])
    # f(s, a1) - f(s, a2) = (dt^2 (a1 - a2), dt (a1 - a2))
    d = first - second
    real = torch.stack([env.dt**2 * d, env.dt * d], -1) / scale
    blind = experiment.blind_response_errors(env, states, first, second)
    assert torch.allclose(blind, real.pow(2).sum(-1))
    identity = torch.zeros(1, od.n_params(H) - 3)  # responds to nothing: blind to the action
    errors = experiment.response_errors(identity, H, env, states, first, second)
    assert torch.allclose(errors, blind)
    model = experiment.model_of(agents(b=2, seed=5), H)
    guess = experiment.forward_model(model, H, states, first, env.dt)
    guess = guess - experiment.forward_model(model, H, states, second, env.dt)
    expected = (guess / scale - real).pow(2).sum(-1)
    got = experiment.response_errors(model, H, env, states, first, second)
    assert torch.allclose(got, expected, atol=1e-6)


def test_an_agents_cost_is_read_off_the_real_pendulum():
    env = experiment.Pendulum(steps=8)
    start, noise = episodes(n=5, env=env)
    params = agents(b=2, seed=8)
    # at p = 1 the agent always sees the world: its cost is its controller's, deployed
    seeing = experiment.costs_of_agents(
        params, p=1.0, hidden=H, env=env, start=start, noise=noise, peek_gen=gen(1)
    )
    deployed = experiment.costs_of_controllers(params[:, :3], env=env, start=start, noise=noise)
    assert torch.allclose(seeing, deployed, atol=1e-6)
    # at p = 0.2 it is the mean squared angle of the states the roll-out went through
    peeks = od.peek_mask(torch.full((1,), 0.2), 5, 8, gen(2)).expand(2, -1, -1)
    _, states, _ = od.rollout(params, H, env, start, noise, peeks)
    some = experiment.costs_of_agents(
        params, p=0.2, hidden=H, env=env, start=start, noise=noise, peek_gen=gen(2)
    )
    assert torch.allclose(some, states[..., 0].pow(2).mean(-1))


def test_the_sign_of_a_response_is_that_of_the_velocitys_change():
    env = experiment.Pendulum()
    states, first, second = experiment.action_pairs(60, env, gen(15))
    identity = torch.zeros(1, od.n_params(H) - 3)
    assert experiment.response_signs(identity, H, env, states, first, second).sum() == 0
    model = experiment.model_of(agents(b=2, seed=7), H)
    v1 = experiment.forward_model(model, H, states, first, env.dt)[..., 1]
    v2 = experiment.forward_model(model, H, states, second, env.dt)[..., 1]
    expected = ((v1 - v2) * (first - second) > 0).float()
    got = experiment.response_signs(model, H, env, states, first, second)
    assert torch.equal(got, expected) and 0 < got.sum() < got.numel()
    pushed = torch.zeros(1, od.n_params(H) - 3)  # M = o + dt (0, a): the push itself
    w1 = pushed[:, : 3 * H].view(1, 3, H)
    w1[0, 2, 0] = 0.01  # the action's input to hidden unit 0, small enough for tanh to be linear
    pushed[:, 4 * H : 6 * H].view(1, H, 2)[0, 0, 1] = 100.0
    assert experiment.response_signs(pushed, H, env, states, first, second).mean() == 1.0


def test_the_double_integrator_has_no_pendulum():
    seen = torch.tensor([[[0.3, -0.5]]])
    action = torch.tensor([[2.0]])
    # v' = v + dt a; theta' = theta + dt v'
    nxt = experiment.double_integrator(seen, action, 0.1)
    assert torch.allclose(nxt, torch.tensor([[[0.3 + 0.1 * (-0.5 + 0.2), -0.5 + 0.2]]]))
    env = experiment.Pendulum(steps=4)
    start, _ = episodes(n=3, env=env)
    controllers = torch.tensor([[0.3, -0.2, 0.1], [0.0, 0.0, 0.0]])
    world = lambda s, a: experiment.double_integrator(s, a, env.dt)  # noqa: E731
    costs = experiment.imagine_in(controllers, world, env, start)
    seen, expected = start.expand(2, -1, -1), []
    for _ in range(4):
        k, b = controllers[:, :2], controllers[:, 2]
        act = env.u_max * torch.tanh((seen * k[:, None]).sum(-1) + b[:, None])
        seen = experiment.double_integrator(seen, act, env.dt)
        expected.append(seen[..., 0].pow(2))
    assert torch.allclose(costs, torch.stack(expected, -1))
    scores = experiment.imagined_costs(controllers, world, env, start)
    assert torch.allclose(scores, costs.mean(-1))
    exploded = experiment.imagined_costs(controllers, lambda s, a: s * float("inf"), env, start)
    assert torch.equal(exploded, torch.full((2, 3), 1e6))


def test_on_policy_transitions_are_the_ones_the_agent_went_through():
    env = experiment.Pendulum(steps=7)
    start, noise = episodes(n=3, env=env)
    agent = agents(b=1, seed=4)
    peeks = torch.rand(1, 3, 7, generator=gen(6)) < 0.3
    states, actions, nexts = experiment.on_policy_transitions(agent, H, env, start, noise, peeks)
    _, real, seen = od.rollout(agent, H, env, start, noise, peeks)
    assert torch.allclose(nexts, real.reshape(1, -1, 2), atol=1e-6)
    before = torch.cat([start[:, :, None], real[..., :-1, :]], -2)
    assert torch.allclose(states, before.reshape(1, -1, 2), atol=1e-6)
    w = od.unpack(agent, H)
    taken = od.controller(w, seen, env.u_max) + noise[..., 1]
    assert torch.allclose(actions, taken.reshape(1, -1), atol=1e-6)


# -- bad input ---------------------------------------------------------------------------------


def test_bad_input_is_refused_with_the_arguments_name():
    with pytest.raises(ValueError, match="dt"):
        experiment.Pendulum(dt=1.0)
    with pytest.raises(ValueError, match="explore"):
        experiment.Pendulum(explore=-1.0)
    with pytest.raises(ValueError, match="hidden"):
        od.n_params(0)
    with pytest.raises(ValueError, match="p must"):
        od.peek_mask(torch.tensor([1.5]), 4, 10, gen(0))
    with pytest.raises(ValueError, match="ps must"):
        experiment.train_agents([-0.1], [0.1], seed=0, env=experiment.Pendulum())
    with pytest.raises(ValueError, match="lrs"):
        experiment.train_agents([0.1, 0.2], [0.1], seed=0, env=experiment.Pendulum())
    with pytest.raises(ValueError, match="kind"):
        experiment.initial_rules(["hold", "forecast"])
    env, start, noise, params = pendulum_world()
    peeks = torch.ones(3, 6, env.steps, dtype=torch.bool)
    with pytest.raises(ValueError, match="params"):
        od.rollout(params[:, :-1], H, env, start, noise, peeks)
    with pytest.raises(ValueError, match="noise"):
        od.rollout(params, H, env, start, noise[..., 0], peeks)
    with pytest.raises(ValueError, match="peeks"):
        od.rollout(params, H, env, start, noise, peeks[:, :, :-1])
    with pytest.raises(ValueError, match="p must"):
        experiment.costs_of_agents(
            params, p=2.0, hidden=H, env=env, start=start, noise=noise, peek_gen=gen(0)
        )
