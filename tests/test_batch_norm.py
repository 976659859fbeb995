"""Unit tests of papernotes.batch_norm, in float64 with fixed seeds.

The reference for the layer is torch.nn.BatchNorm1d / BatchNorm2d with the same hyper-parameters:
outputs, gradients and running statistics must agree in train and in eval mode. Algorithm 2's
population statistics are checked against a direct computation, and the training run against
the book's loop.
"""

import copy

import pytest
import torch
from torch import nn

import papernotes as pn
from conftest import gen, randn
from papernotes import batch_norm as bn_module
from papernotes.batch_norm import BatchNorm, Statistics, experiment, fold_into_linear

TOL = 1e-6


def batches(shape, n, seed=0):
    """n float64 batches with a per-feature offset and scale far from (0, 1)."""
    g = gen(seed)
    channels = shape[1]
    scale = torch.linspace(0.5, 4.0, channels, dtype=torch.float64)
    offset = torch.linspace(-3.0, 2.0, channels, dtype=torch.float64)
    view = (1, channels) + (1,) * (len(shape) - 2)
    return [
        torch.randn(shape, generator=g, dtype=torch.float64) * scale.view(view) + offset.view(view)
        for _ in range(n)
    ]


def reference_for(shape, eps, momentum):
    cls = nn.BatchNorm1d if len(shape) == 2 else nn.BatchNorm2d
    return cls(shape[1], eps=eps, momentum=momentum).double()


def randomise_affine(ours, theirs, seed=1):
    """Give both layers the same non-trivial gamma and beta, so that a swap would show."""
    g = gen(seed)
    gamma = torch.rand(ours.num_features, generator=g, dtype=torch.float64) * 2 + 0.5
    beta = torch.randn(ours.num_features, generator=g, dtype=torch.float64)
    with torch.no_grad():
        ours.gamma.copy_(gamma)
        ours.beta.copy_(beta)
        theirs.weight.copy_(gamma)
        theirs.bias.copy_(beta)


SHAPES = [(16, 5), (8, 3, 4, 5), (1, 3, 3, 3)]
HYPER = [(1e-5, 0.1), (0.5, 0.3)]  # a large eps shows where eps goes; a large momentum, its role


# -- agreement with torch.nn.BatchNorm1d / BatchNorm2d ---------------------------------------------


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize(("eps", "momentum"), HYPER, ids=str)
def test_train_mode_agrees_with_torch_outputs_and_running_statistics(shape, eps, momentum):
    ours = BatchNorm(shape[1], eps=eps, momentum=momentum).double()
    theirs = reference_for(shape, eps, momentum)
    randomise_affine(ours, theirs)
    for x in batches(shape, 4):
        assert torch.allclose(ours(x), theirs(x), rtol=0, atol=TOL)
        assert torch.allclose(ours.running_mean, theirs.running_mean, rtol=0, atol=TOL)
        assert torch.allclose(ours.running_var, theirs.running_var, rtol=0, atol=TOL)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize(("eps", "momentum"), HYPER, ids=str)
def test_eval_mode_agrees_with_torch_after_training_steps(shape, eps, momentum):
    ours = BatchNorm(shape[1], eps=eps, momentum=momentum).double()
    theirs = reference_for(shape, eps, momentum)
    randomise_affine(ours, theirs)
    for x in batches(shape, 5):
        ours(x), theirs(x)
    ours.eval(), theirs.eval()
    (test,) = batches((7, *shape[1:]), 1, seed=9)
    assert torch.allclose(ours(test), theirs(test), rtol=0, atol=TOL)
    # Eval mode reads the statistics, never updates them.
    before = ours.running_mean.clone(), ours.running_var.clone()
    ours(test)
    assert torch.equal(ours.running_mean, before[0]) and torch.equal(ours.running_var, before[1])


@pytest.mark.parametrize("shape", [(16, 5), (8, 3, 4, 5)], ids=str)
def test_gradients_agree_with_torch(shape):
    # Backpropagation goes through the batch mean and variance too (the paper's Section 3).
    ours = BatchNorm(shape[1]).double()
    theirs = reference_for(shape, 1e-5, 0.1)
    randomise_affine(ours, theirs)
    (x,) = batches(shape, 1)
    (upstream,) = batches(shape, 1, seed=5)
    x_ours, x_theirs = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    (ours(x_ours) * upstream).sum().backward()
    (theirs(x_theirs) * upstream).sum().backward()
    assert torch.allclose(x_ours.grad, x_theirs.grad, rtol=0, atol=TOL)
    assert torch.allclose(ours.gamma.grad, theirs.weight.grad, rtol=0, atol=TOL)
    assert torch.allclose(ours.beta.grad, theirs.bias.grad, rtol=0, atol=TOL)


# -- the paper's definitions, checked directly -----------------------------------------------------


def test_a_fresh_layer_has_gamma_one_beta_zero_and_neutral_running_statistics():
    layer = BatchNorm(4)
    assert torch.equal(layer.gamma, torch.ones(4)) and torch.equal(layer.beta, torch.zeros(4))
    assert torch.equal(layer.running_mean, torch.zeros(4))
    assert torch.equal(layer.running_var, torch.ones(4))
    assert {name for name, _ in layer.named_parameters()} == {"gamma", "beta"}


def test_train_mode_normalises_with_the_biased_batch_variance():
    (x,) = batches((10, 3), 1)
    layer = BatchNorm(3, eps=1e-12).double()
    y = layer(x)
    # Zero mean and, with the biased variance (divide by m), exactly unit variance per feature.
    assert torch.allclose(y.mean(0), torch.zeros(3, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(y.var(0, correction=0), torch.ones(3, dtype=torch.float64), atol=1e-9)
    expected = (x - x.mean(0)) / torch.sqrt(x.var(0, correction=0) + 1e-12)
    assert torch.allclose(y, expected, atol=1e-12)


def test_running_variance_is_unbiased_and_momentum_weighs_the_new_batch():
    xs = batches((6, 2), 2)
    layer = BatchNorm(2, momentum=0.25).double()
    for x in xs:
        layer(x)
    mean, var = torch.zeros(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64)
    for x in xs:  # r <- (1 - momentum) r + momentum * batch value, variance with m / (m - 1)
        mean = 0.75 * mean + 0.25 * x.mean(0)
        var = 0.75 * var + 0.25 * x.var(0, correction=1)
    assert torch.allclose(layer.running_mean, mean, atol=1e-12)
    assert torch.allclose(layer.running_var, var, atol=1e-12)


def test_convolutional_statistics_pool_the_batch_and_every_pixel():
    (x,) = batches((4, 3, 5, 2), 1)
    layer = BatchNorm(3, momentum=1.0).double()
    y = layer(x)
    per_channel = x.transpose(0, 1).reshape(3, -1)  # (C, N*H*W)
    assert torch.allclose(layer.running_mean, per_channel.mean(1), atol=1e-12)
    assert torch.allclose(layer.running_var, per_channel.var(1, correction=1), atol=1e-12)
    assert torch.allclose(y.mean((0, 2, 3)), torch.zeros(3, dtype=torch.float64), atol=1e-12)


def test_eval_mode_is_the_formula_with_running_statistics_and_ignores_the_batch():
    layer = BatchNorm(3, eps=1e-3).double()
    for x in batches((12, 3), 3):
        layer(x)
    with torch.no_grad():
        layer.gamma.copy_(torch.tensor([0.5, 2.0, -1.0]))
        layer.beta.copy_(torch.tensor([1.0, 0.0, 3.0]))
    layer.eval()
    (x,) = batches((9, 3), 1, seed=4)
    expected = (x - layer.running_mean) / torch.sqrt(layer.running_var + 1e-3) * layer.gamma
    expected = expected + layer.beta
    assert torch.allclose(layer(x), expected, rtol=0, atol=1e-12)
    # One example at a time gives the same predictions as the whole batch.
    one_by_one = torch.cat([layer(x[i : i + 1]) for i in range(len(x))])
    assert torch.allclose(one_by_one, layer(x), rtol=0, atol=1e-12)


def test_gamma_and_beta_can_undo_the_normalisation():
    (x,) = batches((20, 4), 1)
    layer = BatchNorm(4, eps=1e-12).double()
    with torch.no_grad():
        layer.gamma.copy_(x.var(0, correction=0).sqrt())
        layer.beta.copy_(x.mean(0))
    assert torch.allclose(layer(x), x, atol=1e-9)


# -- folding BN into the linear layer before it ----------------------------------------------------


def trained_pair(bias=True, seed=0):
    torch.manual_seed(seed)
    linear = nn.Linear(6, 4, bias=bias).double()
    bn = BatchNorm(4, eps=1e-2).double()
    with torch.no_grad():
        bn.gamma.uniform_(0.5, 2.0)
        bn.beta.normal_()
    for x in batches((16, 6), 3, seed=seed):
        bn(linear(x))
    return linear, bn.eval()


@pytest.mark.parametrize("bias", [True, False])
def test_folded_linear_equals_bn_after_linear_in_eval_mode(bias):
    linear, bn = trained_pair(bias)
    folded = fold_into_linear(linear, bn)
    assert isinstance(folded, nn.Linear) and folded.bias is not None
    (x,) = batches((11, 6), 1, seed=3)
    with torch.no_grad():
        assert torch.allclose(folded(x), bn(linear(x)), rtol=0, atol=1e-10)


def test_folded_linear_is_a_copy():
    linear, bn = trained_pair()
    folded = fold_into_linear(linear, bn)
    weight = folded.weight.detach().clone()
    with torch.no_grad():
        linear.weight.add_(1.0)
        bn.gamma.mul_(3.0)
    assert torch.equal(folded.weight, weight)


def test_folding_uses_the_running_statistics_not_a_batch():
    linear, bn = trained_pair()
    folded = fold_into_linear(linear, bn)
    (x,) = batches((11, 6), 1, seed=3)
    with torch.no_grad():
        train_mode = copy.deepcopy(bn).train()(linear(x))
        assert (folded(x) - train_mode).abs().max() > 1e-3


# -- Algorithm 1's helpers, which the BN-LSTM reuses -----------------------------------------------


def test_batch_statistics_and_normalize_are_algorithm_1_on_2d_input():
    x = randn(12, 4, seed=2, scale=3.0, shift=1.5)
    mean, variance = bn_module.batch_statistics(x)
    assert mean.shape == variance.shape == (4,)
    assert torch.allclose(mean, x.mean(0), atol=1e-12)
    assert torch.allclose(variance, x.var(0, correction=0), atol=1e-12)  # biased: divide by m
    x_hat = bn_module.normalize(x, mean, variance, 1e-5)
    assert torch.allclose(x_hat, (x - x.mean(0)) / torch.sqrt(x.var(0, correction=0) + 1e-5))
    assert torch.allclose(bn_module.unbiased(variance, 12), x.var(0, correction=1), atol=1e-12)


# -- the paper's MNIST network ---------------------------------------------------------------------


def test_the_mnist_network_has_the_papers_shape_and_bn_replaces_the_bias():
    with_bn, without = experiment.MNISTNet(batch_norm=True), experiment.MNISTNet(batch_norm=False)
    for net in (with_bn, without):
        assert [(lin.in_features, lin.out_features) for lin in net.linears] == [
            (64, 100),
            (100, 100),
            (100, 100),
        ]
        assert (net.readout.in_features, net.readout.out_features) == (100, 10)
        assert isinstance(net.act, nn.Sigmoid)
    assert all(lin.bias is None for lin in with_bn.linears) and len(with_bn.norms) == 3
    assert all(lin.bias is not None for lin in without.linears) and len(without.norms) == 0


def test_networks_of_one_seed_start_from_the_same_weights_with_and_without_bn():
    nets = {}
    for use_bn in (True, False):
        with pn.seeded(3):
            nets[use_bn] = experiment.MNISTNet(batch_norm=use_bn, activation="relu")
    for a, b in zip(
        [*nets[True].linears, nets[True].readout],
        [*nets[False].linears, nets[False].readout],
        strict=True,
    ):
        assert torch.equal(a.weight, b.weight)
    with pn.seeded(4):
        other = experiment.MNISTNet(batch_norm=True)
    assert not torch.equal(other.linears[0].weight, nets[True].linears[0].weight)


def test_nonlinearity_inputs_are_bn_of_wu_and_feed_the_forward_pass():
    with pn.seeded(0):
        net = experiment.MNISTNet(batch_norm=True, activation="relu").double()
    x = randn(30, 64)
    inputs = net.nonlinearity_inputs(x)
    assert [tuple(t.shape) for t in inputs] == [(30, 100)] * 3
    # In train mode each is normalised over the batch (gamma = 1, beta = 0 at the start).
    for t in inputs:
        assert torch.allclose(t.mean(0), torch.zeros(100, dtype=torch.float64), atol=1e-10)
    first = net.norms[0](net.linears[0](x))
    assert torch.allclose(inputs[0], first)
    assert torch.allclose(net(x), net.readout(torch.relu(net.nonlinearity_inputs(x)[-1])))


def test_weights_start_as_small_gaussians_and_biases_at_zero():
    with pn.seeded(0):
        net = experiment.MNISTNet(batch_norm=False, hidden=400, init_std=0.1)
    weight = net.linears[1].weight
    assert weight.mean().item() == pytest.approx(0.0, abs=0.002)
    assert weight.std().item() == pytest.approx(0.1, rel=0.01)
    assert torch.equal(net.linears[1].bias, torch.zeros(400))


def test_percentile_band_is_the_15th_50th_and_85th_percentile_per_unit():
    inputs = torch.arange(101.0).unsqueeze(1) * torch.tensor([1.0, -2.0])  # (101, 2)
    band = experiment.percentile_band(inputs)
    expected = torch.tensor([[15.0, -170.0], [50.0, -100.0], [85.0, -30.0]])
    assert torch.allclose(band, expected, atol=1e-4)


@pytest.fixture(scope="module")
def digits():
    return pn.load_digits_split()


def test_training_is_deterministic_per_seed_and_records_history_and_bands(digits):
    runs = [
        experiment.train_mnist_net(
            digits, 1.0, batch_norm=True, seed=s, steps=60, eval_every=20, band_every=20
        )
        for s in (0, 0, 1)
    ]
    history = runs[0].history
    assert isinstance(history, pn.History) and history.steps == [20, 40, 60]
    assert set(history.metrics) == {"loss", "val_accuracy", "test_accuracy"}
    assert history["test_accuracy"] == runs[1].history["test_accuracy"]
    assert torch.equal(runs[0].bands, runs[1].bands)
    assert history["loss"] != runs[2].history["loss"]  # another seed, other weights and batches
    assert runs[0].bands.shape == (3, 3, 100) and runs[0].band_steps == [20, 40, 60]
    last_only = experiment.train_mnist_net(digits, 1.0, batch_norm=True, seed=0, steps=60)
    assert last_only.band_steps == [60] and torch.allclose(last_only.bands[0], runs[0].bands[-1])
    with pytest.raises(ValueError, match="band_every"):
        experiment.train_mnist_net(
            digits, 1.0, batch_norm=True, seed=0, steps=60, eval_every=20, band_every=30
        )
    assert (runs[0].bands[:, 0] <= runs[0].bands[:, 1]).all()
    assert (runs[0].bands[:, 1] <= runs[0].bands[:, 2]).all()
    assert not history.diverged and not runs[0].model.training


def test_the_recorded_accuracy_and_band_are_the_eval_mode_networks(digits):
    run = experiment.train_mnist_net(digits, 1.0, batch_norm=True, seed=0, steps=30, eval_every=30)
    with pn.evaluating(run.model):
        inputs = run.model.nonlinearity_inputs(digits.test_x)
        accuracy = pn.accuracy(run.model.logits(inputs[-1]), digits.test_y)
        val_accuracy = pn.accuracy(run.model(digits.val_x), digits.val_y)
    assert run.history.final("test_accuracy") == accuracy
    assert run.history.final("val_accuracy") == val_accuracy
    assert torch.equal(run.bands[-1], experiment.percentile_band(inputs[-1]))


def test_a_bn_network_learns_the_digits(digits):
    run = experiment.train_mnist_net(
        digits, 3.0, batch_norm=True, seed=0, steps=200, eval_every=100
    )
    assert run.history.final("val_accuracy") > 0.85


def test_a_diverging_network_is_flagged_and_stops_while_the_others_carry_on(digits):
    settings = [experiment.Setting(1.0), experiment.Setting(1e38)]
    runs = experiment.train_mnist_nets(
        digits, settings, batch_norm=False, seed=0, steps=40, eval_every=20
    )
    assert runs[1].history.diverged and not runs[0].history.diverged
    assert runs[0].history.steps == runs[1].history.steps == [20, 40]
    assert all(torch.isfinite(p).all() for p in runs[0].model.parameters())
    alone = experiment.train_mnist_net(
        digits, 1.0, batch_norm=False, seed=0, steps=40, eval_every=20
    )
    assert runs[0].history["test_accuracy"] == pytest.approx(alone.history["test_accuracy"])


# -- the measurements behind the claims ------------------------------------------------------------


def test_band_drift_is_the_mean_range_of_the_three_percentiles():
    # Two units over three evaluations; unit 0 wanders, unit 1 stands still.
    band = torch.tensor(
        [
            [[0.0, 5.0], [1.0, 6.0], [2.0, 7.0]],
            [[-1.0, 5.0], [3.0, 6.0], [2.0, 7.0]],
            [[1.0, 5.0], [2.0, 6.0], [6.0, 7.0]],
        ]
    )  # (evals, percentiles, units)
    drift = experiment.band_drift(band)
    assert drift.tolist() == pytest.approx([(2.0 + 2.0 + 4.0) / 3, 0.0])


def trained_bn_net(digits, steps=40):
    return experiment.train_mnist_net(
        digits, 1.0, batch_norm=True, seed=0, steps=steps, eval_every=steps
    ).model


def test_population_statistics_are_algorithm_2_over_one_epoch(digits):
    net = trained_bn_net(digits)
    before = [bn.running_mean.clone() for bn in net.norms]
    population, per_batch = bn_module.population_statistics(net, digits.train_x, 60, seed=5)
    assert all(torch.equal(bn.running_mean, b) for bn, b in zip(net.norms, before, strict=True))
    assert len(population) == len(per_batch) == 3
    assert len(per_batch[0]) == len(digits.train_x) // 60 == 17
    # The first layer's input does not depend on the layers above it: check it directly, over
    # the same 17 batches (the generator's stream 2 of the seed).
    batches = pn.minibatches(len(digits.train_x), 60, pn.generator(5, stream=2))
    order = torch.cat([next(batches) for _ in range(17)])
    with torch.no_grad():
        x = net.linears[0](digits.train_x[order]).reshape(17, 60, 100)
    assert torch.allclose(population[0].mean, x.mean(1).mean(0), atol=1e-5)
    expected_var = x.var(1, correction=0).mean(0) * 60 / 59
    assert torch.allclose(population[0].variance, expected_var, rtol=1e-4)
    assert torch.allclose(per_batch[0][3].mean, x[3].mean(0), atol=1e-5)
    assert torch.allclose(per_batch[0][3].variance, x[3].var(0, correction=1), rtol=1e-4)


class ConvNet(nn.Module):
    """A convolution and a BN over its maps: population statistics pooled over the pixels."""

    def __init__(self):
        super().__init__()
        with pn.seeded(3):
            self.conv = nn.Conv2d(2, 3, 3, padding=1).double()
        self.norms = nn.ModuleList([BatchNorm(3).double()])

    def forward(self, x):
        return self.norms[0](self.conv(x))


def test_population_statistics_of_maps_are_unbiased_over_n_h_w_values():
    # Section 3.2: a channel's statistic of a batch of maps pools N * H * W values, so its
    # unbiased variance is m' / (m' - 1) sigma^2_B with m' = 4 * 5 * 6 = 120, not 4 / 3.
    net = ConvNet()
    x = torch.randn(24, 2, 5, 6, generator=gen(4), dtype=torch.float64)
    population, per_batch = bn_module.population_statistics(net, x, 4, seed=2)
    batches = pn.minibatches(len(x), 4, pn.generator(2, stream=2))
    order = torch.cat([next(batches) for _ in range(6)])
    with torch.no_grad():
        z = net.conv(x[order]).reshape(6, 4, 3, 5, 6).transpose(1, 2).reshape(6, 3, 120)
    assert torch.allclose(population[0].mean, z.mean(2).mean(0), atol=1e-12)
    assert torch.allclose(population[0].variance, z.var(2, correction=1).mean(0), atol=1e-12)
    assert torch.allclose(per_batch[0][2].variance, z[2].var(1, correction=1), atol=1e-12)
    # m' = N alone (the bug) would inflate the variance by (4/3) / (120/119), about 32%
    wrong = z.var(2, correction=0).mean(0) * 4 / 3
    assert not torch.allclose(population[0].variance, wrong, rtol=0.1)


def test_normalisation_error_is_the_rms_error_in_x_hat():
    population = Statistics(torch.tensor([0.0, 1.0]), torch.tensor([4.0, 1.0]))
    assert experiment.normalisation_error(population, population, 0.0) == 0.0
    # Feature 0: mean off by one sigma_e (= 2), sigma right; feature 1: sigma_e = 2 sigma_p.
    estimate = Statistics(torch.tensor([-2.0, 1.0]), torch.tensor([4.0, 4.0]))
    assert experiment.normalisation_error(estimate, population, 0.0) == pytest.approx(
        (1.0 + 0.5) / 2
    )
    # And it is the RMS difference of the two normalisations over samples of the population.
    z = torch.randn(200_000, generator=gen(1), dtype=torch.float64)
    x = 3.0 + 2.0 * z
    x_hat_e = (x - 2.0) / 2.5
    rms = (x_hat_e - z).square().mean().sqrt().item()
    one = Statistics(torch.tensor([2.0]), torch.tensor([6.25]))
    truth = Statistics(torch.tensor([3.0]), torch.tensor([4.0]))
    assert experiment.normalisation_error(one, truth, 0.0) == pytest.approx(rms, rel=0.01)


def test_with_statistics_swaps_the_buffers_of_a_copy(digits):
    net = trained_bn_net(digits)
    running = experiment.running_statistics(net)
    stats = [Statistics(torch.full((100,), 0.5), torch.full((100,), 2.0)) for _ in net.norms]
    swapped = experiment.with_statistics(net, stats)
    assert not swapped.training
    assert torch.equal(swapped.norms[1].running_var, torch.full((100,), 2.0))
    assert torch.equal(net.norms[1].running_var, running[1].variance)  # the original is untouched
    running[1].variance.add_(1.0)  # running_statistics hands out copies
    assert not torch.equal(net.norms[1].running_var, running[1].variance)


# -- bad input: one rejection test per entry point -------------------------------------------------


def test_the_layer_rejects_bad_hyper_parameters():
    with pytest.raises(ValueError, match="num_features"):
        BatchNorm(0)
    with pytest.raises(TypeError, match="num_features"):
        BatchNorm(2.5)
    with pytest.raises(ValueError, match="eps"):
        BatchNorm(3, eps=0.0)
    with pytest.raises(ValueError, match="momentum"):
        BatchNorm(3, momentum=1.5)


@pytest.mark.parametrize(
    ("x", "error", "message"),
    [
        (torch.zeros(4, 2), ValueError, r"\(N, C\) with C = 3"),
        (torch.zeros(4, 3, 2), ValueError, r"\(N, C\)"),
        (torch.zeros(4, 5, 2, 2), ValueError, r"\(N, C, H, W\) with C = 3"),
        (torch.zeros(4, 3, dtype=torch.long), TypeError, "float32"),
        (torch.zeros(4, 3, dtype=torch.float64), TypeError, "float32"),
        ([[0.0, 1.0, 2.0]], TypeError, "tensor"),
    ],
    ids=["features", "3-d", "channels", "long", "float64", "list"],
)
def test_the_layer_rejects_bad_input(x, error, message):
    with pytest.raises(error, match=message):
        BatchNorm(3)(x)


def test_one_value_per_feature_cannot_train_but_can_predict():
    layer = BatchNorm(3)
    with pytest.raises(ValueError, match="at least 2 values per feature"):
        layer(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="at least 2 values per feature"):
        layer(torch.zeros(1, 3, 1, 1))
    layer.eval()
    assert layer(torch.ones(1, 3)).shape == (1, 3)


def test_fold_into_linear_rejects_the_wrong_layers():
    linear, bn = trained_pair()
    with pytest.raises(TypeError, match="linear"):
        fold_into_linear(nn.Conv1d(6, 4, 1), bn)
    with pytest.raises(TypeError, match="bn"):
        fold_into_linear(linear, nn.BatchNorm1d(4))
    with pytest.raises(ValueError, match="4 outputs but bn normalises 5"):
        fold_into_linear(linear, BatchNorm(5).double())


def test_the_network_rejects_bad_settings():
    with pytest.raises(ValueError, match="activation"):
        experiment.MNISTNet(batch_norm=True, activation="tanh")
    with pytest.raises(TypeError, match="batch_norm"):
        experiment.MNISTNet(batch_norm=1)
    with pytest.raises(ValueError, match="hidden"):
        experiment.MNISTNet(batch_norm=True, hidden=0)


def test_train_mnist_net_rejects_bad_settings(digits):
    with pytest.raises(ValueError, match="lr"):
        experiment.train_mnist_net(digits, 0.0, batch_norm=True, seed=0)
    with pytest.raises(ValueError, match="eval_every"):
        experiment.train_mnist_net(digits, 1.0, batch_norm=True, seed=0, steps=10, eval_every=20)
    with pytest.raises(ValueError, match="seed"):
        experiment.train_mnist_net(digits, 1.0, batch_norm=True, seed=-1)
    with pytest.raises(TypeError):
        experiment.train_mnist_net(digits, 1.0, batch_norm=True)  # the seed is the chapter's


# -- the chapter's measurements --------------------------------------------------------------------


def test_saturated_fraction_counts_units_whose_whole_band_is_beyond_five():
    # Columns: saturated high, saturated low, straddling zero, reaching 5 but not beyond it.
    band = torch.tensor([[6.0, -9.0, -1.0, 4.0], [7.0, -8.0, 0.0, 5.0], [8.0, -6.0, 1.0, 6.0]])
    assert experiment.saturated_fraction(band) == pytest.approx(0.5)
    assert experiment.saturated_fraction(torch.zeros(3, 4)) == 0.0


def test_largest_affine_reads_the_last_bn_layer():
    net = experiment.MNISTNet(batch_norm=True)
    assert experiment.largest_affine(net) == 1.0  # gamma starts at 1, beta at 0
    with torch.no_grad():
        net.norms[-1].beta[3] = -7.0
        net.norms[0].gamma[0] = 50.0  # not the last layer: not counted
    assert experiment.largest_affine(net) == 7.0


def test_predictions_in_batches_match_one_pass_in_eval_mode_and_not_in_train_mode():
    with pn.seeded(0):
        net = experiment.MNISTNet(batch_norm=True).double()
    x = randn(40, 64)
    net.train()
    for _ in range(20):  # move the running statistics away from (0, 1)
        net(randn(40, 64) + 1.0)
    net.eval()
    whole = experiment.predictions(net, x)
    assert torch.equal(whole, net(x).argmax(-1))
    assert torch.equal(experiment.predictions(net, x, 1), whole)
    copy_in_train_mode = experiment.batch_statistics_model(net)
    assert copy_in_train_mode.training and not net.training
    assert copy_in_train_mode is not net
    # Normalised with each batch's own statistics, the logits depend on the batch.
    with torch.no_grad():
        alone = torch.cat([copy_in_train_mode(x[i : i + 2]) for i in range(0, 40, 2)])
        together = copy_in_train_mode(x)
    assert not torch.allclose(alone, together)


def test_affine_and_readout_rates_step_gamma_beta_and_the_readout_apart(digits):
    def run(use_bn=True, **options):
        return experiment.train_mnist_net(
            digits, 3.0, batch_norm=use_bn, seed=0, steps=5, eval_every=5, **options
        ).model

    with pn.seeded(0):
        start = experiment.MNISTNet(batch_norm=True)
    default, same = run(), run(affine_lr=3.0, readout_lr=3.0)
    for a, b in zip(default.parameters(), same.parameters(), strict=True):
        assert torch.equal(a, b)  # the same rate by either name: the same updates
    frozen_affine, frozen_readout = run(affine_lr=1e-12), run(readout_lr=1e-12)
    for net in (default, frozen_affine, frozen_readout):  # W in front of BN steps at lr
        assert not torch.allclose(net.linears[1].weight, start.linears[1].weight, atol=1e-3)
    for name in ("gamma", "beta"):
        assert torch.allclose(getattr(frozen_affine.norms[2], name), getattr(start.norms[2], name))
        assert not torch.allclose(getattr(default.norms[2], name), getattr(start.norms[2], name))
        moved = getattr(frozen_readout.norms[2], name)
        assert not torch.allclose(moved, getattr(start.norms[2], name))
    assert torch.allclose(frozen_readout.readout.weight, start.readout.weight)
    assert not torch.allclose(frozen_affine.readout.weight, start.readout.weight)
    assert not torch.allclose(default.readout.weight, start.readout.weight)
    # Without BN the hidden weights and biases step at lr, only the read-out at readout_lr.
    with pn.seeded(0):
        plain_start = experiment.MNISTNet(batch_norm=False)
    plain = run(use_bn=False, readout_lr=1e-12)
    assert torch.allclose(plain.readout.weight, plain_start.readout.weight)
    assert not torch.allclose(plain.linears[2].bias, plain_start.linears[2].bias, atol=1e-4)
    for name in ("affine_lr", "readout_lr"):
        with pytest.raises(ValueError, match=name):
            experiment.train_mnist_net(digits, 1.0, batch_norm=True, seed=0, steps=5, **{name: 0.0})


def trained_alone(digits, setting, *, use_bn, seed, steps):
    """The reference: one MNISTNet, torch's SGD and the book's loop, no side-by-side code."""
    with pn.seeded(seed):
        model = experiment.MNISTNet(batch_norm=use_bn, init_std=setting.init_std)
    affine = setting.lr if setting.affine_lr is None else setting.affine_lr
    readout = setting.lr if setting.readout_lr is None else setting.readout_lr
    groups = [
        {"params": list(model.linears.parameters()), "lr": setting.lr},
        {"params": list(model.norms.parameters()), "lr": affine},
        {"params": list(model.readout.parameters()), "lr": readout},
    ]
    batches = pn.minibatches(len(digits.train_x), 60, pn.generator(seed, experiment.BATCHES))
    pn.training.train_classifier(
        model,
        digits.train_y,
        torch.optim.SGD(groups, lr=setting.lr),
        steps,
        batches=batches,
        logits_of=lambda index: model(digits.train_x[index]),
        clip=setting.clip,
    )
    return model.eval()


def test_networks_side_by_side_make_the_updates_each_makes_alone(digits):
    settings = [
        experiment.Setting(1.0),
        experiment.Setting(3.0, init_std=0.5),
        experiment.Setting(10.0, affine_lr=0.5, readout_lr=0.5),
        experiment.Setting(3.0, readout_lr=0.5, clip=0.5),
    ]
    for use_bn in (True, False):
        # 12 updates: float rounding differs between a batched product and nn.Linear, and
        # some of these runs amplify it (by about 10x every 5 updates)
        together = experiment.train_mnist_nets(
            digits, settings, batch_norm=use_bn, seed=2, steps=12, eval_every=4, band_every=8
        )
        for setting, run in zip(settings, together, strict=True):
            alone = trained_alone(digits, setting, use_bn=use_bn, seed=2, steps=12)
            ours, theirs = run.model.state_dict(), alone.state_dict()
            assert ours.keys() == theirs.keys()
            for name in ours:
                assert torch.allclose(ours[name], theirs[name], atol=1e-4, rtol=1e-4), name
            with torch.no_grad():
                inputs = alone.nonlinearity_inputs(digits.test_x)
            assert run.band_steps == [8, 12]
            band = experiment.percentile_band(inputs[-1])
            assert torch.allclose(run.bands[-1], band, atol=1e-3, rtol=1e-3)
            accuracy = pn.accuracy(alone(digits.test_x), digits.test_y)
            assert run.history.final("test_accuracy") == pytest.approx(accuracy, abs=1 / 450)
            assert not run.model.training and isinstance(run.model, experiment.MNISTNet)


def test_a_member_starts_from_the_seeds_mnistnet_draw_times_its_scale():
    with pn.seeded(4):
        nets = experiment.MNISTNets(
            [experiment.Setting(1.0), experiment.Setting(1.0, init_std=0.3)],
            batch_norm=True,
            n_inputs=64,
        )
    with pn.seeded(4):
        reference = experiment.MNISTNet(batch_norm=True)
    for k, scale in ((0, 1.0), (1, 3.0)):
        member = nets.member(k)
        for a, b in zip(member.linears, reference.linears, strict=True):
            assert torch.allclose(a.weight, b.weight * scale)
    with pytest.raises(ValueError, match="standardised"):
        experiment.train_mnist_nets(
            pn.load_digits_split(),
            [experiment.Setting(1.0, standardised=True)],
            batch_norm=True,
            seed=0,
        )
    with pytest.raises(TypeError, match="Setting"):
        experiment.train_mnist_nets(pn.load_digits_split(), [1.0], batch_norm=True, seed=0)


def test_a_standardised_start_gives_every_sigmoid_input_mean_0_and_variance_1(digits):
    settings = [experiment.Setting(1.0, standardised=True), experiment.Setting(1.0)]
    with pn.seeded(1):
        nets = experiment.MNISTNets(settings, batch_norm=False, n_inputs=64)
    before = [w.detach().clone() for w in nets.weights]
    experiment.standardise_start(nets, digits.train_x, [True, False])
    with torch.no_grad():
        inputs = nets.nonlinearity_inputs(digits.train_x)
    for z in inputs:  # (members, N, hidden)
        assert torch.allclose(z[0].mean(0), torch.zeros(100), atol=1e-4)
        assert torch.allclose(z[0].std(0, correction=0), torch.ones(100), atol=1e-4)
        assert z[1].std(0).mean() < 0.5  # the other member keeps its small Gaussian start
    for w, b in zip(nets.weights, before, strict=True):
        assert torch.equal(w[1], b[1])
    assert torch.equal(nets.weights[-1], before[-1])  # the read-out is not rescaled


def test_steps_to_chosen_and_paired_difference():
    history = pn.History()
    for step, accuracy in [(10, 0.2), (20, 0.6), (30, 0.5)]:
        history.log(step, {"test_accuracy": accuracy})
    run = experiment.Run(None, history, torch.empty(0), [], torch.empty(0))
    assert experiment.steps_to(run, 0.55, 99) == 20
    assert experiment.steps_to(run, 0.7, 99) == 99
    assert experiment.chosen({0.1: 0.5, 0.3: 0.7, 1.0: 0.7}) == 0.3  # of equals, the first
    with pytest.raises(ValueError, match="no scores"):
        experiment.chosen({})
    a, b = torch.tensor([1.0, 1.0, 0.0, 1.0]), torch.tensor([0.0, 1.0, 0.0, 0.0])
    mean, se = experiment.paired_difference(a, b)
    assert mean == pytest.approx(0.5)
    assert se == pytest.approx(torch.tensor([1.0, 0.0, 0.0, 1.0]).std().item() / 2)
    with pytest.raises(ValueError, match="b"):
        experiment.paired_difference(a, b[:3])


def test_mode_gap_is_eval_minus_train_mode_accuracy_paired_over_images():
    with pn.seeded(0):
        plain = experiment.MNISTNet(batch_norm=False).double().eval()
        net = experiment.MNISTNet(batch_norm=True).double()
    x, y = randn(40, 64), torch.arange(40) % 10
    assert experiment.mode_gap(plain, x, y, 4) == (0.0, 0.0)  # no BN: the two modes agree
    net.train()
    for _ in range(20):
        net(randn(40, 64) + 1.0)
    net.eval()
    gap, se = experiment.mode_gap(net, x, y, 2)
    eval_correct = (experiment.predictions(net, x) == y).double()
    train_correct = (
        experiment.predictions(experiment.batch_statistics_model(net), x, 2) == y
    ).double()
    difference = eval_correct - train_correct
    assert gap == pytest.approx(difference.mean().item())
    assert se == pytest.approx(difference.std().item() / 40**0.5) and se > 0
    assert not net.training  # measured in train mode on a copy
    with pytest.raises(ValueError, match="batch_size"):
        experiment.mode_gap(net, x, y, 1)


# -- Section 3.3: scale invariance, and the brake the chapter measures


def test_bn_of_wu_ignores_the_scale_of_w_and_its_gradient_shrinks_as_one_over_a():
    # BN((aW)u) = BN(Wu) and dBN((aW)u)/d(aW) = (1/a) dBN(Wu)/dW (Section 3.3), with the gradient
    # through mu_B and sigma^2_B; each row's gradient is orthogonal to the row, so a step makes
    # ||w_j|| grow: the brake section 1 of the chapter measures.
    u = randn(32, 6, seed=3, scale=2.0, shift=0.5)
    upstream = randn(32, 4, seed=4)
    weight = randn(4, 6, seed=5)
    outputs, grads = [], []
    for a in (1.0, 7.0):
        layer = BatchNorm(4, eps=1e-12).double()
        w = (a * weight).requires_grad_(True)
        y = layer(u @ w.T)
        (y * upstream).sum().backward()
        outputs.append(y.detach())
        grads.append(w.grad)
    assert torch.allclose(outputs[0], outputs[1], atol=1e-9)
    assert torch.allclose(grads[1], grads[0] / 7.0, atol=1e-9)
    assert torch.allclose(
        (grads[0] * weight).sum(1), torch.zeros(4, dtype=torch.float64), atol=1e-9
    )
    # Without the gradient through the batch statistics the step is not orthogonal to w.
    x = u @ weight.T
    w = weight.clone().requires_grad_(True)
    z = u @ w.T
    mean, var = x.mean(0), x.var(0, correction=0)
    ((z - mean) / torch.sqrt(var + 1e-12) * upstream).sum().backward()
    assert (w.grad * weight).sum(1).abs().max() > 1e-3


def test_weight_norms_are_the_row_norms_of_each_hidden_layer_at_every_evaluation(digits):
    settings = [experiment.Setting(1.0), experiment.Setting(30.0)]
    runs = experiment.train_mnist_nets(
        digits, settings, batch_norm=True, seed=0, steps=40, eval_every=20
    )
    for run in runs:
        assert run.weight_norms.shape == (2, 3, 100)
        final = torch.stack([lin.weight.norm(dim=1) for lin in run.model.linears])
        assert torch.allclose(run.weight_norms[-1], final, rtol=1e-5)
    # the larger rate grows the norms faster (Section 3.3's brake)
    assert runs[1].weight_norms[-1].median() > 2 * runs[0].weight_norms[-1].median()


def test_percentile_band_of_members_is_each_members_band():
    inputs = torch.randn(50, 3, 7, generator=gen(2))  # (N, members, units)
    bands = experiment.percentile_band(inputs)
    assert bands.shape == (3, 3, 7)
    for k in range(3):
        assert torch.allclose(bands[:, k], experiment.percentile_band(inputs[:, k]))


# -- the weight-normalised null


def weight_normed(settings, seed=0, hidden=100):
    with pn.seeded(seed):
        return experiment.WeightNormNets(settings, n_inputs=64, hidden=hidden)


def test_weight_norm_is_g_v_over_the_norm_of_v_and_starts_as_the_plain_network():
    settings = [experiment.Setting(1.0), experiment.Setting(1.0, init_std=0.5)]
    nets = weight_normed(settings)
    with pn.seeded(0):
        plain = experiment.MNISTNets(settings, batch_norm=False, n_inputs=64)
    x = randn(20, 64).float()
    for i in range(3):
        v, g = nets.weights[i], nets.gains[i]
        # w_j = g_j v_j / ||v_j||, written out row by row
        expected = torch.stack(
            [
                torch.stack([g[k, j] * v[k, j] / v[k, j].norm() for j in range(100)])
                for k in range(2)
            ]
        )
        assert torch.allclose(nets.effective_weight(i), expected, atol=1e-6)
    with torch.no_grad():
        assert torch.allclose(nets(x), plain(x), atol=1e-5)  # g = ||v|| at the start
        for v in nets.weights[:3]:
            v.mul_(3.0)  # the scale of v does not reach the output
        assert torch.allclose(nets(x), plain(x), atol=1e-5)
        member = nets.member(1)
        assert isinstance(member, experiment.MNISTNet) and not member.norms
        assert torch.allclose(member(x), nets(x)[1], atol=1e-5)


def test_weight_norms_standardised_start_sets_g_and_b_and_steps_them_at_affine_lr(digits):
    settings = [experiment.Setting(1.0, standardised=True), experiment.Setting(1.0)]
    nets = weight_normed(settings, seed=1)
    v_before = [v.detach().clone() for v in nets.weights]
    experiment.standardise_start(nets, digits.train_x, [True, False])
    with torch.no_grad():
        inputs = nets.nonlinearity_inputs(digits.train_x)
    for z in inputs:
        assert torch.allclose(z[0].mean(0), torch.zeros(100), atol=1e-4)
        assert torch.allclose(z[0].std(0, correction=0), torch.ones(100), atol=1e-4)
    for v, before in zip(nets.weights, v_before, strict=True):
        assert torch.equal(v, before)  # Salimans & Kingma's start moves g and b, not v
    runs = experiment.train_mnist_nets(
        digits,
        [experiment.Setting(1.0, standardised=True, affine_lr=1e-12)],
        batch_norm=False,
        weight_norm=True,
        seed=1,
        steps=5,
        eval_every=5,
    )
    start = weight_normed([experiment.Setting(1.0, standardised=True)], seed=1)
    experiment.standardise_start(start, digits.train_x, [True])
    trained = runs[0].model
    # g and b frozen: each hidden row of the trained w keeps its norm g, its direction moves
    for i, linear in enumerate(trained.linears):
        assert torch.allclose(linear.weight.norm(dim=1), start.gains[i][0], rtol=1e-4)
        assert torch.allclose(linear.bias, start.biases[i][0], atol=1e-6)
        assert not torch.allclose(linear.weight, start.effective_weight(i)[0], atol=1e-4)


def test_train_mnist_nets_rejects_bad_kinds_and_settings(digits):
    with pytest.raises(ValueError, match="batch_norm or weight_norm"):
        experiment.train_mnist_nets(
            digits, [experiment.Setting(1.0)], batch_norm=True, weight_norm=True, seed=0
        )
    for bad, name in [
        (experiment.Setting(1.0, clip=0.0), "clip"),
        (experiment.Setting(1.0, readout_lr=-1.0), "readout_lr"),
    ]:
        with pytest.raises(ValueError, match=name):
            experiment.train_mnist_nets(digits, [bad], batch_norm=False, seed=0)
    with pytest.raises(ValueError, match="hidden"):
        experiment.train_mnist_nets(
            digits, [experiment.Setting(1.0)], batch_norm=False, seed=0, hidden=0
        )


# -- what the mutation survivors changed, pinned (tests/mutation/batch_norm.yml) ------------------


def test_the_network_refuses_each_count_below_one_naming_it():
    for name in ("n_inputs", "hidden", "n_layers", "n_classes"):
        with pytest.raises(ValueError, match=f"{name} must be an integer"):
            experiment.MNISTNet(batch_norm=True, **{name: 0})


def test_side_by_side_training_refuses_each_count_below_one_naming_it(digits):
    for name in ("steps", "eval_every", "n_layers", "hidden"):
        counts = {"steps": 2, "eval_every": 1, name: 0}
        with pytest.raises(ValueError, match=f"{name} must be an integer"):
            experiment.train_mnist_nets(
                digits, [experiment.Setting(1.0)], batch_norm=True, seed=0, **counts
            )


def test_a_member_of_any_shape_is_handed_back_as_the_network_it_is():
    settings = [experiment.Setting(1.0), experiment.Setting(1.0, init_std=0.5)]
    x = torch.randn(6, 5, generator=gen(4))
    shape = {"n_inputs": 5, "n_layers": 2, "hidden": 7}
    for kind in ("BN", "no BN", "weight norm"):
        with pn.seeded(3):
            if kind == "weight norm":
                nets = experiment.WeightNormNets(settings, **shape)
                assert len(nets.gains) == 2 and nets.gains[0].shape == (2, 7)
            else:
                nets = experiment.MNISTNets(settings, batch_norm=kind == "BN", **shape)
        assert [w.shape for w in nets.weights] == [(2, 7, 5), (2, 7, 7), (2, 10, 7)]
        nets.train()
        nets(torch.randn(9, 5, generator=gen(5)))  # running statistics away from (0, 1)
        nets.eval()
        with torch.no_grad():
            together = nets(x)
            for k in range(2):
                member = nets.member(k)
                assert len(member.linears) == 2 and member.readout.in_features == 7
                assert torch.allclose(member(x), together[k], atol=1e-6), (kind, k)


def small_nets(settings):
    with pn.seeded(0):
        return experiment.MNISTNets(settings, batch_norm=False, n_inputs=3, n_layers=1, hidden=2)


def step_with_gradient(nets, gradient_of):
    """One MemberSGD step of every member alive from parameters at zero (so that a move is
    exact in float32), each parameter's gradient `gradient_of(p)`; returns each one's move."""
    with torch.no_grad():
        for p in nets.parameters():
            p.zero_()
            p.grad = gradient_of(p)
    experiment.MemberSGD(nets, torch.ones(len(nets.settings), dtype=torch.bool)).step()
    return [p.detach() for p in nets.parameters()]


def test_member_sgd_steps_minus_rate_times_gradient_clipped_to_each_members_clip():
    # Plain SGD: -lr * g, whatever the size of g (here its square overflows float32) ...
    nets = small_nets([experiment.Setting(0.5), experiment.Setting(0.25)])
    moves = step_with_gradient(nets, lambda p: torch.full_like(p, 1e20))
    for move in moves:
        assert torch.equal(move[0], torch.full_like(move[0], -0.5e20))
        assert torch.equal(move[1], torch.full_like(move[1], -0.25e20))
    # ... a gradient below the clip is left as it is, however small ...
    nets = small_nets([experiment.Setting(0.5, clip=1.0)])
    entries = sum(p.numel() for p in nets.parameters())
    tiny = 5e-7 / entries**0.5  # ||g|| = 5e-7, below the 1e-6 guarding the division
    moves = step_with_gradient(nets, lambda p: torch.full_like(p, tiny))
    for move in moves:
        assert torch.allclose(move, torch.full_like(move, -0.5 * tiny), rtol=1e-5, atol=0)
    # ... and one above it is scaled to norm clip, when every member is clipped
    nets = small_nets([experiment.Setting(0.5, clip=2.0), experiment.Setting(0.5, clip=4.0)])
    moves = step_with_gradient(nets, lambda p: torch.ones_like(p))
    for k, clip in enumerate((2.0, 4.0)):
        norm = sum(move[k].square().sum() for move in moves).sqrt().item()
        assert norm == pytest.approx(0.5 * clip, rel=1e-5)


def test_a_run_whose_every_network_has_diverged_stops(digits):
    # The read-out's rate is absurd: the second update's logits overflow and the network dies.
    # From then on nothing moves, not even BN's running statistics: 3 or 6 updates, one net.
    def run(steps):
        (r,) = experiment.train_mnist_nets(
            digits,
            [experiment.Setting(1.0, readout_lr=1e37)],
            batch_norm=True,
            seed=0,
            steps=steps,
            eval_every=1,
        )
        return r

    short, longer = run(3), run(6)
    assert short.history.diverged and longer.history.diverged
    for a, b in zip(short.model.norms, longer.model.norms, strict=True):
        assert torch.isfinite(a.running_mean).all()
        assert torch.equal(a.running_mean, b.running_mean)
        assert torch.equal(a.running_var, b.running_var)


def test_normalisation_error_adds_eps_to_both_variances():
    # sigma = sqrt(Var + eps): with eps = 1, sigma_e = sqrt(3 + 1) = 2 and sigma_p = sqrt(0 + 1)
    # = 1, so shift = (0 - 1) / 2 and stretch = 1 / 2 - 1: sqrt(0.25 + 0.25).
    estimate = Statistics(torch.tensor([1.0]), torch.tensor([3.0]))
    population = Statistics(torch.tensor([0.0]), torch.tensor([0.0]))
    assert experiment.normalisation_error(estimate, population, 1.0) == pytest.approx(0.5**0.5)


def test_percentile_band_keeps_the_inputs_precision():
    inputs = torch.arange(101, dtype=torch.float64).unsqueeze(1) / 3
    band = experiment.percentile_band(inputs)
    assert band.dtype == torch.float64
    assert torch.allclose(band[:, 0], torch.tensor([15.0, 50.0, 85.0], dtype=torch.float64) / 3)


def test_predictions_of_side_by_side_networks_are_each_members_classes():
    nets = small_nets([experiment.Setting(1.0), experiment.Setting(1.0, init_std=2.0)])
    x = torch.randn(5, 3, generator=gen(6))
    predicted = experiment.predictions(nets, x)
    assert predicted.shape == (2, 5)
    with torch.no_grad():
        assert torch.equal(predicted, nets(x).argmax(2))


def test_running_statistics_are_copies_of_each_layers_buffers():
    with pn.seeded(0):
        net = experiment.MNISTNet(batch_norm=True, n_inputs=4, hidden=3, n_layers=2)
    net(torch.randn(8, 4, generator=gen(7)))  # train mode: the buffers move
    running = experiment.running_statistics(net)
    assert len(running) == 2
    for stats, bn in zip(running, net.norms, strict=True):
        assert torch.equal(stats.mean, bn.running_mean) and stats.mean is not bn.running_mean
        assert torch.equal(stats.variance, bn.running_var)
        assert not torch.equal(stats.mean, torch.zeros(3))


def test_with_statistics_refuses_a_list_of_another_length():
    with pn.seeded(0):
        net = experiment.MNISTNet(batch_norm=True, n_inputs=4, hidden=3, n_layers=2)
    one = Statistics(torch.zeros(3), torch.ones(3))
    with pytest.raises(ValueError, match="zip"):
        experiment.with_statistics(net, [one])
    with pytest.raises(ValueError, match="zip"):
        experiment.with_statistics(net, [one] * 3)


def test_member_sgd_steps_each_parameter_at_its_members_own_rate():
    # A gradient of ones moves each entry by -its rate: hidden weights at lr; gamma and beta
    # (weight norm's g and hidden biases) at affine_lr, a plain network's hidden biases at lr;
    # the read-out at readout_lr. Two members, every size different so that no owner broadcasts
    # by accident.
    settings = [
        experiment.Setting(0.5, affine_lr=0.25, readout_lr=0.125),
        experiment.Setting(2.0, affine_lr=4.0, readout_lr=8.0),
    ]
    shape = {"n_inputs": 4, "n_layers": 2, "hidden": 3}
    for kind in ("BN", "no BN", "weight norm"):
        with pn.seeded(0):
            if kind == "weight norm":
                nets = experiment.WeightNormNets(settings, **shape)
            else:
                nets = experiment.MNISTNets(settings, batch_norm=kind == "BN", **shape)
        moves = step_with_gradient(nets, torch.ones_like)
        moved = dict(zip((name for name, _ in nets.named_parameters()), moves, strict=True))
        hidden_bias = "lr" if kind == "no BN" else "affine_lr"
        for k, s in enumerate(settings):
            rate = {"lr": s.lr, "affine_lr": s.affine_lr, "readout_lr": s.readout_lr}
            expected = {"weights.0": "lr", "weights.1": "lr", "weights.2": "readout_lr"}
            if kind == "BN":
                expected["biases.0"] = "readout_lr"
                for i in range(2):
                    expected |= {f"norms.{i}.gamma": "affine_lr", f"norms.{i}.beta": "affine_lr"}
            else:
                expected |= {"biases.0": hidden_bias, "biases.1": hidden_bias}
                expected["biases.2"] = "readout_lr"
            if kind == "weight norm":
                expected |= {"gains.0": "affine_lr", "gains.1": "affine_lr"}
            assert set(moved) == set(expected), kind
            for name, which in expected.items():
                ours = moved[name]
                ours = ours[k * 3 : (k + 1) * 3] if name.startswith("norms") else ours[k]
                assert torch.equal(ours, torch.full_like(ours, -rate[which])), (kind, name, k)


def test_train_mnist_net_is_one_network_of_train_mnist_nets(digits):
    def same(a, b):
        ours, theirs = a.model.state_dict(), b.model.state_dict()
        return ours.keys() == theirs.keys() and all(torch.equal(ours[n], theirs[n]) for n in ours)

    options = {"batch_norm": True, "seed": 1, "steps": 3, "eval_every": 3}
    one = experiment.train_mnist_net(
        digits, 2.0, affine_lr=0.5, readout_lr=0.25, init_std=0.3, **options
    )
    setting = experiment.Setting(2.0, affine_lr=0.5, init_std=0.3, readout_lr=0.25)
    assert same(one, experiment.train_mnist_nets(digits, [setting], **options)[0])
    # by default, the default Setting of its rate
    default = experiment.train_mnist_net(digits, 2.0, **options)
    assert same(
        default, experiment.train_mnist_nets(digits, [experiment.Setting(2.0)], **options)[0]
    )
    assert not same(one, default)
