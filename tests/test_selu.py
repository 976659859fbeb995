"""Unit tests of papernotes.selu, in float64 with fixed seeds: against torch's own SELU,
AlphaDropout and initialisers, the paper's constants, and Monte Carlo estimates."""

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import gen, randn
from papernotes import selu, training
from papernotes.data import minibatches
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


def test_jacobian_of_many_points_is_each_points_own():
    mu = torch.tensor([0.05, -0.1, 0.0], dtype=torch.float64)
    nu = torch.tensor([0.9, 1.4, 1.0], dtype=torch.float64)
    omega = torch.tensor([0.1, -0.05, 0.7], dtype=torch.float64)
    stacked = selu.moment_map_jacobian(mu, nu, omega, 1.05)
    assert stacked.shape == (3, 2, 2)
    for i in range(3):
        alone = selu.moment_map_jacobian(mu[i].item(), nu[i].item(), omega[i].item(), 1.05)
        assert torch.allclose(stacked[i], alone, atol=1e-14)
    # omega != 0: the next mean now depends on the current one
    assert stacked[2, 0, 0].abs().item() > 0.1


def test_theorem_one_holds_on_a_coarse_grid_of_its_domain():
    check = experiment.check_theorem_one(points=5)
    assert check.points == 5
    assert check.excursion() < 0  # g's image lies inside the (mu, nu) box of the domain
    assert -0.1 < check.image_mean[0] < 0 < check.image_mean[1] < 0.1
    assert 0.8 < check.image_variance[0] < 1 < check.image_variance[1] < 1.5
    assert 0.7877 < check.largest_norm < 1
    # a corner of the domain is where the norm peaks, and the value there is the largest
    mu, omega, nu, tau = check.where
    corner = selu.moment_map_jacobian(mu, nu, omega, tau)
    assert selu.spectral_norm(corner) == pytest.approx(check.largest_norm, abs=1e-12)


def test_excursion_measures_the_image_against_the_domain():
    inside = experiment.DomainCheck(5, (-0.05, 0.06), (0.85, 1.45), 0.9, (0, 0, 1, 1))
    assert inside.excursion() == pytest.approx(-0.04)  # the mean's upper side is closest
    outside = experiment.DomainCheck(5, (-0.05, 0.06), (0.7, 1.45), 0.9, (0, 0, 1, 1))
    assert outside.excursion() == pytest.approx(0.1)


def test_a_unit_whose_weights_sum_to_one_is_no_longer_a_contraction():
    norm, radius = experiment.stability_at_fixed_point(0.0)
    assert norm == pytest.approx(0.7877, abs=1e-4) and radius < norm
    norm, radius = experiment.stability_at_fixed_point(1.0)
    assert norm > 1 and radius > 1
    # (0, 1) is still a fixed point: the map at omega = 1 leaves it in place
    mean, var = selu.moment_map(0.0, 1.0, 1.0, 1.0)
    assert abs(mean.item()) < 1e-12 and abs(var.item() - 1) < 1e-12


def test_moment_path_stops_once_the_iterates_leave():
    stable = experiment.moment_path(0.5, 2.0, 40)
    assert stable.shape == (41, 2)
    assert torch.allclose(stable, selu.iterate_moment_map(0.5, 2.0, 40))
    unstable = experiment.moment_path(0.5, 2.0, 200, omega=2.0)
    assert len(unstable) < 201 and unstable[-1, 0].abs() > 5
    he = experiment.moment_path(0.0, 1.0, 200, tau=2.0)  # He's tau: a fixed point inside the box
    assert torch.allclose(he[-1], selu.iterate_moment_map(0.0, 1.0, 200, tau=2.0)[-1])


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


def test_alpha_dropout_with_the_drop_value_zero_is_rescaled_dropout():
    x = selu.selu(randn(1_000_000, seed=4))
    p = 0.1
    a, b = selu.alpha_dropout_affine(p, saturation=0.0)
    assert a == pytest.approx((1 - p) ** -0.5) and b == 0.0
    y = selu.alpha_dropout(x, p, generator=gen(5), saturation=0.0)
    kept = selu.plain_dropout(x, p, generator=gen(5)) != 0  # the same mask
    assert torch.allclose(y, x * kept * a, atol=1e-12)
    # it restores mean 0 and variance 1 as well: one layer cannot tell alpha' apart
    assert abs(y.mean().item()) < 0.005 and abs(y.var().item() - 1) < 0.01


def test_the_saturation_value_makes_alpha_dropout_pull_the_variance_back():
    # input mean 0, variance 2: the output variance is 1 + a^2 q (2 - 1)
    x = randn(1_000_000, seed=9, scale=math.sqrt(2.0))
    p = 0.1
    for saturation in (None, 0.0):
        a, _ = selu.alpha_dropout_affine(p, saturation)
        y = selu.alpha_dropout(x, p, generator=gen(10), saturation=saturation)
        assert y.var().item() == pytest.approx(1 + a**2 * (1 - p), abs=0.01)
    gain = selu.alpha_dropout_affine(p)[0] ** 2 * (1 - p)
    assert gain == pytest.approx(1 / (1 + (LAMBDA_01 * ALPHA_01) ** 2 * p), abs=1e-12)


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


def test_selu_forgets_its_inputs_variance_where_relu_keeps_it():
    kwargs = dict(depth=32, width=128, n=128, seed=0)
    selu_3 = experiment.forward_statistics("selu", input_variance=3.0, **kwargs)
    assert selu_3[0, 1].item() > 1.5  # the first layer still carries the input's scale
    assert abs(selu_3[-1, 1].item() - 1) < 0.2
    relu_1 = experiment.forward_statistics("relu", init_scale=2.0, **kwargs)
    relu_3 = experiment.forward_statistics("relu", init_scale=2.0, input_variance=3.0, **kwargs)
    # ReLU is positively homogeneous: the same weights carry the factor 3 through every layer
    assert torch.allclose(relu_3[:, 1], 3 * relu_1[:, 1], rtol=1e-4)


def test_zero_alpha_dropout_in_a_network_is_alpha_dropout_with_the_drop_value_zero():
    ours = experiment.forward_statistics(
        "selu", depth=3, width=32, n=16, dropout="zero_alpha_dropout", seed=4
    )
    alpha = experiment.forward_statistics(
        "selu", depth=3, width=32, n=16, dropout="alpha_dropout", seed=4
    )
    assert ours.shape == (3, 2) and not torch.equal(ours, alpha)


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
    nets = {}
    for arm in experiment.ARMS:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            nets[arm] = experiment.mlp(200, 10, depth=3, width=300, arm=arm)
    names = {arm: [type(m).__name__ for m in net] for arm, net in nets.items()}
    assert names["snn"] == ["Linear", "SELU"] * 3 + ["Linear"]
    assert names["relu_he"] == names["relu_lsuv"] == ["Linear", "ReLU"] * 3 + ["Linear"]
    assert names["elu_lecun"] == names["selu_lambda_one"] == ["Linear", "ELU"] * 3 + ["Linear"]
    assert names["selu_alpha_one"] == ["Linear", "ScaledELU"] * 3 + ["Linear"]
    assert names["relu_he_bn"] == ["Linear", "BatchNorm", "ReLU"] * 3 + ["Linear"]
    assert names["relu_he_bn_after"] == ["Linear", "ReLU", "BatchNorm"] * 3 + ["Linear"]
    assert isinstance(nets["snn"][1], selu.SELU)  # the mechanism's, not torch's
    for arm in ("snn", "elu_lecun", "selu_lambda_one", "selu_alpha_one"):
        assert nets[arm][2].weight.var().item() == pytest.approx(1 / 300, rel=0.03), arm  # LeCun
    assert nets["relu_he"][2].weight.var().item() == pytest.approx(2 / 300, rel=0.03)  # He
    assert nets["selu_he"][2].weight.var().item() == pytest.approx(2 / 300, rel=0.03)
    w = nets["relu_lsuv"][2].weight  # orthogonal before LSUV's rescaling
    assert torch.allclose(w @ w.T, torch.eye(300), atol=1e-4)
    assert nets["snn"][-1].weight.var().item() == pytest.approx(1 / 300, rel=0.1)
    assert nets["relu_he"][-1].weight.var().item() == pytest.approx(1 / 300, rel=0.1)
    assert nets["snn"][0].bias.abs().max().item() == 0.0
    # the same seed draws the same weights whether or not batch norm follows
    assert torch.equal(nets["relu_he"][2].weight, nets["relu_he_bn"][3].weight)
    assert torch.equal(nets["relu_he"][2].weight, nets["relu_he_bn_after"][3].weight)


def test_the_nulls_activations_are_selu_with_other_constants():
    x = torch.linspace(-4.0, 3.0, 71, dtype=torch.float64)
    nets = {arm: experiment.mlp(2, 2, depth=1, width=2, arm=arm) for arm in experiment.ARMS}

    def by_hand(alpha, lam):  # lam * (x if x > 0 else alpha (e^x - 1)), the paper's form
        return lam * torch.where(x > 0, x, alpha * torch.expm1(x))

    assert torch.allclose(nets["selu_lambda_one"][1](x), by_hand(ALPHA_01, 1.0))
    assert torch.allclose(nets["selu_alpha_one"][1](x), by_hand(1.0, LAMBDA_01))
    assert torch.allclose(nets["elu_lecun"][1](x), by_hand(1.0, 1.0))
    assert torch.allclose(nets["selu_he"][1](x), by_hand(ALPHA_01, LAMBDA_01))
    assert torch.allclose(nets["snn"][1](x), by_hand(ALPHA_01, LAMBDA_01))


def test_lsuv_gives_every_hidden_layer_outputs_of_variance_one():
    x = randn(300, 20, seed=5).float() * 3.0
    with training.seeded(1):
        model = experiment.mlp(20, 4, depth=5, width=40, arm="relu_lsuv")
    experiment.lsuv_start(model, x)
    h = x
    for module in model[:-1]:
        h = module(h)
        if isinstance(module, torch.nn.Linear):
            assert h.var().item() == pytest.approx(1.0, abs=1e-4)
            assert module.bias.abs().max().item() == 0.0
    with pytest.raises(ValueError, match="without batch normalization"):
        experiment.lsuv_start(experiment.mlp(20, 4, depth=2, width=8, arm="relu_he_bn"), x)


def test_mlp_rejects_zero_depth_and_unknown_arms():
    with pytest.raises(ValueError, match="depth must be an integer >= 1"):
        experiment.mlp(64, 10, depth=0, width=8)
    with pytest.raises(ValueError, match="arm must be one of"):
        experiment.mlp(64, 10, depth=2, width=8, arm="gelu")


def test_standardize_centres_on_the_training_split():
    train = randn(200, 5, scale=3.0, shift=2.0)
    other = randn(50, 5, seed=1)
    train_z, other_z = experiment.standardize(train, other)
    assert torch.allclose(train_z.mean(0), torch.zeros(5, dtype=torch.float64), atol=1e-12)
    assert train_z.std().item() == pytest.approx(1.0, abs=1e-12)
    assert torch.allclose(other_z, (other - train.mean(0)) / (train - train.mean(0)).std())
    with pytest.raises(ValueError, match="train_x must have shape"):
        experiment.standardize(torch.zeros(3))


def train_one(x, y, arm, rates, **settings):
    """One arm's run through `train_arms`, on x for training and validation."""
    return experiment.train_arms(x, y, x, y, grid={arm: rates}, **settings)[arm]


def test_each_member_of_a_stack_of_arms_trains_as_it_would_alone():
    x = randn(200, 8, seed=2).float()
    y = (x[:, 0] > 0).long()
    arms = ("snn", "relu_lsuv", "selu_alpha_one", "relu_he_bn")
    settings = dict(seed=3, depth=4, width=16, steps=40, batch_size=32, eval_every=20)
    runs = experiment.train_arms(x, y, x, y, grid=dict.fromkeys(arms, (0.1, 0.01)), **settings)
    assert list(runs) == list(arms)
    assert len(runs["snn"].stacks[0].templates) == 6  # one stack without batch norm, one with
    for arm, run in runs.items():
        assert run.learning_rates == (0.01, 0.1)
        assert [h.steps for h in run.histories] == [[20, 40]] * 2
        assert run.diverged() == [False] * 2
        for k, lr in enumerate(run.learning_rates):
            with training.seeded(3):
                alone = experiment.mlp(8, 2, depth=4, width=16, arm=arm)
            if arm == "relu_lsuv":
                experiment.lsuv_start(alone, x)
            batches = minibatches(200, 32, training.generator(3, experiment.BATCHES))
            training.train_classifier(
                alone,
                y,
                torch.optim.SGD(alone.parameters(), lr=lr),
                40,
                batches=batches,
                logits_of=lambda index, model=alone: model(x[index]),
            )
            member = run.member(k)
            assert [type(m) for m in member] == [type(m) for m in alone]
            for (name, ours), theirs in zip(
                member.state_dict().items(), alone.state_dict().values(), strict=True
            ):
                assert torch.allclose(ours, theirs, atol=1e-5), (arm, name)
            accuracy = training.accuracy_of(member, x, y)
            assert accuracy == pytest.approx(run.val_accuracy()[k], abs=1e-6)
        assert run.val_accuracy()[1] > 0.8


def test_an_arms_members_are_the_same_to_the_bit_beside_other_arms():
    x = randn(100, 8, seed=2).float()
    y = (x[:, 0] > 0).long()
    common = dict(seed=1, depth=3, width=8, steps=20, eval_every=10)
    grid = {"snn": (0.1, 0.03), "relu_he": (0.1, 0.05), "relu_he_bn": (0.1, 0.2)}
    together = experiment.train_arms(x, y, x, y, grid=grid, **common)
    for arm, rates in grid.items():
        alone = train_one(x, y, arm, rates, **common)  # a stack of this arm's rates only
        for k in range(len(rates)):
            for ours, theirs in zip(
                together[arm].member(k).state_dict().values(),
                alone.member(k).state_dict().values(),
                strict=True,
            ):
                assert torch.equal(ours, theirs), arm


def test_an_arm_stack_takes_networks_of_one_layout_only():
    with training.seeded(0):
        snn = experiment.mlp(4, 2, depth=2, width=8, arm="snn")
        deeper = experiment.mlp(4, 2, depth=3, width=8, arm="snn")
        normalised = experiment.mlp(4, 2, depth=2, width=8, arm="relu_he_bn")
    for other in (deeper, normalised):
        with pytest.raises(ValueError, match="another layout"):
            experiment.ArmStack([snn, other])
    with pytest.raises(ValueError, match="non-empty list"):
        experiment.ArmStack([])
    stack = experiment.ArmStack([snn, snn])
    assert stack.on_all(torch.zeros(5, 4)).shape == (2, 5, 2)
    with pytest.raises(ValueError, match="below the number of members, 2"):
        stack.member(2)


@pytest.mark.parametrize("arm", ["snn", "relu_he_bn"])
def test_a_diverged_member_leaves_the_others_training(arm):
    x = randn(200, 8, seed=2).float()
    y = (x[:, 0] > 0).long()

    def run_at(rates):
        return train_one(x, y, arm, rates, seed=0, depth=3, width=8, steps=30)

    run, alone = run_at((0.1, 1e6)), run_at((0.1,))
    assert run.diverged() == [False, True] and alone.diverged() == [False]
    for ours, theirs in zip(
        run.member(0).state_dict().values(), alone.member(0).state_dict().values(), strict=True
    ):
        assert torch.allclose(ours, theirs, atol=1e-5)
    assert run.val_accuracy()[0] == pytest.approx(alone.val_accuracy()[0], abs=1e-6)
    assert run.val_accuracy()[0] > 0.7
    scores = run.validation_scores()
    assert list(scores) == [0.1, 1e6] and scores[1e6] == 0.0
    assert scores[0.1] == pytest.approx(run.val_accuracy()[0])


def test_tuned_arms_extend_each_grid_past_an_edge_until_it_brackets_the_best_rate():
    x = randn(200, 8, seed=2).float()
    y = (x[:, 0] > 0).long()
    common = dict(seed=0, depth=3, width=8, steps=30, eval_every=30)
    runs = experiment.tuned_arms(
        x,
        y,
        x,
        y,
        arms=("snn", "selu_alpha_one"),
        learning_rates=(1e-3, 4e-3),
        extensions=4,
        **common,
    )
    for arm, run in runs.items():
        rates = run.learning_rates
        assert {1e-3, 4e-3} <= set(rates) and len(rates) > 2  # 30 updates: both rates too small
        steps = [b / a for a, b in zip(rates[:-1], rates[1:], strict=True)]
        assert steps == pytest.approx([4.0] * len(steps))
        scores = run.validation_scores()
        best = max(rates, key=lambda rate: (scores[rate], -rate))
        assert rates[0] < best < rates[-1] or run.diverged()[-1]
        # each extension is the run its rate would be alone
        k = len(rates) - 1
        alone = train_one(x, y, arm, (rates[k],), **common)
        for ours, theirs in zip(
            run.member(k).state_dict().values(),
            alone.member(0).state_dict().values(),
            strict=True,
        ):
            assert torch.allclose(ours, theirs, atol=1e-5)
    # a best rate inside the grid ends the search; a diverged top rate is never passed
    inside = experiment.tuned_arms(
        x, y, x, y, arms=("snn",), learning_rates=(0.001, 0.1, 1e6), **common
    )["snn"]
    assert inside.learning_rates == (0.001, 0.1, 1e6) and inside.diverged()[-1]
    assert experiment.rate_beyond_the_edge(inside, 4.0) is None
    # the lowest rate best: the grid grows downwards
    low = experiment.tuned_arms(
        x, y, x, y, arms=("snn",), learning_rates=(0.1, 1e6), extensions=1, **common
    )["snn"]
    assert low.learning_rates == pytest.approx((0.025, 0.1, 1e6))


def test_extended_merges_runs_of_one_arm_in_ascending_rates():
    x = randn(100, 8, seed=2).float()
    y = (x[:, 0] > 0).long()
    common = dict(seed=0, depth=2, width=8, steps=10, eval_every=10)
    a = train_one(x, y, "snn", (0.1, 0.01), **common)
    b = train_one(x, y, "snn", (0.05,), **common)
    both = a.extended(b)
    assert both.learning_rates == (0.01, 0.05, 0.1)
    assert both.val_accuracy() == [a.val_accuracy()[0], b.val_accuracy()[0], a.val_accuracy()[1]]
    with pytest.raises(ValueError, match="same arm at other learning rates"):
        a.extended(a)
    other = train_one(x, y, "relu_he", (0.05,), **common)
    with pytest.raises(ValueError, match="same arm"):
        a.extended(other)


def test_train_arms_rejects_mismatched_labels_no_rates_and_no_arms():
    x = torch.zeros(10, 4)
    y = torch.zeros(10, dtype=torch.long)
    with pytest.raises(ValueError, match="train_y must have shape"):
        experiment.train_arms(x, y[:9], x, y, grid={"snn": (0.1,)}, seed=0)
    with pytest.raises(ValueError, match="at least one rate"):
        experiment.train_arms(x, y, x, y, grid={"snn": ()}, seed=0)
    with pytest.raises(ValueError, match="at least one arm"):
        experiment.train_arms(x, y, x, y, grid={}, seed=0)
    with pytest.raises(ValueError, match="arm must be one of"):
        experiment.train_arms(x, y, x, y, grid={"gelu": (0.1,)}, seed=0)


@pytest.mark.parametrize("arm", experiment.FIGURE_ONE_ARMS)
def test_figure_one_curves_are_each_rates_own_run_on_the_summed_loss(arm):
    x = randn(100, 6, seed=4).float()
    y = (x[:, 1] > 0).long()
    curve = dict(seed=5, epochs=3, depth=2, width=8, batch_size=16)
    run = experiment.train_curves(x, y, arm=arm, learning_rates=(1e-3, 1e-2), **curve)
    assert run.losses.shape == (4, 2)  # before each of 3 epochs, and after the last
    for k, lr in enumerate(run.learning_rates):
        with training.seeded(5):
            alone = experiment.mlp(6, 2, depth=2, width=8, arm=arm)
        batches = minibatches(100, 16, training.generator(5, experiment.BATCHES))
        optimizer = torch.optim.SGD(alone.parameters(), lr=lr)
        curve = []
        for _ in range(3):
            alone.train()
            with torch.no_grad():  # the whole training set, 6 unshuffled batches of 16
                batch_losses = [
                    F.cross_entropy(alone(x[i : i + 16]), y[i : i + 16]) for i in range(0, 96, 16)
                ]
            curve.append(torch.stack(batch_losses).mean().item())
            for _ in range(6):  # 100 // 16 updates an epoch
                index = next(batches)
                loss = F.cross_entropy(alone(x[index]), y[index], reduction="sum")
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        assert run.losses[:3, k].tolist() == pytest.approx(curve, rel=1e-4)


def test_loss_rise_sums_only_the_climbs_of_the_log_loss():
    losses = torch.tensor([math.e**3, math.e, math.e**2, 1.0, math.e**0.5])
    assert experiment.loss_rise(losses).item() == pytest.approx(1.5)  # +1 and +0.5
    assert experiment.loss_rise(losses, start=2).item() == pytest.approx(0.5)
    falling = torch.tensor([[3.0, 2.0], [2.0, 2.5], [1.0, 1.0]])
    assert experiment.loss_rise(falling).tolist() == pytest.approx([0.0, math.log(1.25)])


def test_the_paired_standard_error():
    a = torch.tensor([1.0, 0.0, 1.0, 1.0])
    b = torch.tensor([0.0, 0.0, 1.0, 0.0])
    # differences (1, 0, 0, 1): standard deviation 1/sqrt(3), over sqrt(4)
    assert experiment.paired_standard_error(a, b) == pytest.approx(1 / math.sqrt(3) / 2)
    with pytest.raises(ValueError, match="b must have shape"):
        experiment.paired_standard_error(a, b[:3])


def test_the_nulls_never_call_the_mechanism(monkeypatch):
    # Patch every mechanism function a null could reach to fail: the nulls still run.
    def broken(*args, **kwargs):
        raise AssertionError("a null reached papernotes.selu")

    for name in ("selu", "lecun_normal_", "alpha_dropout", "plain_dropout", "moment_map"):
        monkeypatch.setattr(selu, name, broken)
    for arm in experiment.ARMS:
        if arm != "snn":
            experiment.mlp(8, 3, depth=2, width=4, arm=arm)(torch.zeros(2, 8))
    for name in ("relu", "tanh", "elu", "torch_selu"):
        experiment.forward_statistics(name, depth=2, width=8, n=4, dropout="dropout")
        experiment.last_layer(name, depth=2, width=8, n=4)
        experiment.gradient_growth(name, depth=3, width=8)
    experiment.chi_1_range(selu.THEOREM_1_DOMAIN, points=2)
    experiment.forward_statistics("torch_selu", depth=2, width=8, n=4, dropout="zero_alpha_dropout")
    experiment.quadrature_domain(selu.THEOREM_1_DOMAIN, alpha=1.0, lam=1.0, points=2)
    with pytest.raises(AssertionError, match="a null reached"):
        experiment.forward_statistics("selu", depth=2, width=8, n=4)


def test_null_weights_and_dropouts_are_the_mechanisms_numbers():
    ours = experiment.lecun_weights_(torch.empty(30, 40), generator=gen(1))
    assert torch.equal(ours, selu.lecun_normal_(torch.empty(30, 40), generator=gen(1)))
    x = selu.selu(randn(1000, seed=3))
    saturation = -LAMBDA_01 * ALPHA_01
    null = experiment.null_dropout(x, 0.2, saturation, gen(4))
    assert torch.allclose(null, selu.alpha_dropout(x, 0.2, generator=gen(4)), atol=1e-12)
    plain = experiment.null_dropout(x, 0.2, None, gen(4))
    assert torch.allclose(plain, selu.plain_dropout(x, 0.2, generator=gen(4)), atol=1e-12)
    assert experiment.TORCH_SATURATION == pytest.approx(saturation, abs=1e-12)
    # the same weights for the mechanism's SELU and torch's: the statistics agree
    a = experiment.forward_statistics("selu", depth=4, width=32, n=16, seed=2)
    b = experiment.forward_statistics("torch_selu", depth=4, width=32, n=16, seed=2)
    assert torch.allclose(a, b, atol=1e-5)


def test_the_quadrature_moment_map_is_the_closed_form():
    for point in [(0.0, 1.0, 0.0, 1.0), (0.3, 1.4, 0.8, 1.2), (-1.0, 16.0, 0.1, 1.25)]:
        ours = torch.stack(experiment.quadrature_moments(*point, alpha=ALPHA_01, lam=LAMBDA_01))
        closed = torch.stack(selu.moment_map(*point))
        assert torch.allclose(ours, closed, atol=1e-10), point
    elu = torch.stack(experiment.quadrature_moments(0.2, 1.5, 1.0, 1.0, alpha=1.0, lam=1.0))
    assert torch.allclose(elu, torch.stack(selu.moment_map(0.2, 1.5, 1.0, 1.0, alpha=1, lam=1)))
    jacobian = experiment.quadrature_jacobian(0.0, 1.0, alpha=ALPHA_01, lam=LAMBDA_01)
    assert torch.allclose(jacobian, selu.moment_map_jacobian(0.0, 1.0), atol=1e-7)


def test_the_variance_range_is_the_papers_on_theorem_ones_domain():
    check = experiment.check_theorem_one(points=5)  # the extremes sit at the corners
    low, high = check.papers_variance_range()
    assert low == pytest.approx(0.80009, abs=1e-5) and high == pytest.approx(1.48617, abs=1e-5)
    assert low < check.image_variance[0] and check.image_variance[1] < high
    null = experiment.quadrature_domain(selu.THEOREM_1_DOMAIN, alpha=ALPHA_01, lam=LAMBDA_01)
    assert null["papers_variance"] == pytest.approx((low, high), abs=1e-10)


def test_theorems_two_and_three_on_coarse_grids():
    assert experiment.variance_change_range(experiment.THEOREM_2_DOMAIN, points=5)[1] < 0
    assert experiment.variance_change_range(experiment.THEOREM_3_DOMAIN, points=5)[0] > 0


def test_gradient_growth_follows_the_mean_field():
    selu_growth = experiment.gradient_growth("selu", depth=32, width=128, seed=1)
    relu_growth = experiment.gradient_growth("relu", depth=32, width=128, init_scale=2.0, seed=1)
    assert selu_growth.shape == (32,) and selu_growth[-1] == 1.0
    predicted = experiment.chi_1() ** 31
    assert 0.5 * predicted < selu_growth[0].item() < 2 * predicted
    assert 0.3 < relu_growth[0].item() < 3  # ReLU at He's: chi_1 = 1


def test_chi_1_matches_monte_carlo():
    z = randn(2_000_000, seed=11)
    slope = torch.where(z > 0, LAMBDA_01, LAMBDA_01 * ALPHA_01 * torch.exp(z))
    assert experiment.chi_1() == pytest.approx(slope.square().mean().item(), rel=2e-3)
    assert experiment.chi_1() == pytest.approx(1.0716, abs=1e-4)
    z2 = randn(2_000_000, seed=12) * math.sqrt(2.0)  # tau = 2: He's variance
    slope = torch.where(z2 > 0, LAMBDA_01, LAMBDA_01 * ALPHA_01 * torch.exp(z2))
    assert experiment.chi_1(tau=2.0) == pytest.approx(2 * slope.square().mean().item(), rel=2e-3)


def test_gradient_factor_is_the_geometric_mean_per_layer():
    growth = torch.tensor([8.0, 4.0, 2.0, 1.0], dtype=torch.float64)
    assert experiment.gradient_factor(growth) == pytest.approx(2.0)
    selu_growth = experiment.gradient_growth("selu", depth=32, width=128, seed=1)
    assert experiment.gradient_factor(selu_growth) == pytest.approx(experiment.chi_1(), rel=0.05)
    tanh_growth = experiment.gradient_growth("tanh", depth=8, width=256, init_scale=32.0, seed=1)
    assert experiment.gradient_factor(tanh_growth) > 2.5  # a saturated tanh: chi_1 about 3
    with pytest.raises(ValueError, match="at least two layers"):
        experiment.gradient_factor(growth[:1])


def test_chi_1_range_on_theorem_ones_domain_holds_the_fixed_points_chi_1():
    low, high = experiment.chi_1_range(selu.THEOREM_1_DOMAIN)
    assert low < experiment.chi_1() < high
    # a corner by Monte Carlo: mu = omega = 0.1, nu = 1.5, tau = 1.1 (z ~ N(0.01, 1.65))
    z = 0.01 + randn(2_000_000, seed=13) * math.sqrt(1.65)
    slope = torch.where(z > 0, LAMBDA_01, LAMBDA_01 * ALPHA_01 * torch.exp(z))
    corner = 1.1 * slope.square().mean().item()
    assert low - 1e-3 <= corner <= high + 1e-3
    one_point = {k: (v, v) for k, v in {"mu": 0.0, "omega": 0.0, "nu": 1.0, "tau": 1.0}.items()}
    assert experiment.chi_1_range(one_point, points=2) == pytest.approx(
        (experiment.chi_1(),) * 2, rel=1e-9
    )


def test_unit_moments_and_the_share_of_units_in_the_box():
    x = torch.tensor([[0.0, 1.0, 0.0], [0.0, -1.0, 2.0], [0.1, 2.0, 4.0]], dtype=torch.float64)
    moments = experiment.unit_moments(x)
    assert moments[:, 0].tolist() == pytest.approx([1 / 30, 2 / 3, 2.0])
    assert moments[:, 1].tolist() == pytest.approx([1 / 300, 7 / 3, 4.0])
    inside = torch.tensor([[0.0, 1.0], [0.05, 0.9], [0.2, 1.0], [0.0, 1.6]], dtype=torch.float64)
    assert experiment.units_in_box(inside) == pytest.approx(0.5)
    assert experiment.average_unit(inside) == pytest.approx((0.0625, 1.125))


def test_last_layer_is_the_network_forward_statistics_runs():
    x = experiment.last_layer("tanh", depth=5, width=16, n=40, init_scale=2.0, seed=4)
    stats = experiment.forward_statistics("tanh", depth=5, width=16, n=40, init_scale=2.0, seed=4)
    assert x.shape == (40, 16)
    assert torch.allclose(torch.stack([x.mean(), x.var()]), stats[-1])


def test_a_wide_selu_network_keeps_more_of_its_units_in_the_box():
    share = {
        width: experiment.units_in_box(
            experiment.unit_moments(experiment.last_layer("selu", depth=32, width=width, n=512))
        )
        for width in (32, 256)
    }
    assert share[32] < share[256]


def test_fraction_in_theorem_domain_counts_units_with_both_sums_in_range():
    w = torch.tensor([[0.7, -0.7, 0.1], [0.7, 0.7, 0.0], [0.6, -0.6, 0.5], [0.0, 0.0, 0.2]])
    # omega, tau per row: (0.1, 1.03) in; (1.4, 0.98) omega out; (0.5, ...) out; (0.2, 0.04) out
    assert experiment.fraction_in_theorem_domain(w) == pytest.approx(0.25)


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


def test_dropped_value_gap_places_the_dropped_units_among_the_kept():
    x = selu.selu(randn(20_000, seed=13))
    assert experiment.dropped_value_gap(selu.alpha_dropout(x, 0.1, generator=gen(14))) < 0
    for drop_value in (0.0, LAMBDA_01 * ALPHA_01):
        y = experiment.null_dropout(x, 0.1, drop_value, gen(14))
        assert experiment.dropped_value_gap(y) > 0
    assert experiment.dropped_value_gap(torch.tensor([3.0, 1.0, 1.0, 2.0])) == -1.0
