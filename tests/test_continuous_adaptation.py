"""Unit tests of papernotes.continuous_adaptation: the task chains, the adaptation (always from
theta), the next-task meta-loss, its second-order meta-gradient against finite differences in
float64, the step sizes' gradients, and execution along a chain (Algorithm 2)."""

import pytest
import torch

from conftest import gen, randn
from papernotes import continuous_adaptation as ca
from papernotes.continuous_adaptation import experiment
from papernotes.training import History, generator, seeded


def chains64(n=3, episodes=4, goals=5, seed=0):
    """A small batch of chains in float64, with a different random scale on every actuator."""
    scales = 0.3 + 0.7 * torch.rand(n, episodes, ca.ACTUATORS, generator=gen(seed))
    return ca.Chains(scales.double(), randn(n, episodes, goals, ca.ACTUATORS, seed=seed + 1))


def learner64(inner_steps=2, seed=0):
    torch.manual_seed(seed)
    learner = ca.MetaLearner(inner_steps, step_size=0.2).double()
    with torch.no_grad():  # distinct step sizes everywhere, so a swapped index shows
        learner.alpha.add_(0.05 * randn(*learner.alpha.shape, seed=seed + 7))
    return learner


# -- the chains ------------------------------------------------------------------------------------


def test_one_actuator_weakens_linearly_from_one_to_one_minus_drift():
    chains = experiment.task_chains(50, drift=0.6, episodes=4, goals=3, generator=gen())
    assert chains.scales.shape == (50, 4, ca.ACTUATORS)
    assert chains.goals.shape == (50, 4, 3, ca.ACTUATORS)
    weak = chains.scales[:, -1].argmin(-1)
    rows = torch.arange(50)
    torch.testing.assert_close(
        chains.scales[rows, :, weak], torch.tensor([1.0, 0.8, 0.6, 0.4]).expand(50, 4)
    )
    healthy = chains.scales.clone()
    healthy[rows, :, weak] = 1.0
    assert (healthy == 1.0).all()
    assert len(set(weak.tolist())) == ca.ACTUATORS  # every actuator gets crippled sometimes


def test_chains_follow_their_generator():
    a = experiment.task_chains(4, generator=gen(3))
    b = experiment.task_chains(4, generator=gen(3))
    c = experiment.task_chains(4, generator=gen(4))
    assert torch.equal(a.goals, b.goals) and torch.equal(a.scales, b.scales)
    assert not torch.equal(a.goals, c.goals)


def test_task_chains_rejects_bad_arguments():
    with pytest.raises(ValueError, match="drift"):
        experiment.task_chains(4, drift=1.0, generator=gen())
    with pytest.raises(ValueError, match="episodes"):
        experiment.task_chains(4, episodes=1, generator=gen())
    with pytest.raises(TypeError, match="n_chains"):
        experiment.task_chains(2.5, generator=gen())


# -- the task loss ---------------------------------------------------------------------------------


def test_task_loss_by_hand_and_zero_at_the_inverse_gains():
    goals = torch.tensor([[[1.0, 2.0, 0.0, -1.0], [0.5, 0.0, 1.0, 1.0]]])
    scales = torch.tensor([[1.0, 0.5, 0.25, 1.0]])
    W, b = torch.eye(4).unsqueeze(0), torch.zeros(1, 4)
    # outcome s * g; errors (s - 1) g: goal 1 -> (0, -1, 0, 0), goal 2 -> (0, 0, -0.75, 0)
    assert ca.task_loss(W, b, goals, scales).item() == pytest.approx((1.0 + 0.5625) / 2)
    ideal = torch.diag(1 / scales[0]).unsqueeze(0)
    assert ca.task_loss(ideal, b, goals, scales).item() == pytest.approx(0.0, abs=1e-12)


# -- adaptation ------------------------------------------------------------------------------------


def test_adaptation_is_gradient_steps_from_theta_with_the_learned_step_sizes():
    learner, chains = learner64(inner_steps=3), chains64()
    goals, scales = chains.goals[:, 1], chains.scales[:, 1]
    W, b = learner.W.detach().expand(3, -1, -1), learner.b.detach().expand(3, -1)
    for m in range(3):  # the update written out: phi^m = phi^{m-1} - alpha_m * grad
        W, b = W.clone().requires_grad_(True), b.clone().requires_grad_(True)
        grad_W, grad_b = torch.autograd.grad(ca.task_loss(W, b, goals, scales).sum(), (W, b))
        W = (W - learner.alpha_W[m].detach() * grad_W).detach()
        b = (b - learner.alpha_b[m].detach() * grad_b).detach()
    phi_W, phi_b = ca.adapt(learner, goals, scales)
    torch.testing.assert_close(phi_W, W)
    torch.testing.assert_close(phi_b, b)


def test_every_adaptation_starts_from_theta():
    learner, chains = learner64(), chains64()
    with torch.no_grad():
        learner.alpha.zero_()
    W, b = ca.adapt(learner, chains.goals[:, 0], chains.scales[:, 0])
    torch.testing.assert_close(W, learner.W.expand(3, -1, -1))  # zero steps: phi is theta
    learner = learner64()
    first = ca.adapt(learner, chains.goals[:, 2], chains.scales[:, 2])
    ca.adapt(learner, chains.goals[:, 0], chains.scales[:, 0])  # an adaptation in between
    again = ca.adapt(learner, chains.goals[:, 2], chains.scales[:, 2])
    torch.testing.assert_close(first[0], again[0])
    assert learner.W.grad is None  # adapting leaves theta untouched


def test_execution_adapts_each_episode_from_theta_on_the_previous_episode():
    learner, chains = learner64(), chains64()
    lived = experiment.run_chains(learner, chains)
    torch.testing.assert_close(lived.weights[:, 0], learner.W.detach().expand(3, -1, -1))
    for i in range(1, 4):
        W, b = ca.adapt(learner, chains.goals[:, i - 1], chains.scales[:, i - 1])
        torch.testing.assert_close(lived.weights[:, i], W.detach())
        loss = ca.task_loss(W, b, chains.goals[:, i], chains.scales[:, i])
        torch.testing.assert_close(lived.losses[:, i], loss.detach())


def test_tracking_carries_its_parameters_and_no_adaptation_keeps_them():
    learner, chains = learner64(), chains64()
    still = experiment.run_chains(learner, chains, adaptation="none")
    assert torch.equal(still.weights[:, 0], still.weights[:, -1])
    tracked = experiment.run_chains(
        learner, chains, adaptation="tracking", tracking_lr=0.1, tracking_steps=1
    )
    W, b = learner.W.detach().expand(3, -1, -1), learner.b.detach().expand(3, -1)
    for i in range(1, 4):  # one plain step per episode, from where the last episode left off
        W, b = W.clone().requires_grad_(True), b.clone().requires_grad_(True)
        loss = ca.task_loss(W, b, chains.goals[:, i - 1], chains.scales[:, i - 1]).sum()
        grad_W, grad_b = torch.autograd.grad(loss, (W, b))
        W, b = (W - 0.1 * grad_W).detach(), (b - 0.1 * grad_b).detach()
        torch.testing.assert_close(tracked.weights[:, i], W)


# -- the meta-loss and its gradient ----------------------------------------------------------------


def test_the_meta_loss_judges_phi_on_the_next_task_and_maml_on_the_same_one():
    learner, chains = learner64(), chains64()
    c, e, g, a = chains.goals.shape
    W, b = ca.adapt(learner, chains.goals[:, 1], chains.scales[:, 1])
    next_loss = ca.task_loss(W, b, chains.goals[:, 2], chains.scales[:, 2])
    same_loss = ca.task_loss(W, b, chains.goals[:, 2], chains.scales[:, 1])
    # one consecutive pair (episodes 2 -> 3) of the chains, on its own
    pair = ca.Chains(chains.scales[:, 1:3], chains.goals[:, 1:3])
    torch.testing.assert_close(ca.meta_loss(learner, pair), next_loss.mean())
    torch.testing.assert_close(ca.meta_loss(learner, pair, next_task=False), same_loss.mean())
    assert not torch.allclose(next_loss, same_loss)


def finite_difference(f, parameter, h=1e-6):
    grad = torch.zeros_like(parameter)
    flat = parameter.data.view(-1)
    for k in range(flat.numel()):
        old = flat[k].item()
        flat[k] = old + h
        up = f().item()
        flat[k] = old - h
        down = f().item()
        flat[k] = old
        grad.view(-1)[k] = (up - down) / (2 * h)
    return grad


def test_the_meta_gradient_is_second_order_through_the_inner_steps():
    learner, chains = learner64(), chains64()
    ca.meta_loss(learner, chains).backward()
    with torch.no_grad():
        numeric = finite_difference(lambda: ca.meta_loss(learner, chains), learner.W)
    torch.testing.assert_close(learner.W.grad, numeric, atol=1e-6, rtol=1e-5)
    # a first-order meta-gradient (inner gradients treated as constants) is a different vector
    first_order = learner64()
    first_order.zero_grad()
    W, b = first_order.W.expand(9, -1, -1), first_order.b.expand(9, -1)  # 3 chains x 3 pairs
    goals = chains.goals[:, :-1].reshape(-1, 5, 4)
    scales = chains.scales[:, :-1].reshape(-1, 4)
    for m in range(first_order.inner_steps):
        grads = torch.autograd.grad(ca.task_loss(W, b, goals, scales).sum(), (W, b))
        W = W - first_order.alpha_W[m] * grads[0].detach()
        b = b - first_order.alpha_b[m] * grads[1].detach()
    target_goals, target_scales = chains.goals[:, 1:].reshape(-1, 5, 4), chains.scales[:, 1:]
    ca.task_loss(W, b, target_goals, target_scales.reshape(-1, 4)).mean().backward()
    assert (first_order.W.grad - numeric).abs().max() > 1e-3


def test_the_step_sizes_receive_the_meta_gradient():
    learner, chains = learner64(), chains64()
    ca.meta_loss(learner, chains).backward()
    assert learner.alpha.grad is not None and learner.alpha.grad.abs().min() > 0
    with torch.no_grad():
        numeric = finite_difference(lambda: ca.meta_loss(learner, chains), learner.alpha)
    torch.testing.assert_close(learner.alpha.grad, numeric, atol=1e-6, rtol=1e-5)
    # W's step sizes, then b's: alpha has theta's shape [W b] per inner step
    assert learner.alpha.shape == (2, ca.ACTUATORS, ca.ACTUATORS + 1)
    assert torch.equal(learner.alpha_W, learner.alpha[..., :4])
    assert torch.equal(learner.alpha_b, learner.alpha[..., 4])


def test_fixed_step_sizes_are_left_out_of_the_meta_optimizer():
    learner = ca.MetaLearner()
    assert len(ca.meta_parameters(learner, learn_step_sizes=True)) == 3
    fixed = ca.meta_parameters(learner, learn_step_sizes=False)
    assert all(p is not learner.alpha for p in fixed) and len(fixed) == 2
    assert not learner.alpha.requires_grad


# -- training through the book's loop --------------------------------------------------------------


def test_meta_training_lowers_the_next_task_loss_and_follows_the_seed():
    run = experiment.meta_train(seed=0, iterations=150, goals=8, eval_every=50)
    again = experiment.meta_train(seed=0, iterations=150, goals=8, eval_every=50)
    assert run.history.steps == [50, 100, 150]
    assert torch.equal(run.model.W, again.model.W)
    held_out = experiment.task_chains(64, goals=8, generator=gen(9))
    untrained = experiment.meta_train(seed=0, iterations=1, goals=8)
    with torch.no_grad():
        before = ca.meta_loss(untrained.model, held_out).item()
        after = ca.meta_loss(run.model, held_out).item()
    assert after < 0.7 * before
    assert not torch.equal(run.model.alpha, untrained.model.alpha)


def test_no_adaptation_fits_a_fixed_policy_near_the_identity():
    run = experiment.train_no_adaptation(seed=0, iterations=300, goals=8, lr=0.03)
    # one actuator in four weakens, so the best fixed gains sit a little above 1
    diagonal = run.model.W.detach().diagonal()
    assert ((diagonal > 0.95) & (diagonal < 1.4)).all()


def test_training_entry_points_reject_bad_arguments():
    with pytest.raises(ValueError, match="iterations"):
        experiment.meta_train(seed=0, iterations=0)
    with pytest.raises(TypeError, match="next_task"):
        experiment.meta_train(seed=0, next_task=1)
    with pytest.raises(ValueError, match="inner_steps"):
        ca.MetaLearner(inner_steps=0)
    with pytest.raises(ValueError, match="lr"):
        experiment.train_no_adaptation(seed=0, lr=-0.1)


def test_run_chains_rejects_bad_arguments():
    learner, chains = ca.MetaLearner(), experiment.task_chains(2, generator=gen())
    with pytest.raises(ValueError, match="adaptation"):
        experiment.run_chains(learner, chains, adaptation="fine-tune")
    with pytest.raises(TypeError, match="MetaLearner"):
        experiment.run_chains(experiment.Policy(), chains)
    bad = ca.Chains(chains.scales[..., :3], chains.goals[..., :3])
    with pytest.raises(ValueError, match="chains.goals"):
        experiment.run_chains(learner, bad)


def test_step_size_summary_is_the_mean_diagonal_step_size_per_inner_step():
    learner = ca.MetaLearner(inner_steps=2, step_size=0.5)
    with torch.no_grad():
        learner.alpha[1] = 9.0  # off the diagonal, and b's, too
        learner.alpha[1, :, : ca.ACTUATORS].diagonal().copy_(torch.tensor([1.0, 2.0, 3.0, 6.0]))
    assert experiment.step_size_summary(learner) == pytest.approx([0.5, 3.0])
    with pytest.raises(TypeError, match="learner"):
        experiment.step_size_summary(experiment.Policy())


def test_scalar_step_sizes_are_one_number_per_inner_step_shared_by_every_coordinate():
    scalar = ca.MetaLearner(inner_steps=2, step_size=0.2, per_coordinate=False).double()
    assert scalar.alpha.shape == (2, 1, 1) and not scalar.per_coordinate
    assert scalar.alpha_W.shape == (2, 1, 1) and scalar.alpha_b.shape == (2, 1)
    with torch.no_grad():
        scalar.alpha.copy_(torch.tensor([0.1, 0.3]).view(2, 1, 1))
    assert scalar.alpha_b.flatten().tolist() == pytest.approx([0.1, 0.3])  # W's number, for b
    # the same learner with every coordinate's step size set to the shared value
    full = ca.MetaLearner(inner_steps=2, step_size=0.2).double()
    with torch.no_grad():
        full.W.copy_(scalar.W)
        full.b.copy_(scalar.b)
        full.alpha.copy_(scalar.alpha.expand(2, ca.ACTUATORS, ca.ACTUATORS + 1))
    chains = chains64()
    goals, scales = chains.goals[:, 0], chains.scales[:, 0]
    for got, want in zip(
        ca.adapt(scalar, goals, scales), ca.adapt(full, goals, scales), strict=True
    ):
        torch.testing.assert_close(got, want)
    ca.meta_loss(scalar, chains).backward()  # the one step size gets the summed meta-gradient
    ca.meta_loss(full, chains).backward()
    assert scalar.alpha.grad.shape == (2, 1, 1)
    torch.testing.assert_close(scalar.alpha.grad.flatten(), full.alpha.grad.sum((1, 2)))
    assert experiment.step_size_summary(scalar) == pytest.approx([0.1, 0.3])
    with pytest.raises(TypeError, match="per_coordinate"):
        ca.MetaLearner(per_coordinate=1)


# -- the MAML-style baseline's own code, the floor and the measurements ---------------------------


def test_the_maml_baseline_is_the_mechanism_judged_on_the_same_task_written_again():
    options = {"seed": 0, "iterations": 40, "goals": 8, "eval_every": 20, "per_coordinate": False}
    own = experiment.same_task_meta_train(**options)
    mechanism = experiment.meta_train(next_task=False, **options)
    for name in ("W", "b", "alpha"):
        torch.testing.assert_close(getattr(own.model, name), getattr(mechanism.model, name))
    assert own.history["loss"] == pytest.approx(mechanism.history["loss"])
    chains = experiment.task_chains(6, goals=8, generator=gen(21))
    again = experiment.run_chains(own.model, chains, adaptation="maml")
    torch.testing.assert_close(again.losses, experiment.run_chains(own.model, chains).losses)
    continuous = experiment.meta_train(**options)
    assert not torch.allclose(continuous.model.W, own.model.W)  # judged on the next task


def test_the_lag_one_floor_is_the_loss_of_the_exact_fit_of_the_last_episode():
    floor, terms = experiment.lag_one_floor(0.75)
    s = torch.tensor([1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25], dtype=torch.float64)
    torch.testing.assert_close(terms, (s[1:] / s[:-1] - 1) ** 2)
    assert floor == pytest.approx(0.0462, abs=5e-5)
    # an agent running diag(1 / s_i) in episode i + 1 loses that much, up to the goals' noise
    chains = experiment.task_chains(4000, generator=gen(22))
    c, e = chains.scales.shape[:2]
    losses = []
    for i in range(1, e):
        W = torch.diag_embed(1 / chains.scales[:, i - 1])
        losses.append(ca.task_loss(W, torch.zeros(c, 4), chains.goals[:, i], chains.scales[:, i]))
    assert torch.stack(losses, 1).mean().item() == pytest.approx(floor, rel=0.03)
    assert experiment.lag_one_floor(0.0)[0] == 0.0
    with pytest.raises(ValueError, match="drift"):
        experiment.lag_one_floor(1.0)


def test_the_paired_difference_and_the_later_episodes_of_each_chain():
    a, b = torch.tensor([0.5, 0.1, 0.3]), torch.tensor([0.1, 0.1, 0.1])
    d, se = experiment.paired_difference(a, b)
    assert d == pytest.approx(0.2) and se == pytest.approx(0.2 / 3**0.5)
    with pytest.raises(ValueError):
        experiment.paired_difference(a[:1], b[:1])
    losses = torch.arange(14.0).view(2, 7)
    episodes = experiment.Episodes(losses, torch.zeros(2, 7, 4, 4), torch.zeros(2, 7, 4))
    torch.testing.assert_close(experiment.later_per_chain(episodes), losses[:, 1:].mean(1))


def test_step_size_parts_split_the_diagonal_the_rest_of_w_and_b():
    learner = ca.MetaLearner(inner_steps=1, step_size=0.5)
    with torch.no_grad():
        learner.alpha[0, :, :4] = 2.0
        learner.alpha[0, :, :4].diagonal().copy_(torch.tensor([1.0, 2.0, 3.0, 6.0]))
        learner.alpha[0, :, 4] = 7.0
    assert experiment.step_size_parts(learner) == [pytest.approx((3.0, 2.0, 7.0))]
    scalar = ca.MetaLearner(inner_steps=2, step_size=0.4, per_coordinate=False)
    assert experiment.step_size_parts(scalar) == [pytest.approx((0.4, 0.4, 0.4))] * 2


# -- arms trained together, and the reactive baselines ---------------------------------------------


def test_runs_trained_together_are_the_runs_trained_alone():
    options = {"seed": 0, "iterations": 30, "goals": 8, "chains_per_update": 4}
    together = experiment.meta_train_together(lrs=(0.05, 0.3), per_coordinate=False, **options)
    for lr, run in zip((0.05, 0.3), together, strict=True):
        alone = experiment.meta_train(lr=lr, per_coordinate=False, **options)
        for name in ("W", "b", "alpha"):
            torch.testing.assert_close(getattr(run.model, name), getattr(alone.model, name))
    # the two rates moved theta apart: each run had its own learning rate
    assert not torch.allclose(together[0].model.W, together[1].model.W)
    maml = experiment.meta_train_together(
        lrs=(0.05, 0.3), next_task=False, own_copy=True, **options
    )
    alone = experiment.same_task_meta_train(lr=0.3, **options)
    torch.testing.assert_close(maml[1].model.alpha, alone.model.alpha)
    with pytest.raises(ValueError, match="own_copy"):
        experiment.meta_train_together(lrs=(0.1,), own_copy=True, **options)
    with pytest.raises(ValueError, match="lrs"):
        experiment.meta_train_together(lrs=(0.1, -1.0), **options)


def test_fixed_step_sizes_stay_fixed_when_trained_together():
    runs = experiment.meta_train_together(
        seed=0, lrs=(0.1, 0.3), iterations=5, goals=4, learn_step_sizes=False, step_size=0.2
    )
    for run in runs:
        assert torch.equal(run.model.alpha, torch.full_like(run.model.alpha, 0.2))


def test_the_refit_is_the_exact_fit_of_the_last_episode_nearest_the_parameters():
    chains = experiment.task_chains(5, goals=32, generator=gen(31))
    W, b = torch.randn(5, 4, 4, generator=gen(32)), torch.randn(5, 4, generator=gen(33))
    fitted_W, fitted_b = experiment._refit(W, b, chains.goals[:, 3], chains.scales[:, 3])
    # 32 goals pin the policy down: the fit is diag(1 / s), b = 0, whatever the start
    torch.testing.assert_close(
        fitted_W, torch.diag_embed(1 / chains.scales[:, 3]), atol=1e-4, rtol=0
    )
    torch.testing.assert_close(fitted_b, torch.zeros(5, 4), atol=1e-4, rtol=0)
    # with 2 goals (8 equations, 20 parameters) it fits them exactly and moves theta no further:
    # the step is orthogonal to every direction the goals leave free
    few = experiment.task_chains(5, goals=2, generator=gen(34))
    goals, scales = few.goals[:, 0], few.scales[:, 0]
    fitted_W, fitted_b = experiment._refit(W, b, goals, scales)
    assert ca.task_loss(fitted_W, fitted_b, goals, scales).max() < 1e-8
    theta = torch.cat([W.flatten(1), b], 1)
    step = torch.cat([fitted_W.flatten(1), fitted_b], 1) - theta
    rows = torch.cat([goals, torch.ones(5, 2, 1)], -1)  # row j of [W b] sees [g 1] for each goal
    free = torch.linalg.svd(rows).Vh[:, 2:]  # (5, 3, 5): directions no goal sees, per row of W
    step_rows = step[:, :16].view(5, 4, 4)
    step_rows = torch.cat([step_rows, step[:, 16:].unsqueeze(-1)], -1)  # (5, 4, 5): [W b] rows
    assert (step_rows @ free.transpose(-1, -2)).abs().max() < 1e-4


def test_tracking_restarted_and_refit_runs():
    policy, chains = experiment.Policy(), experiment.task_chains(6, goals=32, generator=gen(35))
    restarted = experiment.run_chains(policy, chains, adaptation="restarted", tracking_lr=0.2)
    start_W, start_b = policy.W.detach(), policy.b.detach()
    refit = experiment.run_chains(policy, chains, adaptation="refit")
    for run in (restarted, refit):  # episode 1 runs the policy itself: nothing seen yet
        torch.testing.assert_close(run.weights[:, 0], start_W.expand(6, -1, -1))
        torch.testing.assert_close(run.biases[:, 0], start_b.expand(6, -1))
    for i in range(1, 7):  # always from the policy's own parameters
        W, b = experiment._gradient_steps(
            start_W.expand(6, -1, -1),
            start_b.expand(6, -1),
            chains.goals[:, i - 1],
            chains.scales[:, i - 1],
            0.2,
            3,
        )
        torch.testing.assert_close(restarted.weights[:, i], W)
        torch.testing.assert_close(restarted.biases[:, i], b)
    refit = experiment.run_chains(policy, chains, adaptation="refit")
    exact = torch.diag_embed(1 / chains.scales[:, :-1])
    torch.testing.assert_close(refit.weights[:, 1:], exact, atol=1e-4, rtol=0)
    # the refit runs each episode's exact fit one episode late: it misses by (s_i+1 / s_i - 1) g
    miss = chains.scales[:, 1:] / chains.scales[:, :-1] - 1
    expected = (chains.goals[:, 1:] * miss.unsqueeze(2)).pow(2).sum(-1).mean(-1)
    torch.testing.assert_close(refit.losses[:, 1:], expected, atol=1e-5, rtol=1e-4)


def test_extrapolation_follows_the_trend_or_overshoots_from_the_start():
    c, e = 3, 5
    chains = experiment.task_chains(c, episodes=e, goals=4, generator=gen(36))
    W, b = randn(c, e, 4, 4, seed=37).float(), randn(c, e, 4, seed=38).float()
    run = experiment.Episodes(torch.zeros(c, e), W, b)
    trend = experiment.extrapolated(run, chains, 1.5)
    torch.testing.assert_close(trend.weights[:, :2], W[:, :2])  # no trend before two fits
    for i in range(2, e):  # P_i + beta (P_i - P_(i-1))
        torch.testing.assert_close(trend.weights[:, i], W[:, i] + 1.5 * (W[:, i] - W[:, i - 1]))
        torch.testing.assert_close(trend.biases[:, i], b[:, i] + 1.5 * (b[:, i] - b[:, i - 1]))
        loss = ca.task_loss(
            trend.weights[:, i], trend.biases[:, i], chains.goals[:, i], chains.scales[:, i]
        )
        torch.testing.assert_close(trend.losses[:, i], loss)
    ahead = experiment.extrapolated(run, chains, 0.5, since="start")
    torch.testing.assert_close(ahead.weights[:, 0], W[:, 0])
    torch.testing.assert_close(ahead.biases[:, 0], b[:, 0])
    for i in range(1, e):  # P_i + beta (P_i - P_1), P_1 the start it runs in episode 1
        torch.testing.assert_close(ahead.weights[:, i], W[:, i] + 0.5 * (W[:, i] - W[:, 0]))
        torch.testing.assert_close(ahead.biases[:, i], b[:, i] + 0.5 * (b[:, i] - b[:, 0]))
    with pytest.raises(ValueError, match="since"):
        experiment.extrapolated(run, chains, 1.0, since="first")
    with pytest.raises(ValueError, match="biases"):
        experiment.extrapolated(experiment.Episodes(run.losses, W), chains, 1.0)


# -- pinned against loops written out: training, measurements ------------------------------------


def plain_meta_training(
    *, lrs, iterations, chains, goals, drift, per_coordinate, step_size=0.3, clip=10.0
):
    """Algorithm 1 written out for each rate on its own: torch's Adam, the linear decay, the
    gradient norm clipped, the chains of the run's stream 1; the learners it ends with."""
    learners = []
    for lr in lrs:
        with seeded(0):
            learner = ca.MetaLearner(3, step_size, per_coordinate=per_coordinate)
        parameters = [learner.W, learner.b, learner.alpha]
        optimizer = torch.optim.Adam(parameters, lr=lr)
        batches = generator(0, 1)
        for i in range(iterations):
            for group in optimizer.param_groups:
                group["lr"] = lr * (1 - i / iterations)
            batch = experiment.task_chains(chains, drift=drift, goals=goals, generator=batches)
            loss = ca.meta_loss(learner, batch)
            optimizer.zero_grad()
            loss.backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(parameters, clip)
            optimizer.step()
        learners.append(learner)
    return learners


def test_meta_training_together_is_algorithm_1_written_out_for_each_rate():
    options = {"iterations": 12, "goals": 6, "drift": 0.5}
    # at step size 0.6 the first meta-gradients' norms are in the hundreds: the clip at 10 acts
    for per_coordinate, step_size in ((True, 0.3), (False, 0.6)):
        runs = experiment.meta_train_together(
            seed=0,
            lrs=(0.02, 0.2),
            chains_per_update=3,
            per_coordinate=per_coordinate,
            step_size=step_size,
            **options,
        )
        plain = plain_meta_training(
            lrs=(0.02, 0.2), chains=3, per_coordinate=per_coordinate, step_size=step_size, **options
        )
        for run, learner in zip(runs, plain, strict=True):
            assert run.model.alpha.shape == learner.alpha.shape
            for name in ("W", "b", "alpha"):
                torch.testing.assert_close(
                    getattr(run.model, name), getattr(learner, name), rtol=1e-5, atol=1e-6
                )
    unclipped = plain_meta_training(
        lrs=(0.2,), chains=3, per_coordinate=False, step_size=0.6, clip=None, **options
    )[0]
    assert not torch.allclose(unclipped.W, plain[1].W, rtol=1e-3, atol=1e-4)


def test_meta_training_defaults_are_the_chapters():
    runs = experiment.meta_train_together(
        seed=0, lrs=(0.1,), iterations=100, goals=2, chains_per_update=2, learn_step_sizes=False
    )
    model = runs[0].model
    # three inner steps, a step size per coordinate of theta, starting at 0.3; logged every 50
    assert model.alpha.shape == (3, ca.ACTUATORS, ca.ACTUATORS + 1)
    assert torch.equal(model.alpha, torch.full_like(model.alpha, 0.3))
    assert runs[0].history.steps == [50, 100]


def test_the_maml_baseline_never_calls_the_mechanism(monkeypatch):
    def broken(*args, **kwargs):
        raise AssertionError("the MAML-style baseline reached the mechanism")

    for name in ("adapt", "meta_loss", "meta_parameters", "next_task_targets"):
        monkeypatch.setattr(ca, name, broken)
    run = experiment.same_task_meta_train(seed=0, iterations=3, goals=4, chains_per_update=2)
    runs = experiment.meta_train_together(
        seed=0, lrs=(0.1, 0.2), iterations=3, goals=4, next_task=False, own_copy=True
    )
    chains = experiment.task_chains(2, goals=4, generator=gen(40))
    for model in (run.model, *(r.model for r in runs)):
        experiment.run_chains(model, chains, adaptation="maml")


def test_no_adaptation_is_adam_on_every_episode_written_out():
    run = experiment.train_no_adaptation(
        seed=0, drift=0.5, goals=6, iterations=15, chains_per_update=3
    )
    assert isinstance(run.history, History) and run.history.steps == [15]
    with seeded(0):
        policy = experiment.Policy()
    optimizer = torch.optim.Adam(policy.parameters(), lr=0.01)
    batches = generator(0, 1)
    for i in range(15):
        for group in optimizer.param_groups:
            group["lr"] = 0.01 * (1 - i / 15)
        chains = experiment.task_chains(3, drift=0.5, goals=6, generator=batches)
        # every episode of every chain, the one policy: the mean of the 21 episodes' losses
        losses = [
            ca.task_loss(
                policy.W[None],
                policy.b[None],
                chains.goals[c, i_][None],
                chains.scales[c, i_][None],
            )
            for c in range(3)
            for i_ in range(7)
        ]
        loss = torch.cat(losses).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.testing.assert_close(run.model.W, policy.W, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(run.model.b, policy.b, rtol=1e-5, atol=1e-6)


def test_adapted_fit_scores_phi_i_under_t_i_and_t_i_plus_1_by_hand():
    learner, chains = learner64(), chains64(n=2, episodes=4, goals=5)
    same, following = experiment.adapted_fit_per_chain(learner, chains)
    for c in range(2):
        on_same, on_next = [], []
        for i in range(3):  # phi_i adapted on episode i, scored on episode i + 1's goals
            W, b = ca.adapt(learner, chains.goals[c, i][None], chains.scales[c, i][None])
            goals = chains.goals[c, i + 1][None]
            on_same.append(ca.task_loss(W, b, goals, chains.scales[c, i][None]).item())
            on_next.append(ca.task_loss(W, b, goals, chains.scales[c, i + 1][None]).item())
        assert same[c].item() == pytest.approx(sum(on_same) / 3, rel=1e-9)
        assert following[c].item() == pytest.approx(sum(on_next) / 3, rel=1e-9)
    means = experiment.adapted_fit(learner, chains)
    assert means == pytest.approx((same.mean().item(), following.mean().item()), rel=1e-9)
    with pytest.raises(TypeError, match="learner"):
        experiment.adapted_fit_per_chain(experiment.Policy(), chains)


def test_crippled_gain_reads_the_weakening_actuators_own_gain():
    chains = experiment.task_chains(5, episodes=3, goals=2, generator=gen(41))
    weights = randn(5, 3, 4, 4, seed=42).float()
    episodes = experiment.Episodes(torch.zeros(5, 3), weights)
    gains = experiment.crippled_gain(episodes, chains)
    assert gains.shape == (5, 3)
    for c in range(5):
        j = int(chains.scales[c, -1].argmin())
        assert chains.scales[c, -1, j] < 1  # the actuator that weakens
        torch.testing.assert_close(gains[c], weights[c, :, j, j])
