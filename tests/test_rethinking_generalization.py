"""Tests of papernotes.rethinking_generalization and its experiment: label corruption, input
randomizations, the randomization test's loop (networks side by side following their own runs,
weight decay as Adam's), the Theorem 1 construction and its ablation, the minimum-norm kernel
interpolant, and the chapter's measurements."""

import math

import pytest
import torch

import papernotes as pn
from conftest import gen, randn
from papernotes import rethinking_generalization as rg
from papernotes.rethinking_generalization import experiment
from papernotes.training import accuracy

# -- corrupt_labels -------------------------------------------------------------------------------


def binomial_tolerance(n, p, sds=5):
    return sds * math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize("fraction", [0.1, 0.3, 0.75])
def test_corruption_changes_about_the_asked_fraction(fraction):
    # With C classes a replaced label draws its own class again with probability 1/C.
    n, classes = 100_000, 10
    labels = torch.randint(classes, (n,), generator=gen(1))
    corrupted = rg.corrupt_labels(labels, fraction, classes, gen(2))
    expected = fraction * (1 - 1 / classes)
    changed = (corrupted != labels).double().mean().item()
    assert abs(changed - expected) < binomial_tolerance(n, expected)


def test_corruption_keeps_the_rest_and_leaves_the_input_alone():
    # With 1000 classes nearly every replaced label changes, so the unchanged ones are the kept.
    n, classes, fraction = 50_000, 1000, 0.3
    labels = torch.randint(classes, (n,), generator=gen(3))
    before = labels.clone()
    corrupted = rg.corrupt_labels(labels, fraction, classes, gen(4))
    assert torch.equal(labels, before)
    kept = (corrupted == labels).double().mean().item()
    assert abs(kept - (1 - fraction)) < binomial_tolerance(n, 1 - fraction) + 1e-3


def test_replaced_labels_are_uniform_over_the_classes():
    n, classes = 100_000, 10
    corrupted = rg.corrupt_labels(torch.zeros(n, dtype=torch.int64), 1.0, classes, gen(5))
    frequencies = torch.bincount(corrupted, minlength=classes).double() / n
    assert (frequencies - 1 / classes).abs().max() < binomial_tolerance(n, 1 / classes)


def test_no_corruption_is_the_identity_and_one_draw_is_reproducible():
    labels = torch.randint(10, (1000,), generator=gen(6))
    assert torch.equal(rg.corrupt_labels(labels, 0.0, 10, gen(7)), labels)
    assert torch.equal(
        rg.corrupt_labels(labels, 0.5, 10, gen(8)), rg.corrupt_labels(labels, 0.5, 10, gen(8))
    )


def test_corrupt_labels_rejects_bad_arguments():
    labels = torch.randint(10, (100,), generator=gen(9))
    with pytest.raises(ValueError, match="fraction"):
        rg.corrupt_labels(labels, 1.5, 10)
    with pytest.raises(ValueError, match="labels"):
        rg.corrupt_labels(labels.reshape(10, 10), 0.5, 10)
    with pytest.raises(ValueError, match="labels must lie in"):
        rg.corrupt_labels(labels + 5, 0.5, 10)


# -- randomize_inputs -----------------------------------------------------------------------------


def numbered_images(n=40, d=64):
    """x[i, j] = i * d + j: every pixel value names its image and its position."""
    return torch.arange(n * d, dtype=torch.float64).reshape(n, d)


def test_shuffled_pixels_apply_one_permutation_to_every_image():
    x = numbered_images()
    shuffled = rg.randomize_inputs(x, "shuffled_pixels", gen(10))
    positions = (shuffled - x[:, :1]).long()  # the original column of every pixel
    assert torch.equal(positions, positions[:1].expand_as(positions))
    assert torch.equal(positions[0].sort().values, torch.arange(x.shape[1]))
    assert not torch.equal(positions[0], torch.arange(x.shape[1]))


def test_random_pixels_permute_each_image_on_its_own():
    x = numbered_images()
    shuffled = rg.randomize_inputs(x, "random_pixels", gen(11))
    assert torch.equal(shuffled.sort(dim=1).values, x)  # each row keeps its own pixels
    positions = (shuffled - x[:, :1]).long()
    assert len({tuple(row.tolist()) for row in positions}) == len(x)  # all permutations differ


def test_gaussian_inputs_match_the_mean_and_variance_and_forget_the_images():
    x = 0.3 + 2.0 * randn(500, 64, seed=12).abs()
    noise = rg.randomize_inputs(x, "gaussian", gen(13))
    assert noise.shape == x.shape and noise.dtype == x.dtype
    assert abs(noise.mean() - x.mean()) < 0.02 and abs(noise.std() / x.std() - 1) < 0.02
    correlation = torch.corrcoef(torch.stack([noise.flatten(), x.flatten()]))[0, 1]
    assert abs(correlation) < 0.02
    assert (noise < x.min()).any()  # Gaussian tails, not a rearrangement of x's values


def test_randomize_inputs_rejects_bad_arguments():
    with pytest.raises(ValueError, match="mode"):
        rg.randomize_inputs(numbered_images(), "flipped_pixels")
    with pytest.raises(ValueError, match="x"):
        rg.randomize_inputs(torch.zeros(4, 8, 8), "gaussian")


# -- the randomized data set and the loop ---------------------------------------------------------


def small_digits(n=60, m=30, d=16, classes=4, seed=14):
    x = torch.rand(n + m, d, generator=gen(seed))
    y = torch.randint(classes, (n + m,), generator=gen(seed + 1))
    return x[:n], y[:n], x[n:], y[n:]


def test_a_randomized_set_is_drawn_once_and_served_every_epoch():
    train_x, train_y, test_x, test_y = small_digits()
    data = rg.RandomizedDigits(
        train_x,
        train_y,
        test_x,
        test_y,
        corruption=1.0,
        inputs="random_pixels",
        num_classes=4,
        seed=3,
    )
    first, second = data.epoch(), data.epoch()
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    assert torch.equal(data.test_y, test_y)  # test labels stay true
    assert data.changed_fraction == (data.train_y != train_y).double().mean().item() > 0.5


def test_shuffled_pixels_use_the_same_permutation_on_the_test_images():
    train_x, train_y, test_x, test_y = small_digits()
    data = rg.RandomizedDigits(
        train_x, train_y, test_x, test_y, inputs="shuffled_pixels", num_classes=4, seed=5
    )
    perm = [int((train_x[0] == v).nonzero()) for v in data.train_x[0]]
    assert torch.equal(data.train_x, train_x[:, perm])
    assert torch.equal(data.test_x, test_x[:, perm])
    assert torch.equal(data.train_y, train_y)


def test_randomized_digits_rejects_bad_arguments():
    train_x, train_y, test_x, test_y = small_digits()
    with pytest.raises(ValueError, match="inputs"):
        rg.RandomizedDigits(train_x, train_y, test_x, test_y, inputs="noise")
    with pytest.raises(ValueError, match="corruption"):
        rg.RandomizedDigits(train_x, train_y, test_x, test_y, corruption=-0.1)
    with pytest.raises(ValueError, match="test_x"):
        rg.RandomizedDigits(train_x, train_y, test_x[:, :8], test_y)


def test_the_loop_trains_the_whole_schedule_and_records_the_first_perfect_epoch():
    train_x, train_y, test_x, test_y = small_digits()
    data = rg.RandomizedDigits(train_x, train_y, test_x, test_y, corruption=1.0, num_classes=4)
    run = experiment.randomization_test(data, seed=0, epochs=120, batch_size=10, hidden=64, lr=3e-3)
    assert run.updates_per_epoch == 6
    assert run.history.steps == [6 * e for e in range(1, 121)]  # every epoch, none skipped
    assert run.epochs == list(range(1, 121))
    curve = run.history["train_accuracy"]
    fit = run.epochs_to_fit
    assert fit is not None and fit < 120 and curve[fit - 1] == 1.0 and max(curve[: fit - 1]) < 1.0
    assert run.test_accuracy_when_fitted == run.history["test_accuracy"][fit - 1]
    with torch.no_grad():  # measured at the end, on the whole training set, against its labels
        assert run.train_accuracy == accuracy(run.model(data.train_x), data.train_y)
        assert run.test_accuracy == accuracy(run.model(test_x), test_y)


def test_dropout_adds_layers_without_weights_and_keeps_the_initial_weights():
    train_x, train_y, test_x, test_y = small_digits()
    data = rg.RandomizedDigits(train_x, train_y, test_x, test_y, num_classes=4)
    plain = experiment.randomization_test(data, seed=3, epochs=1, batch_size=60, hidden=8, lr=1e-9)
    dropped = experiment.randomization_test(
        data, seed=3, epochs=1, batch_size=60, hidden=8, lr=1e-9, dropout=0.5
    )
    kinds = [type(m).__name__ for m in dropped.model]
    assert kinds == ["Linear", "ReLU", "Linear", "ReLU", "Dropout", "Linear"]
    for a, b in zip(plain.model.parameters(), dropped.model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_weight_decay_shrinks_the_weights_and_changes_the_run():
    train_x, train_y, test_x, test_y = small_digits()
    data = rg.RandomizedDigits(train_x, train_y, test_x, test_y, corruption=1.0, num_classes=4)

    def norm(run):
        return sum(p.detach().square().sum() for p in run.model.parameters()).item()

    free = experiment.randomization_test(data, epochs=30, batch_size=10, hidden=32, lr=3e-3)
    decayed = experiment.randomization_test(
        data, epochs=30, batch_size=10, hidden=32, lr=3e-3, weight_decay=0.5
    )
    assert norm(decayed) < 0.5 * norm(free)


def test_a_run_that_never_fits_reports_none():
    train_x, train_y, test_x, test_y = small_digits()
    data = rg.RandomizedDigits(train_x, train_y, test_x, test_y, corruption=1.0, num_classes=4)
    run = experiment.randomization_test(data, epochs=2, batch_size=10, hidden=8)
    assert run.epochs_to_fit is None and run.test_accuracy_when_fitted is None
    assert len(run.epochs) == 2


def test_randomization_test_rejects_bad_arguments():
    train_x, train_y, test_x, test_y = small_digits()
    data = rg.RandomizedDigits(train_x, train_y, test_x, test_y, num_classes=4)
    with pytest.raises(TypeError, match="data"):
        experiment.randomization_test((train_x, train_y))
    with pytest.raises(ValueError, match="batch_size"):
        experiment.randomization_test(data, batch_size=100)
    with pytest.raises(ValueError, match="epochs"):
        experiment.randomization_test(data, epochs=0)
    with pytest.raises(ValueError, match="dropout"):
        experiment.randomization_test(data, batch_size=10, dropout=1.0)
    with pytest.raises(ValueError, match="weight_decay"):
        experiment.randomization_test(data, batch_size=10, weight_decay=-1.0)


def test_distinct_subset_drops_duplicates_before_drawing():
    x = torch.tensor([[0.0, 1.0], [2.0, 3.0], [0.0, 1.0], [4.0, 5.0], [2.0, 3.0]])
    y = torch.tensor([0, 1, 2, 3, 4])
    assert rg.first_occurrences(x).tolist() == [0, 1, 3]
    sub_x, sub_y = experiment.distinct_subset(x, y, 3, gen(15))
    assert torch.equal(sub_x, x[[0, 1, 3]]) and sub_y.tolist() == [0, 1, 3]
    with pytest.raises(ValueError, match="n must be at most the 3 distinct"):
        experiment.distinct_subset(x, y, 4)


# -- Theorem 1: finite-sample expressivity ---------------------------------------------------------


@pytest.mark.parametrize(("n", "d"), [(1, 3), (2, 1), (50, 1), (40, 64), (200, 10)])
def test_the_construction_fits_random_labellings_of_random_points(n, d):
    x = randn(n, d, seed=n + d)
    for y in (torch.randint(10, (n,), generator=gen(n)).double(), randn(n, seed=d, scale=5.0)):
        net = rg.finite_sample_expressivity(x, y, gen(d))
        assert experiment.parameter_count(net) == 2 * n + d
        assert (
            experiment.max_fit_error(net, x, y) < 1e-6
        )  # rounding only: a wrong fit is off by units


def test_the_network_is_the_papers_two_layer_relu_network():
    x = randn(30, 5, seed=16)
    y = randn(30, seed=17)
    net = rg.finite_sample_expressivity(x, y, gen(18))
    a, b, w = (p.detach() for p in (net.a, net.b, net.w))
    assert a.shape == (5,) and b.shape == (30,) and w.shape == (30,)
    probe = randn(7, 5, seed=19)
    by_hand = torch.stack(
        [sum(w[j] * max((probe[i] @ a - b[j]).item(), 0.0) for j in range(30)) for i in range(7)]
    )
    assert torch.allclose(net(probe), by_hand, atol=1e-9, rtol=1e-9)


def test_the_biases_interleave_the_projections_and_make_A_lower_triangular():
    x = randn(25, 4, seed=20)
    net = rg.finite_sample_expressivity(x, randn(25, seed=21), gen(22))
    z = (x @ net.a.detach()).sort().values
    b = net.b.detach()
    assert (b < z).all() and (b[1:] > z[:-1]).all()  # b_1 < z_1 < b_2 < ... < b_n < z_n
    A = rg.hidden_units(z, b)
    assert torch.equal(A, A.tril()) and (A.diagonal() > 0).all()


def test_interleaved_biases_and_output_weights_on_a_hand_example():
    z = torch.tensor([0.0, 1.0, 3.0], dtype=torch.float64)
    b = rg.interleaved_biases(z)
    assert b.tolist() == [-0.5, 0.5, 2.0]
    A = rg.hidden_units(z, b)  # [[0.5, 0, 0], [1.5, 0.5, 0], [3.5, 2.5, 1]]
    assert A.tolist() == [[0.5, 0.0, 0.0], [1.5, 0.5, 0.0], [3.5, 2.5, 1.0]]
    w = rg.output_weights(A, torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64))
    assert torch.allclose(w, torch.tensor([2.0, -6.0, 10.0], dtype=torch.float64))


def test_the_construction_refuses_duplicate_points_with_different_labels():
    x = randn(10, 3, seed=23)
    x[7] = x[2]
    y = torch.arange(10, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"duplicate points with different labels: rows 2 and 7"):
        rg.finite_sample_expressivity(x, y)


def test_duplicate_points_with_one_label_count_once():
    x = randn(10, 3, seed=24)
    x[7] = x[2]
    y = torch.arange(10, dtype=torch.float64)
    y[7] = y[2]
    net = rg.finite_sample_expressivity(x, y, gen(25))
    assert experiment.parameter_count(net) == 2 * 9 + 3
    assert experiment.max_fit_error(net, x, y) < 1e-9


def test_the_construction_rejects_bad_shapes():
    with pytest.raises(ValueError, match="x"):
        rg.finite_sample_expressivity(randn(10, seed=26), randn(10, seed=27))
    with pytest.raises(ValueError, match="y"):
        rg.finite_sample_expressivity(randn(10, 3, seed=28), randn(9, seed=29))
    with pytest.raises(TypeError, match="x"):
        rg.finite_sample_expressivity(torch.ones(4, 2, dtype=torch.int64), randn(4, seed=30))
    with pytest.raises(ValueError, match="at least one point"):
        rg.finite_sample_expressivity(torch.zeros(0, 3, dtype=torch.float64), torch.zeros(0))


def test_the_ablation_without_interleaving_fits_affine_functions_of_z_only():
    x = randn(60, 5, seed=31)
    random_labels = torch.randint(10, (60,), generator=gen(32)).double()
    ablation = experiment.least_squares_network(
        x, random_labels, experiment.biases_below_the_points, gen(33)
    )
    assert experiment.parameter_count(ablation) == 2 * 60 + 5
    assert experiment.max_fit_error(ablation, x, random_labels) > 0.5
    z = x @ rg.projection_direction(x, gen(33))
    affine = 3.0 * z + 1.0  # the ablation's A = z 1^T - 1 b^T has rank 2: affine in z it can do
    ablation = experiment.least_squares_network(
        x, affine, experiment.biases_below_the_points, gen(33)
    )
    assert experiment.max_fit_error(ablation, x, affine) < 1e-8


def test_the_network_is_depth_hidden_relu_layers_built_in_order_under_the_seed():
    # The same weights as nn.Linear layers made one after another under the seed, ReLU between.
    train_x, train_y, test_x, test_y = small_digits()
    data = rg.RandomizedDigits(train_x, train_y, test_x, test_y, num_classes=4)
    run = experiment.randomization_test(data, seed=3, epochs=1, batch_size=60, hidden=8, lr=1e-9)
    torch.manual_seed(3)
    expected = [torch.nn.Linear(a, b) for a, b in [(train_x.shape[1], 8), (8, 8), (8, 4)]]
    linear = [m for m in run.model if isinstance(m, torch.nn.Linear)]
    d = train_x.shape[1]
    assert [(m.in_features, m.out_features) for m in linear] == [(d, 8), (8, 8), (8, 4)]
    assert sum(isinstance(m, torch.nn.ReLU) for m in run.model) == 2
    for got, want in zip(linear, expected, strict=True):
        assert torch.allclose(got.weight, want.weight, atol=1e-6)  # one step of lr 1e-9 only
    assert isinstance(run, pn.training.Run) and run.data is data


def test_capped_epochs_counts_a_run_that_never_fits_as_one_past_the_schedule():
    train_x, train_y, test_x, test_y = small_digits()
    data = rg.RandomizedDigits(train_x, train_y, test_x, test_y, corruption=1.0, num_classes=4)
    never = experiment.randomization_test(data, epochs=2, batch_size=10, hidden=8)
    assert experiment.capped_epochs(never) == 3
    never.epochs_to_fit = 2
    assert experiment.capped_epochs(never) == 2


def test_standard_errors_of_a_test_error_and_of_a_paired_difference():
    assert experiment.error_standard_error(0.1, 400) == pytest.approx(0.015)
    train_x, train_y, test_x, test_y = small_digits()
    data = rg.RandomizedDigits(train_x, train_y, test_x, test_y, num_classes=4)
    a = experiment.randomization_test(data, seed=0, epochs=3, batch_size=10, hidden=8)
    b = experiment.randomization_test(data, seed=1, epochs=3, batch_size=10, hidden=8)
    assert experiment.paired_standard_error(a, a) == 0.0
    with torch.no_grad():
        right_a = a.model(test_x).argmax(-1) == test_y
        right_b = b.model(test_x).argmax(-1) == test_y
    by_hand = math.sqrt((right_a != right_b).sum().item()) / len(test_y)
    assert experiment.paired_standard_error(a, b) == pytest.approx(by_hand)
    other = rg.RandomizedDigits(train_x, train_y, test_x[:10], test_y[:10], num_classes=4)
    c = experiment.randomization_test(other, epochs=1, batch_size=10, hidden=8)
    with pytest.raises(ValueError, match="same test set"):
        experiment.paired_standard_error(a, c)


def test_untrained_features_are_a_fixed_relu_network_of_its_own_stream():
    train_x, train_y, test_x, test_y = small_digits()
    data = experiment.FixedSet(train_x, train_y, test_x, test_y, num_classes=4)
    features = experiment.untrained_features(data, seed=3, hidden=8)
    # h = relu(W2 relu(W1 x + b1) + b2), the weights drawn under the UNTRAINED stream's seed
    weights = int(torch.randint(2**62, (1,), generator=pn.generator(3, experiment.UNTRAINED)))
    with torch.random.fork_rng():
        torch.manual_seed(weights)
        first, second = torch.nn.Linear(16, 8), torch.nn.Linear(8, 8)
    with torch.no_grad():
        by_hand = torch.relu(second(torch.relu(first(test_x))))
    assert features.train_x.shape == (len(train_x), 8)
    assert torch.allclose(features.test_x, by_hand, atol=1e-6)
    assert torch.equal(features.train_y, train_y) and torch.equal(features.test_y, test_y)
    again = experiment.untrained_features(data, seed=3, hidden=8)
    assert torch.equal(again.train_x, features.train_x)
    other = experiment.untrained_features(data, seed=4, hidden=8)
    assert not torch.equal(other.train_x, features.train_x)


def test_error_removed_is_the_share_of_the_plain_error_with_its_paired_se():
    train_x, train_y, test_x, test_y = small_digits()
    data = rg.RandomizedDigits(train_x, train_y, test_x, test_y, num_classes=4)
    runs = [
        experiment.randomization_test(data, seed=s, epochs=e, batch_size=10, hidden=8)
        for s, e in [(0, 1), (1, 4), (2, 1), (3, 4)]
    ]
    plain, regularised = runs[0::2], runs[1::2]
    share, se = experiment.error_removed(plain, regularised)
    e_plain = sum(1 - r.test_accuracy for r in plain) / 2
    e_reg = sum(1 - r.test_accuracy for r in regularised) / 2
    assert share == pytest.approx((e_plain - e_reg) / e_plain)
    discordant = sum(
        (experiment.paired_standard_error(a, b) * len(test_y)) ** 2
        for a, b in zip(plain, regularised, strict=True)
    )
    assert se == pytest.approx(math.sqrt(discordant) / (len(test_y) * 2) / e_plain)
    assert experiment.error_removed(plain, plain) == (0.0, 0.0)
    with pytest.raises(ValueError, match="same pairs"):
        experiment.error_removed(plain, regularised[:1])


def test_the_chapters_construction_has_2n_plus_d_parameters():
    # The constructor fixes the count: a (d,), b (n,), w (n,), for n = 300 points of d = 64.
    x = randn(300, 64, seed=37)
    y = torch.randint(10, (300,), generator=gen(38)).double()
    net = rg.finite_sample_expressivity(x, y, gen(39))
    assert experiment.parameter_count(net) == 2 * 300 + 64 == 664


def test_biases_at_random_inside_the_range_lose_rank_and_the_fit():
    x = randn(200, 5, seed=41)
    y = torch.randint(10, (200,), generator=gen(42)).double()
    draws = gen(43)
    ablation = experiment.least_squares_network(
        x, y, lambda z: experiment.biases_at_random_inside(z, draws), gen(44)
    )
    z = (x.double() @ ablation.a.detach()).sort().values
    b = ablation.b.detach()
    assert len(b) == 200 and (b >= z[0]).all() and (b <= z[-1]).all()
    assert torch.equal(b, b.sort().values)
    assert experiment.rank_of_A(ablation, x) < 180  # gaps with two biases, gaps with none
    assert experiment.max_fit_error(ablation, x, y) > 0.5
    assert experiment.max_fit_error(rg.finite_sample_expressivity(x, y, gen(44)), x, y) < 1e-6


def test_rank_of_A_is_n_for_the_construction_and_two_for_the_ablation():
    x = randn(40, 5, seed=34)
    y = torch.randint(10, (40,), generator=gen(35)).double()
    assert experiment.rank_of_A(rg.finite_sample_expressivity(x, y, gen(36)), x) == 40
    ablation = experiment.least_squares_network(x, y, experiment.biases_below_the_points, gen(36))
    assert experiment.rank_of_A(ablation, x) == 2


def test_networks_trained_side_by_side_follow_their_own_runs():
    # Two conditions trained together take the updates each takes alone (Adam is elementwise
    # and the loss sums the networks' own losses): the same curves, up to float rounding.
    train_x, train_y, test_x, test_y = small_digits()
    clean = rg.RandomizedDigits(train_x, train_y, test_x, test_y, num_classes=4)
    noisy = rg.RandomizedDigits(train_x, train_y, test_x, test_y, corruption=1.0, num_classes=4)
    settings = {"seed": 2, "epochs": 6, "batch_size": 10, "hidden": 16, "lr": 3e-3}
    together = experiment.randomization_tests(
        {
            "clean": experiment.Condition(clean),
            "noisy, decayed": experiment.Condition(noisy, weight_decay=0.05),
        },
        **settings,
    )
    alone = {
        "clean": experiment.randomization_test(clean, **settings),
        "noisy, decayed": experiment.randomization_test(noisy, weight_decay=0.05, **settings),
    }
    for name, run in together.items():
        for a, b in zip(run.model.parameters(), alone[name].model.parameters(), strict=True):
            assert torch.allclose(a, b, atol=1e-4)
        assert run.history["train_accuracy"] == alone[name].history["train_accuracy"]
    assert experiment.weight_norm(together["noisy, decayed"]) < experiment.weight_norm(
        together["clean"]
    )


def test_weight_decay_is_the_gradient_of_half_lambda_theta_squared_as_in_adam():
    # One update of a network with weight decay equals torch's Adam(weight_decay=lambda).
    train_x, train_y, test_x, test_y = small_digits()
    data = rg.RandomizedDigits(train_x, train_y, test_x, test_y, num_classes=4)
    ours = experiment.randomization_test(
        data, seed=5, epochs=1, batch_size=60, hidden=8, lr=0.01, weight_decay=0.3
    )
    with pn.training.seeded(5):
        model = experiment.network(train_x.shape[1], 4, hidden=8, depth=2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=0.3)
    loss = torch.nn.functional.cross_entropy(model(train_x), train_y)  # one batch of all 60
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    for a, b in zip(ours.model.parameters(), model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_depth_0_is_a_linear_classifier_that_cannot_memorise_random_labels():
    # 60 points in 4 dimensions with 4 random classes: no linear classifier separates them.
    train_x, train_y, test_x, test_y = small_digits(d=4)
    data = rg.RandomizedDigits(train_x, train_y, test_x, test_y, corruption=1.0, num_classes=4)
    linear = experiment.randomization_test(
        data, seed=0, epochs=120, batch_size=10, hidden=64, lr=3e-3, depth=0
    )
    assert [type(m).__name__ for m in linear.model] == ["Linear"]
    assert linear.epochs_to_fit is None
    with pytest.raises(ValueError, match="conditions"):
        experiment.randomization_tests({})


# -- section 5: the minimum-norm kernel interpolant -----------------------------------------------


def test_the_kernel_interpolant_fits_any_labels_and_has_the_rkhs_norm_of_its_coefficients():
    x = torch.rand(40, 5, generator=gen(80))
    labels = torch.randint(3, (40,), generator=gen(81))
    f = rg.KernelInterpolant(x, labels, gamma=2.0, num_classes=3)
    one_hot = torch.nn.functional.one_hot(labels, 3).double()
    assert torch.allclose(f(x), one_hot, atol=1e-8)  # every training label, exactly
    assert (f(x).argmax(1) == labels).all()
    K = torch.exp(-2.0 * torch.cdist(x.double(), x.double()) ** 2)
    alpha = torch.linalg.solve(K, one_hot)
    assert f.norm == pytest.approx(torch.sqrt((alpha * (K @ alpha)).sum()).item(), rel=1e-9)
    # Of all interpolants, the minimum-norm one: adding any f orthogonal on the points (here a
    # kernel function centred off the points, projected out) can only raise the norm. Check the
    # norm equals sqrt(Y^T K^{-1} Y), the closed form.
    closed = torch.sqrt((one_hot * torch.linalg.solve(K, one_hot)).sum()).item()
    assert f.norm == pytest.approx(closed, rel=1e-9)


def test_the_kernel_interpolant_rejects_duplicates_and_bad_arguments():
    x = torch.rand(5, 3, generator=gen(82))
    labels = torch.tensor([0, 1, 0, 1, 1])
    with pytest.raises(ValueError, match="duplicate"):
        rg.KernelInterpolant(torch.cat([x, x[:1]]), torch.cat([labels, labels[:1]]), 1.0, 2)
    with pytest.raises(ValueError, match="gamma"):
        rg.KernelInterpolant(x, labels, 0.0, 2)
    with pytest.raises(ValueError, match="labels"):
        rg.KernelInterpolant(x, labels + 1, 1.0, 2)


def test_the_nulls_kernel_code_scores_what_the_mechanism_predicts():
    x = torch.rand(60, 4, generator=gen(83))
    labels = torch.randint(10, (60,), generator=gen(84))
    test_x, test_y = (
        torch.rand(30, 4, generator=gen(85)),
        torch.randint(10, (30,), generator=gen(86)),
    )
    f = rg.KernelInterpolant(x, labels, 1.5, 10)
    ours = (f(test_x).argmax(1) == test_y).double().mean().item()
    assert experiment.plain_kernel_accuracy(x, labels, test_x, test_y, 1.5) == pytest.approx(ours)


def test_paired_prediction_error_counts_the_discordant_examples():
    truth = torch.tensor([0, 1, 2, 3])
    first = torch.tensor([0, 1, 0, 0])  # right on 0, 1
    second = torch.tensor([0, 0, 2, 3])  # right on 0, 2, 3
    assert experiment.paired_prediction_error(first, second, truth) == pytest.approx(3**0.5 / 4)
    assert experiment.paired_prediction_error(first, first, truth) == 0.0


def test_the_nulls_sets_draw_their_own_labels_and_pixels():
    train_x, train_y, test_x, test_y = small_digits()
    same = experiment.null_set(train_x, train_y, test_x, test_y, seed=0)
    assert torch.equal(same.train_y, train_y) and torch.equal(same.train_x, train_x)
    noisy = experiment.null_set(
        train_x, train_y, test_x, test_y, seed=0, corruption=1.0, num_classes=4
    )
    assert (noisy.train_y != train_y).float().mean() > 0.5
    shared = experiment.null_set(train_x, train_y, test_x, test_y, seed=0, pixels="shared")
    order = [train_x[0].tolist().index(v) for v in shared.train_x[0].tolist()]
    assert torch.equal(shared.train_x, train_x[:, order]) and torch.equal(
        shared.test_x, test_x[:, order]
    )
    per_image = experiment.null_set(train_x, train_y, test_x, test_y, seed=0, pixels="per_image")
    assert torch.allclose(per_image.train_x.sort(1).values, train_x.sort(1).values)
    assert not torch.equal(per_image.train_x, train_x)
    x, y = same.epoch()
    assert x is same.train_x and y is same.train_y


def test_validation_score_averages_the_last_epochs_cross_entropy():
    train_x, train_y, test_x, test_y = small_digits()
    data = rg.RandomizedDigits(train_x, train_y, test_x, test_y, num_classes=4)
    run = experiment.randomization_test(
        data, seed=1, epochs=5, batch_size=30, hidden=8, lr=1e-2, val=(test_x, test_y)
    )
    losses = run.validation["val_loss"]
    assert len(losses) == 5 and "val_loss" not in run.history
    assert experiment.validation_score(run, last=3) == pytest.approx(sum(losses[-3:]) / 3)
    with pytest.raises(ValueError, match="validation losses"):
        experiment.validation_score(run, last=6)
    # measured over the last epochs only: the same values, the earlier ones not measured
    window = experiment.randomization_test(
        data, seed=1, epochs=5, batch_size=30, hidden=8, lr=1e-2, val=(test_x, test_y), val_epochs=2
    )
    assert window.validation["val_loss"] == losses[-2:]
    assert window.validation.steps == run.validation.steps[-2:]
    with pytest.raises(ValueError, match="val_epochs"):
        experiment.randomization_test(data, seed=1, epochs=2, val=(test_x, test_y), val_epochs=3)
    plain = experiment.randomization_test(data, seed=1, epochs=2, batch_size=30, hidden=8)
    with pytest.raises(ValueError, match="validation losses"):
        experiment.validation_score(plain, last=1)


def test_a_condition_with_other_initial_weights_starts_elsewhere_and_trains_as_alone():
    # init 0 is the seed's own weights; init k > 0 another draw of the seed's INITS stream,
    # the same draw for every condition that asks for it, and each copy trains as it would alone
    train_x, train_y, test_x, test_y = small_digits()
    data = rg.RandomizedDigits(train_x, train_y, test_x, test_y, num_classes=4)
    settings = {"seed": 3, "epochs": 1, "batch_size": 60, "hidden": 8, "lr": 1e-9}
    runs = experiment.randomization_tests(
        {
            "seed's": experiment.Condition(data),
            "other": experiment.Condition(data, init=1),
            "other, again": experiment.Condition(data, init=1, weight_decay=0.1),
            "third": experiment.Condition(data, init=2),
        },
        **settings,
    )
    first = [p.detach() for p in runs["seed's"].model.parameters()]
    with pn.training.seeded(3):
        template = experiment.network(16, 4, hidden=8, depth=2)
    for a, b in zip(first, template.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)  # a rate of 1e-9 barely moves them
    other = [p.detach() for p in runs["other"].model.parameters()]
    again = [p.detach() for p in runs["other, again"].model.parameters()]
    third = [p.detach() for p in runs["third"].model.parameters()]
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(other, again, strict=True))
    assert not torch.allclose(first[0], other[0]) and not torch.allclose(other[0], third[0])
    seed_1 = experiment.initial_weights_seed(3, 1)
    assert seed_1 != 3 and experiment.initial_weights_seed(3, 0) == 3
    assert seed_1 == experiment.initial_weights_seed(3, 1) != experiment.initial_weights_seed(4, 1)
    with pytest.raises(ValueError, match="init"):
        experiment.randomization_tests({"bad": experiment.Condition(data, init=-1)}, **settings)


def test_the_rest_of_a_distinct_subset_is_every_other_distinct_image():
    x = torch.tensor([[0.0, 1], [1, 0], [0, 1], [2, 2], [3, 1], [1, 3]])
    y = torch.tensor([0, 1, 0, 2, 3, 1])
    sub_x, sub_y, rest_x, rest_y = experiment.distinct_subset_and_rest(x, y, 2, gen(16))
    again_x, again_y = experiment.distinct_subset(x, y, 2, gen(16))
    assert torch.equal(sub_x, again_x) and torch.equal(sub_y, again_y)  # the same draw
    assert len(rest_x) == 3  # five distinct images, two drawn
    both = torch.cat([sub_x, rest_x])
    assert len(torch.unique(both, dim=0)) == 5
    for image, label in zip(rest_x, rest_y, strict=True):
        assert label == y[(x == image).all(1)][0]


# -- the decaying rate, sparse measurements, test curves, and the nulls' stack (issue 56) ---------


def test_lr_drops_cut_the_rate_to_a_tenth_at_each_fraction_and_change_the_run():
    train_x, train_y, test_x, test_y = small_digits()
    data = rg.RandomizedDigits(train_x, train_y, test_x, test_y, corruption=1.0, num_classes=4)
    settings = {"seed": 0, "epochs": 10, "batch_size": 10, "hidden": 16, "lr": 3e-3}
    seen = []
    adam_step = experiment.together.Adam.step

    def spy(self, *args, **kwargs):
        seen.append(float(self.param_groups[0]["lr"]))
        return adam_step(self, *args, **kwargs)

    experiment.together.Adam.step = spy
    try:
        decayed = experiment.randomization_test(data, lr_drops=(0.5, 0.8), **settings)
    finally:
        experiment.together.Adam.step = adam_step
    assert seen == pytest.approx([3e-3] * 30 + [3e-4] * 18 + [3e-5] * 12)  # 60 updates
    fixed = experiment.randomization_test(data, **settings)
    assert decayed.history["loss"][:5] == fixed.history["loss"][:5]  # the same until the drop
    assert decayed.history["loss"][-1] != fixed.history["loss"][-1]
    for bad in [(0.8, 0.5), (0.0,), (1.0,), (0.5, 0.5)]:
        with pytest.raises(ValueError, match="lr_drops"):
            experiment.randomization_test(data, lr_drops=bad, **settings)


def test_measure_every_and_test_curves_measure_less_and_the_same():
    train_x, train_y, test_x, test_y = small_digits()
    data = rg.RandomizedDigits(train_x, train_y, test_x, test_y, corruption=1.0, num_classes=4)
    settings = {"seed": 0, "epochs": 12, "batch_size": 10, "hidden": 16, "lr": 3e-3}
    every = experiment.randomization_test(data, **settings)
    sparse = experiment.randomization_test(data, measure_every=5, **settings)
    assert sparse.epochs == [5, 10, 12]
    assert sparse.history["train_accuracy"] == [
        every.history["train_accuracy"][e - 1] for e in (5, 10, 12)
    ]
    conditions = {
        "traced": experiment.Condition(data),
        "grid": experiment.Condition(data, weight_decay=0.1),
    }
    both = experiment.randomization_tests(conditions, **settings)
    one = experiment.randomization_tests(conditions, test_curves=["traced"], **settings)
    assert one["traced"].history["test_accuracy"] == pytest.approx(
        both["traced"].history["test_accuracy"]
    )
    assert all(math.isnan(v) for v in one["grid"].history["test_accuracy"][:-1])
    assert one["grid"].test_accuracy == pytest.approx(both["grid"].test_accuracy)
    assert one["grid"].history["train_accuracy"] == both["grid"].history["train_accuracy"]
    with pytest.raises(ValueError, match="test_curves"):
        experiment.randomization_tests(conditions, test_curves=["neither"], **settings)


def test_zero_padding_leaves_a_linear_classifier_the_same_function_of_the_images():
    train_x, train_y, test_x, test_y = small_digits(d=16)
    data = experiment.FixedSet(train_x, train_y, test_x, test_y, num_classes=4)
    padded = experiment.zero_padded(data, 24)
    assert padded.train_x.shape == (60, 24) and padded.test_x.shape == (30, 24)
    assert torch.equal(padded.train_x[:, :16], train_x) and not padded.train_x[:, 16:].any()
    run = experiment.randomization_tests(
        {"p": experiment.Condition(padded)}, seed=0, epochs=5, batch_size=10, hidden=8, depth=0
    )["p"]
    with pn.seeded(0):
        initial = experiment.network(24, 4, hidden=8, depth=0)[0].weight
    weight, bias = run.model[0].weight, run.model[0].bias
    assert torch.equal(weight[:, 16:], initial[:, 16:])  # no gradient on the zero columns
    assert not torch.equal(weight[:, :16], initial[:, :16])
    with torch.no_grad():  # a linear classifier of the images alone
        expected = torch.nn.functional.linear(train_x, weight[:, :16], bias)
        assert torch.allclose(run.model(padded.train_x), expected, atol=1e-6)
    with pytest.raises(ValueError, match="width"):
        experiment.zero_padded(data, 8)


def test_gradient_descent_from_zero_ends_at_the_pseudo_inverse_solution():
    x = torch.rand(12, 3, generator=gen(3), dtype=torch.float64)
    K = rg.gaussian_kernel(x, x, 2.0)
    Y = torch.nn.functional.one_hot(torch.arange(12) % 3, 3).double()
    eigenvalues = torch.linalg.eigvalsh(K)
    rate = 1 - (eigenvalues[0] / eigenvalues[-1]).item()
    steps = math.ceil(math.log(1e-10) / math.log(rate))
    alpha = rg.gradient_descent_interpolation(K, Y, steps, 1 / eigenvalues[-1].item())
    best = torch.linalg.pinv(K) @ Y
    assert rg.rkhs_norm(K, alpha - best) <= 1e-8 * rg.rkhs_norm(K, best)
    few = rg.gradient_descent_interpolation(K, Y, 3, 1 / eigenvalues[-1].item())
    assert rg.rkhs_norm(K, few - best) > 0.1 * rg.rkhs_norm(K, best)  # it is a descent, not a solve
    assert torch.equal(rg.gradient_descent_interpolation(K, Y, 0, 0.1), torch.zeros_like(Y))
    for bad in [{"steps": -1}, {"lr": 0.0}]:
        with pytest.raises(ValueError):
            rg.gradient_descent_interpolation(K, Y, **({"steps": 5, "lr": 0.1} | bad))


def test_a_warm_started_descent_fits_too_but_ends_away_from_the_minimum_norm():
    x = torch.rand(10, 3, generator=gen(4), dtype=torch.float64)
    z = torch.rand(8, 3, generator=gen(5), dtype=torch.float64)
    Y = torch.nn.functional.one_hot(torch.arange(10) % 2, 2).double()
    Yz = torch.nn.functional.one_hot(torch.arange(8) % 2, 2).double()
    K = rg.gaussian_kernel(x, x, 1.0)
    eigenvalues = torch.linalg.eigvalsh(K)
    eta = 1 / eigenvalues[-1].item()
    steps = math.ceil(math.log(1e-10) / math.log(1 - (eigenvalues[0] / eigenvalues[-1]).item()))
    distance = experiment.warm_started_distance(x, Y, z, Yz, 1.0, steps, eta)
    # by hand: f_T - f* is f_0 less its projection on the span of k(x_i, .)
    gram = lambda a, b: rg.gaussian_kernel(a, b, 1.0)  # noqa: E731
    beta = torch.linalg.solve(gram(z, z), Yz)
    projection = torch.linalg.solve(K, gram(x, z) @ beta)
    outside = (beta * (gram(z, z) @ beta)).sum() - (projection * (K @ projection)).sum()
    best = torch.linalg.solve(K, Y)
    assert distance == pytest.approx(
        (outside.sqrt() / (best * (K @ best)).sum().sqrt()).item(), rel=1e-5
    )
    assert distance > 0.01
    # started from zero (no start points' weight), the same code ends at the minimum norm
    alpha = experiment.descent_from_elsewhere(K, Y, torch.zeros_like(Y), steps, eta)
    assert rg.rkhs_norm(K, alpha - best) <= 1e-8 * rg.rkhs_norm(K, best)


def test_masked_training_fit_turns_the_masks_on_and_leaves_the_model_in_eval_mode():
    train_x, train_y, test_x, test_y = small_digits()
    data = rg.RandomizedDigits(train_x, train_y, test_x, test_y, corruption=1.0, num_classes=4)
    settings = {"seed": 0, "epochs": 20, "batch_size": 10, "hidden": 32, "lr": 3e-3}
    dropped = experiment.randomization_test(data, dropout=0.5, **settings)
    fit = experiment.masked_training_fit(dropped, seed=1)
    assert not dropped.model.training
    assert fit["accuracy, masks off"] == pytest.approx(dropped.train_accuracy)
    assert fit["cross-entropy, masks on"] > fit["cross-entropy, masks off"]
    assert fit == experiment.masked_training_fit(dropped, seed=1)  # the seed's masks
    plain = experiment.randomization_test(data, **settings)  # rate 0: masks change nothing
    same = experiment.masked_training_fit(plain, seed=1)
    assert same["cross-entropy, masks on"] == pytest.approx(same["cross-entropy, masks off"])
