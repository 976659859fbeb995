"""Unit tests of papernotes.randomout: the CGN against autograd's gradient by hand, resets that
touch only the filters under the threshold, cleared optimizer state, and the side-by-side
training of several networks against each network alone."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import papernotes as pn
from conftest import gen, randn
from papernotes import randomout as ro
from papernotes.randomout import experiment
from papernotes.together import minibatches


def conv_with_gradient(out=4, inp=3, seed=0):
    """A conv layer (out filters over inp channels) after one backward pass of a random loss."""
    with pn.seeded(seed):
        conv = nn.Conv2d(inp, out, kernel_size=3).double()
    x = randn(5, inp, 6, 6, seed=seed)
    target = randn(5, out, 4, 4, seed=seed + 1)
    ((conv(x) - target) ** 3).mean().backward()
    return conv


def with_gradient(conv, grad):
    conv.weight.grad = grad.to(conv.weight.dtype)
    return conv


# -- the convolutional gradient norm --------------------------------------------------------------


def test_cgn_is_the_absolute_gradient_summed_per_output_filter():
    conv = conv_with_gradient(out=4, inp=3)
    grad = conv.weight.grad
    by_hand = torch.tensor(
        [
            sum(abs(grad[k, c, i, j].item()) for c in range(3) for i in range(3) for j in range(3))
            for k in range(4)
        ],
        dtype=torch.float64,
    )
    cgn = ro.conv_gradient_norm(conv)
    assert cgn.shape == (4,)
    assert torch.allclose(cgn, by_hand, rtol=1e-12)
    assert torch.allclose(cgn, grad.abs().sum((1, 2, 3)))


def test_cgn_of_a_filter_the_loss_ignores_is_zero():
    conv = nn.Conv2d(2, 3, kernel_size=3)
    out = conv(torch.rand(4, 2, 5, 5, generator=gen()))
    out[:, [0, 2]].pow(2).sum().backward()  # filter 1 does not reach the loss
    cgn = ro.conv_gradient_norm(conv)
    assert cgn[1].item() == 0.0
    assert (cgn[[0, 2]] > 0).all()


def test_cgn_rejects_what_is_not_a_conv_or_has_no_gradient():
    with pytest.raises(TypeError, match="conv must be a torch.nn.Conv2d"):
        ro.conv_gradient_norm(nn.Linear(3, 3))
    with pytest.raises(ValueError, match="conv.weight has no gradient"):
        ro.conv_gradient_norm(nn.Conv2d(1, 2, 3))


# -- RandomOut ------------------------------------------------------------------------------------


def test_randomout_changes_only_the_filters_under_the_threshold():
    conv = conv_with_gradient(out=5, inp=2)
    grad = conv.weight.grad.clone()
    grad[1] = 0.0  # CGN 0
    grad[3] = 1e-3 / grad[3].abs().sum() * grad[3]  # CGN 1e-3, just under the threshold 2e-3
    grad[4] = 2e-3 / grad[4].abs().sum() * grad[4]  # CGN exactly at the threshold: kept
    with_gradient(conv, grad)
    with torch.no_grad():
        conv.bias.fill_(-0.7)
    before_w, before_b = conv.weight.detach().clone(), conv.bias.detach().clone()
    reset = ro.randomout_(conv, 2e-3, generator=gen(1))
    assert reset.tolist() == [1, 3]
    kept = [0, 2, 4]
    assert torch.equal(conv.weight[kept], before_w[kept])
    assert torch.equal(conv.bias[kept], before_b[kept])
    bound = 1 / math.sqrt(2 * 3 * 3)
    for k in (1, 3):
        assert not torch.equal(conv.weight[k], before_w[k])
        assert conv.weight[k].abs().max() <= bound
    # The reset filters keep their biases, as in the authors' code (a reset to 0 would hand a
    # filter born with a negative bias a kinder ticket than the one it lost).
    assert torch.equal(conv.bias, before_b)


def test_reinitialised_weights_follow_the_layers_default_distribution():
    conv = nn.Conv2d(4, 200, kernel_size=3)
    with_gradient(conv, torch.zeros_like(conv.weight))
    ro.randomout_(conv, 1e-8, generator=gen(2))
    bound = 1 / math.sqrt(4 * 9)
    w = conv.weight.detach()
    assert w.abs().max() <= bound
    assert w.var().item() == pytest.approx(bound**2 / 3, rel=0.05)  # U(-b, b): variance b^2/3
    assert w.mean().item() == pytest.approx(0.0, abs=0.02 * bound)


def test_randomout_draws_follow_its_generator():
    def fresh():
        conv = nn.Conv2d(1, 3, kernel_size=3)
        with_gradient(conv, torch.zeros_like(conv.weight))
        ro.randomout_(conv, 1e-8, generator=gen(5))
        return conv.weight.detach()

    assert torch.equal(fresh(), fresh())


def reset_with_generators(index, seeds=(7, 8)):
    conv = nn.Conv2d(1, 4, kernel_size=3)
    with_gradient(conv, torch.ones_like(conv.weight))
    before = conv.weight.detach().clone()
    grad = conv.weight.grad.clone()
    grad[index] = 0.0
    with_gradient(conv, grad)
    ro.randomout_(conv, 1e-8, generator=[gen(s) for s in seeds])
    return conv.weight.detach(), before


def test_each_block_of_filters_draws_from_its_own_generator():
    # Filters 0-1 are one network's, 2-3 another's: each network's fresh filters come from its
    # own generator, whatever the other network resets.
    both, _ = reset_with_generators([1, 3])
    bound = 1 / 3
    assert torch.equal(both[1], torch.empty(1, 3, 3).uniform_(-bound, bound, generator=gen(7)))
    assert torch.equal(both[3], torch.empty(1, 3, 3).uniform_(-bound, bound, generator=gen(8)))
    alone, before = reset_with_generators([3])
    assert torch.equal(alone[3], both[3])  # a shared generator would have drawn filter 1 first
    assert torch.equal(alone[[0, 1, 2]], before[[0, 1, 2]])
    with pytest.raises(ValueError, match="3 generators cannot split 4 filters"):
        reset_with_generators([1], seeds=(1, 2, 3))
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        ro.RandomOut(nn.Conv2d(1, 4, 3), 1e-8, generator=[gen(), "not a generator"])


def clear_state_after_one_step(optimizer_class, **kwargs):
    conv = conv_with_gradient(out=4, inp=2)
    optimizer = optimizer_class(conv.parameters(), lr=0.1, **kwargs)
    optimizer.step()  # the state (momentum, moments) now exists and is nonzero
    state = {
        name: {k: v.clone() for k, v in optimizer.state[p].items() if torch.is_tensor(v)}
        for name, p in (("weight", conv.weight), ("bias", conv.bias))
    }
    grad = conv.weight.grad.clone()
    grad[2] = 0.0
    with_gradient(conv, grad)
    assert ro.randomout_(conv, 1e-8, optimizer=optimizer).tolist() == [2]
    return conv, optimizer, state


def test_reset_clears_the_momentum_of_the_reset_filters_only():
    conv, optimizer, before = clear_state_after_one_step(torch.optim.SGD, momentum=0.9)
    for name, p in (("weight", conv.weight), ("bias", conv.bias)):
        buffer = optimizer.state[p]["momentum_buffer"]
        assert (before[name]["momentum_buffer"][2] != 0).any()
        assert (buffer[2] == 0).all()
        assert torch.equal(buffer[[0, 1, 3]], before[name]["momentum_buffer"][[0, 1, 3]])


def test_reset_clears_adams_moments_of_the_reset_filters_only():
    conv, optimizer, before = clear_state_after_one_step(torch.optim.Adam)
    for name, p in (("weight", conv.weight), ("bias", conv.bias)):
        for moment in ("exp_avg", "exp_avg_sq"):
            assert (optimizer.state[p][moment][2] == 0).all()
            assert torch.equal(
                optimizer.state[p][moment][[0, 1, 3]], before[name][moment][[0, 1, 3]]
            )
        assert torch.equal(optimizer.state[p]["step"], before[name]["step"])


def test_randomout_rejects_bad_arguments():
    conv = conv_with_gradient()
    with pytest.raises(ValueError, match="threshold must be a finite number"):
        ro.randomout_(conv, -1.0)
    with pytest.raises(TypeError, match="conv must be a torch.nn.Conv2d"):
        ro.randomout_(nn.Linear(2, 2), 1e-8)
    with pytest.raises(TypeError, match="optimizer must be a torch.optim.Optimizer"):
        ro.randomout_(conv, 1e-8, optimizer="sgd")
    with pytest.raises(ValueError, match="threshold must be a finite number"):
        ro.RandomOut(conv, math.nan)


def test_the_hook_resets_a_dead_filter_before_the_step_inside_the_books_loop():
    digits = pn.load_digits_split()
    x, y = digits.train_x[:64], digits.train_y[:64]
    dead_after = {}
    for enabled in (False, True):
        with pn.seeded(0):
            net = experiment.FilterNet(2, bias_shift=0.0)
        with torch.no_grad():
            # filter 0 never fires on the non-negative pixels: dead by its weights
            net.conv.weight[0] = -1.0
            net.conv.bias[0] = -0.05
        assert experiment.dead_filters(net, x).tolist() == [True, False]
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        log = ro.RandomOut(net.conv, 1e-8, enabled=enabled, generator=gen())
        log.attach(optimizer)
        pn.train(net, optimizer, lambda _, net=net: F.cross_entropy(net(x), y), steps=3)
        assert log.cgn.shape == (3, 2)
        assert log.cgn[0, 0] == 0.0 and log.cgn[0, 1] > 0  # logged after backward
        dead_after[enabled] = experiment.dead_filters(net, x).tolist()
        assert log.resets == ([(0, 0)] if enabled else [])
        assert net.conv.bias[0].item() == pytest.approx(-0.05, abs=0.05)  # kept, then learned
    assert dead_after == {False: [True, False], True: [False, False]}


# -- the networks ---------------------------------------------------------------------------------


def test_dead_filters_by_hand():
    net = experiment.FilterNet(3, bias_shift=0.0)
    with torch.no_grad():
        net.conv.weight.zero_()
        net.conv.weight[0] = 1.0  # fires on any image with ink
        net.conv.bias[:] = torch.tensor([0.0, -0.5, 0.5])  # filter 1 never fires; 2 always
    x = torch.rand(10, 64, generator=gen())
    assert experiment.dead_filters(net, x).tolist() == [False, True, False]
    with pytest.raises(ValueError, match="x must have shape"):
        experiment.dead_filters(net, x.reshape(10, 8, 8))


def test_filter_net_biases_lie_in_the_shifted_range():
    with pn.seeded(0):
        net = experiment.FilterNet(500, bias_shift=0.7)
    bias = net.conv.bias.detach()
    assert bias.max() <= 0 and bias.min() >= -0.7 and bias.min() < -0.6
    assert (experiment.FilterNet(4, bias_shift=0.0).conv.bias == 0).all()
    with pn.seeded(0):
        default = experiment.FilterNet(500, bias_shift=None).conv.bias.detach()
    # PyTorch's default: U(-1/sqrt(9), 1/sqrt(9)) for a 3x3 filter of one channel
    assert default.abs().max() <= 1 / 3 and default.min() < -0.3 and default.max() > 0.3
    with pytest.raises(ValueError, match="n_filters must be an integer >= 1"):
        experiment.FilterNet(0)
    with pytest.raises(ValueError, match="bias_shift must be a finite number"):
        experiment.FilterNet(2, bias_shift=-1.0)
    assert experiment.FilterNet(2, bias_shift=None, conv_bias=False).conv.bias is None


def members(n=3, n_filters=2, bias_shift=0.3):
    nets = []
    for seed in range(n):
        with pn.seeded(seed):
            nets.append(experiment.FilterNet(n_filters, bias_shift=bias_shift))
    return nets


def test_the_lottery_computes_each_members_network():
    nets = members()
    lottery = experiment.Lottery(nets)
    x = torch.rand(3, 7, 64, generator=gen())
    logits = lottery(x)
    assert logits.shape == (3, 7, 10)
    for s, net in enumerate(nets):
        assert torch.allclose(logits[s], net(x[s]), atol=1e-5)  # net uses torch's conv2d
        assert torch.equal(lottery.member(s).conv.weight, net.conv.weight)


def test_each_arm_holds_a_copy_of_every_network_fed_its_seeds_batch():
    # Member s A + a is arm a's copy of network s and sees network s's batch; images shared by
    # every member give the same logits as the same images passed once per seed.
    nets = members(n=3, bias_shift=0.0)
    lottery = experiment.Lottery(nets, arms=2)
    with torch.no_grad():
        lottery.conv_of(1).weight.mul_(-0.5)  # arm 1's filters differ from arm 0's
    x = torch.rand(3, 5, 64, generator=gen())
    logits = lottery(x)
    assert logits.shape == (6, 5, 10)
    for s, net in enumerate(nets):
        assert torch.allclose(logits[2 * s], net(x[s]), atol=1e-5)
        other = lottery.member(2 * s + 1)
        assert torch.equal(other.conv.weight, -0.5 * net.conv.weight)
        assert torch.allclose(logits[2 * s + 1], other(x[s]), atol=1e-5)
    shared = torch.rand(4, 64, generator=gen(1))
    assert torch.allclose(lottery(shared), lottery(shared.expand(3, 4, 64)), atol=1e-6)
    with pytest.raises(ValueError, match="one batch per seed"):
        lottery(torch.rand(2, 4, 64))


def test_a_lottery_without_biases_computes_each_members_network():
    nets = []
    for seed in range(2):
        with pn.seeded(seed):
            nets.append(experiment.FilterNet(1, bias_shift=None, conv_bias=False))
    lottery = experiment.Lottery(nets, arms=2)
    assert all(lottery.conv_of(a).bias is None for a in range(2))
    x = torch.rand(2, 6, 64, generator=gen())
    logits = lottery(x)
    for s, net in enumerate(nets):
        assert net.conv.bias is None
        assert torch.allclose(logits[2 * s], net(x[s]), atol=1e-5)
        assert lottery.member(2 * s + 1).conv.bias is None


def test_each_members_gradient_is_its_gradient_alone():
    nets = members()
    lottery = experiment.Lottery(nets, arms=2)
    x = torch.rand(3, 16, 64, generator=gen())
    y = torch.randint(0, 10, (6, 16), generator=gen(1))
    logits = lottery(x)
    (F.cross_entropy(logits.flatten(0, 1), y.flatten()) * 6).backward()
    for arm in range(2):
        # each arm's filters are a convolution of their own: its CGN holds its own gradients
        cgn = ro.conv_gradient_norm(lottery.conv_of(arm)).reshape(3, 2)
        for s, net in enumerate(nets):
            net.zero_grad()
            F.cross_entropy(net(x[s]), y[s * 2 + arm]).backward()
            assert torch.allclose(cgn[s], ro.conv_gradient_norm(net.conv), rtol=1e-4, atol=1e-7)


def test_lottery_rejects_mismatched_members():
    with pytest.raises(ValueError, match="same filters, classes and biases"):
        experiment.Lottery([experiment.FilterNet(2), experiment.FilterNet(3)])
    with pytest.raises(ValueError, match="same filters, classes and biases"):
        experiment.Lottery(
            [experiment.FilterNet(2), experiment.FilterNet(2, bias_shift=None, conv_bias=False)]
        )
    with pytest.raises(TypeError, match="nets must be a non-empty list of FilterNet"):
        experiment.Lottery([])
    with pytest.raises(ValueError, match="k must be below the number of members"):
        experiment.Lottery(members()).member(3)
    with pytest.raises(ValueError, match="arm must be below the number of arms"):
        experiment.Lottery(members(), arms=2).conv_of(2)


def small_run(seeds, rules, **kwargs):
    d = pn.load_digits_split()
    return experiment.train_lottery(
        d.train_x, d.train_y, d.val_x, d.val_y, seeds=seeds, rules=rules, **{"epochs": 1} | kwargs
    )


def one_run(seeds, rule, **kwargs):
    return small_run(seeds, {"arm": rule}, **kwargs)["arm"]


def test_with_a_zero_threshold_randomout_changes_nothing():
    # No CGN is below 0: the RandomOut run must be the baseline run, bit for bit (same initial
    # weights, same batches; the resets are the only difference).
    base = one_run([3, 4], experiment.NoResets())
    same = one_run([3, 4], experiment.ByCGN(0.0))
    assert same.log.resets == []
    assert torch.equal(base.model.conv_of(0).weight, same.model.conv_of(0).weight)
    assert base.history["accuracy"] == same.history["accuracy"]
    other = one_run([5, 6], experiment.NoResets())
    assert other.history["accuracy"] != base.history["accuracy"]


def test_each_members_resets_are_what_they_would_be_alone():
    # Seeds 2 and 3 both reset filters in their first epoch: member 1 of the pair must train as
    # seed 3 alone does, resets included (a generator shared by the members would hand it
    # other fresh filters).
    pair = one_run([2, 3], experiment.ByCGN(1e-8))
    alone = one_run([3], experiment.ByCGN(1e-8))
    assert min(pair.resets_per_member()) > 0
    assert [(u, r - 2) for u, r in pair.log.resets if r >= 2] == alone.log.resets
    conv, conv_alone = pair.model.conv_of(0), alone.model.conv_of(0)
    assert torch.allclose(conv.weight[2:], conv_alone.weight, atol=1e-5)
    assert torch.allclose(conv.bias[2:], conv_alone.bias, atol=1e-5)


def test_each_arm_trains_as_it_would_alone():
    # RandomOut beside the nulls: its resets and weights are those of its run alone, and a
    # null's are those of the null alone (the arms share no parameter, only the batches).
    rules = {
        "none": experiment.NoResets(),
        "ro": experiment.ByCGN(1e-8),
        "random": experiment.AtRandom(0.2),
        "early": experiment.AtRandom(0.5, until=3),
        "before": experiment.BeforeTraining(0.5),
    }
    together = small_run([2, 3], rules)
    for name, rule in rules.items():
        alone = one_run([2, 3], rule)
        run = together[name]
        assert run.arm == list(rules).index(name)
        assert run.log.resets == alone.log.resets
        assert run.draws == alone.draws
        weight, weight_alone = run.model.conv_of(run.arm).weight, alone.model.conv_of(0).weight
        assert torch.allclose(weight, weight_alone, atol=1e-5)
        assert run.history["accuracy"] == pytest.approx(alone.history["accuracy"], abs=1e-6)
        d = pn.load_digits_split()
        accuracy = run.accuracy(d.test_x, d.test_y)
        assert accuracy.shape == (2,)
        assert torch.allclose(accuracy, alone.accuracy(d.test_x, d.test_y), atol=1e-6)
        assert run.dead_filters(d.train_x).shape == (2, 2)
    assert len(together["ro"].log.resets) > 0 and len(together["random"].log.resets) > 0


def test_random_resets_at_rate_zero_are_the_baseline_bit_for_bit():
    base = one_run([2, 3], experiment.NoResets())
    zero = one_run([2, 3], experiment.AtRandom(0.0))
    assert zero.log.resets == []
    assert torch.equal(base.model.conv_of(0).weight, zero.model.conv_of(0).weight)
    assert base.history["accuracy"] == zero.history["accuracy"]
    # the baseline's log is the experiment's own gradient norm, the CGN of the same gradients
    assert isinstance(base.log, experiment.GradientLog)
    assert base.log.cgn.shape == (8, 4)


def test_random_resets_ignore_the_gradient_and_follow_their_own_streams():
    run = one_run([2, 3], experiment.AtRandom(0.2))
    again = one_run([2, 3], experiment.AtRandom(0.2))
    assert run.log.resets == again.log.resets and len(run.log.resets) > 0
    assert torch.equal(run.model.conv_of(0).weight, again.model.conv_of(0).weight)
    # about rate x updates x networks resets, of filters whatever their CGN
    assert 0.5 * 0.2 * 16 <= len(run.log.resets) <= 2 * 0.2 * 16
    cgn = run.log.cgn
    assert any(cgn[u, row] > 1e-3 for u, row in run.log.resets)
    # each network's resets are its own: network 1 alone resets as it did beside network 0
    alone = one_run([3], experiment.AtRandom(0.2))
    assert [(u, r - 2) for u, r in run.log.resets if r >= 2] == alone.log.resets


def test_early_random_resets_stop_at_their_update_and_draw_as_the_plain_ones_until_then():
    early = one_run([2, 3], experiment.AtRandom(0.5, until=4))
    plain = one_run([2, 3], experiment.AtRandom(0.5))
    assert early.log.resets and all(u < 4 for u, _ in early.log.resets)
    assert early.log.resets == [(u, r) for u, r in plain.log.resets if u < 4]


def test_a_random_reset_redraws_the_weights_keeps_the_bias_and_clears_the_momentum():
    conv = nn.Conv2d(1, 4, kernel_size=3)
    with torch.no_grad():
        conv.bias.fill_(-0.6)
    optimizer = torch.optim.SGD(conv.parameters(), lr=0.1, momentum=0.9)
    conv.weight.grad, conv.bias.grad = torch.ones_like(conv.weight), torch.ones_like(conv.bias)
    optimizer.step()  # a momentum buffer of ones
    before = conv.weight.detach().clone()
    bias = conv.bias.detach().clone()
    resets = experiment.RandomResets(
        conv, 2, 1.0, choosers=[gen(1), gen(2)], fresh=[gen(3), gen(4)]
    )
    resets._before_step(optimizer)  # rate 1: one filter of each network
    rows = [row for _, row in resets.resets]
    assert len(rows) == 2 and rows[0] in (0, 1) and rows[1] in (2, 3)
    kept = [k for k in range(4) if k not in rows]
    assert torch.equal(conv.weight[kept], before[kept])
    assert all(not torch.equal(conv.weight[k], before[k]) for k in rows)
    assert conv.weight[rows].abs().max() <= 1 / 3
    assert torch.equal(conv.bias, bias)
    for p in (conv.weight, conv.bias):
        buffer = optimizer.state[p]["momentum_buffer"]
        assert (buffer[rows] == 0).all() and (buffer[kept] != 0).all()
    with pytest.raises(ValueError, match="one chooser and one fresh-filter generator"):
        experiment.RandomResets(conv, 2, 0.1, choosers=[gen(1)], fresh=[gen(3)])


def test_firing_fraction_counts_the_images_where_a_filter_fires_somewhere():
    net = experiment.FilterNet(3, bias_shift=0.0)
    with torch.no_grad():
        net.conv.weight.normal_(generator=gen(4))
        net.conv.bias[:] = torch.tensor([0.0, -1.0, 0.5])
    x = torch.rand(40, 64, generator=gen(5))
    by_hand = (net.features(x).amax(dim=(2, 3)) > 0).float().mean(0)  # (filters,)
    found = experiment.firing_fraction(net.conv.weight.reshape(3, 9), net.conv.bias, x)
    assert torch.allclose(found, by_hand)
    no_bias = experiment.firing_fraction(net.conv.weight.reshape(3, 9), None, x)
    with torch.no_grad():
        net.conv.bias.zero_()
    assert torch.allclose(no_bias, (net.features(x).amax(dim=(2, 3)) > 0).float().mean(0))


def test_the_redraw_before_training_redraws_only_filters_that_fire_too_rarely():
    d = pn.load_digits_split()
    x = d.train_x[:200]
    conv = nn.Conv2d(2, 4, kernel_size=3, groups=2)  # two networks of two filters
    with torch.no_grad():
        conv.weight.fill_(0.1)
        conv.weight[1] = -1.0  # network 0's filter 1 never fires
        conv.bias[:] = torch.tensor([0.0, -0.3, -0.7, 0.0])  # network 1's filter 0: rarely
    before_w, before_b = conv.weight.detach().clone(), conv.bias.detach().clone()
    fraction = experiment.firing_fraction(conv.weight.reshape(4, 9), conv.bias, x)
    assert fraction[1] == 0 and 0 < fraction[2] < 0.5 and fraction[0] == fraction[3] == 1
    draws = experiment.redraw_before_training_(conv, 2, x, 0.5, [gen(1), gen(2)])
    assert draws[0] == draws[3] == 0 and draws[1] > 0 and draws[2] > 0
    assert torch.equal(conv.weight[[0, 3]], before_w[[0, 3]])
    assert torch.equal(conv.bias, before_b)  # biases kept, as RandomOut keeps them
    after = experiment.firing_fraction(conv.weight.reshape(4, 9), conv.bias, x)
    assert (after[[1, 2]] >= 0.5).all()
    assert conv.weight.abs().max() <= 1 / 3
    # network 1's filter draws from network 1's generator, whatever network 0 draws
    first = torch.empty(1, 3, 3).uniform_(-1 / 3, 1 / 3, generator=gen(2))
    alone = nn.Conv2d(1, 1, 3)
    with torch.no_grad():
        alone.weight.copy_(before_w[2:3])
        alone.bias.copy_(before_b[2:3])
    experiment.redraw_before_training_(alone, 1, x, 0.5, [gen(2)])
    assert torch.equal(alone.weight[0], conv.weight[2])
    if draws[2] == 1:
        assert torch.equal(conv.weight[2], first)
    # 0 redraws nothing; the cap stops a filter that cannot fire
    assert experiment.redraw_before_training_(conv, 2, x, 0.0, [gen(1), gen(2)]) == [0] * 4
    hopeless = nn.Conv2d(1, 1, 3)
    with torch.no_grad():
        hopeless.bias.fill_(-100.0)
    assert experiment.redraw_before_training_(hopeless, 1, x, 0.001, [gen()], max_draws=7) == [7]


def test_the_nulls_do_not_call_the_mechanism(monkeypatch):
    # A broken RandomOut (tests/mutants/randomout.py) must not move the runs without it.
    nulls = {
        "none": experiment.NoResets(),
        "random": experiment.AtRandom(0.3),
        "early": experiment.AtRandom(0.5, until=3),
        "before": experiment.BeforeTraining(0.5),
    }
    expected = small_run([2], nulls)

    def broken(*args, **kwargs):
        raise AssertionError("a null called the mechanism")

    names = (
        "conv_gradient_norm",
        "filters_to_reset",
        "reinitialise_filters_",
        "clear_filter_state_",
        "randomout_",
    )
    for name in names:
        monkeypatch.setattr(ro, name, broken)
    again = small_run([2], nulls)
    for name, before in expected.items():
        assert again[name].log.resets == before.log.resets
        assert torch.equal(
            again[name].model.conv_of(again[name].arm).weight,
            before.model.conv_of(before.arm).weight,
        )
    with pytest.raises(AssertionError, match="called the mechanism"):
        one_run([2], experiment.ByCGN(1e-8))


def test_the_authors_rule_redraws_a_dead_filter_at_every_update_until_it_fires():
    # A filter dead on the whole training set has a CGN of 0 on every minibatch, so the
    # authors' tau = 1e-30 draws it again before every update until a draw fires (the
    # chapter's old check that no filter ends dead, a consequence of the rule).
    digits = pn.load_digits_split()
    x, y = digits.train_x[:64], digits.train_y[:64]
    with pn.seeded(0):
        net = experiment.FilterNet(2, bias_shift=0.0)
    with torch.no_grad():
        net.conv.weight[0] = -1.0
        net.conv.bias[0] = -0.9  # a kept bias this low makes most fresh draws dead too
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    log = ro.RandomOut(net.conv, 1e-30, generator=gen(3))
    log.attach(optimizer)
    pn.train(net, optimizer, lambda _: F.cross_entropy(net(x), y), steps=40)
    updates = [u for u, k in log.resets if k == 0]
    assert len(updates) > 1
    assert updates == list(range(len(updates)))  # reset at every update while dead
    assert experiment.dead_filters(net, x).tolist() == [False, False]


def test_train_lottery_rejects_bad_arguments():
    d = pn.load_digits_split()

    def train(**kwargs):
        arguments = dict(seeds=[0], rules={"ro": experiment.ByCGN(1e-8)}) | kwargs
        return experiment.train_lottery(d.train_x, d.train_y, d.val_x, d.val_y, **arguments)

    with pytest.raises(ValueError, match="train_x must have shape"):
        experiment.train_lottery(
            d.train_x.reshape(-1, 8, 8), d.train_y, d.val_x, d.val_y, seeds=[0], rules={}
        )
    with pytest.raises(ValueError, match="seeds must be one or more different integers"):
        train(seeds=[1, 1])
    with pytest.raises(TypeError, match="rules must be a non-empty dict"):
        train(rules={})
    with pytest.raises(TypeError, match=r"rules\['x'\] must be NoResets, ByCGN"):
        train(rules={"x": 0.1})
    with pytest.raises(ValueError, match="threshold must be a finite number"):
        train(rules={"ro": experiment.ByCGN(-1.0)})
    with pytest.raises(ValueError, match="rate must be a finite number"):
        train(rules={"r": experiment.AtRandom(2.0)})
    with pytest.raises(ValueError, match="until must be an integer"):
        train(rules={"r": experiment.AtRandom(0.1, until=-1)})
    with pytest.raises(ValueError, match="min_fraction must be a finite number"):
        train(rules={"b": experiment.BeforeTraining(1.5)})
    with pytest.raises(ValueError, match="bias_shift must be None when conv_bias is False"):
        train(conv_bias=False)


# -- the chapter's measurements -------------------------------------------------------------------


def test_seed_summary_counts_failures_below_one_half():
    summary = experiment.seed_summary([0.2, 0.9, 0.95, 0.49, 1.0])
    assert summary["failed"] == pytest.approx(2 / 5)
    assert summary["median"] == 0.9
    assert summary["mean"] == pytest.approx(3.54 / 5)
    assert summary["min"] == 0.2
    assert summary["std"] == pytest.approx(
        torch.tensor([0.2, 0.9, 0.95, 0.49, 1.0]).std(correction=0).item(), rel=1e-6
    )
    assert experiment.seed_summary([0.5, 0.5])["failed"] == 0.0  # 50% is not a failure


def test_death_update_is_where_the_cgn_stays_at_zero_for_good():
    cgn = torch.tensor(
        [[1.0, 2.0], [0.0, 1.0], [3.0, 0.5], [0.0, 0.0], [0.0, 0.0]]  # (updates, filters)
    )
    # Filter 0 is at 0 at update 1 but recovers; from update 3 both stay at 0.
    assert experiment.death_update(cgn) == 3
    cgn[4, 1] = 1e-9  # filter 1 comes back at the last update; filter 0 still dies at 3
    assert experiment.death_update(cgn) == 3
    cgn[4, 0] = 1e-9
    assert experiment.death_update(cgn) is None
    assert experiment.death_update(torch.zeros(4, 2)) == 0


def test_the_paired_standard_error_is_the_differences_sd_over_root_n():
    first, second = [0.9, 0.8, 0.7, 0.95], [0.9, 0.1, 0.7, 0.9]
    d = torch.tensor(first, dtype=torch.float64) - torch.tensor(second, dtype=torch.float64)
    assert experiment.paired_standard_error(first, second) == pytest.approx((d.std() / 2).item())
    assert experiment.paired_standard_error([0.5, 0.6], [0.5, 0.6]) == 0.0
    with pytest.raises(ValueError, match="two pairs"):
        experiment.paired_standard_error([0.5], [0.4])


def test_the_bootstrap_resamples_seeds_in_pairs():
    a = [0.9 + 0.01 * i for i in range(20)]
    # the same arm twice: every resample's difference is 0
    assert experiment.bootstrap_standard_error(a, a, "median", generator=gen(0)) == 0.0
    # a constant shift moves the median and the mean by the shift in every resample, and never
    # the spread
    b = [x - 0.05 for x in a]
    assert experiment.bootstrap_standard_error(a, b, "std", generator=gen(0)) < 1e-12
    assert experiment.bootstrap_standard_error(a, b, "mean", generator=gen(0)) < 1e-12
    # independent noise gives a spread near the analytic SE of a difference of means
    noise = torch.randn(400, generator=gen(1), dtype=torch.float64)
    other = torch.randn(400, generator=gen(2), dtype=torch.float64)
    se = experiment.bootstrap_standard_error(noise, other, "mean", generator=gen(3))
    assert se == pytest.approx(math.sqrt(2 / 400), rel=0.15)
    one = experiment.bootstrap_standard_error(noise, other, "median", generator=gen(4))
    assert one == experiment.bootstrap_standard_error(noise, other, "median", generator=gen(4))
    with pytest.raises(ValueError, match="statistic must be one of"):
        experiment.bootstrap_standard_error(a, a, "max", generator=gen(0))


def test_epochs_to_reach_counts_from_one_and_charges_a_miss_the_budget_plus_one():
    curve = [0.1, 0.5, 0.89, 0.9, 0.85, 0.95]
    assert experiment.epochs_to_reach(curve, 0.9) == 4  # first reached at the end of epoch 4
    assert experiment.epochs_to_reach(curve, 0.05) == 1
    assert experiment.epochs_to_reach(curve, 0.96) == 7  # never: 6 epochs + 1
    with pytest.raises(ValueError, match="level"):
        experiment.epochs_to_reach(curve, 1.5)
    with pytest.raises(ValueError, match="accuracies"):
        experiment.epochs_to_reach([[0.5, 0.6]], 0.5)


def test_paired_failures_count_the_seeds_that_fail_in_one_arm_only():
    first = [0.9, 0.1, 0.95, 0.2, 0.5, 0.3]
    second = [0.1, 0.1, 0.2, 0.9, 0.49, 0.9]
    # fail in second only: seeds 0, 2, 4; in first only: seeds 3, 5; both: seed 1
    assert experiment.paired_failures(first, second) == (3, 2)
    # second fails on 4 seeds; McNemar's bound: 4 - 2 sqrt(3 + 2)
    assert experiment.failure_bound(first, second) == pytest.approx(4 - 2 * math.sqrt(5))
    assert experiment.failure_bound(first, second, k=1) == pytest.approx(4 - math.sqrt(5))
    with pytest.raises(ValueError, match="second must have shape"):
        experiment.paired_failures([0.1, 0.2], [0.3])


def test_a_tie_within_one_paired_standard_error_goes_to_the_preferred_value():
    scores = {
        1e-30: [0.90, 0.80, 0.85, 0.95],
        1e-2: [0.91, 0.81, 0.86, 0.97],  # better by 0.0125, paired SE 0.0025: not a tie
        1e-1: [0.2, 0.3, 0.2, 0.1],
    }
    assert experiment.choose_with_ties(scores, 1e-30) == 1e-2
    assert experiment.choose_with_ties(scores, 1e-30, k=10) == 1e-30
    scores[1e-2] = [0.95, 0.75, 0.86, 0.95]  # better by 0.0025, paired SE 0.02: a tie
    assert experiment.choose_with_ties(scores, 1e-30) == 1e-30
    assert experiment.choose_with_ties(scores, 1e-2) == 1e-2
    with pytest.raises(ValueError, match="prefer must be one of the grid's values"):
        experiment.choose_with_ties(scores, 0.5)


def test_a_runs_dead_filters_are_those_of_its_networks_one_by_one():
    run = one_run([2, 3, 4], experiment.NoResets(), bias_shift=1.0)
    d = pn.load_digits_split()
    by_network = torch.stack(
        [experiment.dead_filters(run.model.member(k), d.train_x) for k in range(3)]
    )
    assert torch.equal(run.dead_filters(d.train_x), by_network)
    assert by_network.any()  # biases from U(-1, 0): some filters are dead


def test_an_arms_logits_alone_are_its_rows_of_the_whole_lotterys():
    for bias_shift, conv_bias in ((0.5, True), (None, False)):
        nets = []
        for seed in range(3):
            with pn.seeded(seed):
                nets.append(experiment.FilterNet(2, bias_shift=bias_shift, conv_bias=conv_bias))
        lottery = experiment.Lottery(nets, arms=2)
        with torch.no_grad():
            lottery.conv_of(1).weight.mul_(-0.7)
        x = torch.rand(11, 64, generator=gen())
        y = torch.randint(0, 10, (11,), generator=gen(1))
        whole = lottery.class_logits(x)
        for arm in range(2):
            alone = lottery.arm_class_logits(x, arm)
            assert torch.allclose(alone, whole[arm::2], atol=1e-6)
        run = experiment.LotteryRun(lottery, pn.History(), None, (0, 1, 2), None, 1, [])
        assert torch.equal(run.accuracy(x, y), experiment.member_accuracy(lottery, x, y)[1::2])


# -- the mutation survivors (tests/mutation/randomout.yml) ----------------------------------------


def test_the_hook_clears_the_momentum_of_the_filters_it_resets():
    # The hook hands its optimizer to randomout_: a reset filter starts its new ticket without
    # the momentum that killed the old one (buffer 0.9 * old + new gradient 0 = 0, not 0.9 old).
    conv = nn.Conv2d(1, 3, kernel_size=3)
    optimizer = torch.optim.SGD(conv.parameters(), lr=0.1, momentum=0.9)
    conv.weight.grad, conv.bias.grad = torch.ones_like(conv.weight), torch.ones_like(conv.bias)
    optimizer.step()  # momentum buffers of ones
    log = ro.RandomOut(conv, 1e-8, generator=gen())
    log.attach(optimizer)
    conv.weight.grad[1], conv.bias.grad[1] = 0.0, 0.0  # filter 1's CGN is 0
    optimizer.step()
    assert log.resets == [(0, 1)]
    for p in (conv.weight, conv.bias):
        buffer = optimizer.state[p]["momentum_buffer"]
        assert (buffer[1] == 0).all()
        assert torch.allclose(buffer[[0, 2]], torch.full_like(buffer[[0, 2]], 1.9))


def test_a_reset_filter_of_a_float64_layer_draws_float64_weights_from_its_block():
    # The weights of filter 3 are the first float64 draw of block 1's generator (float32 draws
    # would be other numbers, and could not be written into the float64 weight).
    conv = nn.Conv2d(1, 4, kernel_size=3).double()
    grad = torch.ones_like(conv.weight)
    grad[3] = 0.0
    with_gradient(conv, grad)
    ro.randomout_(conv, 1e-8, generator=[gen(7), gen(8)])
    expected = torch.empty(1, 3, 3, dtype=torch.float64).uniform_(-1 / 3, 1 / 3, generator=gen(8))
    assert torch.equal(conv.weight[3].detach(), expected)


def test_reinitialising_no_filter_changes_nothing():
    for conv in (nn.Conv2d(1, 4, kernel_size=3), nn.Conv2d(1, 4, kernel_size=3).double()):
        before = conv.weight.detach().clone()
        empty = torch.empty(0, dtype=torch.long)
        ro.reinitialise_filters_(conv, empty, [gen(1), gen(2)])
        ro.reinitialise_filters_(conv, empty, gen(1))
        assert torch.equal(conv.weight, before)


def test_a_layer_of_one_filter_is_reset_within_its_bound():
    # bound 1/sqrt(in x 3 x 3) of the layer's only filter
    conv = nn.Conv2d(2, 1, kernel_size=3)
    with_gradient(conv, torch.zeros_like(conv.weight))
    assert ro.randomout_(conv, 1e-8, generator=gen(3)).tolist() == [0]
    expected = torch.empty(1, 2, 3, 3).uniform_(
        -1 / math.sqrt(18), 1 / math.sqrt(18), generator=gen(3)
    )
    assert torch.equal(conv.weight.detach(), expected)


def test_a_shift_of_zero_zeroes_the_biases_and_leaves_the_seeds_other_weights_as_pytorchs():
    # FilterNet's weights are PyTorch's defaults under the seed: biases at 0 (bias_shift = 0) are
    # set, not drawn, so the classifier's weights are those the seed gives without the shift.
    with pn.seeded(4):
        zero = experiment.FilterNet(2, bias_shift=0.0)
    with pn.seeded(4):
        default = experiment.FilterNet(2, bias_shift=None)
    assert (zero.conv.bias == 0).all()
    assert torch.equal(zero.conv.weight, default.conv.weight)
    assert torch.equal(zero.head.weight, default.head.weight)


def test_a_member_is_its_network_whatever_its_classes():
    nets = []
    for seed in range(2):
        with pn.seeded(seed):
            nets.append(experiment.FilterNet(1, bias_shift=0.5, n_classes=3))
    member = experiment.Lottery(nets, arms=2).member(2)  # network 1, arm 0
    x = torch.rand(5, 64, generator=gen())
    assert member.head.out_features == 3
    assert torch.equal(member(x), nets[1](x))


def fake_run(resets, seeds=(0, 1, 2), n_filters=2):
    lottery = experiment.Lottery(members(n=len(seeds), n_filters=n_filters))
    log = experiment.GradientLog(lottery.conv_of(0))
    log.resets = resets
    return experiment.LotteryRun(lottery, pn.History(), log, seeds, experiment.NoResets(), 0, [])


def test_resets_per_member_counts_each_networks_resets():
    # rows 0-1 are network 0's filters, 2-3 network 1's, 4-5 network 2's
    run = fake_run([(0, 0), (0, 1), (3, 1), (5, 5)])
    assert run.resets_per_member() == [3, 0, 1]
    assert fake_run([]).resets_per_member() == [0, 0, 0]


def test_a_random_reset_before_the_first_step_needs_no_momentum_yet():
    conv = nn.Conv2d(1, 4, kernel_size=3)
    optimizer = torch.optim.SGD(conv.parameters(), lr=0.1, momentum=0.9)  # no state yet
    conv.weight.grad = torch.ones_like(conv.weight)
    resets = experiment.RandomResets(
        conv, 2, 1.0, choosers=[gen(1), gen(2)], fresh=[gen(3), gen(4)]
    )
    resets._before_step(optimizer)
    assert [u for u, _ in resets.resets] == [0, 0]


def test_early_random_resets_number_the_updates_from_zero_and_stop_at_until():
    conv = nn.Conv2d(1, 2, kernel_size=3)
    optimizer = torch.optim.SGD(conv.parameters(), lr=0.1)
    conv.weight.grad = torch.ones_like(conv.weight)
    resets = experiment.RandomResets(conv, 2, 1.0, choosers=[gen(1)], fresh=[gen(3)], until=2)
    for _ in range(4):
        resets._before_step(optimizer)
    assert [u for u, _ in resets.resets] == [0, 1]  # rate 1: updates 0 and 1, then none
    assert resets.cgn.shape == (4, 2)


def test_each_arms_history_holds_the_lotterys_training_loss_and_its_accuracy_per_epoch():
    # the loss logged is the lottery's (the members' mean losses summed), the same in every
    # arm's History, once an epoch beside the arm's accuracy
    runs = small_run([2], {"a": experiment.NoResets(), "b": experiment.AtRandom(0.0)}, epochs=2)
    loss = runs["a"].history["loss"]
    assert len(loss) == len(runs["a"].history["accuracy"]) == 2
    assert loss == runs["b"].history["loss"]
    assert all(0 < value < 2 * 1.1 * math.log(10) for value in loss)  # two members near chance


def test_each_rule_draws_from_its_seeds_own_streams():
    # The hooks' random streams are stream FRESH_FILTERS (RandomOut), RANDOM_CHOICE and
    # NULL_FILTERS (random resets) of each network's own seed.
    def same(generators, stream, seeds):
        states = [g.get_state() for g in generators]
        return all(
            torch.equal(s, pn.generator(seed, stream).get_state())
            for s, seed in zip(states, seeds, strict=True)
        )

    conv = nn.Conv2d(2, 4, kernel_size=3, groups=2)
    seeds = (3, 5)
    randomout = experiment._rule_log(experiment.ByCGN(1e-8), conv, seeds, 2)
    assert same(randomout.generator, experiment.FRESH_FILTERS, seeds)
    random = experiment._rule_log(experiment.AtRandom(0.1), conv, seeds, 2)
    assert same(random.choosers, experiment.RANDOM_CHOICE, seeds)
    assert same(random.fresh, experiment.NULL_FILTERS, seeds)


def subset_of_classes(n_classes=4):
    d = pn.load_digits_split()
    keep = d.train_y < n_classes
    return d.train_x[keep], d.train_y[keep], d.val_x, d.val_y


def test_a_lottery_of_one_network_trains_as_the_books_plain_loop_trains_it_alone(monkeypatch):
    # One network of one filter, no bias, on 4 classes: train_lottery must build the network
    # its seed gives, draw the seed's minibatches (stream BATCHES) and take SGD steps of the given
    # lr and momentum, evaluated at the end of every epoch.
    x, y, vx, vy = subset_of_classes()
    setting = dict(n_filters=1, bias_shift=None, conv_bias=False, batch_size=100, lr=0.3)
    run = experiment.train_lottery(
        x,
        y,
        vx,
        vy,
        seeds=[7],
        rules={"none": experiment.NoResets()},
        epochs=2,
        momentum=0.5,
        **setting,
    )["none"]
    with pn.seeded(7):
        net = experiment.FilterNet(1, bias_shift=None, conv_bias=False, n_classes=4)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.3, momentum=0.5)
    batches = minibatches(len(x), 100, [pn.generator(7, experiment.BATCHES)])
    for _ in range(2 * (len(x) // 100)):
        index = next(batches)[0]
        optimizer.zero_grad()
        F.cross_entropy(net(x[index]), y[index]).backward()
        optimizer.step()
    member = run.model.member(0)
    assert member.head.out_features == 4 and member.conv.bias is None
    assert torch.allclose(member.conv.weight, net.conv.weight, atol=1e-5)
    assert torch.allclose(member.head.weight, net.head.weight, atol=1e-5)
    assert len(run.history["accuracy"]) == 2  # one evaluation an epoch


def test_a_runs_draws_before_training_follow_the_seeds_redraw_stream(monkeypatch):
    # BeforeTraining redraws each network's filters from stream REDRAW of its own seed and
    # returns the draws each filter took; the other rules draw nothing (zeros).
    seen = []

    def spy(conv, n_filters, x, min_fraction, generators, **kwargs):
        seen.append([g.get_state() for g in generators])
        return redraw(conv, n_filters, x, min_fraction, generators, **kwargs)

    redraw = experiment.redraw_before_training_
    monkeypatch.setattr(experiment, "redraw_before_training_", spy)
    rules = {"none": experiment.NoResets(), "before": experiment.BeforeTraining(0.9)}
    runs = small_run([2, 3], rules, bias_shift=1.0)
    assert [run.rule for run in runs.values()] == list(rules.values())
    assert runs["none"].draws == [0, 0, 0, 0]
    assert len(seen) == 1
    for state, seed in zip(seen[0], (2, 3), strict=True):
        assert torch.equal(state, pn.generator(seed, experiment.REDRAW).get_state())
    # the draws returned are the run's: the same nets redrawn from the same streams
    nets = []
    for seed in (2, 3):
        with pn.seeded(seed):
            nets.append(experiment.FilterNet(2, bias_shift=1.0))
    conv = experiment.Lottery(nets).conv_of(0)
    d = pn.load_digits_split()
    generators = [pn.generator(seed, experiment.REDRAW) for seed in (2, 3)]
    assert runs["before"].draws == redraw(conv, 2, d.train_x, 0.9, generators)
    assert sum(runs["before"].draws) > 0


def test_a_filter_that_never_fires_has_a_firing_fraction_of_zero():
    # ReLU(0) = 0: a filter whose pre-activation is at most 0 everywhere does not fire
    x = torch.rand(6, 64, generator=gen())
    zero = experiment.firing_fraction(torch.zeros(2, 9), torch.zeros(2), x)
    assert zero.tolist() == [0.0, 0.0]
    assert experiment.firing_fraction(torch.zeros(1, 9), None, x).tolist() == [0.0]


def test_the_redraw_before_training_handles_filters_without_bias_and_keeps_those_at_the_bar():
    # two images: one blank, one all ink; a filter of ones fires on the inked one only
    x = torch.stack([torch.zeros(64), torch.ones(64)])
    conv = nn.Conv2d(1, 2, kernel_size=3, bias=False)
    with torch.no_grad():
        conv.weight[0] = 1.0  # fires on exactly half the images: at the bar, kept
        conv.weight[1] = -1.0  # fires on none: redrawn until it fires
    before = conv.weight.detach().clone()
    draws = experiment.redraw_before_training_(conv, 2, x, 0.5, [gen(1)])
    assert draws[0] == 0 and draws[1] > 0
    assert torch.equal(conv.weight[0], before[0])
    assert experiment.firing_fraction(conv.weight[1].reshape(1, 9), None, x).item() == 0.5


def test_the_redraw_before_training_stops_after_a_thousand_draws_by_default():
    hopeless = nn.Conv2d(1, 1, 3)
    with torch.no_grad():
        hopeless.bias.fill_(-100.0)
    x = torch.rand(2, 64, generator=gen())
    assert experiment.redraw_before_training_(hopeless, 1, x, 0.5, [gen()]) == [1000]


def test_member_dead_filters_are_each_members_dead_filters():
    nets = members(n=2, bias_shift=0.0)
    with torch.no_grad():
        nets[1].conv.weight[0] = -1.0  # network 1's filter 0 never fires on ink in [0, 1]
    lottery = experiment.Lottery(nets, arms=2)
    with torch.no_grad():
        lottery.conv_of(1).weight[1] = -1.0  # arm 1's copy of network 0's filter 1
    x = torch.rand(20, 64, generator=gen())
    dead = experiment.member_dead_filters(lottery, x)
    # members s A + a: (net 0, arm 0), (net 0, arm 1), (net 1, arm 0), (net 1, arm 1)
    assert dead.tolist() == [[False, False], [False, True], [True, False], [True, False]]


def test_the_bootstrap_takes_two_thousand_resamples_of_the_seed_pairs_by_default():
    a = torch.rand(7, generator=gen(1), dtype=torch.float64)
    b = torch.rand(7, generator=gen(2), dtype=torch.float64)
    index = torch.randint(7, (2000, 7), generator=gen(3))  # 2,000 resamples of 7 pairs
    by_hand = (a[index].mean(1) - b[index].mean(1)).std().item()
    found = experiment.bootstrap_standard_error(a.tolist(), b.tolist(), "mean", generator=gen(3))
    assert found == pytest.approx(by_hand, rel=1e-12)


def test_a_gap_of_one_to_two_standard_errors_is_no_tie_and_equal_scores_are():
    prefer = [0.90, 0.80, 0.85, 0.95]
    # paired differences (0, 0, 0.03, 0.03): gap 0.015, SE 0.01 sqrt(3) / 2 = 0.00866, a gap of
    # 1.73 SE: beyond the one standard error of a tie (the chapter's k = 1), within two
    other = [0.90, 0.80, 0.88, 0.98]
    assert experiment.paired_standard_error(other, prefer) == pytest.approx(0.005 * math.sqrt(3))
    assert experiment.choose_with_ties({0: prefer, 1: other}, 0) == 1
    assert experiment.choose_with_ties({0: prefer, 1: other}, 0, k=2) == 0
    # the same scores: a tie, kept by the preferred value whatever the grid's order
    assert experiment.choose_with_ties({1: list(prefer), 0: prefer}, 0) == 0


def test_accuracies_are_read_as_given_not_rounded_to_float32():
    # 0.8 - 1e-9 and 0.5 - 1e-9 are one float32 with 0.8 and 0.5, but stay below them
    assert experiment.epochs_to_reach([0.8 - 1e-9, 0.8], 0.8) == 2
    assert experiment.paired_failures([0.5 - 1e-9, 0.9], [0.9, 0.5 - 1e-9]) == (1, 1)


def test_a_run_at_exactly_one_half_has_not_failed():
    # seed_summary's rule: a failure is below 50%; 50% is not one
    first, second = [0.9, 0.9, 0.9], [0.5, 0.1, 0.5]
    assert experiment.paired_failures(first, second) == (1, 0)
    assert experiment.paired_failures(second, first) == (0, 1)
    assert experiment.failure_bound(first, second) == pytest.approx(1 - 2 * 1.0)
