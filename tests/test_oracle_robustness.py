"""Unit tests of papernotes.oracle_robustness and its experiment: the oracle and the classifier
as c ∘ g, the attack's guarantees (masked features only, inside the epsilon ball and the data
range) on hand-made and trained models, the unnecessary features' statistics, the Siamese
penalty, and the chapter's data, measurements and choice of the penalty."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import papernotes as pn
from conftest import gen, randn
from papernotes import oracle_robustness as orc
from papernotes.data import load_digits_split
from papernotes.oracle_robustness import experiment


def linear_classifier(weight, bias, reads=None) -> orc.Classifier:
    """A Classifier with no hidden layer (g1 selects, c1 is linear) and the given weights."""
    weight = torch.as_tensor(weight, dtype=torch.float32)
    n_features = weight.shape[1] if reads is None else len(reads)
    model = orc.Classifier(n_features, weight.shape[0], hidden=None, reads=reads)
    with torch.no_grad():
        model.c.weight.copy_(weight)
        model.c.bias.copy_(torch.as_tensor(bias, dtype=torch.float32))
    return model.eval()


@pytest.fixture(scope="module")
def digits_with_extra():
    """Digits with 8 unnecessary features (correlation 0.9), a classifier on all features and
    one on the pixels only, both trained briefly."""
    digits = load_digits_split()
    codes = experiment.label_codes(8, 10, gen(0))
    extra = experiment.unnecessary_features(digits.train_y, codes, 0.9, gen(1))
    x = torch.cat([digits.train_x, extra], 1)
    test_x = torch.cat(
        [
            digits.test_x[:120],
            experiment.unnecessary_features(digits.test_y[:120], codes, 0.9, gen(2)),
        ],
        1,
    )
    ignored = torch.arange(72) >= 64
    all_features = experiment.train_classifier(x, digits.train_y, n_classes=10, seed=0).model
    pixels = experiment.train_classifier(
        x, digits.train_y, n_classes=10, seed=0, reads=~ignored
    ).model
    return x, digits.train_y, test_x, ignored, all_features, pixels


# -- the oracle f2 = c2 ∘ g2 -----------------------------------------------------------------------


def test_the_oracle_decides_from_the_features_it_keeps():
    oracle = orc.Oracle(torch.tensor([True, False, True]), lambda g: (g.sum(-1) > 0).long())
    x = torch.tensor([[1.0, -5.0, -0.5], [-1.0, 9.0, 0.5], [-2.0, 9.0, 1.0]])
    assert torch.equal(oracle.features(x), x[:, [0, 2]])
    assert torch.equal(oracle(x), torch.tensor([1, 0, 0]))
    moved = x.clone()
    moved[:, 1] = torch.tensor([100.0, -100.0, 0.0])  # only the ignored feature
    assert torch.equal(oracle(moved), oracle(x))
    assert torch.equal(oracle.distance(x, moved), torch.zeros(3))  # d2' = 0: a pseudometric
    assert torch.equal(oracle.ignored, torch.tensor([False, True, False]))


def test_the_label_lookup_answers_for_known_images_only():
    images = randn(4, 6, seed=1).float()
    lookup = orc.LabelLookup(images, torch.tensor([3, 1, 4, 1]))
    assert torch.equal(lookup(images[[2, 0]]), torch.tensor([4, 3]))
    touched = images[:1].clone()
    touched[0, 5] += 1e-3
    assert torch.equal(lookup(touched), torch.tensor([-1]))


def test_the_oracle_rejects_a_mask_that_is_not_boolean():
    with pytest.raises(TypeError, match="keep must be"):
        orc.Oracle(torch.tensor([1, 0]), lambda g: g)
    oracle = orc.Oracle(torch.tensor([True, False]), lambda g: g)
    with pytest.raises(ValueError, match="x must have shape"):
        oracle(torch.zeros(3, 5))


# -- the classifier f1 = c1 ∘ g1 -------------------------------------------------------------------


def test_the_classifier_is_its_decision_after_its_features():
    torch.manual_seed(0)
    reads = torch.tensor([True, False, True, True])
    model = orc.Classifier(4, 3, hidden=5, reads=reads)
    x = randn(6, 4, seed=2).float()
    expected = model.c(torch.relu(model.g[0](x[:, reads])))
    assert torch.allclose(model(x), expected)
    assert torch.allclose(model(x), model.decide(model.features(x)))
    changed = x.clone()
    changed[:, 1] = 50.0  # a feature it does not read
    assert torch.equal(model(changed), model(x))


def test_the_classifier_rejects_a_mask_of_the_wrong_size():
    with pytest.raises(ValueError, match="reads must broadcast"):
        orc.Classifier(4, 3, reads=torch.tensor([True, False]))


# -- the attack -----------------------------------------------------------------------------------


def test_projection_is_the_clamp_of_the_step_then_the_range():
    x = torch.tensor([[0.5, 0.9, 0.1]])
    x_adv = torch.tensor([[0.9, 1.5, -0.5]])
    projected = orc.project(x_adv, x, 0.3, 0.0, 1.0)
    assert torch.allclose(projected, torch.tensor([[0.8, 1.0, 0.0]]))
    free = orc.project(x_adv, x, 0.3, -torch.inf, torch.inf)
    assert torch.allclose(free, torch.tensor([[0.8, 1.2, -0.2]]))


def test_a_linear_classifier_flips_exactly_when_epsilon_exceeds_its_margin():
    # Two classes, logit difference 2 * x2 - 1 (class 1 when x2 > 0.5). Points with x2 = 0.7 sit
    # at 0.2 from the boundary along x2; the attack may move x2 only.
    model = linear_classifier([[0.0, -1.0], [0.0, 1.0]], [0.5, -0.5])
    x = torch.tensor([[0.3, 0.7], [0.9, 0.7]])
    mask = torch.tensor([False, True])
    small = orc.attack_unnecessary_features(model, x, mask, 0.15, 10)
    large = orc.attack_unnecessary_features(model, x, mask, 0.25, 10)
    assert not small.flipped.any() and large.flipped.all()
    assert torch.equal(small.x_adv[:, 0], x[:, 0]) and torch.equal(large.x_adv[:, 0], x[:, 0])
    assert (large.x_adv[:, 1] < 0.5).all() and (large.x_adv[:, 1] >= 0.7 - 0.25 - 1e-6).all()
    assert torch.allclose(small.x_adv[:, 1], torch.full((2,), 0.55))  # pushed to the ball's edge


def test_the_attack_moves_only_masked_features_within_the_ball_and_range(digits_with_extra):
    _, _, test_x, ignored, model, _ = digits_with_extra
    for epsilon in (0.1, 0.4, 1.0):
        attack = orc.attack_unnecessary_features(model, test_x, ignored, epsilon, 15)
        assert torch.equal(attack.x_adv[:, ~ignored], test_x[:, ~ignored])
        assert (attack.x_adv - test_x).abs().max() <= epsilon + 1e-6
        assert attack.x_adv.min() >= 0 and attack.x_adv.max() <= 1
        with torch.no_grad():
            changed = model(attack.x_adv).argmax(1) != model(test_x).argmax(1)
        assert torch.equal(attack.flipped, changed)
    assert attack.flipped.float().mean() > 0.3  # at epsilon = 1 it does find some


def test_a_per_example_mask_broadcasts(digits_with_extra):
    _, _, test_x, ignored, model, _ = digits_with_extra
    mask = ignored.expand(len(test_x), -1).clone()
    mask[::2] = False  # even rows: nothing may move
    attack = orc.attack_unnecessary_features(model, test_x, mask, 1.0, 10)
    assert torch.equal(attack.x_adv[::2], test_x[::2]) and not attack.flipped[::2].any()


def test_a_model_that_ignores_the_masked_features_is_never_flipped(digits_with_extra):
    _, _, test_x, ignored, _, pixels_only = digits_with_extra
    for epsilon in (0.5, 1.0, 5.0):
        attack = orc.attack_unnecessary_features(
            pixels_only, test_x, ignored, epsilon, 20, clip=None
        )
        assert not attack.flipped.any()
        assert torch.equal(attack.x_adv, test_x)  # its gradient there is exactly zero


def test_the_attack_rejects_bad_arguments(digits_with_extra):
    _, _, test_x, ignored, model, _ = digits_with_extra
    with pytest.raises(ValueError, match="epsilon"):
        orc.attack_unnecessary_features(model, test_x, ignored, -0.1, 10)
    with pytest.raises(ValueError, match="mask must broadcast"):
        orc.attack_unnecessary_features(model, test_x, ignored[:10], 0.5, 10)
    with pytest.raises(TypeError, match="mask must be a boolean"):
        orc.attack_unnecessary_features(model, test_x, ignored.float(), 0.5, 10)
    with pytest.raises(ValueError, match="x must have shape"):
        orc.attack_unnecessary_features(model, test_x[0], ignored, 0.5, 10)
    with pytest.raises(ValueError, match="steps"):
        orc.attack_unnecessary_features(model, test_x, ignored, 0.5, 0)
    with pytest.raises(ValueError, match="clip"):
        orc.attack_unnecessary_features(model, test_x, ignored, 0.5, 10, clip=(0.0, 0.5))


# -- unnecessary features -------------------------------------------------------------------------


def test_unnecessary_features_show_the_label_code_with_the_given_probability():
    codes = experiment.label_codes(12, 10, gen(3))
    assert codes.shape == (10, 12) and set(codes.unique().tolist()) <= {0.0, 1.0}
    labels = torch.randint(10, (20000,), generator=gen(4))
    exact = experiment.unnecessary_features(labels, codes, 1.0, gen(5), noise=0.0)
    assert torch.equal(exact, codes[labels])
    for correlation in (0.0, 0.6):
        z = experiment.unnecessary_features(labels, codes, correlation, gen(6), noise=0.0)
        own = (z == codes[labels]).all(1).float().mean().item()
        # own code: with probability rho, or by chance 1/10 of the rest (codes of two classes
        # may coincide: count those too)
        same = (codes[:, None] == codes[None]).all(-1).float().sum(1).mean().item() / 10
        expected = correlation + (1 - correlation) * same
        assert own == pytest.approx(expected, abs=0.015)
    noisy = experiment.unnecessary_features(labels[:50], codes, 0.9, gen(7))
    assert noisy.min() >= 0 and noisy.max() <= 1
    assert torch.equal(noisy, experiment.unnecessary_features(labels[:50], codes, 0.9, gen(7)))
    with pytest.raises(ValueError, match="correlation"):
        experiment.unnecessary_features(labels, codes, 1.5, gen(0))


# -- Siamese training ------------------------------------------------------------------------------


def test_the_twin_redraws_only_the_ignored_features():
    x = torch.rand(50, 6, generator=gen(8))
    ignored = torch.tensor([False, False, True, False, True, True])
    twin = orc.oracle_twin(x, ignored, gen(9))
    assert torch.equal(twin[:, ~ignored], x[:, ~ignored])
    assert (twin[:, ignored] != x[:, ignored]).all()
    assert twin.min() >= 0 and twin.max() <= 1
    with pytest.raises(ValueError, match="ignored must broadcast"):
        orc.oracle_twin(x, ignored[:4], gen(0))


def test_the_siamese_penalty_is_the_mean_squared_distance_of_representations():
    torch.manual_seed(1)
    model = orc.Classifier(5, 3, hidden=4)
    x, twin = randn(7, 5, seed=10).float(), randn(7, 5, seed=11).float()
    by_hand = (
        sum(
            ((model.features(x[i : i + 1]) - model.features(twin[i : i + 1])) ** 2).sum()
            for i in range(7)
        )
        / 7
    )
    assert torch.allclose(orc.siamese_penalty(model, x, twin), by_hand)
    assert orc.siamese_penalty(model, x, x) == 0


def test_siamese_training_makes_the_representation_ignore_the_extra_features(digits_with_extra):
    x, y, test_x, ignored, plain, _ = digits_with_extra
    siamese = experiment.train_classifier(x, y, n_classes=10, seed=0, penalty=1.0, ignored=ignored)
    twin = orc.oracle_twin(test_x, ignored, gen(12))
    with torch.no_grad():
        plain_gap = orc.siamese_penalty(plain, test_x, twin).item()
        siamese_gap = orc.siamese_penalty(siamese.model, test_x, twin).item()
        plain_scale = plain.features(test_x).pow(2).sum(-1).mean().item()
        siamese_scale = siamese.model.features(test_x).pow(2).sum(-1).mean().item()
    assert siamese_gap / siamese_scale < 0.2 * plain_gap / plain_scale
    attack = orc.attack_unnecessary_features(siamese.model, test_x, ignored, 1.0, 20)
    plain_attack = orc.attack_unnecessary_features(plain, test_x, ignored, 1.0, 20)
    assert attack.flipped.float().mean() < 0.5 * plain_attack.flipped.float().mean()


def test_training_learns_follows_its_seed_and_checks_its_arguments(digits_with_extra):
    x, y, test_x, ignored, plain, _ = digits_with_extra
    digits = load_digits_split()
    with torch.no_grad():
        accuracy = (plain(test_x).argmax(1) == digits.test_y[:120]).float().mean()
    assert accuracy > 0.9
    again = experiment.train_classifier(x, y, n_classes=10, seed=0).model
    other = experiment.train_classifier(x, y, n_classes=10, seed=1, steps=5).model
    assert torch.equal(again.c.weight, plain.c.weight)
    assert not torch.equal(other.c.weight, plain.c.weight)
    with pytest.raises(ValueError, match="needs `ignored`"):
        experiment.train_classifier(x, y, n_classes=10, seed=0, penalty=0.5)
    with pytest.raises(ValueError, match="penalty"):
        experiment.train_classifier(x, y, n_classes=10, seed=0, penalty=-1.0, ignored=ignored)
    with pytest.raises(ValueError, match="y must have shape"):
        experiment.train_classifier(x, y[:10], n_classes=10, seed=0)


def test_the_pixel_only_classifier_matches_a_plain_network_on_the_pixels(digits_with_extra):
    # Reading the pixels only is the same as a network that never saw the extra columns.
    x, y, _, ignored, _, pixels_only = digits_with_extra
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    with torch.no_grad():
        net[0].weight.copy_(pixels_only.g[0].weight)
        net[0].bias.copy_(pixels_only.g[0].bias)
        net[2].weight.copy_(pixels_only.c.weight)
        net[2].bias.copy_(pixels_only.c.bias)
        assert torch.allclose(net(x[:, :64]), pixels_only(x))
        assert F.cross_entropy(pixels_only(x), y) < 0.3


def test_without_a_penalty_training_is_plain_cross_entropy(digits_with_extra):
    # penalty = 0 adds nothing: the run is the same whether `ignored` is given or not.
    x, y, _, ignored, plain, _ = digits_with_extra
    with_mask = experiment.train_classifier(x, y, n_classes=10, seed=0, ignored=ignored).model
    assert torch.equal(with_mask.c.weight, plain.c.weight)


# -- the chapter's data and measurements -----------------------------------------------------------


def test_the_toy_oracle_labels_from_x1_and_x2_tracks_its_label():
    oracle = orc.Oracle(torch.tensor([True, False]), lambda z: (z[:, 0] > 0).long())
    x, y = experiment.toy_data(oracle, 2000, gen(0))
    assert torch.equal(y, (x[:, 0] > 0).long())
    # x2 = 0.75 (2y - 1) + 0.5 noise: its mean is +-0.75 by class, its std 0.5.
    for label, sign in ((0, -1), (1, 1)):
        assert x[y == label, 1].mean().item() == pytest.approx(0.75 * sign, abs=0.05)
        assert x[y == label, 1].std().item() == pytest.approx(0.5, abs=0.05)
    again = experiment.toy_data(oracle, 2000, gen(0))
    assert torch.equal(again[0], x)


def test_digits_with_unnecessary_features_append_k_coded_columns_to_each_split():
    digits = load_digits_split()
    data = experiment.with_unnecessary_features(digits, 8, 1.0, seed=0)
    assert set(data) == {"train", "val", "test"}
    for split, (x, y) in {
        "train": (digits.train_x, digits.train_y),
        "val": (digits.val_x, digits.val_y),
        "test": (digits.test_x, digits.test_y),
    }.items():
        assert data[split].shape == (len(x), 72)
        assert torch.equal(data[split][:, :64], x)
        # correlation 1: the extra columns are the class's code plus clipped noise of std 0.1
        codes = experiment.label_codes(8, 10, pn.generator(0, experiment.CODES))
        assert ((data[split][:, 64:] - codes[y]).abs() < 0.5).float().mean() > 0.99
    again = experiment.with_unnecessary_features(digits, 8, 1.0, seed=0)
    assert all(torch.equal(again[k], data[k]) for k in data)
    other = experiment.with_unnecessary_features(digits, 8, 1.0, seed=1)
    assert not torch.equal(other["train"], data["train"])


def test_measure_reports_accuracy_and_the_flips_of_each_radius(digits_with_extra):
    x, y, test_x, ignored, plain, pixels = digits_with_extra
    digits = load_digits_split()
    oracle = orc.Oracle(~ignored, lambda z: torch.zeros(len(z), dtype=torch.int64))
    result = experiment.measure(plain, test_x, digits.test_y[:120], oracle, (0.5, 1.0), 10)
    with torch.no_grad():
        accuracy = (plain(test_x).argmax(1) == digits.test_y[:120]).float().mean().item()
    assert result["accuracy"] == accuracy
    assert set(result["attacks"]) == set(result["flips"]) == {0.5, 1.0}
    for eps, attack in result["attacks"].items():
        assert result["flips"][eps] == attack.flipped.float().mean().item()
        assert torch.equal(attack.x_adv[:, :64], test_x[:, :64])  # the oracle's pixels stay
    assert result["flips"][1.0] > 0
    assert experiment.measure(pixels, test_x, digits.test_y[:120], oracle, (1.0,), 10)["flips"] == {
        1.0: 0.0
    }


def test_the_weight_is_chosen_by_accuracy_under_attack():
    def result(robust, flips):
        return {"robust_accuracy": robust, "strongest_flips": flips}

    validation = {0.1: result(0.80, 0.15), 0.3: result(0.90, 0.05), 1.0: result(0.85, 0.0)}
    assert experiment.choose_weight(validation) == 0.3  # 1.0 is moved least, but less accurate
    tie = {0.1: result(0.9, 0.08), 0.3: result(0.9, 0.05), 1.0: result(0.9, 0.05)}
    assert experiment.choose_weight(tie) == 0.3  # fewer changed, then the smaller weight
    with pytest.raises(ValueError, match="no weights"):
        experiment.choose_weight({})


# -- the exhaustive search, the baselines and the chapter's measures ------------------------------


def test_pasting_values_flips_exactly_where_a_value_changes_the_prediction():
    # f1 says 1 where x0 + x1 > 0.5; the oracle reads x0, the search writes x1
    model = linear_classifier([[0.0, 0.0], [1.0, 1.0]], [0.0, -0.5])
    x = torch.tensor([[0.0, 0.0], [0.3, 0.0], [2.0, 0.0]])
    mask = torch.tensor([False, True])
    attack = orc.attack_by_values(model, x, mask, torch.tensor([[0.1], [0.4], [0.9]]))
    # clean: 0, 0, 1. x0 = 0 needs x1 > 0.5 (0.9); x0 = 0.3 needs x1 > 0.2 (0.4, the first);
    # x0 = 2 stays 1 for every value
    assert attack.flipped.tolist() == [True, True, False]
    assert torch.equal(attack.x_adv[:, 0], x[:, 0])  # the oracle's feature never moves
    assert attack.x_adv[:, 1].tolist() == pytest.approx([0.9, 0.4, 0.0])
    with pytest.raises(ValueError, match="values"):
        orc.attack_by_values(model, x, mask, torch.zeros(3, 2))  # two values for one feature
    with pytest.raises(ValueError, match="one mask"):
        orc.attack_by_values(model, x, mask.expand(3, 2), torch.zeros(3, 1))


def test_the_strongest_attack_is_the_union_of_both(digits_with_extra):
    x, y, test_x, ignored, plain, pixels = digits_with_extra
    digits = load_digits_split()
    oracle = orc.Oracle(~ignored, lambda z: torch.zeros(len(z), dtype=torch.int64))
    values = experiment.label_codes(8, 10, gen(0))
    result = experiment.measure(plain, test_x, digits.test_y[:120], oracle, (1.0,), 10, values)
    union = result["pasted"].flipped | result["attacks"][1.0].flipped
    assert torch.equal(result["strongest"], union)
    assert result["strongest_flips"] == union.float().mean().item() > 0
    assert torch.equal(result["pasted"].x_adv[:, :64], test_x[:, :64])
    assert torch.equal(result["correct"], plain(test_x).argmax(1) == digits.test_y[:120])
    assert "strongest" not in experiment.measure(
        plain, test_x, digits.test_y[:120], oracle, (1.0,), 10
    )


def test_the_paired_difference_and_its_standard_error():
    a = torch.tensor([True, True, False, True])
    b = torch.tensor([True, False, False, False])
    d, se = experiment.paired_difference(a, b)
    per_input = torch.tensor([0.0, 1.0, 0.0, 1.0])
    assert d == pytest.approx(0.5)
    assert se == pytest.approx((per_input.std() / 2).item())
    assert experiment.paired_difference(a, a) == (0.0, 0.0)
    real = experiment.paired_difference(
        torch.tensor([0.5, 0.1, 0.3]), torch.tensor([0.1, 0.1, 0.1])
    )
    assert real[0] == pytest.approx(0.2) and real[1] == pytest.approx(0.2 / 3**0.5)
    with pytest.raises(ValueError):
        experiment.paired_difference(a, b[:3])


def test_the_representation_shift_is_zero_for_pixels_only_and_positive_otherwise(
    digits_with_extra,
):
    x, y, test_x, ignored, plain, pixels = digits_with_extra
    assert experiment.representation_shift(pixels, test_x, ignored, gen(3)) == 0.0
    shift = experiment.representation_shift(plain, test_x, ignored, gen(3))
    assert 0.0 < shift < 10.0
    # a g1 that reads only the extra features moves as much under a twin as between inputs
    extra_only = orc.Classifier(72, 10, reads=ignored)
    assert experiment.representation_shift(extra_only, test_x, ignored, gen(3)) > 0.5
    per_input = experiment.shift_per_input(plain, test_x, ignored, gen(3))
    assert per_input.shape == (len(test_x),) and (per_input >= 0).all()
    assert per_input.mean().item() == pytest.approx(shift)


def test_retraining_the_decision_keeps_g1_and_follows_its_run(digits_with_extra):
    x, y, test_x, ignored, plain, pixels = digits_with_extra
    before = {k: v.clone() for k, v in plain.state_dict().items()}
    first = experiment.retrain_decision(plain, x, y, seed=0, run=0, steps=30).model
    again = experiment.retrain_decision(plain, x, y, seed=0, run=0, steps=30).model
    other = experiment.retrain_decision(plain, x, y, seed=0, run=1, steps=30).model
    assert all(torch.equal(plain.state_dict()[k], v) for k, v in before.items())  # untouched
    for name, value in first.g.state_dict().items():
        assert torch.equal(value, plain.g.state_dict()[name])  # g1 frozen
    assert not torch.equal(first.c.weight, plain.c.weight)  # c1 drawn afresh and trained
    assert torch.equal(first.c.weight, again.c.weight)
    assert not torch.equal(first.c.weight, other.c.weight)
    assert pn.training.accuracy_of(first, x, y) > 0.8


def test_the_augmentation_baseline_trains_on_the_twins(digits_with_extra):
    x, y, test_x, ignored, plain, pixels = digits_with_extra
    augmented = experiment.train_classifier(
        x, y, n_classes=10, seed=0, augment=10.0, ignored=ignored, steps=60
    ).model
    short = experiment.train_classifier(x, y, n_classes=10, seed=0, steps=60).model
    assert not torch.equal(augmented.c.weight, short.c.weight)
    # trained on twins whose extra features are noise, g1 leans on them less
    shift = experiment.representation_shift(augmented, test_x, ignored, gen(3))
    assert shift < experiment.representation_shift(short, test_x, ignored, gen(3))
    with pytest.raises(ValueError, match="ignored"):
        experiment.train_classifier(x, y, n_classes=10, seed=0, augment=1.0)
    with pytest.raises(ValueError, match="three arms"):
        experiment.train_classifier(
            x, y, n_classes=10, seed=0, augment=1.0, penalty=1.0, ignored=ignored
        )


def test_a_robustness_seeking_decision_keeps_g1_and_moves_less(digits_with_extra):
    x, y, test_x, ignored, plain, _ = digits_with_extra
    plain_c1 = experiment.retrain_decision(plain, x, y, seed=0, run=0, steps=100).model
    seeking = experiment.retrain_decision(
        plain, x, y, seed=0, run=0, steps=100, recipe="siamese", weight=3.0, ignored=ignored
    ).model
    for name, value in seeking.g.state_dict().items():
        assert torch.equal(value, plain.g.state_dict()[name])  # g1 frozen
    twin = orc.oracle_twin(test_x, ignored, gen(13))
    with torch.no_grad():
        gap = {m: (m(test_x) - m(twin)).pow(2).sum(-1).mean().item() for m in (plain_c1, seeking)}
    assert gap[seeking] < 0.5 * gap[plain_c1]  # its answers move less under an oracle twin
    flips = {
        m: orc.attack_unnecessary_features(m, test_x, ignored, 1.0, 20).flipped.float().mean()
        for m in (plain_c1, seeking)
    }
    assert flips[seeking] < flips[plain_c1]
    with pytest.raises(ValueError, match="needs `ignored`"):
        experiment.retrain_decision(plain, x, y, seed=0, run=0, recipe="siamese", weight=1.0)
    with pytest.raises(ValueError, match="weight"):
        experiment.retrain_decision(plain, x, y, seed=0, run=0, recipe="twins", ignored=ignored)
    with pytest.raises(ValueError, match="recipe"):
        experiment.retrain_decision(plain, x, y, seed=0, run=0, recipe="pgd", weight=1.0)
    with pytest.raises(ValueError, match="codes"):
        experiment.retrain_decision(
            plain, x, y, seed=0, run=0, recipe="adversarial", weight=1.0, ignored=ignored
        )


# -- the nulls' own code ---------------------------------------------------------------------------


def test_the_nulls_twin_is_the_mechanisms_twin_written_again():
    x = torch.rand(40, 6, generator=gen(14))
    ignored = torch.tensor([False, True, False, True, True, False])
    assert torch.equal(
        experiment.redraw_ignored(x, ignored, gen(15)), orc.oracle_twin(x, ignored, gen(15))
    )


def test_the_nulls_search_finds_what_the_mechanisms_strongest_attack_finds(digits_with_extra):
    x, y, test_x, ignored, plain, pixels = digits_with_extra
    digits = load_digits_split()
    oracle = orc.Oracle(~ignored, lambda z: torch.zeros(len(z), dtype=torch.int64))
    values = experiment.label_codes(8, 10, gen(0))
    for model in (plain, pixels):
        mechanism = experiment.measure(
            model, test_x, digits.test_y[:120], oracle, (1.0,), 20, values
        )
        null = experiment.measure_null(model, test_x, digits.test_y[:120], ignored, values, 20)
        assert torch.equal(null["strongest"], mechanism["strongest"])
        assert torch.equal(null["robust"], mechanism["robust"])
        assert null["robust_accuracy"] == mechanism["robust_accuracy"]
    assert null["strongest_flips"] == 0.0  # pixels only: nothing to move
    assert mechanism["robust"].sum() == (mechanism["correct"] & ~mechanism["strongest"]).sum()


def test_a_constant_decision_is_never_moved_and_right_on_its_class_only():
    y = torch.tensor([3, 1, 3, 0, 3, 2])
    constant = experiment.constant_decision(y)
    assert constant["accuracy"] == constant["robust_accuracy"] == pytest.approx(0.5)
    assert constant["strongest_flips"] == 0.0 and not constant["strongest"].any()


def test_every_attacked_digit_keeps_the_oracles_label_and_stays_in_its_ball():
    # The definition's two by-construction guarantees, on a classifier trained on digits with 16
    # unnecessary features: the oracle (a lookup of the given labels) answers the same for every
    # attacked input, its features do not move (d2' = 0), and no feature moves by more than eps.
    digits = load_digits_split()
    data = experiment.with_unnecessary_features(digits, 16, 0.9, seed=0)
    keep = torch.arange(80) < 64
    labeller = orc.LabelLookup(digits.test_x, digits.test_y)
    oracle = orc.Oracle(keep, labeller)
    model = experiment.train_classifier(data["train"], digits.train_y, n_classes=10, seed=0).model
    x = data["test"][:150]
    attacks = [
        (eps, orc.attack_unnecessary_features(model, x, ~keep, eps, 20))
        for eps in (0.25, 0.5, 0.75, 1.0)
    ]
    attacks.append((1.0, orc.attack_by_values(model, x, ~keep, experiment.codes_of(16, 0))))
    for eps, attack in attacks:
        assert torch.equal(oracle(attack.x_adv), oracle(x))
        assert torch.equal(oracle(x), digits.test_y[:150])
        assert oracle.distance(attack.x_adv, x).max() == 0
        assert (attack.x_adv - x).abs().max() <= eps + 1e-6
    assert attacks[0][1].flipped.any() and attacks[-1][1].flipped.any()
    # the projection binds below eps = 1: without it, 20 steps of 2.5 eps / 20 would go further
    assert (attacks[0][1].x_adv - x).abs().max() == pytest.approx(0.25, abs=1e-6)


def test_the_nulls_network_is_the_mechanisms_classifier_written_again(digits_with_extra):
    x, y, test_x, ignored, plain, pixels = digits_with_extra
    for reads, hidden in ((None, 64), (~ignored, 64), (None, None)):
        with pn.training.seeded(3):
            mechanism = orc.Classifier(72, 10, hidden=hidden, reads=reads)
        with pn.training.seeded(3):
            null = experiment.PlainNetwork(72, 10, hidden=hidden, reads=reads)
        assert mechanism.state_dict().keys() == null.state_dict().keys()
        for name, value in mechanism.state_dict().items():
            assert torch.equal(value, null.state_dict()[name])
        with torch.no_grad():
            assert torch.equal(mechanism(test_x), null(test_x))
            assert torch.equal(mechanism.features(test_x), null.features(test_x))
    # only the Siamese network is the mechanism's; the nulls are not
    assert type(plain) is experiment.PlainNetwork


def test_the_worst_code_is_the_one_of_largest_loss_per_input(digits_with_extra):
    x, y, test_x, ignored, plain, _ = digits_with_extra
    codes = experiment.label_codes(8, 10, gen(0))
    labels = load_digits_split().test_y[:120]
    worst = experiment.worst_code(plain, test_x, labels, ignored, codes)
    with torch.no_grad():
        losses = []
        for code in codes:  # every code written in by hand
            pasted = test_x.clone()
            pasted[:, 64:] = code
            losses.append(F.cross_entropy(plain(pasted), labels, reduction="none"))
        expected = torch.stack(losses).argmax(0)
    assert torch.equal(worst[:, :64], test_x[:, :64])  # the oracle's pixels untouched
    assert torch.equal(worst[:, 64:], codes[expected])
    # and the stacked version picks the same codes, decision by decision
    logits = experiment.worst_logits(
        lambda z: plain(z).unsqueeze(0), test_x, labels, ignored, codes
    )
    with torch.no_grad():
        assert torch.allclose(logits[0], plain(worst), atol=1e-5)


def test_decisions_trained_together_are_their_own_runs(digits_with_extra):
    x, y, test_x, ignored, plain, _ = digits_with_extra
    codes = experiment.label_codes(8, 10, gen(0))
    for recipe in ("siamese", "twins", "adversarial"):
        grid = experiment.retrain_decisions(
            plain,
            x,
            y,
            seed=0,
            run=0,
            recipe=recipe,
            weights=(0.5, 5.0),
            ignored=ignored,
            codes=codes,
            steps=40,
        )
        for k, weight in enumerate((0.5, 5.0)):
            alone = experiment.retrain_decision(
                plain,
                x,
                y,
                seed=0,
                run=0,
                recipe=recipe,
                weight=weight,
                ignored=ignored,
                codes=codes,
                steps=40,
            )
            assert torch.allclose(grid[k].model.c.weight, alone.model.c.weight, atol=1e-5)
        assert not torch.allclose(grid[0].model.c.weight, grid[1].model.c.weight, atol=1e-3)


def test_a_decision_trained_on_its_worst_code_resists_the_pasting_search(digits_with_extra):
    x, y, test_x, ignored, plain, _ = digits_with_extra
    codes = experiment.label_codes(8, 10, gen(0))
    plain_c1 = experiment.retrain_decision(plain, x, y, seed=0, run=0, steps=150).model
    adversarial = experiment.retrain_decision(
        plain,
        x,
        y,
        seed=0,
        run=0,
        steps=150,
        recipe="adversarial",
        weight=10.0,
        ignored=ignored,
        codes=codes,
    ).model
    for name, value in adversarial.g.state_dict().items():
        assert torch.equal(value, plain.g.state_dict()[name])  # g1 frozen
    pasted = {
        m: orc.attack_by_values(m, test_x, ignored, codes).flipped.float().mean()
        for m in (plain_c1, adversarial)
    }
    assert pasted[adversarial] < 0.5 * pasted[plain_c1]


def test_adversarial_training_of_the_network_resists_the_pasting_search(digits_with_extra):
    x, y, test_x, ignored, plain, _ = digits_with_extra
    codes = experiment.label_codes(8, 10, gen(0))
    trained = experiment.train_classifier(
        x, y, n_classes=10, seed=0, adversarial=10.0, ignored=ignored, codes=codes
    ).model
    pasted = {
        m: orc.attack_by_values(m, test_x, ignored, codes).flipped.float().mean()
        for m in (plain, trained)
    }
    assert pasted[trained] < 0.5 * pasted[plain]
    with pytest.raises(ValueError, match="codes"):
        experiment.train_classifier(x, y, n_classes=10, seed=0, adversarial=1.0, ignored=ignored)


def test_the_shift_at_values_is_the_largest_over_the_values_written_in(digits_with_extra):
    x, y, test_x, ignored, plain, pixels = digits_with_extra
    codes = experiment.label_codes(8, 10, gen(0))
    shift = experiment.shift_at_values(plain, test_x, ignored, codes, gen(3))
    other = test_x[torch.randperm(len(test_x), generator=gen(3))]
    with torch.no_grad():
        g = plain.features(test_x)
        scale = (g - plain.features(other)).pow(2).sum(-1).mean()
        each = []
        for code in codes:
            pasted = test_x.clone()
            pasted[:, 64:] = code
            each.append((g - plain.features(pasted)).pow(2).sum(-1))
        expected = torch.stack(each).amax(0) / scale
    assert torch.allclose(shift, expected)
    assert shift.mean() > 0.01
    assert experiment.shift_at_values(pixels, test_x, ignored, codes, gen(3)).max() == 0
