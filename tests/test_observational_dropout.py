"""Unit tests of papernotes.observational_dropout: the physics against a step-by-step simulation,
the peek pattern against its generator and Monte Carlo, and the roll-out against hand-made
models that record what they are fed (never the real observation when the agent does not peek;
never called at all when it always peeks)."""

import pytest
import torch
from torch import nn

from conftest import gen
from papernotes import observational_dropout as od
from papernotes.observational_dropout import experiment


def simulate(x, v, steps, dt):
    """The bouncing point step by step: move, and reflect at the walls."""
    xs = []
    for _ in range(steps):
        x = x + v * dt
        over = x.abs() > 1
        x = torch.where(over, 2 * x.sign() - x, x)
        v = torch.where(over, -v, v)
        xs.append(x)
    return torch.stack(xs, 1)


class Recorder(nn.Module):
    """A world model that moves the point by its velocity and records every input it gets."""

    def __init__(self, dt=0.1):
        super().__init__()
        self.dt = dt
        self.inputs = []

    def forward(self, seen, action):
        self.inputs.append(seen.detach().clone())
        return torch.stack([seen[..., 0] + self.dt * seen[..., 1], seen[..., 1]], -1)


class Refuses(nn.Module):
    def forward(self, seen, action):
        raise AssertionError("the world model was consulted")


def episodes(n=8, steps=12, seed=0):
    return experiment.BouncingPoint().episodes(n, steps, gen(seed))


def identity_controller():
    controller = od.Controller()
    with torch.no_grad():
        controller.linear.weight.fill_(1.0)
        controller.linear.bias.zero_()
    return controller


# -- the environment -------------------------------------------------------------------------


def test_the_closed_form_bounce_matches_a_step_by_step_simulation():
    x0 = torch.tensor([0.0, 0.95, -0.9, 0.5, -0.2])
    v0 = torch.tensor([0.7, 0.9, -1.0, -0.35, 0.3])
    steps, dt = 200, 0.1  # long enough for several bounces off both walls
    expected = simulate(x0, v0, steps, dt)
    times = torch.arange(1, steps + 1) * dt
    ours = experiment.bounce(x0.unsqueeze(1) + v0.unsqueeze(1) * times)
    assert torch.allclose(ours, expected, atol=1e-4)
    assert ours.abs().max() <= 1


def test_episodes_observe_position_and_finite_difference_velocity():
    env = experiment.BouncingPoint()
    positions, observations = env.episodes(64, 50, gen(1))
    assert positions.shape == (64, 50) and observations.shape == (64, 50, 2)
    assert torch.equal(observations[..., 0], positions)
    velocity = (positions[:, 1:] - positions[:, :-1]) / env.dt
    assert torch.allclose(observations[:, 1:, 1], velocity, atol=1e-5)
    # Away from the walls the observed speed is the drawn speed, in [min_speed, max_speed].
    speeds = observations[..., 1].abs()
    assert speeds.max() <= env.max_speed + 1e-5
    assert (speeds.median(1).values >= env.min_speed - 1e-5).all()


def test_episodes_follow_their_generator():
    assert torch.equal(episodes(seed=3)[1], episodes(seed=3)[1])
    assert not torch.equal(episodes(seed=3)[1], episodes(seed=4)[1])


# -- the peek pattern ------------------------------------------------------------------------


def test_the_peek_pattern_follows_the_generator_seed():
    a = od.peek_mask(16, 40, 0.3, gen(5))
    assert torch.equal(a, od.peek_mask(16, 40, 0.3, gen(5)))
    assert not torch.equal(a, od.peek_mask(16, 40, 0.3, gen(6)))


def test_peeks_happen_with_probability_p_after_a_real_first_step():
    peeks = od.peek_mask(2000, 51, 0.3, gen(0))
    assert peeks[:, 0].all()
    rate = peeks[:, 1:].float().mean().item()
    assert abs(rate - 0.3) < 4 * (0.3 * 0.7 / peeks[:, 1:].numel()) ** 0.5
    assert not od.peek_mask(50, 20, 0.0, gen(0))[:, 1:].any()
    assert od.peek_mask(50, 20, 1.0, gen(0)).all()


# -- the roll-out ----------------------------------------------------------------------------


def test_with_p_one_the_world_model_is_never_consulted():
    positions, observations = episodes()
    peeks = od.peek_mask(8, 12, 1.0, gen(0))
    controller = od.Controller()
    actions, seen = od.rollout(controller, Refuses(), observations, peeks)
    assert torch.equal(seen, observations)
    assert torch.allclose(actions, controller(observations))


def test_with_p_zero_the_real_observation_is_never_seen_after_the_first_step():
    positions, observations = episodes()
    peeks = od.peek_mask(8, 12, 0.0, gen(0))
    model = Recorder()
    actions, seen = od.rollout(identity_controller(), model, observations, peeks)
    scrambled = observations.clone()
    scrambled[:, 1:] = torch.randn(8, 11, 2, generator=gen(9))
    _, seen_scrambled = od.rollout(identity_controller(), Recorder(), scrambled, peeks)
    assert torch.equal(seen, seen_scrambled)  # what comes after step 0 never reaches the agent
    assert torch.equal(seen[:, 0], observations[:, 0])
    # The model is fed its own previous output, not the real observation.
    for t in range(11):
        assert torch.equal(model.inputs[t], seen[:, t])


def test_the_agent_sees_the_real_observation_when_it_peeks_and_else_the_models_output():
    _, observations = episodes(n=16, steps=20, seed=2)
    peeks = od.peek_mask(16, 20, 0.4, gen(3))
    controller = od.Controller()
    model = od.WorldModel()
    with torch.no_grad():
        actions, seen = od.rollout(controller, model, observations, peeks)
        for t in range(19):
            expected = torch.where(
                peeks[:, t + 1, None], observations[:, t + 1], model(seen[:, t], actions[:, t])
            )
            assert torch.allclose(seen[:, t + 1], expected)
            assert torch.allclose(actions[:, t], controller(seen[:, t]))


def test_without_a_model_the_agent_holds_the_last_real_observation():
    _, observations = episodes(n=4, steps=15, seed=4)
    peeks = od.peek_mask(4, 15, 0.3, gen(1))
    _, seen = od.rollout(od.Controller(), None, observations, peeks)
    for b in range(4):
        last = 0
        for t in range(15):
            if peeks[b, t]:
                last = t
            assert torch.equal(seen[b, t], observations[b, last])


def test_the_controller_reads_only_the_position_it_sees():
    controller = od.Controller()
    assert controller(torch.tensor([[0.7, 0.2]])).item() == 0.0  # it starts at the centre
    with torch.no_grad():
        controller.linear.weight.fill_(0.8)
        controller.linear.bias.fill_(0.1)
    seen = torch.tensor([[0.3, 0.0], [0.3, 5.0]])
    out = controller(seen)
    assert out[0] == out[1]
    assert out[0].item() == pytest.approx(0.8 * 0.3 + 0.1)


def test_the_world_model_is_residual():
    model = od.WorldModel(hidden=8)
    with torch.no_grad():
        model.net[2].weight.zero_()
        model.net[2].bias.zero_()
    seen = torch.randn(5, 2, generator=gen(0))
    assert torch.equal(model(seen, torch.zeros(5)), seen)


# -- training on the task alone --------------------------------------------------------------


def test_at_p_one_training_leaves_the_world_model_untouched():
    # No prediction loss anywhere: a model that is never consulted gets no gradient at all.
    with torch.random.fork_rng():
        torch.manual_seed(7)  # as train_agent builds them: the controller, then the model
        controller, model = od.Controller(), od.WorldModel()
    agent = experiment.train_agent(1.0, seed=7, updates=5, episodes=4, steps=10)
    for before, after in zip(model.parameters(), agent.model.parameters(), strict=True):
        assert torch.equal(before, after)
    assert not torch.equal(controller.linear.weight, agent.controller.linear.weight)


def test_training_follows_the_seed():
    a = experiment.train_agent(0.3, seed=1, updates=3, episodes=4, steps=10)
    b = experiment.train_agent(0.3, seed=1, updates=3, episodes=4, steps=10)
    c = experiment.train_agent(0.3, seed=2, updates=3, episodes=4, steps=10)
    assert a.history.final("loss") == b.history.final("loss")
    assert a.history.final("loss") != c.history.final("loss")
    assert (
        experiment.train_agent(0.3, seed=1, hold=True, updates=2, episodes=4, steps=10).model
        is None
    )


# -- measuring the emergent model ------------------------------------------------------------


def test_one_step_errors_of_a_perfect_mover_and_of_holding():
    positions, observations = episodes(n=32, steps=40, seed=6)
    agent = experiment.Agent(
        model=Recorder(), history=None, controller=identity_controller(), p=0.5
    )
    hold = experiment.hold_error(positions, observations)
    expected_hold = (positions[:, 1:] - positions[:, :-1]).pow(2).mean().item()
    assert hold == pytest.approx(expected_hold, rel=1e-6)
    # Moving by the observed velocity is exact except across a bounce.
    mover = experiment.one_step_error(agent, positions, observations)
    guess = observations[:, :-1, 0] + 0.1 * observations[:, :-1, 1]
    assert mover == pytest.approx((guess - positions[:, 1:]).pow(2).mean().item(), rel=1e-6)
    assert mover < hold / 5


def test_imagine_runs_the_model_on_its_own_outputs():
    positions, observations = episodes(n=4, steps=8, seed=8)
    agent = experiment.Agent(
        model=Recorder(), history=None, controller=identity_controller(), p=0.0
    )
    imagined = experiment.imagine(agent, observations)
    x, v = observations[:, 0, 0], observations[:, 0, 1]
    expected = x.unsqueeze(1) + 0.1 * v.unsqueeze(1) * torch.arange(8)
    assert torch.allclose(imagined, expected, atol=1e-6)


def test_imagination_error_is_the_squared_error_over_the_first_steps_only():
    real = torch.zeros(2, 6)
    imagined = torch.tensor([[1.0, 1.0, 3.0, 9.0, 9.0, 9.0], [1.0, -1.0, 1.0, 9.0, 9.0, 9.0]])
    # Over the first 3 steps: (1 + 1 + 9 + 1 + 1 + 1) / 6; later steps must not count.
    assert experiment.imagination_error(imagined, real, 3) == pytest.approx(14 / 6)
    assert experiment.imagination_error(real, real, 6) == 0.0
    with pytest.raises(ValueError, match="imagined"):
        experiment.imagination_error(imagined[:, :5], real, 3)


# -- bad input -------------------------------------------------------------------------------


def test_bad_input_is_refused_with_the_arguments_name():
    with pytest.raises(ValueError, match="dt"):
        experiment.BouncingPoint(dt=2.0)
    with pytest.raises(ValueError, match="hidden"):
        od.WorldModel(hidden=0)
    with pytest.raises(ValueError, match="p must"):
        od.peek_mask(4, 10, 1.5, gen(0))
    with pytest.raises(ValueError, match="p must"):
        experiment.train_agent(-0.1, seed=0)
    _, observations = episodes()
    with pytest.raises(ValueError, match="observations"):
        od.rollout(od.Controller(), None, observations[..., :1], torch.ones(8, 12, dtype=bool))
    with pytest.raises(ValueError, match="peeks"):
        od.rollout(od.Controller(), None, observations, torch.ones(8, 11, dtype=bool))
    with pytest.raises(ValueError, match="positions"):
        experiment.hold_error(torch.zeros(8, 11), observations)
    with pytest.raises(ValueError, match="observations"):
        experiment.imagine(
            experiment.Agent(model=None, history=None, controller=od.Controller(), p=0.0),
            observations[0],
        )


# -- the references and the read-out-free scores ---------------------------------------------


def test_the_constant_velocity_rule_is_exact_but_across_a_bounce():
    positions, observations = episodes(n=32, steps=40, seed=9)
    error = experiment.constant_velocity_error(positions, observations)
    guess = observations[:, :-1, 0] + 0.1 * observations[:, :-1, 1]
    wrong = (guess - positions[:, 1:]).abs() > 1e-5
    assert 0 < wrong.float().mean() < 0.2  # only the steps that cross a wall
    assert error == pytest.approx((guess - positions[:, 1:]).pow(2).mean().item(), rel=1e-6)
    assert error < experiment.hold_error(positions, observations) / 5


def test_the_read_out_and_the_correlation_score_the_forecast_as_the_task_and_scale_free():
    positions, observations = episodes(n=32, steps=40, seed=10)
    mover = experiment.Agent(model=Recorder(), history=None, controller=identity_controller(), p=1)
    hold = experiment.Agent(model=None, history=None, controller=identity_controller(), p=1)
    # With a = x^ the read-out is the forecast's position itself.
    assert experiment.readout_error(mover, positions, observations) == pytest.approx(
        experiment.one_step_error(mover, positions, observations), rel=1e-6
    )
    assert experiment.readout_error(hold, positions, observations) == pytest.approx(
        experiment.hold_error(positions, observations), rel=1e-6
    )
    # A controller that halves what it sees reads a forecast of twice the motion as right: the
    # raw error grows, the read-out sees the true motion, the correlation does not move.
    halving = od.Controller()
    with torch.no_grad():
        halving.linear.weight.fill_(0.5)

    class Doubled(nn.Module):
        def forward(self, seen, action):
            return torch.stack([2 * seen[..., 0] + 0.2 * seen[..., 1], seen[..., 1]], -1)

    scaled = experiment.Agent(model=Doubled(), history=None, controller=halving, p=1)
    raw = experiment.one_step_error(scaled, positions, observations)
    read = experiment.readout_error(scaled, positions, observations)
    assert read == pytest.approx(experiment.constant_velocity_error(positions, observations))
    assert raw > 10 * read
    correlation = experiment.motion_correlation(mover, positions, observations)
    assert 0.9 < correlation < 1.0  # right but for the bounces
    assert experiment.motion_correlation(hold, positions, observations) == 0.0


def test_the_predictor_is_the_same_model_trained_to_predict_and_learns_to():
    positions, observations = episodes(n=64, steps=30, seed=11)
    predictor = experiment.train_predictor(seed=0, updates=150, episodes=16, steps=20, lr=0.03)
    assert isinstance(predictor.model, od.WorldModel)
    assert predictor.controller.linear.weight.item() == 1.0  # it reports what it sees
    assert not any(p.requires_grad for p in predictor.controller.parameters())
    error = experiment.one_step_error(predictor, positions, observations)
    assert error < experiment.hold_error(positions, observations) / 4
