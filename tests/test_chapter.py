"""The setup cell's work: seeds, one thread, determinism, the clock, quiet mode."""

import random

import numpy as np
import pytest
import torch

import papernotes as pn
from papernotes import chapter


def draws():
    # The legacy global NumPy generator is the one seed_everything seeds.
    return random.random(), np.random.rand(), torch.rand(1).item()  # noqa: NPY002


def test_one_seed_makes_every_generator_repeat():
    pn.seed_everything(7)
    first = draws()
    pn.seed_everything(7)
    assert draws() == first
    pn.seed_everything(8)
    assert draws() != first


@pytest.mark.parametrize("seed", [-1, 1.5, "0", True])
def test_seeds_must_be_non_negative_integers(seed):
    with pytest.raises(ValueError, match="seed"):
        pn.seed_everything(seed)


def test_setup_pins_threads_determinism_and_starts_the_clock(monkeypatch):
    monkeypatch.setattr(chapter, "_started_at", None)
    with pytest.raises(RuntimeError, match="setup cell"):
        pn.elapsed()
    torch.set_num_threads(2)
    pn.setup(seed=3)
    assert torch.get_num_threads() == 1
    assert torch.are_deterministic_algorithms_enabled()
    assert 0 <= pn.elapsed() < 5
    value = torch.rand(1).item()
    pn.setup(seed=3)
    assert torch.rand(1).item() == value


@pytest.mark.parametrize(
    ("env", "expected"),
    [({}, False), ({"CI": "true"}, True), ({"PAPERNOTES_QUIET": "1"}, True), ({"CI": "0"}, False)],
)
def test_quiet_follows_the_environment(monkeypatch, env, expected):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("PAPERNOTES_QUIET", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert pn.quiet() is expected


def test_the_seed_comes_from_the_environment_unless_given(monkeypatch):
    monkeypatch.setattr(chapter, "_seed", None)
    monkeypatch.setenv("PAPERNOTES_SEED", "3")
    assert pn.chapter_seed() == 3
    pn.setup()
    assert pn.chapter_seed() == 3
    three = torch.rand(1).item()
    monkeypatch.setenv("PAPERNOTES_SEED", "4")
    pn.setup()
    assert pn.chapter_seed() == 4 and torch.rand(1).item() != three
    pn.setup(seed=3)
    assert pn.chapter_seed() == 3 and torch.rand(1).item() == three
    monkeypatch.setenv("PAPERNOTES_SEED", "four")
    with pytest.raises(ValueError, match="PAPERNOTES_SEED must be a non-negative integer"):
        pn.setup()


def test_show_source_shows_the_function():
    shown = pn.show_source(pn.evaluating).data
    assert shown.startswith("```python\n@contextlib.contextmanager\ndef evaluating(")
    assert "model.train(was_training)" in shown
