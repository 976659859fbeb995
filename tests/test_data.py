"""The book's small MNIST: scikit-learn's 8x8 digits as tensors, split once."""

import pytest
import torch

import papernotes as pn


def test_split_sizes_shapes_and_range():
    digits = pn.load_digits_split()
    assert digits.train_x.shape == (1347, 64) and digits.test_x.shape == (450, 64)
    assert digits.train_x.dtype == torch.float32 and digits.train_y.dtype == torch.int64
    for x in (digits.train_x, digits.test_x):
        assert x.min() == 0.0 and x.max() == 1.0
    assert digits.images(digits.test_x).shape == (450, 8, 8)
    assert digits.n_pixels == 64


def test_split_is_fixed_and_stratified():
    a, b = pn.load_digits_split(), pn.load_digits_split()
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)
    test_counts = torch.bincount(a.test_y, minlength=10)
    all_counts = test_counts + torch.bincount(a.train_y, minlength=10)
    assert ((test_counts - 0.25 * all_counts).abs() <= 1).all()  # each class split 1:3
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
