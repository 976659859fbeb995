"""Unit tests of papernotes.hypercolumns: the hypercolumn against torch's own interpolation and
hand-made maps, linearity (classify then upsample), the location-specific classifiers against a
plain 1 x 1 convolution and their grid-cell centres, their probabilities (not their scores)
blended, the data, the nulls' own code against the mechanism, and the segmentation measures."""

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import gen, randn
from papernotes import hypercolumns as hc
from papernotes import training
from papernotes.data import Standardizer
from papernotes.hypercolumns import experiment


def random_classifier(n_features, grid, seed=0, n_outputs=2, dtype=torch.float64, n_categories=1):
    """A LocationClassifier with random weights, biases and feature statistics."""
    standardizer = Standardizer(
        randn(n_features, seed=seed), 0.5 + torch.rand(n_features, generator=gen(seed + 1))
    )
    classifier = hc.LocationClassifier(
        n_features, standardizer, grid=grid, n_outputs=n_outputs, n_categories=n_categories
    )
    with torch.no_grad():
        classifier.weight.copy_(randn(*classifier.weight.shape, seed=seed + 2))
        classifier.bias.copy_(randn(*classifier.bias.shape, seed=seed + 3))
    return classifier.to(dtype)


def pyramid(batch=2, size=24, channels=(3, 4, 5), seed=0):
    """Maps at strides 2, 4, 8 of a size x size window, float64."""
    return [
        randn(batch, c, size // 2 ** (i + 1), size // 2 ** (i + 1), seed=seed + i)
        for i, c in enumerate(channels)
    ]


# -- 1. the hypercolumn ---------------------------------------------------------------------------


def test_hypercolumns_stack_every_upsampled_map_in_order():
    maps = pyramid()
    h = hc.hypercolumns(maps, 24)
    assert h.shape == (2, 12, 24, 24)
    start = 0
    for m in maps:
        stop = start + m.shape[1]
        expected = F.interpolate(m, size=(24, 24), mode="bilinear", align_corners=False)
        assert torch.allclose(h[:, start:stop], expected, atol=1e-12)
        start = stop


def test_channel_order_follows_the_list_with_hand_made_constant_maps():
    # Channel c of map i holds the constant 10 i + c: the stack must read 0, 1, 10, 11, 12, 20.
    maps = [
        torch.arange(2.0).view(1, 2, 1, 1).expand(1, 2, 6, 6),
        (10 + torch.arange(3.0)).view(1, 3, 1, 1).expand(1, 3, 3, 3),
        torch.full((1, 1, 1, 1), 20.0),
    ]
    h = hc.hypercolumns(maps, (12, 12))
    assert h.shape == (1, 6, 12, 12)
    expected = torch.tensor([0.0, 1.0, 10.0, 11.0, 12.0, 20.0]).view(1, 6, 1, 1)
    assert torch.allclose(h, expected.expand(1, 6, 12, 12), atol=1e-5)  # constants stay put


def test_upsampling_puts_each_cell_at_the_centre_of_the_pixels_it_pools():
    # A linear ramp sampled at the cell centres of a stride-4 map, (j + 0.5) * 4, comes back as
    # the ramp at the pixel centres i + 0.5 away from the border (where the ends are clamped).
    stride, cells = 4, 6
    centres = (torch.arange(cells, dtype=torch.float64) + 0.5) * stride
    coarse = centres.view(1, 1, 1, cells).expand(1, 1, cells, cells)
    fine = hc.upsample(coarse, stride * cells)[0, 0, 0]
    pixels = torch.arange(stride * cells, dtype=torch.float64) + 0.5
    inside = (pixels >= centres[0]) & (pixels <= centres[-1])
    assert torch.allclose(fine[inside], pixels[inside], atol=1e-12)
    misaligned = hc.upsample(coarse, stride * cells, align_corners=True)[0, 0, 0]
    assert (misaligned[inside] - pixels[inside]).abs().max() > 0.5


def test_select_keeps_the_named_layers_in_the_networks_order():
    maps = pyramid(channels=(3, 4, 5, 6))
    assert [m.shape[1] for m in hc.select(maps, ["gap", "conv1"])] == [3, 6]
    assert [m.shape[1] for m in hc.select(maps, ["pool3", "pool2"])] == [4, 5]
    assert hc.select(maps, ["gap"])[0] is maps[3]


def test_hypercolumns_reject_bad_input():
    maps = pyramid()
    with pytest.raises(ValueError, match=r"feature_maps\[1\]"):
        hc.hypercolumns([maps[0], maps[1][:1]], 24)  # another batch size
    with pytest.raises(ValueError, match="feature_maps"):
        hc.hypercolumns([], 24)
    with pytest.raises(TypeError, match="feature_maps"):
        hc.hypercolumns(maps[0], 24)
    with pytest.raises(ValueError, match=r"feature_maps\[0\]"):
        hc.hypercolumns([maps[0][0]], 24)
    with pytest.raises(ValueError, match="size"):
        hc.hypercolumns(maps, 0)
    with pytest.raises(ValueError, match="layers"):
        hc.select(maps, ["conv4"])


# -- 2. the standardisation -----------------------------------------------------------------------


def test_standardizer_gives_every_channel_mean_0_and_std_1_on_the_training_pixels():
    pixels = randn(5000, 4, seed=3) * torch.tensor([1e-3, 1.0, 1e3, 5.0]) + 7.0
    standardizer = Standardizer.fit(pixels)
    classifier = hc.LocationClassifier(4, standardizer).double()
    z = classifier.standardize(pixels)
    assert torch.allclose(z.mean(0), torch.zeros(4, dtype=torch.float64), atol=1e-9)
    assert torch.allclose(z.std(0), torch.ones(4, dtype=torch.float64), atol=1e-9)
    constant = Standardizer.fit(torch.ones(10, 2))
    assert torch.equal(constant.std, torch.ones(2))  # no division by zero


def test_standardizer_rejects_bad_input():
    with pytest.raises(ValueError, match="train_x"):
        Standardizer.fit(torch.zeros(3, 4, 5))


# -- 3. location-specific classifiers -------------------------------------------------------------


def test_one_cell_is_a_plain_1x1_convolution():
    classifier = random_classifier(12, grid=1)
    h = hc.hypercolumns(pyramid(), 24)
    w = classifier.weight[0, 0] / classifier.feature_std  # (n, D): the standardisation folded in
    b = classifier.bias[0, 0] - w @ classifier.feature_mean
    conv = F.conv2d(h, w[:, :, None, None], b)
    assert torch.allclose(classifier(h), conv.softmax(1), atol=1e-10)


def test_a_pixel_at_a_cells_centre_gets_exactly_that_cells_classifier():
    # 15 pixels and K = 3: cells of 5 pixels centred on pixels 2, 7 and 12.
    grid, size = 3, 15
    classifier = random_classifier(6, grid=grid, seed=4)
    h = randn(1, 6, size, size, seed=5)
    out = classifier(h)
    per_cell = classifier.per_cell(h, torch.zeros(1, dtype=torch.long)).softmax(2)
    for row, r in enumerate((2, 7, 12)):
        for col, c in enumerate((2, 7, 12)):
            assert torch.allclose(out[0, :, r, c], per_cell[0, row * grid + col, :, r, c])
    # Between two centres the output is the two classifiers' bilinear mix: pixel column 4 lies
    # 0.4 of the way from the centre of cell 0 (pixel 2) to that of cell 1 (pixel 7).
    mix = 0.6 * per_cell[0, 0, :, 2, 4] + 0.4 * per_cell[0, 1, :, 2, 4]
    assert torch.allclose(out[0, :, 2, 4], mix, atol=1e-12)


def test_the_cells_probabilities_are_blended_not_their_scores():
    # Two cells of one row (K = 2 on a 1 x 4 strip is not square; use 4 x 4 and read row 0):
    # cell 0 says figure with score +10, cell 1 ground with -2. Midway (weights 1/2, 1/2) the
    # paper's blend is (sigmoid(10) + sigmoid(-2)) / 2 = 0.56, figure; blending the scores
    # first would give sigmoid(4) = 0.98.
    standardizer = Standardizer(torch.zeros(1), torch.ones(1))
    classifier = hc.LocationClassifier(1, standardizer, grid=2).double()
    with torch.no_grad():
        classifier.bias.zero_()
        classifier.bias[0, [0, 2], 1] = 10.0
        classifier.bias[0, [1, 3], 1] = -2.0
    beta = torch.tensor([[0.5, 0.5, 0.0, 0.0]], dtype=torch.float64)
    p = classifier.at_pixels(torch.zeros(1, 1, dtype=torch.float64), beta).exp()[0, 1]
    expected = (
        torch.sigmoid(torch.tensor(10.0, dtype=torch.float64))
        + torch.sigmoid(torch.tensor(-2.0, dtype=torch.float64))
    ) / 2
    assert p.item() == pytest.approx(expected.item(), abs=1e-9)
    assert abs(p.item() - torch.sigmoid(torch.tensor(4.0)).item()) > 0.3
    whole = classifier(torch.zeros(1, 1, 4, 4, dtype=torch.float64))
    assert torch.allclose(whole.sum(1), torch.ones(1, 4, 4, dtype=torch.float64))


def test_interpolation_weights_are_bilinear_and_sum_to_one():
    beta = hc.interpolation_weights(3, (15, 15)).double()
    assert beta.shape == (9, 15, 15)
    assert (beta >= 0).all()
    assert torch.allclose(beta.sum(0), torch.ones(15, 15, dtype=torch.float64), atol=1e-6)
    # Outside the outer centres the border cell takes everything (clamped).
    assert beta[0, 0, 0].item() == pytest.approx(1.0)
    # Pixel (4, 4): 0.4 of the way in both directions between cells (0, 0) and (1, 1).
    assert beta[[0, 1, 3, 4], 4, 4].tolist() == pytest.approx([0.36, 0.24, 0.24, 0.16], abs=1e-6)
    assert torch.equal(hc.interpolation_weights(1, 7), torch.ones(1, 7, 7))


def test_sampled_pixels_get_the_same_logits_as_the_whole_map():
    classifier = random_classifier(12, grid=3, seed=6)
    h = hc.hypercolumns(pyramid(seed=7), 24)
    rows = torch.tensor([0, 5, 11, 23])
    cols = torch.tensor([3, 23, 12, 0])
    beta = hc.interpolation_weights(3, (24, 24)).double()[:, rows, cols].T
    pixels = classifier.at_pixels(h[1, :, rows, cols].T, beta)  # log-probabilities
    assert torch.allclose(pixels.exp(), classifier(h)[1, :, rows, cols].T, atol=1e-12)


def test_each_window_gets_the_classifiers_of_its_own_category():
    # Three sets of 3 x 3 classifiers; window b must be scored by set categories[b] alone, as a
    # one-set classifier holding only that set scores it.
    classifier = random_classifier(12, grid=3, seed=20, n_categories=3)
    h = hc.hypercolumns(pyramid(seed=21), 24)
    categories = torch.tensor([2, 1])
    out = classifier(h, categories)
    for b, c in enumerate(categories.tolist()):
        alone = random_classifier(12, grid=3, seed=20)
        with torch.no_grad():
            alone.weight.copy_(classifier.weight[c : c + 1])
            alone.bias.copy_(classifier.bias[c : c + 1])
        assert torch.allclose(out[b], alone(h[b : b + 1])[0], atol=1e-12)
    assert not torch.allclose(out[0], classifier(h, torch.tensor([0, 1]))[0])
    rows, cols = torch.tensor([3, 20]), torch.tensor([7, 1])
    beta = hc.interpolation_weights(3, (24, 24)).double()[:, rows, cols].T
    pixels = classifier.at_pixels(h[0, :, rows, cols].T, beta, torch.tensor([2, 2]))
    assert torch.allclose(pixels.exp(), out[0, :, rows, cols].T, atol=1e-12)


def test_categories_are_required_with_several_sets_and_must_name_one():
    classifier = random_classifier(12, grid=1, seed=22, n_categories=3)
    h = hc.hypercolumns(pyramid(seed=23), 24)
    with pytest.raises(ValueError, match="categories are required"):
        classifier(h)
    with pytest.raises(ValueError, match=r"categories must lie in \[0, 3\)"):
        classifier(h, torch.tensor([0, 3]))
    with pytest.raises(TypeError, match="categories"):
        classifier(h, torch.tensor([0.0, 1.0]))


def test_cell_membership_puts_each_pixel_in_exactly_its_own_cell():
    member = hc.cell_membership(3, 24)
    assert member.shape == (9, 24, 24)
    assert torch.equal(member.sum(0), torch.ones(24, 24))
    assert member[0, :8, :8].all() and member[4, 8:16, 8:16].all() and member[8, 16:, 16:].all()
    assert member[1, :8, :8].sum() == 0
    # At a cell's centre both weightings agree; near a cell border they do not.
    beta = hc.interpolation_weights(3, 24)
    assert beta[:, 4, 4].argmax() == member[:, 4, 4].argmax() == 0
    assert beta[0, 4, 8].item() > 0.4 and member[0, 4, 8] == 0  # pixel 8 is cell 1


def test_location_classifier_rejects_bad_input():
    standardizer = Standardizer(torch.zeros(4), torch.ones(4))
    with pytest.raises(ValueError, match="grid"):
        hc.LocationClassifier(4, standardizer, grid=0)
    with pytest.raises(ValueError, match="standardizer.mean"):
        hc.LocationClassifier(5, standardizer)
    with pytest.raises(ValueError, match="h must have shape"):
        hc.LocationClassifier(4, standardizer)(torch.zeros(1, 3, 8, 8))


# -- 4. classify, then upsample -------------------------------------------------------------------


@pytest.mark.parametrize("grid", [1, 3])
@pytest.mark.parametrize("align_corners", [False, True])
def test_classifying_before_upsampling_equals_upsampling_before_classifying(grid, align_corners):
    # Float32, as the chapter runs: the two orders agree to 1e-5.
    maps = [m.float() for m in pyramid(seed=8)]
    classifier = random_classifier(12, grid=grid, seed=9, dtype=torch.float32)
    explicit = classifier(hc.hypercolumns(maps, 24, align_corners=align_corners))
    efficient = hc.classify_then_upsample(classifier, maps, 24, align_corners=align_corners)
    assert efficient.shape == (2, 2, 24, 24)
    assert (explicit - efficient).abs().max().item() < 1e-5


def test_classify_then_upsample_picks_each_windows_category_as_the_definition_does():
    maps = pyramid(seed=30)
    classifier = random_classifier(12, grid=3, seed=31, n_categories=3)
    categories = torch.tensor([2, 0])
    explicit = classifier(hc.hypercolumns(maps, 24), categories)
    efficient = hc.classify_then_upsample(classifier, maps, 24, categories=categories)
    assert torch.allclose(explicit, efficient, atol=1e-10)
    with pytest.raises(ValueError, match="categories"):
        hc.classify_then_upsample(classifier, maps, 24)


def test_classify_then_upsample_rejects_a_mismatched_classifier():
    with pytest.raises(ValueError, match="channels"):
        hc.classify_then_upsample(random_classifier(11, grid=1), pyramid(), 24)


# -- the data and the network ---------------------------------------------------------------------


def test_generated_shapes_are_reproducible_and_follow_their_masks():
    a = experiment.generate_shapes(400, noise=0.3, pair=False, generator=gen(10))
    b = experiment.generate_shapes(400, noise=0.3, pair=False, generator=gen(10))
    c = experiment.generate_shapes(400, noise=0.3, pair=False, generator=gen(11))
    assert torch.equal(a.images, b.images) and not torch.equal(a.images, c.images)
    assert a.images.shape == (400, 1, 24, 24) and a.masks.shape == (400, 24, 24)
    assert set(a.labels.tolist()) == {0, 1, 2}
    inside = a.images[:, 0][a.masks.bool()]
    outside = a.images[:, 0][~a.masks.bool()]
    assert inside.mean().item() == pytest.approx(1.0, abs=0.05)  # brightness 0.6 to 1.4
    assert outside.mean().item() == pytest.approx(0.0, abs=0.02)
    assert outside.std().item() == pytest.approx(0.3, abs=0.02)


def test_shape_areas_match_their_geometry():
    # Without noise: circle pi r^2, square (1.6 r)^2, equilateral triangle (3 sqrt 3 / 4) r^2,
    # for radii uniform in [0.2, 0.26] * 24; E[r^2] = (b^3 - a^3) / (3 (b - a)).
    data = experiment.generate_shapes(3000, noise=0.0, pair=False, generator=gen(12))
    a, b = 0.2 * 24, 0.26 * 24
    mean_r2 = (b**3 - a**3) / (3 * (b - a))
    areas = data.masks.sum((1, 2)).double()
    for label, factor in enumerate((math.pi, 1.6**2, 3 * math.sqrt(3) / 4)):
        measured = areas[data.labels == label].mean().item()
        assert measured == pytest.approx(factor * mean_r2, rel=0.05), experiment.SHAPES[label]


def test_a_pair_is_two_equally_bright_shapes_across_the_middle():
    data = experiment.generate_shapes(500, noise=0.0, generator=gen(20))
    figure = data.masks.bool()
    bright = data.images[:, 0] > 0
    assert torch.equal(bright & figure, figure)
    ground = bright & ~figure
    assert ground.any((1, 2)).all()  # every window has its other shape
    # As bright as each other: one brightness per window.
    for i in range(20):
        assert data.images[i, 0][bright[i]].unique().numel() == 1
    # On either side of the middle: the centres of mass lie about 0.27 * 24 = 6.5 pixels from
    # the window's centre, in opposite directions.
    coords = torch.arange(24.0) + 0.5

    def centre(m):
        m = m.float()
        total = m.sum((1, 2))
        return (
            torch.stack([(m.sum(2) * coords).sum(1), (m.sum(1) * coords).sum(1)], 1)
            / total[:, None]
        )

    f, g = centre(figure) - 12, centre(ground) - 12
    assert f.norm(dim=1).mean().item() == pytest.approx(6.5, abs=1.0)
    assert ((f * g).sum(1) < 0).float().mean() > 0.95
    assert set(data.labels.tolist()) == {0, 1, 2}
    # The figure is not always on one side: its direction is drawn uniformly.
    assert (f[:, 1] > 0).float().mean().item() == pytest.approx(0.5, abs=0.08)


def test_generate_shapes_rejects_bad_arguments():
    with pytest.raises(ValueError, match="n must"):
        experiment.generate_shapes(0)
    with pytest.raises(ValueError, match="noise"):
        experiment.generate_shapes(5, noise=-1.0)
    with pytest.raises(TypeError, match="pair"):
        experiment.generate_shapes(5, pair=1)


def test_shapenet_maps_have_strides_1_4_8_and_a_global_top():
    net = experiment.ShapeNet((4, 5, 6))
    maps = net.feature_maps(torch.randn(3, 1, 24, 24, generator=gen(12)))
    shapes = [tuple(m.shape) for m in maps]
    assert shapes == [(3, 4, 24, 24), (3, 5, 6, 6), (3, 6, 3, 3), (3, 6, 1, 1)]
    assert torch.allclose(maps[3], maps[2].mean((2, 3), keepdim=True))  # gap averages pool3
    assert net(torch.zeros(3, 1, 24, 24)).shape == (3, 3)
    with pytest.raises(ValueError, match="channels"):
        experiment.ShapeNet((4, 5))


def test_pretraining_learns_the_shapes_and_freezes_the_network():
    data = experiment.generate_shapes(600, noise=0.1, pair=False, generator=gen(13))
    val = experiment.generate_shapes(200, noise=0.1, pair=False, generator=gen(14))
    model, history = experiment.pretrain(data, seed=0, steps=120, val=val)
    assert history.final("val_accuracy") > 0.6  # chance is 1/3
    assert not any(p.requires_grad for p in model.parameters())
    with pytest.raises(ValueError, match="data.images"):
        experiment.pretrain(experiment.Shapes(data.images[:, 0], data.masks, data.labels), seed=0)


# -- training on sampled pixels -------------------------------------------------------------------


def test_sampled_pixels_carry_their_hypercolumns_and_labels():
    data = experiment.generate_shapes(20, generator=gen(15))
    net = experiment.ShapeNet().eval()
    sample = experiment.sample_pixels(net, data, ["conv1", "gap"], 500, generator=gen(16), chunk=7)
    assert sample.features.shape == (500, 8 + 32)
    with torch.no_grad():
        full = hc.hypercolumns(hc.select(net.feature_maps(data.images), ["conv1", "gap"]), 24)
    i, (r, c) = sample.images, sample.positions.T
    assert torch.allclose(sample.features, full[i, :, r, c], atol=1e-6)
    assert torch.equal(sample.labels, data.masks[i, r, c])
    assert len(set(i.tolist())) == 20  # 500 draws reach every image (chunks of 7 included)
    with pytest.raises(ValueError, match="n_pixels"):
        experiment.sample_pixels(net, data, ["conv1"], 0)


def test_a_pixel_classifier_learns_a_separable_rule():
    # Label 1 where the first feature is positive, whatever its scale; location matters not.
    features = randn(4000, 3, seed=17).float() * torch.tensor([100.0, 1.0, 1.0])
    labels = (features[:, 0] > 0).long()
    positions = torch.randint(10, (4000, 2), generator=gen(18))
    sample = experiment.PixelSample(features, labels, positions, (10, 10))
    (classifier,), history = experiment.train_pixel_classifiers(
        sample, [0.05], grid=2, seed=0, steps=150
    )
    beta = hc.interpolation_weights(2, (10, 10))[:, positions[:, 0], positions[:, 1]].T
    accuracy = (classifier.at_pixels(features, beta).argmax(1) == labels).float().mean()
    assert accuracy > 0.98
    (plain,), _ = experiment.train_pixel_classifiers(
        sample, [0.05], grid=2, seed=0, steps=150, reference=True
    )
    assert (plain.at_pixels(features, beta).argmax(1) == labels).float().mean() > 0.98
    assert not history.diverged
    with pytest.raises(ValueError, match="sample.labels"):
        experiment.train_pixel_classifiers(
            experiment.PixelSample(features, labels[:10], positions, (10, 10)), [0.05], seed=0
        )


@pytest.mark.parametrize("reference", [False, True])
def test_a_grid_trained_in_one_loop_gives_the_classifiers_of_separate_runs(reference):
    features = randn(3000, 4, seed=31).float()
    labels = (features[:, 0] + features[:, 1] > 0).long()
    positions = torch.randint(10, (3000, 2), generator=gen(32))
    sample = experiment.PixelSample(features, labels, positions, (10, 10))
    options = dict(grid=2, seed=0, steps=40, batch_size=500, decay=True, reference=reference)
    together, _ = experiment.train_pixel_classifiers(sample, [0.01, 0.3], **options)
    for lr, classifier in zip([0.01, 0.3], together, strict=True):
        (alone,), _ = experiment.train_pixel_classifiers(sample, [lr], **options)
        assert torch.equal(classifier.weight, alone.weight)
        assert torch.equal(classifier.bias, alone.bias)
    assert not torch.equal(together[0].weight, together[1].weight)
    with pytest.raises(ValueError, match="lrs"):
        experiment.train_pixel_classifiers(sample, [], seed=0)


def test_classifiers_per_category_and_per_cell_learn_what_one_shared_set_cannot():
    # The label is the sign of the feature, flipped for category 1 and in the right half of the
    # window: one set for all categories cannot fit it, one per category can; per cell, both
    # the interpolated training and the test-time-only one can.
    features = randn(6000, 1, seed=24).float()
    positions = torch.randint(10, (6000, 2), generator=gen(25))
    categories = torch.randint(2, (6000,), generator=gen(26))
    flip = (categories == 1) ^ (positions[:, 1] >= 5)
    labels = ((features[:, 0] > 0) ^ flip).long()
    sample = experiment.PixelSample(features, labels, positions, (10, 10), None, categories)

    def accuracy(interpolate, per_category):
        (classifier,), _ = experiment.train_pixel_classifiers(
            sample, [0.05], grid=2, per_category=per_category, interpolate=interpolate, seed=0
        )
        beta = hc.interpolation_weights(2, (10, 10))[:, positions[:, 0], positions[:, 1]].T
        c = categories if per_category else None
        return (classifier.at_pixels(features, beta, c).argmax(1) == labels).float().mean()

    assert accuracy(True, per_category=False) < 0.75
    assert accuracy(True, per_category=True) > 0.9
    assert accuracy(False, per_category=True) > 0.9
    with pytest.raises(ValueError, match="categories"):
        experiment.train_pixel_classifiers(
            experiment.PixelSample(features, labels, positions, (10, 10)),
            [0.05],
            per_category=True,
            seed=0,
        )


def test_the_untrained_network_is_where_pretraining_starts():
    data = experiment.generate_shapes(64, generator=gen(27))
    start = experiment.untrained(seed=3)
    trained, _ = experiment.pretrain(data, seed=3, steps=5)
    with training.seeded(3):
        fresh = experiment.ShapeNet()
    for a, b, c in zip(start.parameters(), fresh.parameters(), trained.parameters(), strict=True):
        assert torch.equal(a, b) and not a.requires_grad
        assert not torch.equal(a, c)


# -- measuring a segmentation ---------------------------------------------------------------------


def test_boundary_band_is_the_ring_around_a_square():
    mask = torch.zeros(1, 12, 12, dtype=torch.long)
    mask[0, 3:9, 3:9] = 1
    band = experiment.boundary_band(mask, width=1)[0]
    expected = torch.zeros(12, 12, dtype=torch.bool)
    expected[2:10, 2:10] = True
    expected[4:8, 4:8] = False  # inner pixels more than one pixel from the ground
    assert torch.equal(band, expected)
    with pytest.raises(ValueError, match="width"):
        experiment.boundary_band(mask, width=0)
    with pytest.raises(ValueError, match="masks"):
        experiment.boundary_band(mask[0])


def test_segmentation_scores_on_a_hand_made_example():
    truth = torch.tensor([[[1, 1, 0, 0]]])
    predicted = torch.tensor([[[1, 0, 1, 0]]])
    band = torch.tensor([[[False, True, True, False]]])
    scores = experiment.segmentation_scores(predicted, truth, band)
    assert scores["iou"] == pytest.approx(1 / 3)
    assert scores["accuracy"] == pytest.approx(0.5)
    assert scores["boundary_accuracy"] == pytest.approx(0.0)
    with pytest.raises(ValueError, match="truth"):
        experiment.segmentation_scores(predicted, truth[:, :, :3], band)


def test_predicted_masks_follow_the_classifier():
    net = experiment.ShapeNet().eval()
    data = experiment.generate_shapes(5, generator=gen(19))
    classifier = hc.LocationClassifier(8, Standardizer(torch.zeros(8), torch.ones(8)))
    with torch.no_grad():
        classifier.bias.copy_(torch.tensor([[[0.0, 1.0]]]))  # every pixel is figure
    masks = experiment.predict_masks(net, classifier, data.images, ["conv1"], chunk=2)
    assert torch.equal(masks, torch.ones(5, 24, 24, dtype=torch.long))
    with pytest.raises(ValueError, match="images"):
        experiment.predict_masks(net, classifier, data.images[:, 0], ["conv1"])


def test_paired_difference_on_hand_made_windows():
    truth = torch.zeros(4, 2, 2, dtype=torch.long)
    truth[:, 0] = 1  # two figure pixels per window
    first = truth.clone()
    second = truth.clone()
    second[:, 0, 1] = 0  # misses one of them: IoU 1/2
    difference, error = experiment.paired_difference(first, second, truth, generator=gen(28))
    assert difference == pytest.approx(0.5)
    assert error == pytest.approx(0.0, abs=1e-12)  # every window the same: no spread
    second[0] = truth[0]  # now one window of four is right: the resamples disagree
    difference, error = experiment.paired_difference(first, second, truth, generator=gen(29))
    assert difference == pytest.approx(1 - 5 / 8)
    assert error > 0.05
    same, none = experiment.paired_difference(first, first, truth)
    assert same == 0.0 and none == 0.0
    # In the boundary band: every figure pixel of a 2 x 2 window with one figure row is in it,
    # and so is every ground pixel. `second` is wrong on one of four band pixels in 3 windows.
    band_gain, _ = experiment.paired_difference(
        first, second, truth, measure="boundary_accuracy", generator=gen(29)
    )
    assert band_gain == pytest.approx(1 - 13 / 16)
    with pytest.raises(ValueError, match="measure"):
        experiment.paired_difference(first, second, truth, measure="dice")


def test_most_correlated_channel_finds_the_channel_that_follows_the_mask_either_way():
    data = experiment.generate_shapes(6, size=12, generator=gen(40))
    noise = torch.randn(6, 1, 12, 12, generator=gen(41))
    inverted = 1.0 - data.masks.float().unsqueeze(1)  # anti-correlated: counts by |corr|
    coarse = torch.nn.functional.avg_pool2d(data.masks.float().unsqueeze(1), 3)
    assert experiment.most_correlated_channel(torch.cat([noise, inverted], 1), data.masks) == 1
    # A coarse map is upsampled to the masks' size first.
    coarse_noise = torch.nn.functional.avg_pool2d(noise, 3)
    maps = torch.cat([coarse_noise, coarse, coarse_noise], 1)
    assert experiment.most_correlated_channel(maps, data.masks) == 1
    with pytest.raises(ValueError, match="layer_map"):
        experiment.most_correlated_channel(noise[:3], data.masks)


# -- the nulls' own code --------------------------------------------------------------------------


def test_the_nulls_own_code_computes_what_the_mechanism_does():
    maps = [m.float() for m in pyramid(channels=(3, 4, 5), seed=50)] + [
        randn(2, 6, 1, 1, seed=53).float()
    ]
    layers = ["conv1", "pool3", "gap"]
    picked = experiment.plain_select(maps, layers)
    assert [m.shape[1] for m in picked] == [m.shape[1] for m in hc.select(maps, layers)]
    h = experiment.plain_hypercolumns(picked, (24, 24))
    assert torch.allclose(h, hc.hypercolumns(hc.select(maps, layers), 24), atol=1e-6)
    assert torch.allclose(experiment.plain_weights(3, (24, 24)), hc.interpolation_weights(3, 24))
    mechanism = random_classifier(h.shape[1], grid=3, seed=51, n_categories=3, dtype=torch.float32)
    plain = experiment.PlainLocationClassifier(
        h.shape[1],
        Standardizer(mechanism.feature_mean, mechanism.feature_std),
        grid=3,
        n_categories=3,
    )
    plain.load_state_dict(mechanism.state_dict())
    categories = torch.tensor([1, 2])
    assert torch.allclose(plain(h, categories), mechanism(h, categories), atol=1e-6)
    rows, cols = torch.tensor([0, 9, 23]), torch.tensor([5, 11, 2])
    beta = hc.interpolation_weights(3, 24)[:, rows, cols].T
    pixels = h[0, :, rows, cols].T
    c = torch.tensor([1, 1, 1])
    assert torch.allclose(
        plain.at_pixels(pixels, beta, c), mechanism.at_pixels(pixels, beta, c), atol=1e-5
    )


def test_raw_pixels_sit_at_the_networks_strides():
    x = torch.arange(2 * 24 * 24, dtype=torch.float32).view(2, 1, 24, 24)
    shapes = [tuple(m.shape) for m in experiment.RawPixels().feature_maps(x)]
    assert shapes == [(2, 1, 24, 24), (2, 1, 6, 6), (2, 1, 3, 3), (2, 1, 1, 1)]
    assert torch.allclose(experiment.RawPixels().feature_maps(x)[3][:, 0, 0, 0], x.mean((1, 2, 3)))


def test_segment_keeps_the_rate_of_lowest_validation_cross_entropy_and_the_nulls_code_agrees():
    train = experiment.generate_shapes(40, generator=gen(60))
    val = experiment.generate_shapes(10, generator=gen(65))
    test = experiment.generate_shapes(10, generator=gen(61))
    net = experiment.untrained(seed=2)
    runs = [
        experiment.segment(
            net,
            ["conv1", "gap"],
            train,
            val,
            test,
            grid=3,
            seed=0,
            pixel_generator=gen(62),
            lrs=(0.001, 0.05),
            n_pixels=2000,
            steps=30,
            reference=reference,
        )
        for reference in (False, True)
    ]
    for run in runs:
        assert run.masks["test"].shape == (10, 24, 24)
        assert set(run.scores["test"]) == {"iou", "accuracy", "boundary_accuracy"}
        assert list(run.validation) == [0.001, 0.05]
        assert run.validation[run.lr] == min(run.validation.values())
        assert run.masks["val"].shape == (10, 24, 24)
    # The same pixels, the same batches, the same math: the same masks, nearly to the pixel.
    agree = (runs[0].masks["test"] == runs[1].masks["test"]).float().mean()
    assert agree > 0.99
    with pytest.raises(ValueError, match="lrs"):
        experiment.segment(
            net, ["gap"], train, val, test, grid=1, seed=0, pixel_generator=gen(63), lrs=()
        )
    with pytest.raises(ValueError, match="interpolation only"):
        experiment.train_pixel_classifiers(
            experiment.sample_pixels(net, train, ["gap"], 100, generator=gen(64)),
            [0.05],
            seed=0,
            interpolate=False,
            reference=True,
        )


def test_validation_cross_entropy_is_the_training_loss_with_the_bilinear_weights():
    data = experiment.generate_shapes(6, generator=gen(80))
    net = experiment.untrained(seed=3)
    sample = experiment.sample_pixels(net, data, ["conv1", "gap"], 500, generator=gen(81))
    val = experiment.sample_pixels(net, data, ["conv1", "gap"], 300, generator=gen(82))
    beta = hc.interpolation_weights(3, 24)[:, val.positions[:, 0], val.positions[:, 1]].T
    for interpolate in (True, False):  # trained through the blend or cell by cell: scored blended
        classifiers, _ = experiment.train_pixel_classifiers(
            sample,
            [0.01, 0.1],
            grid=3,
            per_category=True,
            interpolate=interpolate,
            seed=0,
            steps=10,
        )
        scores = experiment.validation_cross_entropy(classifiers, val)
        for classifier, score in zip(classifiers, scores, strict=True):
            log_p = classifier.at_pixels(val.features, beta, val.categories)
            assert math.isclose(score, F.cross_entropy(log_p, val.labels).item(), rel_tol=1e-6)
        assert scores[0] != scores[1]
    plain, _ = experiment.train_pixel_classifiers(
        sample, [0.01], grid=3, per_category=True, seed=0, steps=10, reference=True
    )
    mechanism, _ = experiment.train_pixel_classifiers(
        sample, [0.01], grid=3, per_category=True, seed=0, steps=10
    )
    assert math.isclose(
        experiment.validation_cross_entropy(plain, val, reference=True)[0],
        experiment.validation_cross_entropy(mechanism, val)[0],
        rel_tol=1e-4,
    )


def small_task(stream: int, seed: int):
    """20 training and 6 validation windows (from streams `stream` and the next) and the
    untrained network of `seed`."""
    train = experiment.generate_shapes(20, generator=gen(stream))
    val = experiment.generate_shapes(6, generator=gen(stream + 1))
    return train, val, experiment.untrained(seed=seed)


def test_segment_on_a_sample_drawn_apart_is_segment_drawing_it():
    train, val, net = small_task(90, seed=4)
    options = {"grid": 2, "seed": 0, "lrs": (0.01, 0.1), "n_pixels": 800, "steps": 10}
    drawn = experiment.segment(
        net, ["conv1", "gap"], train, val, val, pixel_generator=gen(92), **options
    )
    sample = experiment.sample_pixels(net, train, ["conv1", "gap"], 800, generator=gen(92))
    given = experiment.segment(net, ["conv1", "gap"], train, val, val, sample=sample, **options)
    assert torch.equal(drawn.masks["test"], given.masks["test"])
    assert drawn.validation == given.validation
    with pytest.raises(ValueError, match="pixel_generator or a sample"):
        experiment.segment(net, ["gap"], train, val, val, **options)


def test_plain_copy_holds_the_classifiers_weights_and_computes_the_same_blend():
    classifier = random_classifier(12, grid=3, seed=70, n_categories=3, dtype=torch.float32)
    plain = experiment.plain_copy(classifier)
    assert isinstance(plain, experiment.PlainLocationClassifier)
    h = hc.hypercolumns([m.float() for m in pyramid(seed=71)], 24)
    categories = torch.tensor([0, 2])
    assert torch.allclose(plain(h, categories), classifier(h, categories), atol=1e-6)
    with torch.no_grad():
        classifier.bias[..., 1].add_(1.0)  # a copy, not a view
    assert not torch.allclose(plain(h, categories), classifier(h, categories), atol=1e-3)


def test_segment_scores_every_rate_and_its_chosen_rate_is_the_run_itself():
    train, val, net = small_task(93, seed=5)
    test = experiment.generate_shapes(5, generator=gen(95))
    options = {"grid": 2, "seed": 0, "lrs": (0.01, 1.0), "n_pixels": 800, "steps": 10}
    plain = experiment.segment(
        net, ["conv1", "gap"], train, val, test, pixel_generator=gen(96), **options
    )
    every = experiment.segment(
        net, ["conv1", "gap"], train, val, test, pixel_generator=gen(96), every_rate=True, **options
    )
    assert plain.by_rate is None
    assert list(every.by_rate) == [0.01, 1.0]
    scores, masks = every.by_rate[every.lr]
    assert scores == every.scores
    assert torch.equal(masks, every.masks["test"])
    assert torch.equal(every.masks["test"], plain.masks["test"])
    other = 1.0 if every.lr == 0.01 else 0.01
    assert every.by_rate[other][0] != scores  # another classifier, scored on its own masks
    assert every.by_rate[other][1].shape == (5, 24, 24)
    with pytest.raises(TypeError, match="every_rate"):
        experiment.segment(
            net, ["gap"], train, val, test, pixel_generator=gen(96), every_rate=1, **options
        )


def test_generate_shapes_draws_the_windows_its_docstring_describes():
    # The draws written out in generate_shapes' order: a label, a brightness in [0.6, 1.4], for a
    # pair another kind (an offset of 1 or 2), a direction, two centres 0.27 of the window from
    # the middle, each jittered by up to 0.04, two radii in [0.2, 0.26]; then N(0, 0.25^2) noise.
    n, size, g = 40, 24, gen(97)

    def uniform(low, high):
        return low + (high - low) * torch.rand(n, 1, 1, generator=g)

    labels = torch.randint(3, (n,), generator=g)
    brightness = uniform(0.6, 1.4)
    others = (labels + torch.randint(1, 3, (n,), generator=g)) % 3
    angle = uniform(0.0, 2 * math.pi)
    dy, dx = 0.27 * size * torch.sin(angle), 0.27 * size * torch.cos(angle)
    centres = [
        (12 + s * dy + uniform(-0.04, 0.04) * size, 12 + s * dx + uniform(-0.04, 0.04) * size)
        for s in (1, -1)
    ]
    radii = uniform(0.2, 0.26) * size, uniform(0.2, 0.26) * size
    figure = experiment._shape_masks(labels, radii[0], *centres[0], size)
    ground = experiment._shape_masks(others, radii[1], *centres[1], size) & ~figure
    images = brightness * (figure | ground) + 0.25 * torch.randn(n, size, size, generator=g)
    data = experiment.generate_shapes(n, generator=gen(97))
    assert torch.equal(data.labels, labels)
    assert (others != labels).all()
    assert torch.equal(data.masks, figure.long())
    assert data.masks.dtype == torch.int64
    assert torch.allclose(data.images[:, 0], images, atol=1e-6)
    assert data.images.shape == (n, 1, size, size)


def test_each_rate_falls_linearly_and_a_diverging_rate_stops_while_the_others_go_on(monkeypatch):
    data = experiment.generate_shapes(8, generator=gen(98))
    sample = experiment.sample_pixels(
        experiment.untrained(seed=6), data, ["conv1", "gap"], 400, generator=gen(99)
    )
    seen = []
    plain_train = experiment.train

    def recording_train(modules, optimizer, loss_of_update, steps, **options):
        def recorded(i):
            loss = loss_of_update(i)
            seen.append([group["lr"] for group in optimizer.param_groups])
            return loss

        return plain_train(modules, optimizer, recorded, steps, **options)

    monkeypatch.setattr(experiment, "train", recording_train)
    options = {"grid": 2, "seed": 0, "steps": 4, "batch_size": 100}
    experiment.train_pixel_classifiers(sample, [0.01, 0.1], decay=True, **options)
    assert seen == [[pytest.approx(lr * (1 - i / 4)) for lr in (0.01, 0.1)] for i in range(4)]
    seen.clear()
    experiment.train_pixel_classifiers(sample, [0.01, 0.1], decay=False, **options)
    assert seen == [[0.01, 0.1]] * 4
    # A rate that diverges first in the list: its group's rate is 0 from then on, and the rate
    # after it trains exactly as it would alone.
    seen.clear()
    diverging, kept = experiment.train_pixel_classifiers(sample, [1e30, 0.01], **options)[0]
    assert seen[-1] == [0.0, 0.01]
    alone = experiment.train_pixel_classifiers(sample, [0.01], **options)[0][0]
    for a, b in zip(kept.parameters(), alone.parameters(), strict=True):
        assert torch.equal(a, b)
        assert not a.requires_grad
    features = sample.features[:5]
    mix = torch.full((5, 4), 0.25)
    assert kept.at_pixels(features, mix, None).shape == (5, 2)  # figure and ground
