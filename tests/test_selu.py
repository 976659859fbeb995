"""Unit tests of papernotes.selu, in float64 with fixed seeds: against torch's own SELU,
AlphaDropout and initialisers, the paper's constants, and Monte Carlo estimates."""

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import gen, randn
from papernotes import selu
from papernotes.selu import experiment

# The constants to 20 digits, as the authors' code writes them (bioinf-jku/SNNs).
ALPHA_01 = 1.6732632423543772848170429916717
LAMBDA_01 = 1.0507009873554804934193349852946


def monte_carlo_moments(mu, nu, omega, tau, f=F.selu, n=2_000_000, seed=0):
    """Mean and variance of f(z), z ~ N(mu * omega, nu * tau), with their standard errors."""
    z = mu * omega + math.sqrt(nu * tau) * randn(n, seed=seed)
    y = f(z)
    mean, var = y.mean().item(), y.var().item()
    fourth = ((y - mean) ** 4).mean().item()
    return mean, var, math.sqrt(var / n), math.sqrt((fourth - var**2) / n)


# -- the constants --------------------------------------------------------------------------------


def test_constants_match_the_papers_closed_form_to_float64_precision():
    assert selu.ALPHA == pytest.approx(ALPHA_01, abs=1e-12)
    assert selu.LAMBDA == pytest.approx(LAMBDA_01, abs=1e-12)


def test_constants_match_torchs_selu():
    # torch.nn.SELU in float32: lambda = selu(1), lambda * alpha = -selu(-40).
    layer = torch.nn.SELU()
    lam = layer(torch.tensor(1.0)).item()
    saturation = -layer(torch.tensor(-40.0)).item()
    assert selu.LAMBDA == pytest.approx(lam, abs=1e-7)
    assert selu.ALPHA == pytest.approx(saturation / lam, abs=1e-6)


def test_constants_solve_the_fixed_point_equations():
    # Newton's method on g(0, 1) = (0, 1) over (alpha, lambda), from a start off the solution,
    # with a finite-difference Jacobian: an independent route to the closed form's two numbers.
    def residual(alpha, lam):
        mean, var = selu.moment_map(0.0, 1.0, alpha=alpha, lam=lam)
        return torch.stack([mean, var - 1.0])

    params = torch.tensor([1.5, 1.1], dtype=torch.float64)
    h = 1e-7
    for _ in range(30):
        alpha, lam = params.tolist()
        r = residual(alpha, lam)
        jacobian = torch.stack(
            [(residual(alpha + h, lam) - r) / h, (residual(alpha, lam + h) - r) / h], dim=1
        )
        params = params - torch.linalg.solve(jacobian, r)
    assert params[0].item() == pytest.approx(selu.ALPHA, abs=1e-12)
    assert params[1].item() == pytest.approx(selu.LAMBDA, abs=1e-12)


def test_zero_one_is_a_fixed_point_of_the_moment_map():
    mean, var = selu.moment_map(0.0, 1.0)
    assert mean.dtype == torch.float64
    assert abs(mean.item()) < 1e-12
    assert abs(var.item() - 1.0) < 1e-12


# -- the activation -------------------------------------------------------------------------------


def test_selu_matches_torch_in_value_and_gradient():
    x = randn(1000, scale=3.0).requires_grad_()
    ours = selu.selu(x)
    theirs = F.selu(x)
    assert torch.allclose(ours, theirs, atol=1e-12)
    (g_ours,) = torch.autograd.grad(ours.sum(), x)
    (g_theirs,) = torch.autograd.grad(theirs.sum(), x)
    assert torch.allclose(g_ours, g_theirs, atol=1e-12)


def test_selu_by_hand():
    x = torch.tensor([2.0, 0.0, -1.0], dtype=torch.float64)
    expected = [2 * LAMBDA_01, 0.0, LAMBDA_01 * ALPHA_01 * (math.exp(-1) - 1)]
    assert selu.selu(x).tolist() == pytest.approx(expected, abs=1e-12)
    assert selu.SELU()(x).tolist() == pytest.approx(expected, abs=1e-12)


def test_selu_rejects_a_non_float_tensor():
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        selu.selu(torch.tensor([1, 2]))


# -- the moment map -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mu", "nu", "omega", "tau"),
    [(0.0, 1.0, 0.0, 1.0), (0.3, 1.4, 0.8, 1.2), (-0.5, 0.3, 1.5, 0.9), (1.0, 2.5, -0.4, 1.1)],
)
def test_moment_map_matches_monte_carlo(mu, nu, omega, tau):
    mean, var = selu.moment_map(mu, nu, omega, tau)
    mc_mean, mc_var, se_mean, se_var = monte_carlo_moments(mu, nu, omega, tau)
    assert abs(mean.item() - mc_mean) < 5 * se_mean
    assert abs(var.item() - mc_var) < 5 * se_var


def test_moment_map_of_another_scaled_elu_matches_monte_carlo():
    # With alpha = lambda = 1 the map is ELU's: the closed form is not tied to the constants.
    mean, var = selu.moment_map(0.2, 1.5, 1.0, 1.0, alpha=1.0, lam=1.0)
    mc_mean, mc_var, se_mean, se_var = monte_carlo_moments(0.2, 1.5, 1.0, 1.0, f=F.elu, seed=1)
    assert abs(mean.item() - mc_mean) < 5 * se_mean
    assert abs(var.item() - mc_var) < 5 * se_var
    assert abs(var.item() - selu.moment_map(0.2, 1.5, 1.0, 1.0)[1].item()) > 0.1


def test_moment_map_broadcasts_over_tensors():
    nu = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)
    mean, var = selu.moment_map(torch.zeros(3, dtype=torch.float64), nu)
    assert mean.shape == var.shape == (3,)
    assert var[1].item() == pytest.approx(1.0, abs=1e-12)
    assert var[0].item() < 1.0 < var[2].item()  # pulled up from below, down from above...
    assert var[0].item() > 0.5 and var[2].item() < 2.0  # ...towards 1 in both cases


def test_jacobian_at_the_fixed_point_is_the_papers():
    jacobian = selu.moment_map_jacobian(0.0, 1.0)
    # Central finite differences of the closed form agree with autograd.
    h = 1e-6
    for column, (dmu, dnu) in enumerate([(h, 0.0), (0.0, h)]):
        plus = torch.stack(selu.moment_map(dmu, 1.0 + dnu))
        minus = torch.stack(selu.moment_map(-dmu, 1.0 - dnu))
        assert torch.allclose(jacobian[:, column], (plus - minus) / (2 * h), atol=1e-7)
    assert jacobian[:, 0].abs().max().item() < 1e-12  # omega = 0: the mean is forgotten
    assert selu.spectral_norm(jacobian) == pytest.approx(0.7877, abs=1e-4)


def test_iterates_converge_to_the_fixed_point():
    path = selu.iterate_moment_map(0.8, 2.5, 60)
    assert path.shape == (61, 2)
    assert path[0].tolist() == [0.8, 2.5]
    assert torch.allclose(path[-1], torch.tensor([0.0, 1.0], dtype=torch.float64), atol=1e-6)
    assert (path[1:, 1] - 1).abs().diff().le(0).all()  # the variance error never grows


def test_moment_map_rejects_a_non_positive_variance():
    with pytest.raises(ValueError, match="nu must be positive"):
        selu.moment_map(0.0, 0.0)
    with pytest.raises(ValueError, match="tau must be positive"):
        selu.moment_map(0.0, 1.0, 0.0, torch.tensor([1.0, -1.0]))


def test_jacobian_and_iterates_reject_bad_arguments():
    with pytest.raises(ValueError, match="nu must be positive"):
        selu.moment_map_jacobian(0.0, -1.0)
    with pytest.raises(ValueError, match="steps must be an integer >= 0"):
        selu.iterate_moment_map(0.0, 1.0, -1)


# -- LeCun-normal initialisation ------------------------------------------------------------------


def test_lecun_normal_matches_torchs_fan_in_normal():
    torch.manual_seed(0)
    theirs = torch.nn.init.kaiming_normal_(torch.empty(30, 40), nonlinearity="linear")
    torch.manual_seed(0)
    ours = selu.lecun_normal_(torch.empty(30, 40))
    assert torch.equal(ours, theirs)


def test_lecun_normal_has_variance_one_over_fan_in():
    w = selu.lecun_normal_(torch.empty(400, 250, dtype=torch.float64), generator=gen())
    assert w.var().item() == pytest.approx(1 / 250, rel=0.02)
    tau = (w**2).sum(1)  # per unit: tau = sum of squared weights, 1 on average
    assert tau.mean().item() == pytest.approx(1.0, abs=0.02)


def test_lecun_normal_rejects_a_vector():
    with pytest.raises(ValueError, match="tensor must be a weight of shape"):
        selu.lecun_normal_(torch.empty(5))


# -- alpha-dropout --------------------------------------------------------------------------------


def test_alpha_dropout_matches_torchs_alpha_dropout():
    x = randn(500, 40)
    for p in (0.05, 0.2, 0.5):
        torch.manual_seed(3)
        theirs = torch.nn.AlphaDropout(p)(x)
        torch.manual_seed(3)
        ours = selu.alpha_dropout(x, p)
        assert torch.allclose(ours, theirs, atol=1e-12)


def test_alpha_dropout_affine_against_torchs_formula():
    # torch: a = ((alpha'^2 p + 1)(1 - p))^(-1/2), b = a * |alpha'| * p.
    saturation = LAMBDA_01 * ALPHA_01
    for p in (0.05, 0.1, 0.3):
        a, b = selu.alpha_dropout_affine(p)
        expected_a = 1 / math.sqrt((saturation**2 * p + 1) * (1 - p))
        assert a == pytest.approx(expected_a, abs=1e-12)
        assert b == pytest.approx(expected_a * saturation * p, abs=1e-12)
    assert selu.alpha_dropout_affine(0.0) == pytest.approx((1.0, 0.0))


def test_alpha_dropout_keeps_mean_and_variance_where_dropout_does_not():
    x = selu.selu(randn(1_000_000, seed=4))  # the SELU fixed point: mean 0, variance 1
    for p in (0.1, 0.3):
        y = selu.alpha_dropout(x, p, generator=gen(5))
        assert abs(y.mean().item()) < 0.005 and abs(y.var().item() - 1) < 0.01
        torch.manual_seed(6)
        theirs = torch.nn.AlphaDropout(p)(x)
        assert abs(theirs.mean().item()) < 0.005 and abs(theirs.var().item() - 1) < 0.01
        plain = selu.plain_dropout(x, p, generator=gen(5))
        assert plain.var().item() == pytest.approx(1 / (1 - p), rel=0.01)


def test_alpha_dropout_drops_to_the_saturation_value():
    x = randn(10_000, seed=7)
    p = 0.2
    a, b = selu.alpha_dropout_affine(p)
    y = selu.alpha_dropout(x, p, generator=gen(8))
    dropped = (y - (a * (-LAMBDA_01 * ALPHA_01) + b)).abs() < 1e-12
    assert dropped.float().mean().item() == pytest.approx(p, abs=0.015)
    assert torch.allclose(y[~dropped], a * x[~dropped] + b, atol=1e-12)


def test_dropouts_are_the_identity_when_not_training():
    x = randn(100)
    assert torch.equal(selu.alpha_dropout(x, 0.3, training=False), x)
    assert torch.equal(selu.alpha_dropout(x, 0.0), x)
    assert torch.equal(selu.plain_dropout(x, 0.3, training=False), x)


def test_alpha_dropout_rejects_a_rate_of_one():
    with pytest.raises(ValueError, match=r"p must be a finite number in \[0, 1\)"):
        selu.alpha_dropout(randn(10), 1.0)
    with pytest.raises(ValueError, match="p must be"):
        selu.alpha_dropout_affine(-0.1)


# -- deep random networks -------------------------------------------------------------------------


def test_selu_networks_keep_their_statistics_where_relu_loses_them():
    stats = {
        name: experiment.forward_statistics(name, depth=32, width=128, n=128, seed=0)
        for name in ("selu", "relu")
    }
    assert stats["selu"].shape == (32, 2)
    mean, var = stats["selu"][-1].tolist()
    assert abs(mean) < 0.1 and 0.8 < var < 1.2
    assert stats["relu"][-1, 1].item() < 1e-6  # halved by each of 32 layers: about 2^-32


def test_he_scaled_weights_let_selu_drift():
    mean, var = experiment.forward_statistics("selu", depth=16, width=128, n=128, init_scale=2.0)[
        -1
    ]
    assert var.item() > 5.0


def test_forward_statistics_follow_the_seed():
    a = experiment.forward_statistics("selu", depth=4, width=32, n=16, seed=1)
    assert torch.equal(a, experiment.forward_statistics("selu", depth=4, width=32, n=16, seed=1))
    assert not torch.equal(
        a, experiment.forward_statistics("selu", depth=4, width=32, n=16, seed=2)
    )
    # A shallower network is the first layers of the deeper one.
    assert torch.equal(
        a[:2], experiment.forward_statistics("selu", depth=2, width=32, n=16, seed=1)
    )


def test_forward_statistics_reject_unknown_names():
    with pytest.raises(ValueError, match="activation must be one of"):
        experiment.forward_statistics("sigmoid")
    with pytest.raises(ValueError, match="dropout must be one of"):
        experiment.forward_statistics("selu", dropout="gaussian")


# -- the classifiers ------------------------------------------------------------------------------


def test_mlp_initialises_each_network_for_its_activation():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        snn = experiment.mlp(200, 10, depth=3, width=300, snn=True)
        relu = experiment.mlp(200, 10, depth=3, width=300, snn=False)
    assert [type(m).__name__ for m in snn] == ["Linear", "SELU"] * 3 + ["Linear"]
    assert [type(m).__name__ for m in relu] == ["Linear", "ReLU"] * 3 + ["Linear"]
    assert snn[2].weight.var().item() == pytest.approx(1 / 300, rel=0.03)  # LeCun
    assert relu[2].weight.var().item() == pytest.approx(2 / 300, rel=0.03)  # He
    assert snn[0].weight.var().item() == pytest.approx(1 / 200, rel=0.03)
    assert snn[0].bias.abs().max().item() == 0.0


def test_mlp_rejects_zero_depth():
    with pytest.raises(ValueError, match="depth must be an integer >= 1"):
        experiment.mlp(64, 10, depth=0, width=8)


def test_standardize_centres_on_the_training_split():
    train = randn(200, 5, scale=3.0, shift=2.0)
    other = randn(50, 5, seed=1)
    train_z, other_z = experiment.standardize(train, other)
    assert torch.allclose(train_z.mean(0), torch.zeros(5, dtype=torch.float64), atol=1e-12)
    assert train_z.std().item() == pytest.approx(1.0, abs=1e-12)
    assert torch.allclose(other_z, (other - train.mean(0)) / (train - train.mean(0)).std())
    with pytest.raises(ValueError, match="train_x must have shape"):
        experiment.standardize(torch.zeros(3))


def test_train_classifier_learns_a_separable_problem():
    x = randn(256, 8, seed=2).float()
    y = (x[:, 0] > 0).long()
    run = experiment.train_classifier(
        x,
        y,
        x,
        y,
        snn=True,
        seed=0,
        depth=4,
        width=16,
        lr=0.1,
        steps=100,
        batch_size=32,
        eval_every=50,
    )
    assert run.history.steps == [50, 100]
    assert run.history.final("val_accuracy") > 0.9


def test_train_classifier_rejects_mismatched_labels():
    x = torch.zeros(10, 4)
    with pytest.raises(ValueError, match="train_y must have shape"):
        experiment.train_classifier(
            x, torch.zeros(9, dtype=torch.long), x, torch.zeros(10), snn=True, seed=0
        )


# -- the chapter's measurements -------------------------------------------------------------------


def test_distance_from_the_fixed_point_is_the_larger_of_the_two_misses():
    assert experiment.distance_from_fixed_point(0.0, 1.0) == 0.0
    assert experiment.distance_from_fixed_point(torch.tensor(-0.3), torch.tensor(1.1)) == (
        pytest.approx(0.3)
    )
    assert experiment.distance_from_fixed_point(0.05, 0.5) == pytest.approx(0.5)
    x = torch.tensor([-1.0, 1.0, -1.0, 1.0], dtype=torch.float64) + 0.25
    # mean 0.25, unbiased variance 4/3
    assert experiment.moved_from_fixed_point(x) == pytest.approx(1 / 3)


def test_layers_to_converge_finds_the_first_layer_within_the_tolerance():
    path = torch.tensor(
        [[0.5, 2.0], [0.01, 1.0], [0.0005, 1.002], [0.0001, 1.0005], [0.0, 1.0]],
        dtype=torch.float64,
    )
    assert experiment.layers_to_converge(path) == 3  # layer 2's variance misses by 2e-3
    assert experiment.layers_to_converge(path, tolerance=0.01) == 1
    assert experiment.layers_to_converge(path[:3]) is None
    converging = selu.iterate_moment_map(0.8, 2.0, 60)
    layer = experiment.layers_to_converge(converging)
    assert layer is not None and layer > 1
    assert (converging[layer] - torch.tensor([0.0, 1.0]).double()).abs().max() <= 1e-3
