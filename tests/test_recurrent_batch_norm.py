"""Unit tests of papernotes.recurrent_batch_norm, in float64 with fixed seeds.

The BN-LSTM is checked against a reference written out here from the paper's equations, so a
wrong placement of a BN (inside the cell recurrence, on the summed pre-activation, ...) fails.
Sequences are batch-first: (B, T, D).
"""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import gen, randn
from papernotes import recurrent_batch_norm as rbn
from papernotes import training
from papernotes.recurrent_batch_norm import experiment
from papernotes.training import History, generator, seeded

EPS = 1e-5


def bn_lstm(input_size=3, hidden_size=4, max_steps=5, gamma_init=0.1, seed=0):
    with seeded(seed):
        model = rbn.BNLSTM(input_size, hidden_size, max_steps, gamma_init).double()
    with torch.no_grad():  # move every parameter off its initial value, so that all matter
        for parameter in model.parameters():
            parameter.add_(0.3 * torch.randn(parameter.shape, generator=gen(seed + 1)).double())
    return model


def batch_stats(z):
    return z.mean(0), z.var(0, unbiased=False)


def reference_bn_lstm(model, x, h, c, statistics=None):
    """The paper's equations, written out: statistics(name, t) -> (mean, var) or batch stats."""
    hidden = model.hidden_size

    def bn(z, name, t):
        module = getattr(model, name)
        mean, var = batch_stats(z) if statistics is None else statistics(name, t)
        out = module.gamma * (z - mean) / torch.sqrt(var + EPS)
        return out if module.beta is None else out + module.beta

    outputs = []
    for t in range(x.shape[1]):
        pre = (
            bn(h @ model.weight_h, "bn_h", t) + bn(x[:, t] @ model.weight_x, "bn_x", t) + model.bias
        )
        f, i, o = (torch.sigmoid(pre[:, k * hidden : (k + 1) * hidden]) for k in range(3))
        g = torch.tanh(pre[:, 3 * hidden :])
        c = f * c + i * g
        h = o * torch.tanh(bn(c, "bn_c", t))
        outputs.append(h)
    return torch.stack(outputs, dim=1), h, c


def set_statistics(bn, seed=5):
    with torch.no_grad():
        bn.running_mean.copy_(randn(*bn.running_mean.shape, seed=seed))
        bn.running_var.copy_(randn(*bn.running_var.shape, seed=seed + 1).abs() + 0.5)


# -- StepwiseBatchNorm --------------------------------------------------------------------------


def test_training_normalizes_each_step_with_its_own_batch_statistics():
    bn = rbn.StepwiseBatchNorm(6, max_steps=3, gamma_init=0.7).double()
    with torch.no_grad():
        bn.beta.copy_(randn(6, seed=1))
    z = randn(10, 6, seed=2, scale=3.0, shift=2.0)
    mean, var = batch_stats(z)
    expected = 0.7 * (z - mean) / torch.sqrt(var + EPS) + bn.beta
    assert torch.allclose(bn(z, 1), expected, atol=1e-12)


def test_population_statistics_are_kept_per_time_step():
    bn = rbn.StepwiseBatchNorm(4, max_steps=4, momentum=0.25).double()
    z0 = randn(50, 4, seed=3, shift=5.0)
    z2 = randn(50, 4, seed=4, scale=2.0, shift=-3.0)
    bn(z0, 0)
    bn(z2, 2)
    for t, z in ((0, z0), (2, z2)):
        assert torch.allclose(bn.running_mean[t], 0.25 * z.mean(0), atol=1e-12)
        assert torch.allclose(bn.running_var[t], 0.75 + 0.25 * z.var(0, unbiased=True), atol=1e-12)
    for t in (1, 3):  # steps that saw no data keep their initial statistics
        assert torch.equal(bn.running_mean[t], torch.zeros(4, dtype=torch.float64))
        assert torch.equal(bn.running_var[t], torch.ones(4, dtype=torch.float64))


def test_all_steps_at_once_equals_step_by_step():
    z = randn(9, 4, 3, seed=6, scale=2.0, shift=1.0)  # (B, T, F)
    one, each = (rbn.StepwiseBatchNorm(3, max_steps=6, gamma_init=0.4).double() for _ in range(2))
    together = one.all_steps(z)
    separately = torch.stack([each(z[:, t], t) for t in range(4)], dim=1)
    assert torch.allclose(together, separately, atol=1e-12)
    assert torch.allclose(one.running_mean, each.running_mean, atol=1e-12)
    assert torch.allclose(one.running_var, each.running_var, atol=1e-12)
    set_statistics(one)
    set_statistics(each)
    one.eval(), each.eval()
    longer = randn(5, 8, 3, seed=7)  # past max_steps: the last row is reused
    separately = torch.stack([each(longer[:, t], t) for t in range(8)], dim=1)
    assert torch.allclose(one.all_steps(longer), separately, atol=1e-12)


def test_evaluation_uses_each_steps_population_statistics_and_the_last_beyond_max_steps():
    bn = rbn.StepwiseBatchNorm(3, max_steps=4, gamma_init=1.0, shift=False).double().eval()
    set_statistics(bn)
    z = randn(7, 3, seed=7)
    for t in range(8):
        row = min(t, 3)
        expected = (z - bn.running_mean[row]) / torch.sqrt(bn.running_var[row] + EPS)
        assert torch.allclose(bn(z, t), expected, atol=1e-12), t
    # Steps 4, 5, ... are not merely clamped somewhere: they use exactly step 3's row.
    assert torch.equal(bn(z, 9), bn(z, 3))
    assert not torch.allclose(bn(z, 2), bn(z, 3))


def test_keep_first_steps_makes_later_steps_reuse_the_new_last_step():
    bn = rbn.StepwiseBatchNorm(3, max_steps=6).double().eval()
    set_statistics(bn, seed=8)
    z = randn(5, 3, seed=9)
    before = [bn(z, t) for t in range(6)]
    bn.keep_first_steps(2)
    assert bn.max_steps == 2 and bn.running_mean.shape == (2, 3)
    assert torch.equal(bn(z, 0), before[0]) and torch.equal(bn(z, 1), before[1])
    for t in range(2, 6):
        assert torch.equal(bn(z, t), before[1])


def test_batch_norm_gradient_matches_the_written_out_formula():
    bn = rbn.StepwiseBatchNorm(5, max_steps=2, gamma_init=0.4).double()
    z = randn(8, 5, seed=10).requires_grad_(True)
    weights = randn(8, 5, seed=11)
    (bn(z, 0) * weights).sum().backward()
    z_ref = z.detach().clone().requires_grad_(True)
    mean, var = batch_stats(z_ref)
    ((0.4 * (z_ref - mean) / torch.sqrt(var + EPS)) * weights).sum().backward()
    assert torch.allclose(z.grad, z_ref.grad, atol=1e-10)


# -- the BN-LSTM ---------------------------------------------------------------------------------


def test_bn_lstm_training_forward_follows_the_papers_equations():
    model = bn_lstm()
    x = randn(6, 5, 3, seed=12)
    h0, c0 = randn(6, 4, seed=13, scale=0.1), randn(6, 4, seed=14)
    outputs, (h, c) = model(x, (h0, c0))
    expected, h_ref, c_ref = reference_bn_lstm(model, x, h0, c0)
    assert outputs.shape == (6, 5, 4)
    assert torch.allclose(outputs, expected, atol=1e-10)
    assert torch.allclose(h, h_ref, atol=1e-10) and torch.allclose(c, c_ref, atol=1e-10)


def test_the_cell_state_is_carried_unnormalized_when_the_gates_say_so():
    # Forget gate fully open, input gate shut: the LSTM cell must carry c_0 unchanged. A BN
    # inside the cell's recurrence would rescale it at every step.
    model = bn_lstm(seed=1)
    with torch.no_grad():
        model.bias[:4] = 40.0  # forget gate: sigmoid = 1
        model.bias[4:8] = -40.0  # input gate: sigmoid = 0
    c0 = randn(6, 4, seed=17, scale=5.0, shift=3.0)
    _, (_, c) = model(randn(6, 4, 3, seed=15), (randn(6, 4, seed=16, scale=0.1), c0))
    assert torch.allclose(c, c0, atol=1e-10)


def test_per_step_statistics_are_kept_for_every_bn_and_step():
    model = bn_lstm(max_steps=4)
    x = randn(8, 4, 3, seed=18)
    model(x, (randn(8, 4, seed=19, scale=0.1), torch.zeros(8, 4, dtype=torch.float64)))
    for name in ("bn_x", "bn_h", "bn_c"):
        means = getattr(model, name).running_mean
        assert means.shape[0] == 4
        assert (means.abs().sum(1) > 0).all(), name  # every step has been updated
        assert not torch.allclose(means[1], means[2]), name  # and separately
    # The input term's step-t statistics are those of W_x x_t over the batch (momentum 0.1).
    expected = 0.1 * (x @ model.weight_x).mean(0)
    assert torch.allclose(model.bn_x.running_mean, expected.detach(), atol=1e-12)


def test_the_input_term_bn_of_one_pixel_is_the_standardised_pixel():
    # With one input feature, BN(W_x x_t) = gamma * sign(W_x) * (x_t - mean_t) / std_t (up to
    # eps): the input-term BN standardises the pixel, which standardize_steps does to the data.
    model = bn_lstm(input_size=1, hidden_size=3, max_steps=4)
    with torch.no_grad():  # weights away from 0, where eps / w^2 would matter
        model.weight_x.copy_(model.weight_x.sign() * (0.5 + model.weight_x.abs()))
    x = randn(50, 4, 1, seed=20, scale=0.3, shift=0.5)
    input_term = model.bn_x.all_steps(x @ model.weight_x)
    standardised = experiment.standardize_steps(x, x)
    expected = standardised * (model.bn_x.gamma * model.weight_x[0].sign())
    assert torch.allclose(input_term, expected, atol=1e-3)
    assert torch.allclose(standardised.mean(0), torch.zeros(4, 1, dtype=torch.float64))
    assert torch.allclose(standardised.std(0, unbiased=False), torch.ones(4, 1).double(), atol=1e-3)


def test_evaluation_beyond_max_steps_uses_the_last_steps_statistics():
    model = bn_lstm(max_steps=3).eval()
    for name in ("bn_x", "bn_h", "bn_c"):
        set_statistics(getattr(model, name), seed=20 + len(name))
    x = randn(5, 6, 3, seed=21)
    zeros = torch.zeros(5, 4, dtype=torch.float64)

    def statistics(name, t):
        module = getattr(model, name)
        row = min(t, 2)
        return module.running_mean[row], module.running_var[row]

    outputs, _ = model(x)
    expected, _, _ = reference_bn_lstm(model, x, zeros, zeros, statistics)
    assert torch.allclose(outputs, expected, atol=1e-10)

    # The same model with statistics for 6 steps, rows 3..5 copied from row 2, agrees.
    longer = rbn.BNLSTM(3, 4, 6).double().eval()
    state = {k: v for k, v in model.state_dict().items() if "running" not in k}
    longer.load_state_dict(state, strict=False)
    for name in ("bn_x", "bn_h", "bn_c"):
        short, long_ = getattr(model, name), getattr(longer, name)
        with torch.no_grad():
            long_.running_mean.copy_(short.running_mean[[0, 1, 2, 2, 2, 2]])
            long_.running_var.copy_(short.running_var[[0, 1, 2, 2, 2, 2]])
    assert torch.allclose(longer(x)[0], outputs, atol=1e-12)


def test_a_training_sequence_longer_than_max_steps_is_an_error():
    model = bn_lstm(max_steps=5)
    with pytest.raises(ValueError, match="longer than max_steps = 5"):
        model(randn(4, 6, 3, seed=22))
    model.eval()
    assert model(randn(4, 6, 3, seed=22))[0].shape == (4, 6, 4)  # fine at test time


@pytest.mark.parametrize("gamma", [0.1, 0.5, 1.0])
def test_gamma_init_is_honoured_by_every_bn(gamma):
    model = rbn.BNLSTM(2, 3, 4, gamma_init=gamma)
    for name, features in (("bn_x", 12), ("bn_h", 12), ("bn_c", 3)):
        module = getattr(model, name)
        assert torch.equal(module.gamma.detach(), torch.full((features,), gamma)), name
    assert model.bn_x.beta is None and model.bn_h.beta is None  # b is the only shift
    assert torch.equal(model.bn_c.beta.detach(), torch.zeros(3))


def test_default_gamma_is_the_papers_0_1():
    assert torch.equal(rbn.BNLSTM(1, 2, 3).bn_h.gamma.detach(), torch.full((8,), 0.1))


def test_gradients_flow_to_every_parameter():
    model = bn_lstm(max_steps=6)
    x = randn(8, 6, 3, seed=23)
    state = (randn(8, 4, seed=24, scale=0.1), torch.zeros(8, 4, dtype=torch.float64))
    outputs, _ = model(x, state)
    (outputs * randn(8, 6, 4, seed=25)).sum().backward()
    names = {name for name, _ in model.named_parameters()}
    assert names == {
        "weight_x",
        "weight_h",
        "bias",
        "bn_x.gamma",
        "bn_h.gamma",
        "bn_c.gamma",
        "bn_c.beta",
    }
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None, name
        assert torch.isfinite(parameter.grad).all() and parameter.grad.abs().sum() > 0, name


def test_gradients_reach_the_first_inputs():
    model = bn_lstm(max_steps=6)
    x = randn(8, 6, 3, seed=26).requires_grad_(True)
    outputs, _ = model(x, (randn(8, 4, seed=27, scale=0.1), torch.zeros(8, 4).double()))
    outputs[:, -1].sum().backward()
    assert (x.grad[:, 0].abs().sum() > 0).item()


def test_initialisation_follows_the_papers_code():
    model = rbn.BNLSTM(1, 5, 4)
    hidden = 5
    assert torch.equal(model.weight_h[:, 3 * hidden :].detach(), torch.eye(hidden))
    gates = model.weight_h[:, : 3 * hidden].detach()
    assert torch.allclose(gates @ gates.T, torch.eye(hidden), atol=1e-5)  # orthogonal rows
    assert torch.equal(model.bias[:hidden].detach(), torch.ones(hidden))
    assert torch.equal(model.bias[hidden:].detach(), torch.zeros(3 * hidden))


def test_the_lstm_baseline_is_the_same_lstm_without_bn():
    with seeded(3):
        baseline = experiment.LSTM(3, 4).double()
    lstm = baseline.lstm
    x = randn(6, 5, 3, seed=28)
    h, c = randn(6, 4, seed=29, scale=0.1), randn(6, 4, seed=30)
    outputs, (h_last, c_last) = baseline(x, (h, c))
    assert outputs.shape == (6, 5, 4)
    # By hand, in torch's gate order (i, f, g, o).
    for t in range(5):
        pre = x[:, t] @ lstm.weight_ih_l0.T + h @ lstm.weight_hh_l0.T + lstm.bias_ih_l0
        i, f, g, o = pre.chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        assert torch.allclose(outputs[:, t], h, atol=1e-12)
    assert torch.allclose(h_last, h) and torch.allclose(c_last, c)
    # Same initialisation as the BN-LSTM: identity on the candidate block, forget bias 1.
    assert torch.equal(lstm.weight_hh_l0[8:12].detach(), torch.eye(4, dtype=torch.float64))
    assert torch.equal(lstm.bias_ih_l0[4:8].detach(), torch.ones(4, dtype=torch.float64))
    assert lstm.bias_ih_l0[:4].abs().sum() == 0 and lstm.bias_hh_l0.abs().sum() == 0


# -- gradient flow through the Figure-1 network ---------------------------------------------------


def test_bn_tanh_rnn_is_tanh_of_one_bn_on_the_summed_preactivation():
    with seeded(0):
        model = rbn.BNTanhRNN(2, 3, gamma=0.3).double()
    x, h0 = randn(5, 4, 2, seed=31), randn(5, 3, seed=32, scale=0.1)
    states = model(x, h0)
    h = h0
    for t in range(4):
        z = h @ torch.eye(3, dtype=torch.float64) + x[:, t] @ model.weight_x
        mean, var = batch_stats(z)
        h = torch.tanh(0.3 * (z - mean) / torch.sqrt(var + EPS))
        assert torch.allclose(states[t + 1], h, atol=1e-12)
    assert len(states) == 5 and states[0] is h0


def test_gradient_norms_are_those_of_autograd():
    x, labels = torch.rand(8, 6, 1, generator=gen(33)), torch.arange(8) % 3
    norms = experiment.gradient_norms_through_time(
        x, labels, 0.4, hidden_size=5, n_classes=3, seed=2
    )
    assert norms.shape == (7,) and norms.dtype == torch.float64
    # Recompute by hand with the same seed-fixed initialisation and noise.
    with seeded(2):
        model = rbn.BNTanhRNN(1, 5, 0.4).double()
        readout = torch.nn.Linear(5, 3).double()
        torch.nn.init.orthogonal_(readout.weight)
        torch.nn.init.zeros_(readout.bias)
    noise = torch.randn(8, 5, dtype=torch.float64, generator=generator(2))
    h0 = (0.1 * noise).requires_grad_(True)
    states = model(x.double(), h0)
    for s in states:
        s.retain_grad()
    F.cross_entropy(readout(states[-1]), labels).backward()
    expected = torch.stack([s.grad.norm(dim=1).mean() for s in states])
    assert torch.allclose(norms, expected, atol=1e-14)
    other = experiment.gradient_norms_through_time(
        x, labels, 0.4, hidden_size=5, n_classes=3, seed=3
    )
    assert not torch.allclose(norms, other)  # the seed matters


def test_gamma_one_makes_the_gradient_vanish_where_gamma_0_1_keeps_it():
    from papernotes.data import load_digits_split

    digits = load_digits_split()
    x, labels = experiment.pixel_sequences(digits.train_x[:64]), digits.train_y[:64]
    small = experiment.gradient_norms_through_time(x, labels, 0.1)
    large = experiment.gradient_norms_through_time(x, labels, 1.0)
    assert small[0] / small[-1] > 0.1
    assert large[0] / large[-1] < 1e-2
    assert small[0] > 100 * large[0]


def test_gradient_flow_over_draws_is_one_measurement_per_draw_of_digits_and_seed():
    images, labels = torch.rand(20, 6, generator=gen(34)), torch.arange(20) % 3
    draws = experiment.gradient_flow_over_draws(
        images, labels, 0.4, draws=3, batch_size=8, steps=4, seed=5
    )
    assert draws.shape == (3, 5) and draws.dtype == torch.float64
    assert not torch.allclose(draws[0], draws[1])  # each draw its own digits and weights
    # The first draw of a longer sweep is the sweep of one draw: the draws follow the seed alone.
    one = experiment.gradient_flow_over_draws(
        images, labels, 0.4, draws=1, batch_size=8, steps=4, seed=5
    )
    assert torch.equal(one[0], draws[0])
    # The same digits and seeds for every gamma: at another gamma the first draw is still the
    # measurement of the same batch, recomputed here by hand.
    stream = generator(5, experiment.FLOW_DRAWS)
    rows = torch.randperm(20, generator=stream)[:8]
    draw_seed = int(torch.randint(2**31, (1,), generator=stream))
    expected = experiment.gradient_norms_through_time(
        experiment.pixel_sequences(images[rows], steps=4), labels[rows], 0.7, seed=draw_seed
    )
    other = experiment.gradient_flow_over_draws(
        images, labels, 0.7, draws=1, batch_size=8, steps=4, seed=5
    )
    assert torch.equal(other[0], expected)


def test_tanh_derivative_statistics():
    assert experiment.tanh_derivative_statistics(0.0) == (1.0, 1.0, 1.0)
    mean, low, high = experiment.tanh_derivative_statistics(1.0, samples=200_000)
    # E[1 - tanh(z)^2] for z ~ N(0, 1), by quadrature.
    z = torch.linspace(-12, 12, 200_001, dtype=torch.float64)
    density = torch.exp(-(z**2) / 2) / math.sqrt(2 * math.pi)
    exact = torch.trapezoid((1 - torch.tanh(z) ** 2) * density, z).item()
    assert mean == pytest.approx(exact, abs=3e-3)
    assert low < mean < high < 1.0
    assert (
        experiment.tanh_derivative_statistics(3.0)[0]
        < experiment.tanh_derivative_statistics(0.3)[0]
    )


# -- sequential digits ---------------------------------------------------------------------------


def test_pixel_sequences_read_one_pixel_per_step():
    images = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    seq = experiment.pixel_sequences(images)
    assert seq.shape == (3, 4, 1)
    assert torch.equal(seq[1, :, 0], images[1])
    order = torch.tensor([2, 0, 3, 1])
    assert torch.equal(experiment.pixel_sequences(images, order=order)[2, :, 0], images[2, order])
    longer = experiment.pixel_sequences(images, steps=6)
    assert torch.equal(longer[:, :4], seq) and torch.equal(longer[:, 4:], torch.zeros(3, 2, 1))
    assert torch.equal(experiment.pixel_sequences(images, steps=2), seq[:, :2])


def test_standardize_steps_uses_the_reference_statistics_of_each_step():
    reference = randn(40, 3, 2, seed=34, scale=2.0, shift=1.0)
    x = randn(5, 3, 2, seed=35)
    mean, var = reference.mean(0), reference.var(0, unbiased=False)
    expected = (x - mean) / torch.sqrt(var + EPS)
    assert torch.allclose(experiment.standardize_steps(x, reference), expected, atol=1e-12)


def test_initial_state_noise():
    h, c = rbn.initial_state(500, 20, 0.1, gen(36))
    assert h.shape == c.shape == (500, 20)
    assert torch.equal(c, torch.zeros(500, 20))
    assert h.std().item() == pytest.approx(0.1, rel=0.05)
    assert torch.equal(rbn.initial_state(3, 2, 0.0)[0], torch.zeros(3, 2))


def test_estimate_population_statistics_sets_each_step_to_the_batch_statistics():
    model = experiment.SequenceClassifier(bn_lstm(max_steps=4)).double()
    x = randn(30, 4, 3, seed=37)
    model.eval()
    rbn.estimate_population_statistics(model, x)
    assert not model.training  # the mode is restored
    bn_x = model.rnn.bn_x
    assert bn_x.momentum == 0.1  # and so is the momentum
    inputs = x @ model.rnn.weight_x
    assert torch.allclose(bn_x.running_mean, inputs.mean(0).detach(), atol=1e-12)
    assert torch.allclose(bn_x.running_var, inputs.var(0, unbiased=True).detach(), atol=1e-12)
    # With these statistics, evaluation on the same batch equals training-mode normalization
    # up to the biased/unbiased variance: close, not equal.
    train_logits = copy.deepcopy(model).train()(x)
    assert torch.allclose(model(x), train_logits, atol=0.05)


def tiny_task(n=256, steps=6, seed=38):
    """Class = whether the first input is positive; later inputs are noise: needs memory."""
    x = torch.randn(n, steps, 1, generator=gen(seed))
    y = (x[:, 0, 0] > 0).long()
    return x, y


@pytest.mark.parametrize("make", [experiment.lstm_classifier, experiment.bn_lstm_classifier])
def test_training_learns_a_task_that_needs_memory(make):
    x, y = tiny_task()
    val = tiny_task(seed=39)
    kwargs = {"max_steps": 6} if make is experiment.bn_lstm_classifier else {}
    model = make(8, seed=1, **kwargs)
    run = experiment.train_classifier(
        model, x, y, {"val": val}, steps=120, batch_size=32, eval_every=40, population_size=64
    )
    history = run.history
    assert isinstance(history, History) and not history.diverged and run.model is model
    assert history.steps == [40, 80, 120]
    assert set(history.metrics) == {"loss", "val_accuracy", "val_loss"}
    assert history.final("val_accuracy") > 0.8  # chance is 0.5
    assert not model.training  # returned ready to be measured
    # which sequences each evaluation got right, one row per evaluation
    assert run.correct["val"].shape == (3, 256) and run.correct["val"].dtype == torch.bool
    assert run.correct["val"][-1].double().mean().item() == pytest.approx(
        history.final("val_accuracy")
    )
    assert run.mean_correct("val").mean().item() == pytest.approx(history.mean("val_accuracy"))


def test_a_run_follows_its_seed():
    x, y = tiny_task(n=64, steps=4)

    def run(seed):
        model = experiment.bn_lstm_classifier(4, 4, seed=seed)
        run = experiment.train_classifier(
            model, x, y, {"val": (x, y)}, steps=6, batch_size=16, eval_every=3, seed=seed
        )
        return run.history["loss"]

    assert run(0) == run(0)
    assert run(0) != run(1)


def test_cut_steps_also_evaluates_the_bn_lstm_with_its_first_steps_statistics_only():
    x, y = tiny_task(n=64, steps=6)

    def run(make, cut_steps):
        return experiment.train_classifier(
            make(),
            x,
            y,
            {"test": (x, y)},
            steps=4,
            batch_size=16,
            eval_every=2,
            cut_steps=cut_steps,
            seed=3,
        )

    def make():
        return experiment.bn_lstm_classifier(4, 6, seed=2)

    full, cut_at_6, cut_at_1 = run(make, None), run(make, 6), run(make, 1)
    # the cut is measured beside the run and leaves its training and accuracy as they were
    assert cut_at_1.history["test_accuracy"] == full.history["test_accuracy"]
    assert "test_cut" not in full.correct and "test_cut_accuracy" not in full.history.metrics
    # a cut at the sequence's length changes nothing; the last evaluation's cut is that model's
    assert torch.equal(cut_at_6.correct["test_cut"], cut_at_6.correct["test"])
    model = cut_at_1.model
    right = training.accuracy_of(experiment.statistics_for_first(model, 1), x, y)
    assert cut_at_1.history.final("test_cut_accuracy") == pytest.approx(right)
    assert cut_at_1.correct["test_cut"].shape == cut_at_1.correct["test"].shape
    # the nulls, written apart, ignore it
    lstm = run(lambda: experiment.lstm_classifier(4, seed=2), 1)
    assert "test_cut" not in lstm.correct
    with pytest.raises(ValueError, match="cut_steps"):
        run(make, 0)


def test_the_classifiers_follow_their_seed():
    same = [experiment.lstm_classifier(4, seed=5).readout.weight for _ in range(2)]
    assert torch.equal(*same)
    other = experiment.bn_lstm_classifier(4, 3, seed=6).rnn.weight_h
    assert not torch.equal(experiment.bn_lstm_classifier(4, 3, seed=5).rnn.weight_h, other)


def test_statistics_drift_is_zero_for_constant_statistics_and_sees_a_jump():
    bn = rbn.StepwiseBatchNorm(3, max_steps=5).double()
    with torch.no_grad():
        bn.running_mean.copy_(torch.tensor([1.0, 2.0, 3.0]).double().expand(5, 3))
        bn.running_var.fill_(4.0)
    assert torch.equal(experiment.statistics_drift(bn), torch.zeros(4, dtype=torch.float64))
    with torch.no_grad():
        bn.running_mean[3:] += 1.0  # a jump of half a standard deviation between steps 2 and 3
    drift = experiment.statistics_drift(bn)
    assert torch.allclose(drift, torch.tensor([0, 0, 0.5, 0], dtype=torch.float64))


def classifier_with_distinct_statistics(max_steps=6):
    """A BN-LSTM classifier whose every BN has population statistics that differ per step."""
    model = experiment.bn_lstm_classifier(3, max_steps, seed=2).double()
    with torch.no_grad():
        for name in ("bn_x", "bn_h", "bn_c"):
            bn = getattr(model.rnn, name)
            steps = torch.arange(max_steps, dtype=torch.float64)[:, None]
            bn.running_mean.copy_(steps.expand_as(bn.running_mean))
            bn.running_var.copy_((1.0 + steps).expand_as(bn.running_var))
    return model.eval()


def test_statistics_for_first_reuses_step_k_for_the_recurrent_bns_only():
    model = classifier_with_distinct_statistics()
    cut = experiment.statistics_for_first(model, 2)
    for name in experiment.RECURRENT:
        bn = getattr(cut.rnn, name)
        assert bn.max_steps == 2 and [bn.statistics_step(t) for t in (0, 1, 4)] == [0, 1, 1]
    assert cut.rnn.bn_x.max_steps == 6  # the input term keeps its own
    assert model.rnn.bn_h.max_steps == 6  # a copy: the model is untouched
    x = randn(4, 6, 1)
    with torch.no_grad():
        assert not torch.allclose(cut(x), model(x))
        assert torch.allclose(experiment.statistics_for_first(model, 6)(x), model(x))


def test_averaged_from_replaces_later_steps_by_the_mean_of_the_earlier_ones():
    model = classifier_with_distinct_statistics()
    ablated = experiment.averaged_from(model, 2)
    for name in experiment.RECURRENT:
        bn = getattr(ablated.rnn, name)
        assert bn.max_steps == 6
        assert torch.equal(bn.running_mean[:2, 0], torch.tensor([0.0, 1.0]).double())
        assert torch.equal(bn.running_mean[2:, 0], torch.full((4,), 0.5).double())  # mean of 0, 1
        assert torch.equal(bn.running_var[2:, 0], torch.full((4,), 1.5).double())  # of 1, 2
    assert torch.equal(ablated.rnn.bn_x.running_mean, model.rnn.bn_x.running_mean)
    assert model.rnn.bn_h.running_mean[5, 0] == 5.0  # a copy: the model is untouched
    # Not the paper's rule: step k - 1's statistics are not what the later steps get.
    cut = experiment.statistics_for_first(model, 2)
    x = randn(4, 6, 1)
    with torch.no_grad():
        assert not torch.allclose(ablated(x), cut(x))


def test_shared_by_every_step_gives_every_step_the_average_over_steps():
    model = classifier_with_distinct_statistics()
    shared = experiment.shared_by_every_step(model)
    for name in experiment.RECURRENT:
        bn = getattr(shared.rnn, name)
        assert torch.allclose(bn.running_mean, torch.full_like(bn.running_mean, 2.5))  # 0..5
        assert torch.allclose(bn.running_var, torch.full_like(bn.running_var, 3.5))  # 1..6
    assert model.rnn.bn_h.running_mean[0, 0] == 0.0  # a copy: the model is untouched
    # By default the input term keeps its own statistics per step (they never settle on pixels).
    assert torch.equal(shared.rnn.bn_x.running_mean, model.rnn.bn_x.running_mean)
    only_cell = experiment.shared_by_every_step(model, ("bn_c",))
    assert torch.equal(only_cell.rnn.bn_h.running_mean, model.rnn.bn_h.running_mean)


def test_cut_comparison_fills_later_steps_by_the_rule_and_by_the_average():
    model = classifier_with_distinct_statistics()
    x, y = randn(6, 6, 1, seed=42), torch.arange(6) % 10
    result = experiment.cut_comparison(model, x, y, (2, 6))
    rule = [training.accuracy_of(experiment.statistics_for_first(model, k), x, y) for k in (2, 6)]
    average = [training.accuracy_of(experiment.averaged_from(model, k), x, y) for k in (2, 6)]
    assert result == {"rule": rule, "average": average}
    # With every step's own statistics kept (k = T), the two fillings are the same model.
    assert result["rule"][1] == result["average"][1]


# -- bad input: one rejection per entry point ------------------------------------------------------


def test_bn_lstm_rejects_bad_hyper_parameters():
    with pytest.raises(ValueError, match="gamma_init"):
        rbn.BNLSTM(1, 4, 8, gamma_init=0.0)


def test_stepwise_batch_norm_rejects_bad_hyper_parameters():
    with pytest.raises(ValueError, match="momentum"):
        rbn.StepwiseBatchNorm(4, 3, momentum=1.5)
    with pytest.raises(ValueError, match=r"steps must lie in \[1, 3\]"):
        rbn.StepwiseBatchNorm(4, 3).keep_first_steps(4)


def test_bad_sequences_and_states_are_rejected():
    model = bn_lstm()
    with pytest.raises(ValueError, match=r"x must have shape \(B, T, D\) with D = 3"):
        model(torch.zeros(4, 5, 2, dtype=torch.float64))
    with pytest.raises(TypeError, match="floating-point"):
        experiment.LSTM(3, 4)(torch.zeros(2, 3, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"state h must have shape \(B, H\)"):
        model(randn(3, 2, 3, seed=40), (torch.zeros(3, 5).double(), torch.zeros(3, 4).double()))
    with pytest.raises(ValueError, match="at least 2 examples"):
        model(randn(1, 2, 3, seed=41))


def test_other_entry_points_reject_bad_arguments():
    with pytest.raises(ValueError, match="permutation"):
        experiment.pixel_sequences(torch.zeros(2, 4), order=torch.tensor([0, 0, 1, 2]))
    with pytest.raises(ValueError, match="noise"):
        rbn.initial_state(2, 3, -0.1)
    with pytest.raises(ValueError, match=r"x must have shape \(B, T, D\) with T = 4"):
        experiment.standardize_steps(torch.zeros(2, 3, 1), torch.zeros(5, 4, 1))
    with pytest.raises(ValueError, match="labels"):
        experiment.gradient_norms_through_time(torch.rand(3, 4, 1), torch.zeros(2).long(), 0.1)
    with pytest.raises(ValueError, match="gamma"):
        rbn.BNTanhRNN(1, 3, gamma=-1.0)
    x, y = tiny_task(n=8, steps=2)
    with pytest.raises(ValueError, match="lr"):
        experiment.train_classifier(
            experiment.lstm_classifier(4), x, y, {}, steps=1, batch_size=4, lr=0.0
        )


# -- the nulls, written apart from the mechanism --------------------------------------------------


def copy_weights(mechanism: rbn.BNLSTM, apart: experiment.BNLSTMWrittenApart) -> None:
    with torch.no_grad():
        apart.weight_x.copy_(mechanism.weight_x)
        apart.weight_h.copy_(mechanism.weight_h)
        apart.bias.copy_(mechanism.bias)
        apart.gamma_x.copy_(mechanism.bn_x.gamma)
        apart.gamma_h.copy_(mechanism.bn_h.gamma)
        apart.gamma_c.copy_(mechanism.bn_c.gamma)
        apart.beta_c.copy_(mechanism.bn_c.beta)


def test_the_nulls_start_from_the_bn_lstms_initial_weights():
    bn = experiment.bn_lstm_classifier(4, 5, 0.3, input_size=2, seed=3)
    apart = experiment.bn_lstm_written_apart_classifier(4, 5, 0.3, input_size=2, seed=3)
    only_input = experiment.input_bn_lstm_classifier(4, 5, 0.3, input_size=2, seed=3)
    plain = experiment.lstm_classifier(4, input_size=2, seed=3)
    assert torch.equal(apart.rnn.weight_x, bn.rnn.weight_x)
    assert torch.equal(apart.rnn.weight_h, bn.rnn.weight_h)
    assert torch.equal(apart.rnn.bias, bn.rnn.bias)
    assert torch.equal(only_input.rnn.weight_x, experiment.torch_gate_order(bn.rnn.weight_x))
    assert torch.equal(
        plain.rnn.lstm.weight_hh_l0, experiment.torch_gate_order(bn.rnn.weight_h).T.contiguous()
    )
    for null in (apart, only_input, plain):  # torch's own LSTM draws leave the read-out alone
        assert torch.equal(null.readout.weight, bn.readout.weight)
    # the gammas start where gamma_init says
    assert torch.equal(only_input.rnn.gamma_x, torch.full((16,), 0.3))
    assert torch.equal(apart.rnn.gamma_c, torch.full((4,), 0.3))


def test_the_bn_lstm_written_apart_is_the_mechanisms_bn_lstm():
    mechanism = bn_lstm(input_size=2, hidden_size=4, max_steps=5)
    with seeded(0):
        apart = experiment.BNLSTMWrittenApart(2, 4, 5).double()
    copy_weights(mechanism, apart)
    x = randn(7, 5, 2, seed=50)
    state = (randn(7, 4, seed=51, scale=0.1), torch.zeros(7, 4, dtype=torch.float64))
    outputs, (h, c) = mechanism(x, state)
    apart_outputs, (apart_h, apart_c) = apart(x, state)
    assert torch.allclose(outputs, apart_outputs, atol=1e-12)
    assert torch.allclose(c, apart_c, atol=1e-12)
    # the same population statistics, and the same evaluation, past max_steps too
    rbn.estimate_population_statistics(mechanism, x, state)
    apart.estimate_population_statistics(x, state)
    assert torch.allclose(apart.mean_h, mechanism.bn_h.running_mean, atol=1e-12)
    assert torch.allclose(apart.var_c, mechanism.bn_c.running_var, atol=1e-12)
    mechanism.eval(), apart.eval()
    longer = randn(3, 8, 2, seed=52)
    assert torch.allclose(mechanism(longer)[0], apart(longer)[0], atol=1e-12)
    assert apart.training is False  # the estimate restores the mode


def test_input_only_bn_is_the_bn_lstm_without_its_recurrent_and_cell_bns():
    class Identity(torch.nn.Module):
        def forward(self, z, t):
            return z

    ablated = experiment.bn_lstm_classifier(4, 5, 0.3, seed=3).double()
    ablated.rnn.bn_h, ablated.rnn.bn_c = Identity(), Identity()
    only_input = experiment.input_bn_lstm_classifier(4, 5, 0.3, seed=3).double()
    x = torch.rand(9, 5, 1, generator=gen(53)).double()
    state = (randn(9, 4, seed=54, scale=0.1), torch.zeros(9, 4, dtype=torch.float64))
    assert torch.allclose(ablated(x, state), only_input(x, state), atol=1e-12)
    rbn.estimate_population_statistics(ablated, x, state)
    experiment.set_population_statistics(only_input, x, state)
    ablated.eval(), only_input.eval()
    longer = torch.rand(4, 7, 1, generator=gen(55)).double()  # past max_steps: the last row
    assert torch.allclose(ablated(longer), only_input(longer), atol=1e-12)
    # what it trains: W_x, gamma_x, b and W_h; torch's input weights stay the identity
    trainable = {n for n, p in only_input.rnn.named_parameters() if p.requires_grad}
    assert trainable == {"weight_x", "gamma_x", "bias", "lstm.weight_hh_l0"}


def test_bn_h_dropped_is_the_bn_lstm_without_its_recurrent_term_bn_only():
    class Identity(torch.nn.Module):
        def forward(self, z, t):
            return z

    ablated = experiment.bn_lstm_classifier(4, 5, 0.3, seed=3).double()
    ablated.rnn.bn_h = Identity()  # the input and cell BNs kept
    dropped = experiment.bn_h_dropped_classifier(4, 5, 0.3, seed=3).double()
    x = torch.rand(9, 5, 1, generator=gen(60)).double()
    state = (randn(9, 4, seed=61, scale=0.1), torch.zeros(9, 4, dtype=torch.float64))
    assert torch.allclose(ablated(x, state), dropped(x, state), atol=1e-12)
    rbn.estimate_population_statistics(ablated, x, state)
    experiment.set_population_statistics(dropped, x, state)
    ablated.eval(), dropped.eval()
    longer = torch.rand(4, 7, 1, generator=gen(62)).double()
    assert torch.allclose(ablated(longer), dropped(longer), atol=1e-12)
    assert "gamma_h" not in dict(dropped.rnn.named_parameters())
    # and it differs from the BN-LSTM, whose recurrent term is normalized
    full = experiment.bn_lstm_written_apart_classifier(4, 5, 0.3, seed=3).double()
    assert not torch.allclose(full(x, state), dropped(x, state), atol=1e-6)


def test_frozen_statistics_keep_the_initial_ones_while_training_and_after_estimates():
    x = torch.rand(16, 5, 1, generator=gen(63))
    model = experiment.frozen_statistics_classifier(x, 4, 5, 0.1, seed=3)
    rnn = model.rnn
    # frozen at the initial weights' statistics: those of the unfrozen model at the same seed
    # and under the same h_0 noise
    unfrozen = experiment.bn_lstm_written_apart_classifier(4, 5, 0.1, seed=3)
    state = experiment._noisy_initial_state(
        16, 4, 0.1, training.generator(3, experiment.FROZEN_STATISTICS)
    )
    unfrozen.rnn.estimate_population_statistics(x, state)
    for name in ("mean_h", "var_h", "mean_c", "var_c"):
        assert torch.allclose(getattr(rnn, name), getattr(unfrozen.rnn, name))
    frozen_h = rnn.mean_h.clone()
    # training normalizes the recurrent term with the frozen statistics, not the batch's
    rnn.train()
    z = torch.randn(6, 16, generator=gen(64)) * 3 + 2
    expected = rnn.gamma_h * (z - rnn.mean_h[1]) / (rnn.var_h[1] + rnn.eps).sqrt()
    assert torch.allclose(rnn._bn(z, "h", 1, rnn.gamma_h), expected, atol=1e-6)
    # the input term still uses each minibatch's statistics
    batch_x = rnn._input_terms(torch.rand(6, 5, 1, generator=gen(65))) - rnn.bias
    assert torch.allclose(batch_x.mean(0), torch.zeros(5, 16), atol=1e-5)
    # a step of training and a later estimate leave the frozen statistics as they were
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    F.cross_entropy(model(x), torch.arange(16) % 3).backward()
    optimizer.step()
    old_x = rnn.mean_x.clone()
    experiment.set_population_statistics(model, x, state)
    assert torch.equal(rnn.mean_h, frozen_h)
    assert not torch.allclose(rnn.mean_x, old_x)
    with pytest.raises(ValueError, match="frozen=True"):
        unfrozen.rnn.freeze_statistics(x, state)


def test_the_tanh_rnn_without_bn_is_tanh_of_the_summed_preactivation():
    x, labels = torch.rand(8, 6, 1, generator=gen(66)), torch.arange(8) % 3
    with seeded(4):
        network = experiment.TanhRNNWithoutBN(1, 5, 0.7).double()
    h0 = randn(8, 5, seed=67, scale=0.1)
    states = network(x.double(), h0)
    h = h0
    for t in range(6):
        h = torch.tanh(h + x[:, t].double() @ network.weight_x)  # W_h = I
        assert torch.allclose(states[t + 1], h, atol=1e-12)
    norms = experiment.gradient_norms_through_time(
        x, labels, 0.7, hidden_size=5, n_classes=3, seed=4, without_bn=True
    )
    with_bn = experiment.gradient_norms_through_time(
        x, labels, 0.7, hidden_size=5, n_classes=3, seed=4, written_apart=True
    )
    assert norms.shape == (7,) and not torch.allclose(norms, with_bn)


def test_the_tanh_rnn_written_apart_measures_the_same_gradient_flow():
    x, labels = torch.rand(8, 6, 1, generator=gen(56)), torch.arange(8) % 3
    kwargs = {"hidden_size": 5, "n_classes": 3, "seed": 4}
    ours = experiment.gradient_norms_through_time(x, labels, 0.7, **kwargs)
    apart = experiment.gradient_norms_through_time(x, labels, 0.7, written_apart=True, **kwargs)
    assert torch.allclose(ours, apart, rtol=1e-10)


def test_bn_lstm_gradient_norms_are_those_of_autograd():
    x, labels = torch.rand(6, 5, 1, generator=gen(57)), torch.arange(6) % 3
    norms = experiment.bn_lstm_gradient_norms(x, labels, 0.4, hidden_size=4, seed=7)
    assert norms.shape == (6,)
    # dL/dh_0 and dL/dh_T by hand: h_0 as a leaf, h_T as the read-out's input
    model = experiment.bn_lstm_classifier(4, 5, 0.4, seed=7).double().train()
    h0 = 0.1 * torch.randn(6, 4, dtype=torch.float64, generator=generator(7))
    h0.requires_grad_(True)
    _, (h, _) = model.rnn(x.double(), (h0, torch.zeros_like(h0)))
    h.retain_grad()
    F.cross_entropy(model.readout(h), labels).backward()
    assert norms[0].item() == pytest.approx(h0.grad.norm(dim=1).mean().item(), rel=1e-10)
    assert norms[-1].item() == pytest.approx(h.grad.norm(dim=1).mean().item(), rel=1e-10)
    # and a middle state, by the same rule: h_2 from a run of the first two steps
    model.zero_grad()
    _, (h2, c2) = model.rnn(x.double()[:, :2], (h0.detach(), torch.zeros_like(h0)))
    h2, c2 = h2.detach().requires_grad_(True), c2.detach()
    _, (h, _) = model.rnn(x.double()[:, 2:], (h2, c2))  # training mode: batch statistics
    F.cross_entropy(model.readout(h), labels).backward()
    assert norms[2].item() == pytest.approx(h2.grad.norm(dim=1).mean().item(), rel=1e-10)


def test_step_factors_of_a_small_gamma_are_close_to_one():
    from papernotes.data import load_digits_split

    digits = load_digits_split()
    x, y = experiment.pixel_sequences(digits.train_x[:64]), digits.train_y[:64]
    small, large = experiment.step_factors(x, y, 0.01), experiment.step_factors(x, y, 1.0)
    assert small["linear"] == 1.0 and small["tanh"] > 0.999
    assert small["tanh_on_gradient"] > 0.999
    # the gradient meets a tanh factor no smaller than the plain mean's: it sits where tanh' is
    # large; each is a mean of factors below 1
    assert large["tanh"] < large["tanh_on_gradient"] < 1.0
    assert large["linear"] < 0.1 and large["tanh"] < small["tanh"]
    assert large["bn_gain"] > 1.0  # BN stretches a squashed state back


def test_sequence_drift_is_the_drift_of_the_datas_own_statistics():
    x = randn(40, 5, 2, seed=58, scale=2.0, shift=1.0)
    bn = rbn.StepwiseBatchNorm(2, 5).double()
    with torch.no_grad():
        bn.running_mean.copy_(x.mean(0))
        bn.running_var.copy_(x.var(0))
    assert torch.allclose(experiment.sequence_drift(x), experiment.statistics_drift(bn))
    constant = torch.ones(10, 4, 1).double() + torch.arange(10.0)[:, None, None]
    assert torch.allclose(experiment.sequence_drift(constant), torch.zeros(3, dtype=torch.float64))


def test_paired_standard_error():
    a, b = torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0.0, 0.0, 1.0, 0.0])
    assert experiment.paired_standard_error(a, b) == pytest.approx((a - b).std().item() / 2)
    assert experiment.paired_standard_error(a, a) == 0.0
    with pytest.raises(ValueError, match="b must have shape"):
        experiment.paired_standard_error(a, b[:3])


class FakeRun:
    def __init__(self, score):
        self.history = History()
        self.history.log(1, {"val_accuracy": score})


def test_tune_learning_rate_widens_the_grid_until_every_tuned_choice_is_inside():
    peaks = {"a": 0.3, "b": 0.01, "noise": 1.0}  # each arm's best rate
    trained = []

    def train(make, rates):
        name = make()
        trained.extend((name, lr) for lr in rates)
        return [FakeRun(-abs(math.log10(lr) - math.log10(peaks[name]))) for lr in rates]

    arms = {name: (lambda n=name: n) for name in peaks}
    grid, runs = experiment.tune_learning_rate(
        train, arms, (0.03, 0.1), tuned=["a", "b"], max_values=6
    )
    # a's best, 0.3, needs 1.0 beyond it; b's, 0.01, needs 0.003 below it
    assert grid == [0.003, 0.01, 0.03, 0.1, 0.3, 1.0]
    for name in arms:  # every arm, the untuned one too, at every rate of the final grid
        assert sorted(runs[name]) == grid
    assert len(trained) == len(set(trained)) == 3 * 6  # no rate trained twice
    assert experiment.best_learning_rate(runs["a"]) == 0.3
    assert list(experiment.validation_scores(runs["b"])) == grid
    # the untuned arm's edge choice widens nothing
    grid, _ = experiment.tune_learning_rate(train, {"noise": arms["noise"]}, (0.03, 0.1), tuned=[])
    assert grid == [0.03, 0.1]
    # and the grid stops at max_values
    grid, _ = experiment.tune_learning_rate(train, {"b": arms["b"]}, (0.1, 0.3), max_values=3)
    assert grid == [0.03, 0.1, 0.3]
    with pytest.raises(ValueError, match="tuned arm 'c'"):
        experiment.tune_learning_rate(train, arms, (0.1,), tuned=["c"])
    # in parts: b alone, then a on b's grid; b's runs are carried on, never trained again
    trained.clear()
    grid, runs = experiment.tune_learning_rate(train, {"b": arms["b"]}, (0.03, 0.1))
    assert grid == [0.003, 0.01, 0.03, 0.1] and len(trained) == 4
    both = {name: arms[name] for name in ("a", "b")}
    grid, runs = experiment.tune_learning_rate(train, both, grid, runs=runs, max_values=6)
    assert grid == [0.003, 0.01, 0.03, 0.1, 0.3, 1.0]
    assert len(trained) == len(set(trained)) == 4 + 4 + 2 * 2
    assert sorted(runs["b"]) == sorted(runs["a"]) == grid


def test_set_population_statistics_goes_to_each_models_own_estimate():
    x = torch.rand(12, 4, 1, generator=gen(59))
    state = rbn.initial_state(12, 3, 0.1, gen(60))
    for make in (experiment.bn_lstm_classifier, experiment.input_bn_lstm_classifier):
        model = make(3, 4, seed=1)
        experiment.set_population_statistics(model, x, state)
        means = (
            model.rnn.bn_x.running_mean
            if make is experiment.bn_lstm_classifier
            else model.rnn.population_mean
        )
        assert means.abs().sum() > 0
    experiment.set_population_statistics(experiment.lstm_classifier(3), x, state)  # nothing to set


def test_the_nulls_reject_bad_input():
    with pytest.raises(ValueError, match="longer than max_steps"):
        experiment.input_bn_lstm_classifier(3, 4).train()(torch.rand(5, 6, 1))
    with pytest.raises(ValueError, match="at least 2 examples"):
        experiment.bn_lstm_written_apart_classifier(3, 4).train()(torch.rand(1, 3, 1))
    with pytest.raises(ValueError, match="gamma_init"):
        experiment.InputNormalizedLSTM(1, 3, 4, gamma_init=0.0)


def test_measure_later_gives_what_measuring_during_the_run_gives():
    x, y = tiny_task(n=64, steps=6)
    recipe = dict(steps=4, batch_size=16, eval_every=2, cut_steps=3, seed=4)

    def make():
        return experiment.bn_lstm_classifier(4, 6, seed=2)

    during = experiment.train_classifier(make(), x, y, {"val": (x, y), "test": (x, y)}, **recipe)
    later = experiment.train_classifier(make(), x, y, {"val": (x, y)}, **recipe)
    assert "test_accuracy" not in later.history.metrics and "test" not in later.correct
    later.measure_later({"test": (x, y)}, cut_steps=3)
    for name in ("test_accuracy", "test_loss", "test_cut_accuracy"):
        assert later.history[name] == pytest.approx(during.history[name], abs=1e-6)
    for split in ("test", "test_cut"):
        assert torch.equal(later.correct[split], during.correct[split])
    with pytest.raises(ValueError, match="measured already"):
        later.measure_later({"test": (x, y)})
    # the grid runner: one run a rate, each the run train_classifier makes at that rate
    runs = experiment.train_classifiers(make, [0.01, 0.1], x, y, {"val": (x, y)}, **recipe)
    alone = experiment.train_classifier(make(), x, y, {"val": (x, y)}, lr=0.1, **recipe)
    assert runs[1].history["val_accuracy"] == alone.history["val_accuracy"]
