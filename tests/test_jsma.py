"""Unit tests of papernotes.jsma and its experiment: hand-made Jacobians and linear models whose
attack can be followed by hand, torch's own Jacobian, the attack's guarantees on a trained
network, and the chapter's measurements on hand-made attacks."""

import itertools
import math

import pytest
import torch
from torch import nn

from conftest import gen, randn
from papernotes import jsma
from papernotes.data import load_digits_split
from papernotes.jsma import experiment


def linear(weight, bias=None) -> nn.Linear:
    """A linear model with the given weights (classes, features), in float64."""
    weight = torch.as_tensor(weight, dtype=torch.float64)
    layer = nn.Linear(weight.shape[1], weight.shape[0], dtype=torch.float64)
    with torch.no_grad():
        layer.weight.copy_(weight)
        layer.bias.copy_(torch.zeros(weight.shape[0]) if bias is None else torch.as_tensor(bias))
    return layer


@pytest.fixture(scope="module")
def trained():
    """A small MLP trained briefly on the digits, with 30 test digits and a target for each."""
    digits = load_digits_split()
    model = experiment.train_classifier(digits, steps=300, seed=0).model
    x = digits.test_x[:30]
    with torch.no_grad():
        source = model(x).argmax(1)
    return model, x, (source + 1 + torch.arange(30) % 9) % 10


# -- the forward derivative -----------------------------------------------------------------------


def test_forward_derivative_of_a_linear_model_is_its_weight_matrix():
    weight = randn(3, 5, seed=1)
    jacobian = jsma.forward_derivative(linear(weight), randn(4, 5, seed=2))
    assert jacobian.shape == (4, 3, 5)
    assert torch.allclose(jacobian, weight.expand(4, -1, -1))


def test_forward_derivative_matches_torchs_jacobian_row_by_row():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 4)).double()
    x = randn(3, 6, seed=3)
    jacobian = jsma.forward_derivative(model, x)
    for i in range(3):
        expected = torch.autograd.functional.jacobian(model, x[i])
        assert torch.allclose(jacobian[i], expected)


def test_forward_derivative_rejects_an_unflattened_batch():
    with pytest.raises(ValueError, match="x must have shape"):
        jsma.forward_derivative(linear(randn(3, 5)), randn(2, 1, 5))


# -- the saliency map -----------------------------------------------------------------------------


# One example, three classes, four features; the target is class 0. Column by column:
#   dF_0/dx:            1    -1     2    0.5
#   sum_{j!=0} dF_j/dx: -2   -1     1   -0.5
HAND = torch.tensor([[[1.0, -1.0, 2.0, 0.5], [-1.0, 0.0, 0.5, -1.0], [-1.0, -1.0, 0.5, 0.5]]])


def test_increasing_saliency_keeps_features_that_raise_the_target_and_lower_the_rest():
    # feature 1: the target's derivative is negative; feature 2: the others rise too.
    s = jsma.saliency_map(HAND, torch.tensor([0]), increase=True)
    assert torch.equal(s, torch.tensor([[1.0 * 2.0, 0.0, 0.0, 0.5 * 0.5]]))


def test_decreasing_saliency_turns_both_conditions_over():
    # Decreasing x_i helps when dF_t/dx_i < 0 and the others' sum is > 0: no feature of HAND.
    assert torch.equal(
        jsma.saliency_map(HAND, torch.tensor([0]), increase=False), torch.zeros(1, 4)
    )
    flipped = torch.tensor([[[-1.0, 3.0], [0.5, -1.0], [1.0, 0.5]]])  # others' sums: 1.5, -0.5
    s = jsma.saliency_map(flipped, torch.tensor([0]), increase=False)
    assert torch.equal(s, torch.tensor([[1.0 * 1.5, 0.0]]))


def test_the_saliency_map_is_the_papers_equation_at_values_inside_zero_and_one():
    # The paper's S(X, t), written out feature by feature, at derivatives of size below 1 (a
    # threshold of 1 in place of 0 would keep features the conditions reject).
    d_t = torch.tensor([0.3, 0.6, -0.4, -0.2, 0.5])
    d_o = torch.tensor([-0.5, 0.4, 0.7, -0.3, 0.0])
    jacobian = torch.stack([d_t, d_o, torch.zeros(5)])[None]  # class 0 the target
    expected = {True: [], False: []}
    for t, o in zip(d_t.tolist(), d_o.tolist(), strict=True):
        expected[True].append(0.0 if t < 0 or o > 0 else t * abs(o))
        expected[False].append(0.0 if t > 0 or o < 0 else abs(t) * o)
    for increase in (True, False):
        s = jsma.saliency_map(jacobian, torch.tensor([0]), increase=increase)
        assert torch.allclose(s[0], torch.tensor(expected[increase]))
    assert expected[True][0] > 0 and expected[False][2] > 0  # each direction keeps a feature


def test_pair_scores_are_the_papers_conditions_on_alpha_and_beta():
    # -alpha * beta where alpha > 0 and beta < 0 (raising) or alpha < 0 and beta > 0 (lowering),
    # 0 elsewhere, on the diagonal and outside the domain; sums of size below 1 on purpose.
    # Pairs (0, 1) and (2, 3) pass one condition of each direction only.
    d_t = torch.tensor([[0.3, 0.2, -0.45, -0.1, 0.5]])
    d_o = torch.tensor([[-0.2, 0.3, 0.35, -0.4, 0.1]])
    domain = torch.tensor([[True, True, True, True, False]])
    for increase in (True, False):
        scores = jsma.pair_scores(d_t, d_o, domain, increase)
        for p, q in itertools.product(range(5), repeat=2):
            alpha, beta = (d_t[0, p] + d_t[0, q]).item(), (d_o[0, p] + d_o[0, q]).item()
            passes = alpha > 0 and beta < 0 if increase else alpha < 0 and beta > 0
            keep = p != q and domain[0, p] and domain[0, q] and passes
            assert scores[0, p, q].item() == pytest.approx(-alpha * beta if keep else 0.0)
        assert (scores > 0).any()  # each direction has an admissible pair here


def test_saliency_map_rejects_a_target_out_of_range():
    with pytest.raises(ValueError, match="target must hold class indices"):
        jsma.saliency_map(HAND, torch.tensor([3]))


def test_pair_search_takes_the_best_admissible_pair_like_brute_force():
    for seed in range(5):
        jacobian = randn(1, 4, 7, seed=seed)
        target = torch.tensor([seed % 4])
        domain = torch.rand(1, 7, generator=gen(seed)) < 0.8
        for increase in (True, False):
            chosen, found = jsma.choose_features(jacobian, target, domain, increase)
            a, b = jsma.target_and_others(jacobian, target)
            best, pair = 0.0, None
            for p, q in itertools.combinations(domain[0].nonzero().squeeze(1).tolist(), 2):
                alpha, beta = (a[0, p] + a[0, q]).item(), (b[0, p] + b[0, q]).item()
                ok = alpha > 0 and beta < 0 if increase else alpha < 0 and beta > 0
                if ok and -alpha * beta > best:
                    best, pair = -alpha * beta, {p, q}
            assert found.item() == (pair is not None)
            assert set(chosen[0].nonzero().squeeze(1).tolist()) == (pair or set())


# -- the attack on hand-made linear models --------------------------------------------------------

# Two classes, four features. Class 1 (the target) gains 3, 1, 1, 0 per unit of each feature;
# class 0 loses as much and starts with a bias of 9.5. From x = (1, 0, 0, 0) the logits are
# (6.5, 3): class 0. Feature 0 has the largest pull but is already at 1, outside the search
# domain; raising features 1 and 2 gives (4.5, 5): class 1, in one pair (a 50% budget).
PULL = [[-3.0, -1.0, -1.0, 0.0], [3.0, 1.0, 1.0, 0.0]]
SATURATED = torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)


def test_one_pair_reaches_the_target_skipping_the_saturated_feature():
    model = linear(PULL, [9.5, 0.0])
    attack = jsma.jsma(model, SATURATED, 1, theta=1.0, max_distortion=0.5)
    assert attack.success.item()
    assert torch.equal(attack.x_adv, torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=torch.float64))
    assert attack.changed.item() == 0.5


def test_decreasing_features_follows_the_mirror_image():
    # Mirror of the case above: lowering features 1 and 2 from 1 to 0; feature 0 is already 0.
    model = linear([[3.0, 1.0, 1.0, 0.0], [-3.0, -1.0, -1.0, 0.0]], [3.5, 5.0])
    x = torch.tensor([[0.0, 1.0, 1.0, 1.0]], dtype=torch.float64)  # logits (5.5, 3): class 0
    attack = jsma.jsma(model, x, 1, theta=-1.0, max_distortion=0.5)
    assert attack.success.item()
    assert torch.equal(attack.x_adv, torch.tensor([[0.0, 0.0, 0.0, 1.0]], dtype=torch.float64))


def test_the_attack_stops_when_no_pair_passes_the_conditions():
    # Every feature raises both classes alike: no pair has beta < 0, so nothing changes.
    model = linear([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], [1.0, 0.0])
    attack = jsma.jsma(model, torch.zeros(1, 3, dtype=torch.float64), 1, max_distortion=1.0)
    assert not attack.success.item() and attack.changed.item() == 0.0


def test_single_features_change_one_feature_a_step_within_the_same_budget():
    model = linear(PULL, [9.5, 0.0])
    # Budget 1/4: one single feature (feature 1, the best of the domain): not enough.
    one = jsma.jsma(model, SATURATED, 1, max_distortion=0.25, pairs=False)
    assert torch.equal(one.x_adv, torch.tensor([[1.0, 1.0, 0.0, 0.0]], dtype=torch.float64))
    two = jsma.jsma(model, SATURATED, 1, max_distortion=0.5, pairs=False)
    assert two.success.item() and two.changed.item() == 0.5


def test_the_budget_is_floor_of_m_upsilon_over_two_pairs():
    assert jsma.max_iterations(64, 0.5) == 16
    assert jsma.max_iterations(64, 0.145) == 4  # 9.28 features: 4 pairs
    assert jsma.max_iterations(784, 0.145) == 56
    assert jsma.max_iterations(64, 0.145, per_step=1) == 9


# -- the attack's guarantees on a trained network -------------------------------------------------


@pytest.mark.parametrize("theta", [1.0, -1.0, 0.4])
def test_the_attack_keeps_its_budget_direction_and_clip(trained, theta):
    model, x, target = trained
    clip = (0.0, 0.9)
    x = x.clamp(*clip)
    attack = jsma.jsma(model, x, target, theta=theta, max_distortion=0.2, clip=clip)
    assert (attack.changed <= 0.2).all()
    assert (attack.changed * 64 <= 2 * jsma.max_iterations(64, 0.2)).all()
    step = attack.x_adv - x
    assert (step >= 0).all() if theta > 0 else (step <= 0).all()
    assert ((attack.x_adv >= clip[0]) & (attack.x_adv <= clip[1])).all()
    assert torch.equal(attack.changed, (attack.x_adv != x).float().mean(-1))


@pytest.mark.parametrize("theta", [1.0, -1.0])
def test_every_success_is_classified_as_its_target(trained, theta):
    model, x, target = trained
    attack = jsma.jsma(model, x, target, theta=theta, max_distortion=0.5)
    with torch.no_grad():
        predicted = model(attack.x_adv).argmax(1)
    assert torch.equal(attack.success, predicted == target)
    assert attack.success.float().mean() > 0.5 if theta > 0 else attack.success.any()


@pytest.mark.parametrize("theta", [1.0, -1.0])
def test_a_smaller_budget_is_the_first_steps_of_a_larger_one(trained, theta):
    model, x, target = trained
    large = jsma.jsma(model, x, target, theta=theta, max_distortion=0.5)
    small = jsma.jsma(model, x, target, theta=theta, max_distortion=0.1)
    assert torch.equal(jsma.success_within(large, 0.1), small.success)
    rnd = [
        experiment.null_attack(model, x, target, theta, budget, rule="random", generator=gen(4))
        for budget in (0.5, 0.1)
    ]
    assert torch.equal(jsma.success_within(rnd[0], 0.1), rnd[1].success)
    # the nulls' own reading, which the chapter uses for them, agrees with direct runs too
    for rule in experiment.NULL_RULES:
        runs = [
            experiment.null_attack(model, x, target, theta, budget, rule=rule, generator=gen(4))
            for budget in (0.5, 0.1)
        ]
        assert torch.equal(experiment.null_success_within(runs[0], 0.1), runs[1].success)


def test_the_nulls_reading_needs_no_mechanism(trained, monkeypatch):
    # A broken success_within in the mechanism must not move the nulls' reading of the budget.
    model, x, target = trained
    attack = experiment.null_attack(model, x, target, 1.0, 0.5, rule="target alone")
    expected = attack.success & (attack.changed <= 0.25 + 1e-6)
    monkeypatch.setattr(jsma, "success_within", lambda *a, **k: 1 / 0)
    assert torch.equal(experiment.null_success_within(attack, 0.25), expected)
    assert not expected.all() and expected.any()
    with pytest.raises(ValueError, match="max_distortion"):
        experiment.null_success_within(attack, 0.0)


def test_random_pairs_keep_the_same_budget_and_follow_their_generator(trained):
    model, x, target = trained

    def random(g):
        return experiment.null_attack(model, x, target, 1.0, 0.25, rule="random", generator=g)

    one, two = random(gen(7)), random(gen(7))
    assert torch.equal(one.x_adv, two.x_adv)
    other = random(gen(8))
    assert not torch.equal(one.x_adv, other.x_adv)
    assert (one.changed <= 0.25).all() and (one.x_adv >= x).all()
    with torch.no_grad():
        assert torch.equal(one.success, model(one.x_adv).argmax(1) == target)


def test_the_saliency_attack_beats_random_pairs(trained):
    model, x, target = trained
    ours = jsma.jsma(model, x, target, max_distortion=0.25).success.float().mean()
    rnd = experiment.null_attack(model, x, target, 1.0, 0.25, rule="random", generator=gen(1))
    rnd = rnd.success.float().mean()
    assert ours > rnd + 0.3


def test_attack_arguments_are_checked(trained):
    model, x, target = trained
    with pytest.raises(ValueError, match="theta must be non-zero"):
        jsma.jsma(model, x, target, theta=0.0)
    with pytest.raises(ValueError, match="max_distortion"):
        jsma.jsma(model, x, target, max_distortion=1.5)
    with pytest.raises(ValueError, match="x must lie inside clip"):
        jsma.jsma(model, x, target, clip=(0.0, 0.5))
    with pytest.raises(ValueError, match="target must have shape"):
        jsma.jsma(model, x, target[:3])
    with pytest.raises(TypeError, match="the random rule needs a torch.Generator"):
        experiment.null_attack(model, x, target, 1.0, 0.25, rule="random", generator=0)
    with pytest.raises(ValueError, match="rule must be one of"):
        experiment.null_attack(model, x, target, 1.0, 0.25, rule="saliency")
    with pytest.raises(ValueError, match="theta must be non-zero"):
        experiment.null_attack(model, x, target, 0.0, 0.25, rule="target alone")


# -- hardness, adversarial distance, robustness ---------------------------------------------------


def test_adversarial_distance_counts_the_features_with_a_useful_saliency():
    # Linear model, target 1: dF_1/dx = (2, -1, 1, 1), others' sum dF_0/dx = (-1, -1, 1, -3):
    # features 0 and 3 pass both conditions, so A = 1 - 2/4.
    model = linear([[-1.0, -1.0, 1.0, -3.0], [2.0, -1.0, 1.0, 1.0]])
    distance = jsma.adversarial_distance(model, randn(3, 4, seed=5), 1)
    assert torch.allclose(distance, torch.full((3,), 0.5, dtype=torch.float64))
    with pytest.raises(ValueError, match="target must hold class indices"):
        jsma.adversarial_distance(model, randn(3, 4), 2)


def test_hardness_is_the_area_under_distortion_against_success_from_zero():
    # (tau, eps): (0, -), (0.5, 0.1), (1.0, 0.3): the strip from 0 to 0.5 is flat at 0.1
    # (0.5 * 0.1), the trapezoid from 0.5 to 1 is 0.5 * 0.2.
    assert jsma.hardness([0.0, 0.5, 1.0], [0.0, 0.1, 0.3]) == pytest.approx(0.05 + 0.1)
    # the rate stays at 0.2: only the strip, at the first budget's distortion
    assert jsma.hardness([0.2, 0.2], [0.1, 0.4]) == pytest.approx(0.02)
    assert jsma.hardness([0.0, 0.0], [0.0, 0.0]) == 0.0
    # the paper's sum, without the book's strip: the trapezoids alone
    assert jsma.hardness([0.0, 0.5, 1.0], [0.0, 0.1, 0.3], strip=False) == pytest.approx(0.1)
    assert jsma.hardness([0.2, 0.2], [0.1, 0.4], strip=False) == 0.0
    with pytest.raises(ValueError, match="not decrease"):
        jsma.hardness([0.5, 0.4], [0.1, 0.1])


def test_hardness_sums_every_trapezoid_of_a_longer_curve():
    # Four budgets: the strip 0.2 * 0.1, then trapezoids (0.5 - 0.2)(0.1 + 0.2)/2,
    # (0.7 - 0.5)(0.2 + 0.4)/2 and (1.0 - 0.7)(0.4 + 0.3)/2.
    tau, eps = [0.2, 0.5, 0.7, 1.0], [0.1, 0.2, 0.4, 0.3]
    trapezoids = 0.3 * 0.3 / 2 + 0.2 * 0.6 / 2 + 0.3 * 0.7 / 2
    assert jsma.hardness(tau, eps, strip=False) == pytest.approx(trapezoids)
    assert jsma.hardness(tau, eps) == pytest.approx(trapezoids + 0.2 * 0.1)


def test_robustness_is_the_smallest_mean_distance_over_targets():
    distances = torch.tensor([0.9, 0.5, 0.7, 0.7, 0.3, 0.9])
    target = torch.tensor([0, 1, 2, 0, 1, 2])
    assert jsma.robustness(distances, target) == pytest.approx(0.4)
    # the smallest distance of any (X, t)
    assert jsma.robustness(distances, target, per_target=False) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="target must have shape"):
        jsma.robustness(distances, target[:4])


def test_the_classifier_learns_and_rejects_a_bad_learning_rate():
    digits = load_digits_split()
    run = experiment.train_classifier(digits, steps=200, seed=1)
    assert run.history.final("val_accuracy") > 0.9
    with pytest.raises(ValueError, match="lr"):
        experiment.train_classifier(digits, lr=0.0, seed=0)


def test_the_cnn_takes_flat_digits_and_its_derivative_matches_torchs():
    torch.manual_seed(0)
    model = experiment.CNN(channels=4, hidden=8).double().eval()
    x = torch.rand(2, 64, generator=gen(3), dtype=torch.float64)
    jacobian = jsma.forward_derivative(model, x)
    assert jacobian.shape == (2, 10, 64)
    assert torch.allclose(jacobian[1], torch.autograd.functional.jacobian(model, x[1:2])[0, :, 0])


def test_the_perceptron_is_64_to_128_relu_units_to_10_logits():
    model = experiment.train_classifier(load_digits_split(), steps=1, seed=0).model
    linear = [layer for layer in model.modules() if isinstance(layer, nn.Linear)]
    assert [(layer.in_features, layer.out_features) for layer in linear] == [(64, 128), (128, 10)]
    assert any(isinstance(layer, nn.ReLU) for layer in model.modules())
    with pytest.raises(TypeError, match="cnn must be True or False"):
        experiment.train_classifier(load_digits_split(), cnn=1, seed=0)


def test_flags_are_checked():
    with pytest.raises(TypeError, match="increase must be True or False"):
        jsma.saliency_map(HAND, torch.tensor([0]), increase=1)
    with pytest.raises(TypeError, match="pairs must be True or False"):
        jsma.jsma(linear(PULL, [9.5, 0.0]), SATURATED, 1, pairs=1)


# -- the chapter's sample and measurements ---------------------------------------------------------


def test_the_sample_is_correctly_classified_per_class_and_follows_its_generator():
    labels = torch.arange(10).repeat(6)
    predictions = labels.clone()
    predictions[:10] = (labels[:10] + 1) % 10  # the first example of each class is misclassified
    chosen = experiment.correctly_classified(labels, predictions, 3, gen(0))
    assert len(chosen) == 30 and len(set(chosen.tolist())) == 30
    assert torch.equal(labels[chosen], torch.arange(10).repeat_interleave(3))
    assert (predictions[chosen] == labels[chosen]).all() and (chosen >= 10).all()
    assert torch.equal(chosen, experiment.correctly_classified(labels, predictions, 3, gen(0)))
    assert not torch.equal(chosen, experiment.correctly_classified(labels, predictions, 3, gen(1)))


def test_other_classes_lists_the_nine_other_targets_in_order():
    targets = experiment.other_classes(torch.tensor([0, 7]))
    assert targets.dtype == torch.int64
    assert targets.tolist() == [*range(1, 10), 0, 1, 2, 3, 4, 5, 6, 8, 9]


def hand_attack():
    # Four attacks: two succeed, changing 1/8 and 3/8 of their features; two fail.
    return jsma.Attack(
        torch.zeros(4, 8),
        torch.tensor([True, True, False, False]),
        torch.tensor([0.125, 0.375, 0.5, 0.0]),
    )


def test_success_rate_and_distortion_count_the_successes_within_the_budget():
    attack = hand_attack()
    assert experiment.success_rate(attack, 0.5) == 0.5
    assert experiment.success_rate(attack, 0.25) == 0.25
    assert experiment.distortion(attack, 0.5) == pytest.approx(0.25)
    assert experiment.distortion(attack, 0.25) == 0.125
    rows = torch.tensor([False, True, True, False])
    assert experiment.success_rate(attack, 0.25, rows) == 0.0
    assert math.isnan(experiment.distortion(attack, 0.25, rows))
    assert experiment.distortion(attack, 0.5, rows) == 0.375


def test_pair_hardness_is_the_area_over_the_budgets():
    # Nothing within 0.1; success 1/4 then 2/4, mean distortion 0.125 then 0.25: the strip
    # 0.25 * 0.125, then (0.5 - 0.25) * (0.125 + 0.25) / 2.
    attack = hand_attack()
    assert experiment.pair_hardness(attack, [0.1, 0.25, 0.5], slice(None)) == pytest.approx(
        0.25 * 0.125 + 0.25 * 0.375 / 2
    )
    assert experiment.pair_hardness(attack, [0.05, 0.1], slice(None)) == 0.0
    # per unit of success reached: divided by the last budget's success rate, 2/4
    assert experiment.pair_hardness(
        attack, [0.1, 0.25, 0.5], slice(None), per_success=True
    ) == pytest.approx((0.25 * 0.125 + 0.25 * 0.375 / 2) / 0.5)
    assert math.isnan(experiment.pair_hardness(attack, [0.05, 0.1], slice(None), per_success=True))


def test_the_paired_difference_has_a_clustered_standard_error():
    a = torch.tensor([True, True, True, False, False, False])
    b = torch.tensor([False, False, False, False, False, False])
    clusters = torch.tensor([0, 0, 0, 1, 1, 1])
    d, se = experiment.paired_difference(a, b, clusters)
    assert d == pytest.approx(0.5)
    # two clusters with means 1 and 0: std of the means / sqrt(2) = 0.5
    assert se == pytest.approx(0.5)
    # the same differences spread evenly over the clusters: no spread between their means
    mixed = torch.tensor([0, 1, 0, 1, 0, 1])
    assert experiment.paired_difference(a, b, torch.tensor([0, 0, 1, 1, 2, 2]))[1] > 0
    assert experiment.paired_difference(a, torch.tensor([True] * 3 + [False] * 3), mixed) == (
        0.0,
        0.0,
    )
    # clustered attacks that move together give a larger SE than independent ones would
    independent = experiment.paired_difference(a, b, torch.arange(6))[1]
    assert se > independent
    with pytest.raises(ValueError, match="two clusters"):
        experiment.paired_difference(a, b, torch.zeros(6, dtype=torch.int64))


def test_the_target_alone_null_takes_a_pair_the_saliency_map_rejects():
    # Every feature raises both classes alike: no pair has beta < 0, so the saliency map finds
    # nothing, while the target's derivative alone raises features 0 and 1 (alpha 2 > 0).
    model = linear([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]], [1.0, 0.0])
    x = torch.zeros(1, 3, dtype=torch.float64)
    full = jsma.jsma(model, x, 1, max_distortion=1.0)
    alone = experiment.null_attack(model, x, torch.tensor([1]), 1.0, 1.0, rule="target alone")
    assert full.changed.item() == 0.0
    assert alone.x_adv.tolist() == [[1.0, 1.0, 0.0]]
    assert not alone.success.item()  # both logits rose by 2: class 0 stays ahead


def test_the_target_alone_null_lowers_pairs_whose_alpha_is_negative():
    # Target 0 loses 2 per unit of feature 0 and gains 1 per unit of feature 1; lowering the pair
    # (0, 2) has alpha = -2 - 1 = -3 < 0 and reaches the target.
    model = linear([[-2.0, 1.0, -1.0], [0.0, 0.0, 0.0]], [2.0, 0.0])
    x = torch.ones(1, 3, dtype=torch.float64)  # logits (0, 0): a tie goes to class 0 ...
    x[0, 1] = 0.0  # ... so start from (-1, 0): class 1
    attack = experiment.null_attack(model, x, torch.tensor([0]), -1.0, 1.0, rule="target alone")
    assert attack.success.item()
    assert attack.x_adv.tolist() == [[0.0, 0.0, 0.0]]


def test_the_nulls_do_not_reach_the_mechanism(trained, monkeypatch):
    # A broken mechanism (tests/mutants/jsma.py) must not move the chapter's nulls.
    model, x, target = trained
    before = {
        rule: experiment.null_attack(model, x, target, 1.0, 0.25, rule=rule, generator=gen(2))
        for rule in experiment.NULL_RULES
    }

    def broken(*args, **kwargs):
        raise AssertionError("a null called the mechanism")

    for name in ("_jacobian", "pair_scores", "search_domain", "choose_features", "_attack"):
        monkeypatch.setattr(jsma, name, broken)
    for rule, expected in before.items():
        again = experiment.null_attack(model, x, target, 1.0, 0.25, rule=rule, generator=gen(2))
        assert torch.equal(again.x_adv, expected.x_adv)
    with pytest.raises(AssertionError, match="called the mechanism"):
        jsma.jsma(model, x, target)


def test_the_untrained_guide_is_the_trained_networks_start_and_steers_the_null(trained):
    model, x, target = trained
    d = load_digits_split()
    start = experiment.untrained_perceptron(64, seed=3)
    run = experiment.train_classifier(d, steps=1, lr=1e-9, seed=3)
    for a, b in zip(start.parameters(), run.model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)  # one update at a tiny rate moves nothing
    own = experiment.null_attack(model, x, target, 1.0, 0.25, rule="target alone")
    guided = experiment.null_attack(model, x, target, 1.0, 0.25, rule="target alone", guide=start)
    assert not torch.equal(own.x_adv, guided.x_adv)
    with torch.no_grad():  # success is judged by the attacked network, whatever steers
        assert torch.equal(guided.success, model(guided.x_adv).argmax(1) == target)
    steered_by_itself = experiment.null_attack(
        model, x, target, 1.0, 0.25, rule="target alone", guide=model
    )
    assert torch.equal(steered_by_itself.x_adv, own.x_adv)


def test_per_class_pair_fills_each_off_diagonal_cell_from_its_own_rows():
    source = torch.tensor([0, 0, 1, 2])
    target = torch.tensor([1, 2, 0, 1])
    # Each cell sums the numbers 1..4 of its own rows: 1, 2, 3, 4 in the four cells used, 0 else.
    matrix = experiment.per_class_pair(
        lambda rows: float((rows * torch.arange(1, 5)).sum()), source, target
    )
    assert matrix.shape == (10, 10) and torch.isnan(matrix.diagonal()).all()
    expected = torch.zeros(10, 10, dtype=torch.float64)
    expected[0, 1], expected[0, 2], expected[1, 0], expected[2, 1] = 1, 2, 3, 4
    off = ~torch.eye(10, dtype=torch.bool)
    assert torch.equal(matrix[off], expected[off])


def test_three_standard_errors_of_a_difference_of_rates():
    assert experiment.three_standard_errors(0.5, 0.5, 100) == pytest.approx(3 * math.sqrt(0.005))
    assert experiment.three_standard_errors(1.0, 0.0, 10) == 0.0


def test_the_target_alone_null_is_a_pair_search_and_moves_only_pairs():
    model = nn.Sequential(nn.Linear(6, 3))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[1.0, 1, 0, 0, 0, 0], [0, 0, 1, 1, 0, 0], [0] * 6]))
        model[0].bias.zero_()
    x = torch.zeros(2, 6)
    x[:, 2] = 0.5  # class 1 ahead
    target = torch.zeros(2, dtype=torch.int64)
    attack = experiment.null_attack(model, x, target, 1.0, 0.5, rule="target alone")
    # the target's derivative alone picks features 0 and 1, which reach class 0 in one step
    assert attack.success.all()
    assert torch.equal(attack.x_adv[:, :2], torch.ones(2, 2))
    assert torch.equal(attack.changed, torch.full((2,), 2 / 6))


def test_the_levelled_off_budget_is_the_first_within_two_paired_errors_of_the_last():
    # 20 digits of 9 attacks: success first at 2, 4 or 6 features for a third of the digits each
    changed = torch.tensor([2, 4, 6]).repeat_interleave(60) / 64
    attack = jsma.Attack(torch.zeros(180, 64), torch.ones(180, dtype=torch.bool), changed)
    clusters = torch.arange(180) // 9
    budgets = [2 / 64, 4 / 64, 6 / 64, 8 / 64]
    assert experiment.levelled_off(attack, budgets, clusters) == 6 / 64
    # a single straggler at 8 features is within noise of the last budget
    straggler = changed.clone()
    straggler[0] = 8 / 64
    late = jsma.Attack(attack.x_adv, attack.success, straggler)
    assert experiment.levelled_off(late, budgets, clusters) == 6 / 64
    with pytest.raises(ValueError, match="increasing"):
        experiment.levelled_off(attack, budgets[::-1], clusters)


def test_spearman_brown_doubles_a_test_from_its_halves():
    assert experiment.spearman_brown(0.5) == pytest.approx(2 / 3)
    assert experiment.spearman_brown(0.0) == 0.0
    assert experiment.spearman_brown(1.0) == 1.0
    with pytest.raises(ValueError, match="r must be a finite number"):
        experiment.spearman_brown(1.5)


def test_the_gap_beyond_is_the_difference_of_two_paired_differences():
    a1 = torch.tensor([True, True, True, False, True, True])
    b1 = torch.tensor([False, False, True, False, False, True])
    a2 = torch.tensor([True, False, True, False, True, True])
    b2 = torch.tensor([True, False, True, False, False, True])
    clusters = torch.tensor([0, 0, 1, 1, 2, 2])
    gap, se = experiment.gap_beyond((a1, b1), (a2, b2), clusters)
    # first gap 3/6, second gap 1/6
    assert gap == pytest.approx(2 / 6)
    values = (a1.double() - b1.double()) - (a2.double() - b2.double())
    assert (gap, se) == experiment.clustered_mean(values, clusters)
    assert se > 0
    # the same pair twice: no gap, no error
    assert experiment.gap_beyond((a1, b1), (a1, b1), clusters) == (0.0, 0.0)
    with pytest.raises(ValueError, match="b2 must have shape"):
        experiment.gap_beyond((a1, b1), (a2, b2[:3]), clusters)


# -- pinned by the mutation record's survivors (tests/mutation/jsma.yml) ---------------------------


def test_the_saliency_map_raises_features_by_default():
    # The paper's default direction: S(X, t) for increasing features.
    default = jsma.saliency_map(HAND, torch.tensor([0]))
    assert torch.equal(default, jsma.saliency_map(HAND, torch.tensor([0]), increase=True))
    assert default.sum() > 0


def test_pairs_find_what_no_single_feature_passes():
    # Target 1 of a linear model: feature 0 raises the target (2) but the other class too (1);
    # feature 1 lowers the other class (-3) but the target too (-1). Neither passes S(X, t)'s
    # conditions alone; together alpha = 1 > 0 and beta = -2 < 0: the paper's reason for pairs.
    # From x = 0 the logits are (1, 0); raising both gives (-1, 1): class 1.
    model = linear([[1.0, -3.0], [2.0, -1.0]], [1.0, 0.0])
    x = torch.zeros(1, 2, dtype=torch.float64)
    attack = jsma.jsma(model, x, 1, max_distortion=1.0)  # pairs, the default
    assert attack.success.item() and attack.x_adv.tolist() == [[1.0, 1.0]]
    single = jsma.jsma(model, x, 1, max_distortion=1.0, pairs=False)
    assert not single.success.item() and single.changed.item() == 0.0


def test_the_default_step_is_the_papers_theta_of_one():
    # On a clip range of 3 the chosen pair (0, 1) rises by theta = +1, not to the bound: the
    # logits go from (5, 0) to (1, 4).
    model = linear([[-3.0, -1.0, 0.0], [3.0, 1.0, 0.0]], [5.0, 0.0])
    x = torch.zeros(1, 3, dtype=torch.float64)
    attack = jsma.jsma(model, x, 1, max_distortion=2 / 3, clip=(0.0, 3.0))
    assert attack.success.item() and attack.x_adv.tolist() == [[1.0, 1.0, 0.0]]


def test_an_input_already_classified_as_its_target_is_left_as_it_is():
    # PULL again, a batch of two aimed at class 1: the first input is class 0 (logits 6.5, 3);
    # the second, (1, 0.9, 0.9, 0), is class 1 already (4.7, 4.8) though pairs of its features
    # could still raise the target. Every attack, the paper's and the nulls', leaves it alone.
    model = linear(PULL, [9.5, 0.0])
    x = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 0.9, 0.9, 0.0]], dtype=torch.float64)
    target = torch.tensor([1, 1])
    attacks = [
        jsma.jsma(model, x, target, max_distortion=0.5),
        jsma.jsma(model, x, target, max_distortion=0.5, pairs=False),
        experiment.null_attack(model, x, target, 1.0, 0.5, rule="target alone"),
        experiment.null_attack(model, x, target, 1.0, 0.5, rule="random", generator=gen(0)),
    ]
    for attack in attacks:
        assert torch.equal(attack.x_adv[1], x[1]) and attack.success[1].item()
        assert attack.changed[1].item() == 0.0 and attack.changed[0].item() > 0.0
    for attack in attacks[:3]:
        assert attack.x_adv[0].tolist() == [1.0, 1.0, 1.0, 0.0] and attack.success[0].item()


def test_no_admissible_feature_or_pair_leaves_the_input():
    # Target 1 loses from every feature: raising none helps it, so the single-feature search
    # (S(X, t) = 0 everywhere) and the target-only null (alpha < 0 for every pair) stop at once.
    model = linear([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    x = torch.zeros(1, 3, dtype=torch.float64)
    single = jsma.jsma(model, x, 1, max_distortion=1.0, pairs=False)
    alone = experiment.null_attack(model, x, torch.tensor([1]), 1.0, 1.0, rule="target alone")
    for attack in (single, alone):
        assert torch.equal(attack.x_adv, x) and not attack.success.item()


def test_the_target_alone_null_spends_its_one_pair_away_from_the_bound():
    # floor(4 * 0.5 / 2) = exactly one pair. Raising (PULL): feature 0 has the largest pull but
    # is at the bound already, so the pair is (1, 2), which reaches class 1. Lowering, the mirror
    # image: feature 0 is at 0 already.
    model = linear(PULL, [9.5, 0.0])
    up = experiment.null_attack(model, SATURATED, torch.tensor([1]), 1.0, 0.5, rule="target alone")
    assert up.success.item() and up.x_adv.tolist() == [[1.0, 1.0, 1.0, 0.0]]
    mirror = linear([[3.0, 1.0, 1.0, 0.0], [-3.0, -1.0, -1.0, 0.0]], [3.5, 5.0])
    x = torch.tensor([[0.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    down = experiment.null_attack(mirror, x, torch.tensor([1]), -1.0, 0.5, rule="target alone")
    assert down.success.item() and down.x_adv.tolist() == [[0.0, 0.0, 0.0, 1.0]]


def test_every_attack_takes_a_second_pair_when_the_first_is_not_enough():
    # Class 1 gains w = (1, 0.9, 0.8, 0.7) per unit, class 0 loses as much from a bias of 6: the
    # target needs w.x > 3, all four features (3.4; the best three give 2.7). A budget of two
    # pairs: the second pair is the two features the first left in the search domain.
    w = [1.0, 0.9, 0.8, 0.7]
    model = linear([[-v for v in w], w], [6.0, 0.0])
    x, target = torch.zeros(1, 4, dtype=torch.float64), torch.tensor([1])
    attacks = [
        jsma.jsma(model, x, target, max_distortion=1.0),
        experiment.null_attack(model, x, target, 1.0, 1.0, rule="target alone"),
        experiment.null_attack(model, x, target, 1.0, 1.0, rule="random", generator=gen(0)),
    ]
    for attack in attacks:
        assert attack.success.item() and attack.x_adv.tolist() == [[1.0] * 4]


def test_the_target_alone_null_ranks_pairs_by_alpha_at_derivatives_below_one():
    # Raising: class 1 gains (0.3, 0.2, 0.1, 0) against a constant 0.35; the pair (0, 1),
    # alpha = 0.5, reaches it (0.5 > 0.35); feature 0 alone (0.3) would not.
    model = linear([[0.0] * 4, [0.3, 0.2, 0.1, 0.0]], [0.35, 0.0])
    x, target = torch.zeros(1, 4, dtype=torch.float64), torch.tensor([1])
    up = experiment.null_attack(model, x, target, 1.0, 0.5, rule="target alone")
    assert up.success.item() and up.x_adv.tolist() == [[1.0, 1.0, 0.0, 0.0]]
    # Lowering from x = 1: class 1 gains (-0.3, -0.2, 0.3, 0.4), 0.2 against 0.45. Only pairs
    # with alpha < 0 lower the target's rivals' lead: (0, 1), alpha = -0.5, gives 0.7 > 0.45;
    # (2, 3) has the larger |alpha| (0.7) but the wrong sign.
    model = linear([[0.0] * 4, [-0.3, -0.2, 0.3, 0.4]], [0.45, 0.0])
    down = experiment.null_attack(model, torch.ones_like(x), target, -1.0, 0.5, rule="target alone")
    assert down.success.item() and down.x_adv.tolist() == [[0.0, 0.0, 1.0, 1.0]]


def test_every_attack_stops_at_its_target_with_budget_left():
    # One pair of the six features reaches class 1 (logits 3 - s, s for s features raised);
    # the budget allows three. Each attack stops there: two features changed.
    model = linear([[-1.0] * 6, [1.0] * 6], [3.0, 0.0])
    x, target = torch.zeros(1, 6, dtype=torch.float64), torch.tensor([1])
    attacks = [
        jsma.jsma(model, x, target, max_distortion=1.0),
        experiment.null_attack(model, x, target, 1.0, 1.0, rule="target alone"),
        experiment.null_attack(model, x, target, 1.0, 1.0, rule="random", generator=gen(0)),
    ]
    for attack in attacks:
        assert attack.success.item() and attack.changed.item() == pytest.approx(2 / 6)


def test_the_target_alone_null_clips_a_step_that_starts_inside_the_range():
    # From x = 0.5 a step of theta = +1 or -1 ends at the clip bound, 1 or 0, not at 1.5 or -0.5.
    # Class 0's bias keeps class 1 out of reach: one pair is moved and the attack fails.
    for theta, bound in ((1.0, 1.0), (-1.0, 0.0)):
        model = linear([[0.0] * 4, [3.0 * theta, 2.0 * theta, theta, 0.0]], [10.0, 0.0])
        x, target = torch.full((1, 4), 0.5, dtype=torch.float64), torch.tensor([1])
        attack = experiment.null_attack(model, x, target, theta, 0.5, rule="target alone")
        assert attack.x_adv.tolist() == [[bound, bound, 0.5, 0.5]]


def test_random_pairs_draw_from_the_search_domain_until_it_holds_no_pair():
    # A model that never outputs the target; eight features, four pairs of budget. Row 0 has one
    # feature below the bound (no pair: untouched), row 1 three (one pair, then one feature
    # left: it stops), row 2 all eight (four pairs, each feature once).
    model = linear(torch.zeros(2, 8))
    x = torch.ones(3, 8, dtype=torch.float64)
    x[0, 7:], x[1, 5:], x[2] = 0.0, 0.0, 0.0
    attack = experiment.null_attack(
        model, x, torch.ones(3, dtype=torch.int64), 1.0, 1.0, rule="random", generator=gen(5)
    )
    assert attack.changed.tolist() == [0.0, 2 / 8, 1.0]
    assert torch.equal(attack.x_adv[0], x[0]) and attack.x_adv[1, 5:].sum() == 2
    # Steps of 0.25: two movable features stay in the search domain until they reach 1.
    x = torch.tensor([[1.0] * 6 + [0.0] * 2], dtype=torch.float64)
    small = experiment.null_attack(
        model, x, torch.tensor([1]), 0.25, 1.0, rule="random", generator=gen(5)
    )
    assert small.x_adv.tolist() == [[1.0] * 8]


def test_adversarial_distance_is_per_input_at_derivatives_below_one():
    # logits = W relu(x): the Jacobian is W with the columns of negative features zeroed. Target
    # 1: dF_1/dx = (1, -0.5, 0.5, 0.5), the other class's (-0.5, -0.5, 0.5, -1.5); S(X, t) =
    # (0.5, 0, 0, 0.75), every value below 1. With every feature positive two of four pass,
    # A = 0.5; with feature 0 negative only feature 3 does, A = 0.75.
    weight = [[-0.5, -0.5, 0.5, -1.5], [1.0, -0.5, 0.5, 0.5]]
    model = nn.Sequential(nn.ReLU(), linear(weight))
    x = torch.tensor([[0.5, 0.5, 0.5, 0.5], [-0.5, 0.5, 0.5, 0.5]], dtype=torch.float64)
    distance = jsma.adversarial_distance(model, x, 1)
    assert distance.tolist() == [0.5, 0.75]


def test_the_gap_beyond_names_the_argument_it_rejects():
    good = torch.tensor([True, False, True, False])
    for i, name in enumerate(("a1", "b1", "a2", "b2")):
        args = [good] * 4
        args[i] = good.double()
        with pytest.raises(TypeError, match=f"^{name} must be a torch.bool tensor"):
            experiment.gap_beyond(
                (args[0], args[1]), (args[2], args[3]), torch.tensor([0, 0, 1, 1])
            )


def test_the_levelled_off_budget_waits_for_a_last_group_beyond_two_errors():
    # 20 digits of 9 attacks, a quarter of the digits succeeding first at 2, 4, 6 and 8 features.
    # At 6 features success is 0.25 below the last budget's, with a paired SE of 0.0993: more
    # than two SE (0.199), less than three (0.298). So 8 features is where it levels off.
    changed = torch.tensor([2, 4, 6, 8]).repeat_interleave(45) / 64
    attack = jsma.Attack(torch.zeros(180, 64), torch.ones(180, dtype=torch.bool), changed)
    budgets = [2 / 64, 4 / 64, 6 / 64, 8 / 64]
    gap, se = experiment.paired_difference(
        jsma.success_within(attack, 8 / 64),
        jsma.success_within(attack, 6 / 64),
        torch.arange(180) // 9,
    )
    assert 2 * se < gap <= 3 * se
    assert experiment.levelled_off(attack, budgets, torch.arange(180) // 9) == 8 / 64


def test_a_success_at_exactly_the_budget_counts_within_it():
    # Changed 2/8, 3/8, 1/8 (a failure) and 0: within 2/8, the first succeeds (exactly at the
    # budget), the second is over it, the third failed.
    attack = jsma.Attack(
        torch.zeros(4, 8),
        torch.tensor([True, True, False, True]),
        torch.tensor([2, 3, 1, 0]) / 8,
    )
    expected = [True, False, False, True]
    assert jsma.success_within(attack, 2 / 8).tolist() == expected
    assert experiment.null_success_within(attack, 2 / 8).tolist() == expected


def test_pair_hardness_reads_only_its_rows_and_the_papers_sum_without_the_strip():
    # Six attacks; the cell's rows are the first four: successes at 1/8, 2/8 and 3/8 of the
    # features and a failure. Over budgets 0.1, 1/8, 2/8, 3/8 its success rates are 0, 1/4,
    # 1/2, 3/4 and the mean distortions of its successes -, 1/8, 3/16, 1/4.
    attack = jsma.Attack(
        torch.zeros(6, 8),
        torch.tensor([True, True, True, False, True, True]),
        torch.tensor([0.125, 0.25, 0.375, 0.5, 0.125, 0.125]),
    )
    rows = torch.tensor([True, True, True, True, False, False])
    budgets = [0.1, 0.125, 0.25, 0.375]
    trapezoids = 0.25 * (0.125 + 0.1875) / 2 + 0.25 * (0.1875 + 0.25) / 2
    paper = experiment.pair_hardness(attack, budgets, rows, strip=False)
    assert paper == pytest.approx(trapezoids)
    book = experiment.pair_hardness(attack, budgets, rows)
    assert book == pytest.approx(trapezoids + 0.25 * 0.125)
    per_success = experiment.pair_hardness(attack, budgets, rows, per_success=True)
    assert per_success == pytest.approx((trapezoids + 0.25 * 0.125) / 0.75)
    # success only at the last of three budgets: H per success is its distortion, 1/8
    late = experiment.pair_hardness(attack, [0.05, 0.1, 0.125], rows, per_success=True)
    assert late == pytest.approx(0.125)


def test_hardness_is_computed_in_double_precision():
    # Python floats in, the area to 12 digits: single precision would round 0.1 and 0.05.
    tau, eps = [0.1, 0.3, 0.7], [0.05, 0.2, 0.3]
    expected = 0.1 * 0.05 + 0.2 * (0.05 + 0.2) / 2 + 0.4 * (0.2 + 0.3) / 2
    assert jsma.hardness(tau, eps) == pytest.approx(expected, rel=1e-12)


def test_per_class_pair_keeps_each_measure_in_double_precision():
    source, target = torch.tensor([0, 0, 1]), torch.tensor([1, 2, 0])
    matrix = experiment.per_class_pair(lambda rows: rows.sum().item() / 3, source, target)
    assert matrix[0, 1].item() == 1 / 3 and matrix[1, 0].item() == 1 / 3


def test_spearman_brown_of_opposite_halves_is_minus_one():
    # 2r / (1 + r) has no value at r = -1 (0 in the denominator): the reliability is -1 there.
    assert experiment.spearman_brown(-1.0) == -1.0
    assert experiment.spearman_brown(-0.5) == pytest.approx(-2.0)


def test_the_cnn_is_two_same_padded_convolutions_and_a_64_unit_relu_layer():
    # The chapter's CNN: 3x3 convolutions that keep the 8x8 and 4x4 maps (16 then 32 channels),
    # each followed by a ReLU and a 2x2 max-pool, then 128 -> 64 ReLU units -> 10 logits.
    model = experiment.CNN()
    shapes, h = [], torch.zeros(1, 64).reshape(1, 1, 8, 8)
    for layer in [*model.features, *model.head]:
        h = layer(h)
        shapes.append((type(layer).__name__, tuple(h.shape[1:])))
    assert shapes == [
        ("Conv2d", (16, 8, 8)),
        ("ReLU", (16, 8, 8)),
        ("MaxPool2d", (16, 4, 4)),
        ("Conv2d", (32, 4, 4)),
        ("ReLU", (32, 4, 4)),
        ("MaxPool2d", (32, 2, 2)),
        ("Flatten", (128,)),
        ("Linear", (64,)),
        ("ReLU", (64,)),
        ("Linear", (10,)),
    ]
    assert model.features[0].padding == (1, 1)


def test_training_draws_batches_of_64_from_the_runs_batch_stream(monkeypatch):
    # What train_classifier hands the shared loop, without training: the model asked for, Adam
    # at the learning rate given, minibatches of 64 drawn from stream BATCHES of the seed, and
    # six evaluations of the validation accuracy over the run (every step of a shorter run).
    digits = load_digits_split()
    calls = []

    def spy(model, train_y, optimizer, steps, **kwargs):
        calls.append((model, optimizer, kwargs))
        return experiment.training.History()

    monkeypatch.setattr(experiment.training, "train_classifier", spy)
    experiment.train_classifier(digits, lr=0.02, steps=600, seed=3)
    experiment.train_classifier(digits, cnn=True, steps=5, seed=3)
    (mlp, adam, first), (cnn, _, second) = calls
    assert not isinstance(mlp, experiment.CNN) and isinstance(cnn, experiment.CNN)
    assert adam.param_groups[0]["lr"] == 0.02
    expected = experiment.minibatches(
        len(digits.train_x), 64, experiment.training.generator(3, experiment.BATCHES)
    )
    for _ in range(2):
        assert torch.equal(next(first["batches"]), next(expected))
    assert first["eval_every"] == 100 and second["eval_every"] == 1
    assert set(first["evaluate"]()) == {"val_accuracy"}
