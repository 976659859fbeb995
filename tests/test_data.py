"""The book's small MNIST: scikit-learn's 8x8 digits as tensors, split once."""

import pytest
import torch

import papernotes as pn


def test_split_sizes_shapes_and_range():
    digits = pn.load_digits_split()
    assert digits.train_x.shape == (1077, 64) and digits.val_x.shape == (270, 64)
    assert digits.test_x.shape == (450, 64)
    assert digits.train_x.dtype == torch.float32 and digits.train_y.dtype == torch.int64
    for x in (digits.train_x, digits.val_x, digits.test_x):
        assert x.min() == 0.0 and x.max() == 1.0
    assert digits.images(digits.test_x).shape == (450, 8, 8)
    assert digits.n_pixels == 64


def test_split_is_fixed_and_stratified():
    a, b = pn.load_digits_split(), pn.load_digits_split()
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)
    counts = {
        name: torch.bincount(getattr(a, f"{name}_y"), minlength=10)
        for name in ("train", "val", "test")
    }
    all_counts = sum(counts.values())
    assert ((counts["test"] - 0.25 * all_counts).abs() <= 1).all()  # each class split 1:3
    assert ((counts["val"] - 0.2 * 0.75 * all_counts).abs() <= 1).all()  # and 1:4 of the rest
    rows = {tuple(row.tolist()) for row in a.train_x}  # no image in two splits
    assert not any(tuple(row.tolist()) in rows for row in a.val_x if row.sum() > 0)
    a.train_x[0, 0] = 123.0  # callers get fresh tensors
    assert pn.load_digits_split().train_x[0, 0] != 123.0


def test_binarize_thresholds_and_checks_its_threshold():
    x = torch.tensor([0.0, 0.5, 0.51, 1.0])
    assert torch.equal(pn.binarize(x), torch.tensor([0.0, 0.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="threshold"):
        pn.binarize(x, threshold=1.5)


def test_minibatches_cover_each_epoch_once_with_equal_sizes():
    batches = pn.minibatches(10, 3, torch.Generator().manual_seed(0))
    epoch = [next(batches) for _ in range(3)]  # 10 // 3 = 3 full batches per epoch
    assert all(len(b) == 3 for b in epoch)
    seen = torch.cat(epoch)
    assert len(set(seen.tolist())) == 9
    assert not torch.equal(torch.cat([next(batches) for _ in range(3)]), seen)  # reshuffled


@pytest.mark.parametrize("batch_size", [0, 11])
def test_minibatch_size_must_fit(batch_size):
    with pytest.raises(ValueError, match="batch_size"):
        next(pn.minibatches(10, batch_size))


def test_the_standardizer_uses_training_statistics_and_spares_constant_features():
    from papernotes.data import Standardizer

    train = torch.tensor([[0.0, 5.0], [2.0, 5.0], [4.0, 5.0]])
    scale = Standardizer.fit(train)
    out = scale(torch.tensor([[2.0, 6.0]]))
    assert torch.allclose(out, torch.tensor([[0.0, 1.0]]))  # the constant feature: scale 1
    assert torch.allclose(scale(train).std(0)[0], torch.tensor(1.0))
    assert Standardizer.fit(train, eps=1.0).std[0] == 3.0
    with pytest.raises(ValueError, match="x"):
        scale(torch.zeros(2, 3))
