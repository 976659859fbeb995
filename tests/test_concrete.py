"""Unit tests of papernotes.concrete, in float64 with fixed seeds."""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import gen
from papernotes import concrete
from papernotes.concrete import experiment

LOGITS = torch.tensor([1.5, 0.2, -0.7, 0.0], dtype=torch.float64)
LOGITS_3 = torch.log(torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64))


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
    assert experiment.chi_square_p_value(counts, probs) > 1e-3


def test_chi_square_rejects_the_wrong_distribution():
    n = 50_000
    uniform = concrete.gumbel_max_sample(torch.zeros(n, 4, dtype=torch.float64), gen(2)).sum(0)
    assert experiment.chi_square_p_value(uniform, torch.softmax(LOGITS, -1)) < 1e-12


def test_chi_square_of_a_known_statistic():
    # counts (60, 40) against (0.5, 0.5): X^2 = 4 with 1 dof, p = 0.0455.
    counts, probs = torch.tensor([60.0, 40.0]), torch.tensor([0.5, 0.5])
    assert experiment.chi_square_statistic(counts, probs) == pytest.approx(4.0)
    assert experiment.chi_square_p_value(counts, probs) == pytest.approx(0.0455003, abs=1e-6)


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


@pytest.mark.parametrize("logits", [LOGITS_3, LOGITS], ids=["K=3", "K=4"])
@pytest.mark.parametrize("tau", [0.3, 1.0, 2.5])
def test_density_agrees_with_torch_relaxed_one_hot_categorical(logits, tau):
    y = concrete.concrete_sample(logits.expand(50, -1), tau, generator=gen(13))
    reference = torch.distributions.RelaxedOneHotCategorical(
        torch.tensor(tau, dtype=torch.float64), logits=logits
    )
    assert torch.allclose(
        concrete.concrete_log_density(y, logits, tau), reference.log_prob(y), atol=1e-10
    )


@pytest.mark.parametrize("tau", [0.5, 1.0, 3.0])
def test_three_category_density_integrates_to_one(tau):
    # In the coordinates u_k = log(y_k / y_3) the simplex is the plane R^2, and
    # p(u) = p(y) * y_1 y_2 y_3: the Jacobian of y = softmax(u_1, u_2, 0). With K = 3 both
    # Gamma(K) = 2 and the exponent -K matter: dropping either changes the integral.
    u = torch.linspace(-60, 60, 1201, dtype=torch.float64)
    u1, u2 = torch.meshgrid(u, u, indexing="ij")
    log_y = torch.log_softmax(torch.stack([u1, u2, torch.zeros_like(u1)], -1), -1)
    integrand = (concrete.concrete_log_density(log_y.exp(), LOGITS_3, tau) + log_y.sum(-1)).exp()
    step = (u[1] - u[0]).item()
    assert (integrand.sum() * step**2).item() == pytest.approx(1.0, abs=1e-4)


def test_density_does_not_depend_on_a_shift_of_the_logits():
    y = concrete.concrete_sample(LOGITS.expand(10, -1), 1.3, generator=gen(14))
    assert torch.allclose(
        concrete.concrete_log_density(y, LOGITS, 1.3),
        concrete.concrete_log_density(y, LOGITS + 5.0, 1.3),
    )


# -- gradient estimators --------------------------------------------------------------------------

OBJECTIVE = experiment.quadratic_objective(torch.linspace(0, 1, 4, dtype=torch.float64))


def test_exact_gradient_matches_autograd_of_the_expectation():
    theta = LOGITS.clone().requires_grad_(True)
    values = OBJECTIVE(torch.eye(4, dtype=torch.float64))
    (torch.softmax(theta, -1) * values).sum().backward()
    assert torch.allclose(concrete.exact_gradient(LOGITS, OBJECTIVE), theta.grad, atol=1e-12)


@pytest.mark.parametrize("leave_one_out", [False, True])
def test_score_function_estimator_is_unbiased(leave_one_out):
    grads = concrete.score_function_gradients(
        LOGITS, OBJECTIVE, 100_000, samples=4, leave_one_out=leave_one_out, generator=gen(15)
    )
    exact = concrete.exact_gradient(LOGITS, OBJECTIVE)
    standard_error = (grads.var(0) / len(grads)).sqrt()
    assert ((grads.mean(0) - exact).abs() <= 4 * standard_error).all()


def test_leave_one_out_baseline_is_the_mean_of_the_other_draws():
    # One estimate of 3 draws, by hand: mean_s (f(z_s) - mean_{j != s} f(z_j)) (z_s - pi).
    grads = concrete.score_function_gradients(
        LOGITS, OBJECTIVE, 1, samples=3, leave_one_out=True, generator=gen(16)
    )
    z = concrete.gumbel_max_sample(LOGITS.expand(3, -1), gen(16))
    f = OBJECTIVE(z)
    pi = torch.softmax(LOGITS, -1)
    by_hand = sum((f[s] - (f.sum() - f[s]) / 2) * (z[s] - pi) for s in range(3)) / 3
    assert torch.allclose(grads[0], by_hand, atol=1e-12)


def test_leave_one_out_baseline_lowers_the_variance():
    exact = concrete.exact_gradient(LOGITS, OBJECTIVE)
    plain, loo = (
        experiment.estimator_stats(
            concrete.score_function_gradients(
                LOGITS, OBJECTIVE, 20_000, samples=4, leave_one_out=flag, generator=gen(17)
            ),
            exact,
        )
        for flag in (False, True)
    )
    assert loo.variance < 0.8 * plain.variance


def test_relaxed_gradients_are_per_sample_gradients_of_f_at_y():
    n, tau = 6, 0.7
    grads = concrete.relaxed_gradients(LOGITS, OBJECTIVE, n, tau, generator=gen(18))
    g = concrete.gumbel_noise(LOGITS.expand(n, -1), gen(18))
    for i in range(n):
        theta = LOGITS.clone().requires_grad_(True)
        OBJECTIVE(torch.softmax((theta + g[i]) / tau, -1)).backward()
        assert torch.allclose(grads[i], theta.grad, atol=1e-12)


def test_relaxed_gradients_average_their_draws():
    single = concrete.relaxed_gradients(LOGITS, OBJECTIVE, 6, 0.7, generator=gen(19))
    paired = concrete.relaxed_gradients(LOGITS, OBJECTIVE, 3, 0.7, samples=2, generator=gen(19))
    assert torch.allclose(paired, single.view(3, 2, 4).mean(1), atol=1e-12)


def test_relaxed_gradient_bias_vanishes_as_temperature_falls():
    exact = concrete.exact_gradient(LOGITS, OBJECTIVE)
    stats = {
        tau: experiment.estimator_stats(
            concrete.relaxed_gradients(LOGITS, OBJECTIVE, 100_000, tau, generator=gen(20)), exact
        )
        for tau in (2.0, 0.5, 0.05)
    }
    assert stats[2.0].bias > stats[0.5].bias > stats[0.05].bias
    assert stats[2.0].variance < stats[0.5].variance < stats[0.05].variance


def test_the_nulls_own_estimators():
    exact = concrete.exact_gradient(LOGITS, OBJECTIVE)
    plain = experiment.plain_score_function_gradients(
        LOGITS, OBJECTIVE, 100_000, samples=2, generator=gen(31)
    )
    assert torch.allclose(plain.mean(0), exact, atol=4 * plain.std(0).max().item() / 300)
    # At tau = 1 the temperature on the logits alone is the relaxation itself.
    alone = experiment.logits_alone_gradients(LOGITS, OBJECTIVE, 50_000, 1.0, generator=gen(32))
    relaxed = concrete.relaxed_gradients(LOGITS, OBJECTIVE, 50_000, 1.0, generator=gen(33))
    assert torch.allclose(alone.mean(0), relaxed.mean(0), atol=0.01)
    stats = experiment.estimator_stats(plain, exact)
    assert 0 < stats.variance_se < 0.05 * stats.variance


def test_concrete_samples_of_their_own_match_the_mechanisms():
    mine = experiment.concrete_samples_of_its_own(LOGITS, 0.8, 50_000, gen(35))
    theirs = concrete.concrete_sample(LOGITS.expand(50_000, -1), 0.8, generator=gen(36))
    assert mine.shape == (50_000, 4)
    assert torch.allclose(mine.mean(0), theirs.mean(0), atol=0.01)
    assert torch.allclose(mine.max(-1).values.mean(), theirs.max(-1).values.mean(), atol=0.01)


def test_ablated_log_density_is_the_formula_with_its_two_ablations():
    y = torch.softmax(torch.randn(7, 4, generator=gen(34), dtype=torch.float64), -1)
    right = concrete.concrete_log_density(y, LOGITS, 0.7)
    assert torch.allclose(experiment.ablated_log_density(y, LOGITS, 0.7), right, atol=1e-12)
    no_gamma = experiment.ablated_log_density(y, LOGITS, 0.7, with_gamma=False)
    assert torch.allclose(right - no_gamma, torch.full((7,), math.lgamma(4)).double())
    shifted = experiment.ablated_log_density(y, LOGITS, 0.7, exponent_shift=-1)
    mixture = torch.logsumexp(torch.log_softmax(LOGITS, -1) - 0.7 * torch.log(y), -1)
    assert torch.allclose(shifted - right, mixture)


def test_estimator_stats_of_a_constant_estimate():
    exact = torch.tensor([1.0, 0.0], dtype=torch.float64)
    stats = experiment.estimator_stats(
        torch.tensor([[4.0, 4.0], [4.0, 4.0]], dtype=torch.float64), exact
    )
    assert stats.bias == pytest.approx(5.0)
    assert stats.variance == 0.0


def test_crossing_interpolates_on_log_log_axes():
    # y = x^-2 crosses 4 at x = 0.5, between the grid points 0.25 and 1.
    assert experiment.crossing([0.25, 1.0, 4.0], [16.0, 1.0, 1 / 16], 4.0) == pytest.approx(0.5)
    assert experiment.crossing([0.25, 1.0], [16.0, 1.0], 100.0) is None


# -- the categorical VAE --------------------------------------------------------------------------


def tiny_vae(seed=0):
    torch.manual_seed(seed)
    return experiment.CategoricalVAE(n_pixels=5, n_latents=2, n_categories=3, hidden=4)


def test_kl_to_prior_is_zero_for_the_prior_itself_and_positive_otherwise():
    model = tiny_vae()
    # The learned prior starts uniform.
    assert torch.allclose(model.kl_to_prior(torch.zeros(5, 2, 3)), torch.zeros(5), atol=1e-7)
    peaked = torch.tensor([[[30.0, 0.0, 0.0], [0.0, 0.0, 0.0]]])
    assert model.kl_to_prior(peaked).item() == pytest.approx(math.log(3), abs=1e-3)
    with torch.no_grad():
        model.prior_logits.copy_(torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 0.0]]))
    prior = model.prior_logits.detach().expand(4, -1, -1)
    assert torch.allclose(model.kl_to_prior(prior), torch.zeros(4), atol=1e-6)


def test_straight_through_decodes_one_hot_codes_and_gumbel_softmax_relaxed_ones():
    model = tiny_vae()
    seen = []
    model.decoder.register_forward_pre_hook(lambda module, args: seen.append(args[0].detach()))
    x = (torch.rand(6, 5, generator=gen(28)) > 0.5).float()
    for estimator in ("straight_through", "gumbel_softmax"):
        experiment.vae_loss(model, x, estimator=estimator, temperature=0.5, generator=gen(29))
    hard, soft = (codes.view(6, 2, 3) for codes in seen)
    assert ((hard == 0) | (hard == 1)).all() and (hard.sum(-1) == 1).all()
    assert ((soft > 0) & (soft < 1)).all()
    assert torch.allclose(soft.sum(-1), torch.ones(6, 2))


@pytest.mark.parametrize("estimator", experiment.ESTIMATORS)
def test_every_estimator_sends_gradients_to_encoder_and_decoder(estimator):
    model = tiny_vae()
    x = (torch.rand(8, 5, generator=gen(21)) > 0.5).float()
    loss, nll = experiment.vae_loss(
        model, x, estimator=estimator, temperature=1.0, generator=gen(22)
    )
    loss.backward()
    assert nll.shape == (8,)
    for name, parameter in model.named_parameters():
        if name.startswith("baseline") and estimator != "reinforce":
            assert parameter.grad is None, name  # only NVIL's REINFORCE trains b(x)
            continue
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


@pytest.mark.parametrize("estimator", ["reinforce", "reinforce_moving_average"])
def test_reinforce_surrogate_has_the_score_function_gradient(estimator):
    model = tiny_vae(1)
    x = torch.tensor([[1.0, 0.0, 1.0, 1.0, 0.0]])
    state = experiment.ScoreFunctionState(mean=0.5, variance=9.0)
    loss, nll = experiment.vae_loss(
        model, x, estimator=estimator, temperature=1.0, state=state, generator=gen(23)
    )
    loss.backward()
    got = model.encoder[2].bias.grad.clone()
    # By hand: d/dlogits [(nll - c - b(x)) log q(z) + KL] / s = [(nll - c - b)(z - q) + dKL] / s,
    # with s = max(1, sqrt(v)) for NVIL (v updated with this batch first), b = 0 and s = 1 for
    # the moving average alone.
    logits = model.posterior_logits(x).detach().requires_grad_(True)
    z = experiment.sample_categorical(logits.detach(), gen(23))
    q = torch.softmax(logits, -1)
    model.kl_to_prior(logits).sum().backward()
    if estimator == "reinforce":
        b = model.baseline(x).item()
        centred = nll.item() - 0.5 - b
        scale = math.sqrt(0.9 * 9.0 + 0.1 * centred**2)
    else:
        centred, scale = nll.item() - 0.5, 1.0
    expected = ((centred * (z - q) + logits.grad) / scale).detach().view(-1)
    assert torch.allclose(got, expected, atol=1e-6)
    assert state.mean.item() == pytest.approx(0.9 * 0.5 + 0.1 * nll.item())


def test_softmax_null_decodes_the_noise_free_relaxation():
    # The null: loss = mean(-log p(x | softmax(logits / tau)) + KL), no noise drawn.
    model = tiny_vae(2)
    x = (torch.rand(6, 5, generator=gen(31)) > 0.5).float()
    noise = gen(32)
    before = noise.get_state()
    loss, nll = experiment.vae_loss(model, x, estimator="softmax", temperature=0.7, generator=noise)
    assert torch.equal(noise.get_state(), before)  # no Gumbel noise, nor any other draw
    logits = model.posterior_logits(x)
    y = torch.exp(logits / 0.7) / torch.exp(logits / 0.7).sum(-1, keepdim=True)
    expected_nll = model.reconstruction_nll(x, y)
    assert torch.allclose(nll, expected_nll.detach(), atol=1e-6)
    assert torch.allclose(loss, (expected_nll + model.kl_to_prior(logits)).mean(), atol=1e-6)


def test_reinforce_without_normalisation_is_the_score_function_times_the_scale():
    # normalise=False leaves out NVIL's division by max(1, sqrt v) and nothing else.
    model = tiny_vae(1)
    x = torch.tensor([[1.0, 0.0, 1.0, 1.0, 0.0]])
    grads = []
    for normalise in (True, False):
        model.zero_grad()
        state = experiment.ScoreFunctionState(mean=0.5, variance=9.0)
        loss, nll = experiment.vae_loss(
            model,
            x,
            estimator="reinforce",
            temperature=1.0,
            state=state,
            generator=gen(23),
            normalise=normalise,
        )
        loss.backward()
        grads.append(model.encoder[2].bias.grad.clone())
    centred = nll.item() - 0.5 - model.baseline(x).item()
    scale = math.sqrt(0.9 * 9.0 + 0.1 * centred**2)
    assert scale > 1.5
    assert torch.allclose(grads[0] * scale, grads[1], atol=1e-6)


def exact_encoder_gradient(model, x):
    """The encoder's exact gradient of mean(E_q[-log p(x|z)] + KL), enumerating the codes."""
    k = model.n_categories
    configs = F.one_hot(torch.tensor(list(itertools.product(range(k), repeat=model.n_latents))), k)
    logits = model.posterior_logits(x)
    log_qz = (torch.log_softmax(logits, -1).unsqueeze(1) * configs).sum((-1, -2))  # (B, C)
    with torch.no_grad():
        nll = torch.stack(
            [model.reconstruction_nll(x, z.float().expand(len(x), -1, -1)) for z in configs], 1
        )
    objective = (log_qz.exp() * nll).sum(1) + model.kl_to_prior(logits)
    grads = torch.autograd.grad(objective.mean(), list(model.encoder.parameters()))
    return torch.cat([g.flatten() for g in grads])


@pytest.mark.parametrize("estimator", ["reinforce", "reinforce_moving_average"])
def test_encoder_gradients_of_reinforce_are_unbiased_and_noisy(estimator):
    # The score function, centred by a fixed c (and b(x)), averages to the exact gradient of the
    # discrete objective; each draw differs from the next.
    model = tiny_vae(3)
    x = (torch.rand(4, 5, generator=gen(33)) > 0.5).float()
    g = experiment.encoder_gradients(
        model, x, estimator=estimator, temperature=0.5, draws=4000, generator=gen(34)
    )
    assert g.shape == (4000, sum(p.numel() for p in model.encoder.parameters()))
    exact = exact_encoder_gradient(model, x)
    se = g.std(0) / math.sqrt(len(g))
    assert ((g.mean(0) - exact).abs() <= 4 * se + 1e-6).all()
    assert (g.var(0).sum() > 1e-4) and exact.norm() > 10 * (4 * se).norm() / math.sqrt(len(se))


def test_encoder_gradients_of_the_noise_free_softmax_do_not_vary_and_the_relaxed_ones_do():
    model = tiny_vae(3)
    x = (torch.rand(4, 5, generator=gen(35)) > 0.5).float()

    def gradients(estimator):
        return experiment.encoder_gradients(
            model, x, estimator=estimator, temperature=0.5, draws=50, generator=gen(36)
        )

    assert torch.equal(gradients("softmax")[0], gradients("softmax")[-1])
    relaxed = gradients("gumbel_softmax")
    assert relaxed.var(0).sum() > 1e-6
    # one draw's gradient is the surrogate's own: the first row, redrawn by hand
    noise = gen(36)
    loss, _ = experiment.vae_loss(
        model, x, estimator="gumbel_softmax", temperature=0.5, generator=noise
    )
    first = torch.autograd.grad(loss, list(model.encoder.parameters()))
    assert torch.allclose(relaxed[0], torch.cat([g.flatten() for g in first]), atol=1e-6)


def test_sample_categorical_draws_the_softmax_probabilities():
    logits = torch.log(torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64))
    z = experiment.sample_categorical(logits.expand(30_000, -1), gen(30))
    assert ((z.sum(-1) == 1) & ((z == 0) | (z == 1)).all(-1)).all()
    assert torch.allclose(z.mean(0), torch.tensor([0.6, 0.3, 0.1]).double(), atol=0.015)


def exact_log_likelihood_and_elbo(model, x):
    """log p(x) and the ELBO, both exactly, by enumerating all K^L latent configurations."""
    n_latents, k = model.n_latents, model.n_categories
    configs = list(itertools.product(range(k), repeat=n_latents))
    z = F.one_hot(torch.tensor(configs), k).float()  # (C, L, K)
    with torch.no_grad():
        # log p(x|z) for every example and configuration: (B, C)
        log_px_given_z = -torch.stack(
            [model.reconstruction_nll(x, z_c.expand(len(x), -1, -1)) for z_c in z], dim=1
        )
        log_prior = (torch.log_softmax(model.prior_logits, -1) * z).sum((-1, -2))  # (C,)
        log_px = torch.logsumexp(log_px_given_z + log_prior, dim=1)
        log_q = torch.log_softmax(model.posterior_logits(x), -1)  # (B, L, K)
        log_qz = (log_q.unsqueeze(1) * z).sum((-1, -2))  # (B, C)
        elbo = (log_qz.exp() * (log_px_given_z + log_prior - log_qz)).sum(1)
    return log_px, elbo


def test_negative_elbo_and_bound_sit_above_the_exact_negative_log_likelihood():
    # With 2 latents of 3 categories, log p(x) sums over 9 configurations exactly. The Monte-Carlo
    # -ELBO must agree with the enumerated -ELBO, which lies above -log p(x) by the KL between
    # q(z|x) and the true posterior (a KL with the wrong sign or convention breaks both).
    model = tiny_vae(2)
    x = (torch.rand(16, 5, generator=gen(24)) > 0.5).float()
    log_px, elbo = exact_log_likelihood_and_elbo(model, x)
    assert (elbo <= log_px + 1e-5).all()
    assert -elbo.mean().item() > -log_px.mean().item() + 1e-3  # an untrained q is not exact
    estimate = experiment.negative_elbo(model, x, samples=4000, seed=0)
    assert estimate == pytest.approx(-elbo.mean().item(), abs=0.02)
    # The m-sample bound: near the -ELBO for m = 1 (on average), between the two for m = 10,
    # and close to -log p(x) with many samples (9 configurations, drawn with replacement).
    single = experiment.negative_bound(model, x.repeat(200, 1), samples=1, seed=0).mean().item()
    assert single == pytest.approx(-elbo.mean().item(), abs=0.1)
    ten = experiment.negative_bound(model, x, samples=10, seed=0)
    assert (ten >= -log_px - 1e-4).float().mean() > 0.5
    assert ten.mean().item() < -elbo.mean().item()
    many = experiment.negative_bound(model, x, samples=3000, seed=0)
    assert torch.allclose(many, -log_px, atol=0.02)


def test_the_no_latent_model_is_the_independent_pixel_likelihood():
    train = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    # add-one counts: p = (2 + 1) / 5 and (1 + 1) / 5
    nll = experiment.independent_pixels_nll(train, torch.tensor([[1.0, 0.0]]))
    assert nll.item() == pytest.approx(-math.log(0.6) - math.log(0.6))


def test_paired_standard_error():
    a, b = torch.tensor([1.0, 2.0, 3.0, 6.0]), torch.tensor([0.0, 0.0, 0.0, 0.0])
    assert experiment.paired_standard_error(a, b) == pytest.approx(a.std().item() / 2)


def test_train_vae_returns_its_model_and_validation_history():
    x = (torch.rand(300, 16, generator=gen(25)) > 0.7).float()
    untrained = experiment.negative_bound(tiny_vae_like(x), x, samples=10).mean().item()
    run = experiment.train_vae(
        x, x, estimator="gumbel_softmax", seed=0, steps=200, batch_size=50, eval_every=100, lr=3e-3
    )
    assert run.history.steps == [100, 200]
    assert not run.model.training
    assert run.history.final("val_bound") < untrained - 1.0


def tiny_vae_like(x):
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return experiment.CategoricalVAE(n_pixels=x.shape[1])


@pytest.mark.parametrize("estimator", experiment.ESTIMATORS)
def test_train_vae_follows_its_seed(estimator):
    x = (torch.rand(200, 8, generator=gen(26)) > 0.6).float()

    def final(seed):
        run = experiment.train_vae(
            x, x, estimator=estimator, seed=seed, steps=30, batch_size=20, eval_every=30
        )
        return run.history.final("val_bound")

    assert final(0) == final(0)
    assert final(0) != final(1)


def test_a_stacked_vae_gives_each_member_its_own_loss_gradient_and_statistics():
    members = [tiny_vae(4), tiny_vae(5)]
    stack = experiment.StackedVAE(members)
    x = (torch.rand(6, 5, generator=gen(37)) > 0.5).float()
    losses, nll = experiment.vae_loss(stack, x, estimator="softmax", temperature=0.7)
    assert losses.shape == (2,) and nll.shape == (2, 6)
    losses.sum().backward()
    for k, member in enumerate(members):
        loss, own_nll = experiment.vae_loss(member, x, estimator="softmax", temperature=0.7)
        loss.backward()
        assert losses[k].item() == pytest.approx(loss.item(), abs=1e-5)
        assert torch.allclose(nll[k], own_nll, atol=1e-5)
        got = stack.prior_logits.grad[k, 0]
        assert torch.allclose(got, member.prior_logits.grad, atol=1e-6)
        plain = stack.member(k)
        assert torch.equal(plain.encoder[0].weight, member.encoder[0].weight)
        assert torch.equal(plain.prior_logits, member.prior_logits)
    # REINFORCE keeps its running statistics per member, over that member's batch
    state = experiment.ScoreFunctionState()
    _, nll = experiment.vae_loss(
        stack, x, estimator="reinforce", temperature=1.0, state=state, generator=gen(38)
    )
    assert state.mean.shape == (2, 1)
    assert torch.allclose(state.mean[:, 0], nll.mean(-1))


def test_runs_trained_together_match_the_runs_trained_apart():
    # The noise-free softmax draws no noise, so each member of the stack follows the run at its
    # rate alone, to float rounding.
    x = (torch.rand(200, 8, generator=gen(39)) > 0.6).float()
    options = dict(estimator="softmax", seed=3, steps=40, batch_size=20, eval_every=20)
    together = experiment.train_vaes(x, x, rates=[1e-3, 1e-2], **options)
    for lr, run in zip([1e-3, 1e-2], together, strict=True):
        alone = experiment.train_vae(x, x, lr=lr, **options)
        assert run.history["val_bound"] == pytest.approx(alone.history["val_bound"], rel=1e-4)
    assert together[0].history.final("val_bound") != together[1].history.final("val_bound")


def test_temperature_schedule_decays_to_its_floor():
    assert experiment.temperature_schedule(0, 1e-3) == 1.0
    assert experiment.temperature_schedule(100, 1e-3) == pytest.approx(math.exp(-0.1))
    assert experiment.temperature_schedule(10_000, 1e-3) == 0.5


# -- bad input: one rejection per entry point -----------------------------------------------------


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda: concrete.gumbel_max_sample(torch.tensor([1, 2, 3])), TypeError),
        (lambda: concrete.gumbel_max_sample(torch.tensor([0.0, math.inf])), ValueError),
        (lambda: concrete.concrete_sample(torch.zeros(3, 1), 1.0), ValueError),
        (lambda: concrete.concrete_sample(LOGITS, 0.0), ValueError),
        (lambda: concrete.concrete_log_density(torch.full((4,), 0.3), LOGITS, 1.0), ValueError),
        (lambda: concrete.concrete_log_density(torch.full((3,), 1 / 3), LOGITS, 1.0), ValueError),
        (lambda: concrete.exact_gradient(LOGITS.expand(2, -1), OBJECTIVE), ValueError),
        (
            lambda: concrete.score_function_gradients(LOGITS, OBJECTIVE, 5, leave_one_out=True),
            ValueError,
        ),
        (lambda: concrete.relaxed_gradients(LOGITS, OBJECTIVE, 0, 1.0), ValueError),
        (lambda: experiment.chi_square_p_value(torch.ones(3), torch.ones(4) / 4), ValueError),
        (lambda: experiment.CategoricalVAE(n_categories=1), ValueError),
        (
            lambda: experiment.vae_loss(
                tiny_vae(), torch.zeros(2, 5), estimator="straight-through", temperature=1.0
            ),
            ValueError,
        ),
        (lambda: experiment.negative_elbo(tiny_vae(), torch.zeros(2, 6)), ValueError),
        (
            lambda: experiment.encoder_gradients(
                tiny_vae(), torch.zeros(2, 5), estimator="reinforce", temperature=1.0, draws=1
            ),
            ValueError,
        ),
        (lambda: experiment.negative_bound(tiny_vae(), torch.zeros(2, 6)), ValueError),
        (
            lambda: experiment.independent_pixels_nll(torch.zeros(3, 5), torch.zeros(2, 4)),
            ValueError,
        ),
        (lambda: experiment.ablated_log_density(torch.ones(2, 3) / 3, LOGITS, 1.0), ValueError),
        (
            lambda: experiment.train_vae(
                torch.zeros(10, 5), torch.zeros(10, 4), estimator="reinforce", seed=0
            ),
            ValueError,
        ),
    ],
    ids=[
        "gumbel_max_sample-int",
        "gumbel_max_sample-inf",
        "concrete_sample-K1",
        "concrete_sample-tau",
        "density-off-simplex",
        "density-shape",
        "exact_gradient-shape",
        "score_function-loo",
        "relaxed-n",
        "chi_square-shape",
        "vae-categories",
        "vae_loss-estimator",
        "negative_elbo-shape",
        "encoder_gradients-draws",
        "negative_bound-shape",
        "no_latent-shape",
        "ablated_density-shape",
        "train_vae-shape",
    ],
)
def test_bad_input_is_rejected_at_the_door(call, error):
    with pytest.raises(error):
        call()


def test_error_messages_name_the_argument():
    with pytest.raises(ValueError, match="temperature"):
        concrete.concrete_sample(LOGITS, -1.0)
    with pytest.raises(ValueError, match="estimator must be one of"):
        experiment.train_vae(
            torch.zeros(4, 2), torch.zeros(4, 2), estimator="gumbel softmax", seed=0
        )
    with pytest.raises(ValueError, match="strictly inside"):
        concrete.concrete_log_density(torch.tensor([1.0, 0.0, 0.0, 0.0]).double(), LOGITS, 1.0)


# -- the density against sampled histograms -------------------------------------------------------

EDGES = torch.linspace(-6.0, 8.0, 29, dtype=torch.float64)


def test_histogram_distance_is_half_the_l1_distance_with_the_outside_as_a_cell():
    p = torch.tensor([0.5, 0.5], dtype=torch.float64)
    assert experiment.histogram_distance(p, torch.tensor([1.0, 0.0]).double()) == 0.5
    # Half of q's mass lies outside the grid: that mass counts too (0.5 * (0.5 + 0.5)).
    half = torch.tensor([0.25, 0.25], dtype=torch.float64)
    assert experiment.histogram_distance(p, half) == pytest.approx(0.5)
    assert experiment.histogram_distance(p, p) == 0.0


def test_logit_histogram_counts_each_sample_in_its_cell():
    # v = tau * (log y_1 - log y_3, log y_2 - log y_3) = (0.25, -0.75) at tau = 1: the cell of
    # rows [0, 0.5) and columns [-1, -0.5); a sample far outside the grid is not counted.
    inside = torch.softmax(torch.tensor([0.25, -0.75, 0.0], dtype=torch.float64), -1)
    outside = torch.softmax(torch.tensor([20.0, 0.0, 0.0], dtype=torch.float64), -1)
    h = experiment.logit_histogram(torch.stack([inside, outside]), 1.0, EDGES)
    cells = len(EDGES) - 1
    assert h.shape == (cells**2,)
    assert h.sum().item() == 0.5
    assert h[12 * cells + 10].item() == 0.5  # row cell 12 = [0, 0.5), column 10 = [-1, -0.5)


def test_cell_masses_of_the_formula_match_a_sampled_histogram():
    # The formula's masses sum to nearly 1 on this grid (a little lies outside) and match 200,000
    # samples; the density without Gamma(K), half as large, is far from them.
    for tau in (0.5, 1.0):
        masses = experiment.cell_masses(
            lambda y, t: concrete.concrete_log_density(y, LOGITS_3, t), tau, EDGES
        )
        assert 0.99 < masses.sum().item() <= 1.0
        y = concrete.concrete_sample(LOGITS_3.expand(200_000, -1), tau, generator=gen(27))
        sampled = experiment.logit_histogram(y, tau, EDGES)
        assert experiment.histogram_distance(sampled, masses) < 0.03
        halved = experiment.cell_masses(
            lambda y, t: concrete.concrete_log_density(y, LOGITS_3, t) - math.lgamma(3), tau, EDGES
        )
        assert experiment.histogram_distance(sampled, halved) > 0.4


# -- the nearest corner and the log-convexity of the density --------------------------------------


def test_corner_mismatches_are_zero_for_the_relaxation_and_many_for_tau_on_the_logits(monkeypatch):
    logits = torch.log(torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64))
    for tau in (0.1, 1.0, 10.0):
        assert experiment.corner_mismatches(logits, tau, 5000, (0, 3)) == 0

    def logits_alone(logits, temperature, *, hard=False, generator=None):
        return torch.softmax(logits / temperature + concrete.gumbel_noise(logits, generator), -1)

    monkeypatch.setattr(concrete, "relax", logits_alone)
    # At tau = 0.1 the logits / tau swamp the noise: nearly every sample takes corner 1, so the
    # draws whose Gumbel-max category is 2 or 3 (about 40%) disagree.
    assert experiment.corner_mismatches(logits, 0.1, 5000, (0, 3)) > 1500


def test_log_density_curvature_of_a_hand_example():
    # K = 2, pi = (1/2, 1/2), at y = 1/2: the second derivative of log p in y is
    # 8 (1 - tau^2) by hand, positive below tau = 1 = 1 / (K - 1), zero at it, negative above;
    # the curvature is its sign (a 1 x 1 Hessian), and 0 where it vanishes.
    logits = torch.zeros(2, dtype=torch.float64)
    point = torch.tensor([[0.5, 0.5]], dtype=torch.float64)
    assert experiment.log_density_curvature(logits, 1.0, point) == pytest.approx(0.0, abs=1e-6)
    for tau in (0.5, 2.0):
        h = 1e-4
        y = torch.tensor([0.5 - h, 0.5, 0.5 + h], dtype=torch.float64)
        values = concrete.log_density(torch.stack([y, 1 - y], -1), logits, tau)
        second = (values[0] - 2 * values[1] + values[2]) / h**2
        curvature = experiment.log_density_curvature(logits, tau, point)
        assert second == pytest.approx(8 * (1 - tau**2), rel=1e-5)
        assert curvature == pytest.approx(1.0 if second > 0 else -1.0)


def test_the_density_is_log_convex_below_one_over_k_minus_one_and_not_above():
    # Maddison et al., Proposition 1(d): log-convex for tau <= 1 / (K - 1).
    for k in (3, 5):
        logits = torch.randn(k, generator=gen(40 + k), dtype=torch.float64)
        points = experiment.uniform_simplex_points(500, k, gen(50 + k))
        assert torch.allclose(points.sum(-1), torch.ones(500, dtype=torch.float64))
        assert (points > 0).all() and abs(points[:, 0].mean() - 1 / k) < 0.05
        assert experiment.log_density_curvature(logits, 1 / (k - 1), points) > -1e-12
        assert experiment.log_density_curvature(logits, 0.5 / (k - 1), points) > -1e-12
        assert experiment.log_density_curvature(logits, 2.0, points) < -0.5
