"""Unit tests of papernotes.concrete, in float64 with fixed seeds."""

import math

import pytest
import torch
import torch.nn.functional as F

from papernotes import concrete


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


LOGITS = torch.tensor([1.5, 0.2, -0.7, 0.0], dtype=torch.float64)


# -- Gumbel-max -----------------------------------------------------------------------------------


def test_gumbel_max_sample_is_one_hot_with_the_logits_shape():
    z = concrete.gumbel_max_sample(torch.zeros(7, 3, 5, dtype=torch.float64), gen())
    assert z.shape == (7, 3, 5)
    assert torch.equal(z.sum(-1), torch.ones(7, 3, dtype=torch.float64))
    assert set(z.unique().tolist()) == {0.0, 1.0}


def test_gumbel_max_frequencies_match_softmax():
    n = 200_000
    counts = concrete.gumbel_max_sample(LOGITS.expand(n, -1), gen(1)).sum(0)
    probs = torch.softmax(LOGITS, -1)
    # Within 4 standard errors per category, and the chi-square test does not reject.
    assert ((counts / n - probs).abs() <= 4 * (probs * (1 - probs) / n).sqrt()).all()
    assert concrete.chi_square_p_value(counts, probs) > 1e-3


def test_chi_square_rejects_the_wrong_distribution():
    n = 50_000
    uniform_counts = concrete.gumbel_max_sample(torch.zeros(n, 4, dtype=torch.float64), gen(2)).sum(
        0
    )
    assert concrete.chi_square_p_value(uniform_counts, torch.softmax(LOGITS, -1)) < 1e-12


def test_chi_square_p_value_of_a_known_statistic():
    # counts (60, 40) against (0.5, 0.5): X^2 = 4 with 1 dof, p = 0.0455.
    p = concrete.chi_square_p_value(torch.tensor([60.0, 40.0]), torch.tensor([0.5, 0.5]))
    assert p == pytest.approx(0.0455003, abs=1e-6)


def test_gumbel_noise_is_standard_gumbel():
    g = concrete.gumbel_noise(torch.zeros(400_000, dtype=torch.float64), gen(3))
    euler_gamma = 0.5772156649
    assert g.mean().item() == pytest.approx(euler_gamma, abs=0.01)
    assert g.var().item() == pytest.approx(math.pi**2 / 6, abs=0.02)
    assert torch.isfinite(g).all()


def test_gumbel_noise_is_finite_even_when_uniform_draws_are_zero(monkeypatch):
    monkeypatch.setattr(torch, "rand", lambda shape, **kw: torch.zeros(shape, dtype=kw["dtype"]))
    assert torch.isfinite(concrete.gumbel_noise(torch.zeros(3, dtype=torch.float32))).all()


# -- the relaxation -------------------------------------------------------------------------------


def test_concrete_samples_lie_on_the_simplex():
    y = concrete.concrete_sample(LOGITS.expand(1000, -1), 0.7, generator=gen())
    assert (y > 0).all()
    assert torch.allclose(y.sum(-1), torch.ones(1000, dtype=torch.float64))


def test_concrete_sample_is_softmax_of_noisy_logits_over_temperature():
    # Same generator state -> same noise: y must be softmax((logits + g) / tau), not logits/tau + g.
    tau = 0.3
    g = concrete.gumbel_noise(LOGITS.expand(5, -1), gen(4))
    y = concrete.concrete_sample(LOGITS.expand(5, -1), tau, generator=gen(4))
    assert torch.allclose(y, torch.softmax((LOGITS + g) / tau, -1), atol=1e-12)


def test_argmax_of_relaxed_sample_is_the_gumbel_max_sample():
    y = concrete.concrete_sample(LOGITS.expand(500, -1), 2.0, generator=gen(5))
    z = concrete.gumbel_max_sample(LOGITS.expand(500, -1), gen(5))
    assert torch.equal(F.one_hot(y.argmax(-1), 4).double(), z)


def test_low_temperature_samples_are_nearly_one_hot():
    y = concrete.concrete_sample(LOGITS.expand(2000, -1), 0.05, generator=gen(6))
    high = concrete.concrete_sample(LOGITS.expand(2000, -1), 5.0, generator=gen(6))
    assert y.max(-1).values.mean() > 0.97
    assert high.max(-1).values.mean() < 0.6


def test_hard_sample_is_one_hot_forward_with_the_relaxed_gradient():
    theta = LOGITS.clone().requires_grad_(True)
    weights = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    hard = concrete.concrete_sample(theta, 0.5, hard=True, generator=gen(7))
    assert set(hard.detach().tolist()) == {0.0, 1.0}
    (hard @ weights).backward()
    hard_grad = theta.grad.clone()

    theta.grad = None
    soft = concrete.concrete_sample(theta, 0.5, hard=False, generator=gen(7))
    (soft @ weights).backward()
    assert torch.equal(hard.detach(), F.one_hot(soft.argmax(), 4).double())
    assert torch.allclose(hard_grad, theta.grad)
    assert hard_grad.abs().sum() > 0


def test_relaxed_distribution_agrees_with_torch_gumbel_softmax():
    # Same law as torch.nn.functional.gumbel_softmax: compare the means and the distribution of
    # the first coordinate (two-sample quantiles) over 100k draws each.
    n, tau = 100_000, 0.8
    ours = concrete.concrete_sample(LOGITS.expand(n, -1), tau, generator=gen(8))
    torch.manual_seed(9)
    theirs = F.gumbel_softmax(LOGITS.expand(n, -1), tau=tau)
    assert torch.allclose(ours.mean(0), theirs.mean(0), atol=0.005)
    q = torch.tensor([0.1, 0.25, 0.5, 0.75, 0.9], dtype=torch.float64)
    assert torch.allclose(ours[:, 0].quantile(q), theirs[:, 0].quantile(q), atol=0.01)
    hard_ours = concrete.concrete_sample(LOGITS.expand(n, -1), tau, hard=True, generator=gen(10))
    hard_theirs = F.gumbel_softmax(LOGITS.expand(n, -1), tau=tau, hard=True)
    assert torch.allclose(hard_ours.mean(0), hard_theirs.mean(0), atol=0.006)


def test_a_wrongly_placed_temperature_would_be_caught():
    # logits / tau + g is a different law; the agreement test above must be able to see that.
    n, tau = 100_000, 0.4
    ours = concrete.concrete_sample(LOGITS.expand(n, -1), tau, generator=gen(11))
    wrong = torch.softmax(LOGITS / tau + concrete.gumbel_noise(LOGITS.expand(n, -1), gen(12)), -1)
    assert (ours.mean(0) - wrong.mean(0)).abs().max() > 0.05


# -- the density ----------------------------------------------------------------------------------


def test_density_agrees_with_torch_relaxed_one_hot_categorical():
    tau = 0.6
    y = concrete.concrete_sample(LOGITS.expand(50, -1), tau, generator=gen(13))
    reference = torch.distributions.RelaxedOneHotCategorical(
        torch.tensor(tau, dtype=torch.float64), logits=LOGITS
    )
    assert torch.allclose(
        concrete.concrete_log_density(y, LOGITS, tau), reference.log_prob(y), atol=1e-10
    )


@pytest.mark.parametrize("tau", [0.5, 1.0, 3.0])
def test_two_category_density_integrates_to_one(tau):
    logits = torch.tensor([0.8, -0.4], dtype=torch.float64)
    u = torch.linspace(-40, 40, 200_001, dtype=torch.float64)  # y1 = sigmoid(u)
    points = torch.stack([torch.sigmoid(u), torch.sigmoid(-u)], -1)
    integrand = (
        concrete.concrete_log_density(points, logits, tau) + torch.log(points).sum(-1)
    ).exp()
    assert torch.trapezoid(integrand, u).item() == pytest.approx(1.0, abs=1e-6)


def test_density_does_not_depend_on_a_shift_of_the_logits():
    y = concrete.concrete_sample(LOGITS.expand(10, -1), 1.3, generator=gen(14))
    assert torch.allclose(
        concrete.concrete_log_density(y, LOGITS, 1.3),
        concrete.concrete_log_density(y, LOGITS + 5.0, 1.3),
    )


# -- gradient estimators --------------------------------------------------------------------------

OBJECTIVE = concrete.quadratic_objective(torch.linspace(0, 1, 4, dtype=torch.float64))


def test_exact_gradient_matches_autograd_of_the_expectation():
    theta = LOGITS.clone().requires_grad_(True)
    values = OBJECTIVE(torch.eye(4, dtype=torch.float64))
    (torch.softmax(theta, -1) * values).sum().backward()
    assert torch.allclose(concrete.exact_gradient(LOGITS, OBJECTIVE), theta.grad, atol=1e-12)


def test_score_function_estimator_is_unbiased():
    grads = concrete.score_function_gradients(LOGITS, OBJECTIVE, 400_000, gen(15))
    exact = concrete.exact_gradient(LOGITS, OBJECTIVE)
    standard_error = (grads.var(0) / len(grads)).sqrt()
    assert ((grads.mean(0) - exact).abs() <= 4 * standard_error).all()


def test_relaxed_gradients_are_per_sample_gradients_of_f_at_y():
    n, tau = 6, 0.7
    grads = concrete.relaxed_gradients(LOGITS, OBJECTIVE, n, tau, generator=gen(16))
    g = concrete.gumbel_noise(LOGITS.expand(n, -1), gen(16))
    for i in range(n):
        theta = LOGITS.clone().requires_grad_(True)
        OBJECTIVE(torch.softmax((theta + g[i]) / tau, -1)).backward()
        assert torch.allclose(grads[i], theta.grad, atol=1e-12)


def test_relaxed_gradient_bias_vanishes_as_temperature_falls():
    exact = concrete.exact_gradient(LOGITS, OBJECTIVE)
    stats = {
        tau: concrete.estimator_stats(
            concrete.relaxed_gradients(LOGITS, OBJECTIVE, 100_000, tau, generator=gen(17)), exact
        )
        for tau in (2.0, 0.5, 0.05)
    }
    assert stats[2.0].bias > stats[0.5].bias > stats[0.05].bias
    assert stats[2.0].variance < stats[0.5].variance < stats[0.05].variance


def test_estimator_stats_of_a_constant_estimate():
    exact = torch.tensor([1.0, 0.0], dtype=torch.float64)
    stats = concrete.estimator_stats(
        torch.tensor([[4.0, 4.0], [4.0, 4.0]], dtype=torch.float64), exact
    )
    assert stats.bias == pytest.approx(5.0)
    assert stats.variance == 0.0


# -- the categorical VAE --------------------------------------------------------------------------


def test_kl_to_uniform_is_zero_for_a_uniform_posterior_and_positive_otherwise():
    model = concrete.CategoricalVAE(n_pixels=6, n_latents=2, n_categories=3, hidden=4)
    assert torch.allclose(model.kl_to_uniform(torch.zeros(5, 2, 3)), torch.zeros(5), atol=1e-7)
    peaked = torch.tensor([[[30.0, 0.0, 0.0], [0.0, 0.0, 0.0]]])
    assert model.kl_to_uniform(peaked).item() == pytest.approx(math.log(3), abs=1e-3)


@pytest.mark.parametrize("estimator", concrete.ESTIMATORS)
def test_every_estimator_sends_gradients_to_encoder_and_decoder(estimator):
    torch.manual_seed(0)
    model = concrete.CategoricalVAE(n_pixels=6, n_latents=2, n_categories=3, hidden=4)
    x = (torch.rand(8, 6) > 0.5).float()
    loss, nll = concrete.vae_loss(model, x, estimator, temperature=1.0, baseline=1.0)
    loss.backward()
    assert nll.shape == (8,)
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


def test_reinforce_surrogate_has_the_score_function_gradient():
    torch.manual_seed(1)
    model = concrete.CategoricalVAE(n_pixels=4, n_latents=1, n_categories=3, hidden=3)
    x = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    torch.manual_seed(2)
    loss, nll = concrete.vae_loss(model, x, "reinforce", temperature=1.0, baseline=0.5)
    loss.backward()
    got = model.encoder[2].bias.grad.clone()
    # By hand: d/dlogits [(nll - b) log q(z) + KL] = (nll - b)(z - q) + dKL/dlogits.
    torch.manual_seed(2)
    logits = model.posterior_logits(x).detach().requires_grad_(True)
    z = concrete.gumbel_max_sample(logits.detach())
    q = torch.softmax(logits, -1)
    model.kl_to_uniform(logits).sum().backward()
    expected = ((nll - 0.5).view(1, 1, 1) * (z - q) + logits.grad).detach().view(-1)
    assert torch.allclose(got, expected, atol=1e-6)


def test_negative_elbo_is_at_least_the_data_entropy_bound():
    model = concrete.CategoricalVAE(n_pixels=6, n_latents=2, n_categories=3, hidden=4)
    x = (torch.rand(16, 6, generator=gen(18)) > 0.5).float()
    assert concrete.negative_elbo(model, x) > 0


def test_short_training_improves_the_elbo_with_gumbel_softmax():
    torch.manual_seed(0)
    x = (torch.rand(300, 16, generator=gen(19)) > 0.7).float()
    history = concrete.train_vae(
        x, x, "gumbel-softmax", steps=200, batch_size=50, eval_every=100, lr=3e-3
    )
    assert history["step"] == [100, 200]
    untrained = concrete.negative_elbo(concrete.CategoricalVAE(n_pixels=16), x)
    assert history["test_neg_elbo"][-1] < untrained - 1.0


def test_temperature_schedule_decays_to_its_floor():
    assert concrete.temperature_schedule(0, 1e-3) == 1.0
    assert concrete.temperature_schedule(100, 1e-3) == pytest.approx(math.exp(-0.1))
    assert concrete.temperature_schedule(10_000, 1e-3) == 0.5


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("tau", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_temperatures_are_rejected(tau):
    with pytest.raises(ValueError, match="temperature"):
        concrete.concrete_sample(LOGITS, tau)
    with pytest.raises(ValueError, match="temperature"):
        concrete.concrete_log_density(torch.softmax(LOGITS, -1), LOGITS, tau)


def test_non_numeric_temperature_is_rejected():
    with pytest.raises(TypeError, match="temperature"):
        concrete.concrete_sample(LOGITS, "1.0")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_logits_are_rejected(bad):
    logits = LOGITS.clone()
    logits[1] = bad
    for call in (
        lambda: concrete.gumbel_max_sample(logits),
        lambda: concrete.concrete_sample(logits, 1.0),
        lambda: concrete.concrete_log_density(
            torch.full((4,), 0.25, dtype=torch.float64), logits, 1.0
        ),
    ):
        with pytest.raises(ValueError, match="finite"):
            call()


@pytest.mark.parametrize("shape", [(), (3, 1)])
def test_logits_need_a_category_axis_of_at_least_two(shape):
    with pytest.raises(ValueError, match=r"shape \(\.\.\., K\)"):
        concrete.concrete_sample(torch.zeros(shape), 1.0)


def test_integer_logits_are_rejected():
    with pytest.raises(TypeError, match="floating-point"):
        concrete.gumbel_max_sample(torch.tensor([1, 2, 3]))


def test_density_rejects_points_off_the_simplex_or_of_the_wrong_shape():
    with pytest.raises(ValueError, match="shape"):
        concrete.concrete_log_density(torch.full((3,), 1 / 3, dtype=torch.float64), LOGITS, 1.0)
    with pytest.raises(ValueError, match="sum to 1"):
        concrete.concrete_log_density(torch.full((4,), 0.3, dtype=torch.float64), LOGITS, 1.0)
    with pytest.raises(ValueError, match="strictly inside"):
        concrete.concrete_log_density(
            torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64), LOGITS, 1.0
        )


def test_unknown_estimator_is_rejected():
    model = concrete.CategoricalVAE(n_pixels=4)
    with pytest.raises(ValueError, match="estimator must be one of"):
        concrete.vae_loss(model, torch.zeros(2, 4), "reparam", 1.0)
