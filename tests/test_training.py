"""The shared step loop and its progress bar."""

import pytest
import torch

import papernotes as pn
from papernotes import chapter


def test_fit_collects_what_each_step_returns():
    history = pn.fit(lambda i: {"loss": 10 - i, "double": 2 * i}, 5)
    assert history == {
        "step": [1, 2, 3, 4, 5],
        "loss": [10.0, 9.0, 8.0, 7.0, 6.0],
        "double": [0.0, 2.0, 4.0, 6.0, 8.0],
    }


def test_fit_logs_every_nth_step_and_the_last():
    history = pn.fit(lambda i: {"i": i}, 7, log_every=3)
    assert history["step"] == [1, 4, 7]
    assert history["i"] == [0.0, 3.0, 6.0]


def test_steps_that_return_nothing_are_not_logged():
    calls = []
    history = pn.fit(lambda i: calls.append(i) or ({"x": i} if i == 2 else None), 4)
    assert calls == [0, 1, 2, 3]
    assert history == {"step": [3], "x": [2.0]}


@pytest.mark.parametrize(("steps", "log_every"), [(0, 1), (3, 0)])
def test_bad_step_counts_are_rejected(steps, log_every):
    with pytest.raises(ValueError):
        pn.fit(lambda i: None, steps, log_every=log_every)


def test_progress_bar_is_silent_when_quiet(monkeypatch, capsys):
    monkeypatch.setenv("PAPERNOTES_QUIET", "1")
    assert list(pn.progress(range(3), desc="x")) == [0, 1, 2]
    assert capsys.readouterr().err == ""


def test_progress_bar_shows_when_someone_watches(monkeypatch, capsys):
    monkeypatch.delenv("PAPERNOTES_QUIET", raising=False)
    monkeypatch.delenv("CI", raising=False)
    assert not chapter.quiet()
    list(pn.progress(range(3), desc="watched"))
    assert "watched" in capsys.readouterr().err


def test_accuracy_counts_argmax_hits():
    logits = torch.tensor([[2.0, 1.0], [0.0, 3.0], [5.0, -1.0], [0.1, 0.2]])
    assert pn.accuracy(logits, torch.tensor([0, 1, 1, 1])) == 0.75


def test_accuracy_checks_shapes():
    with pytest.raises(ValueError, match=r"logits \(N, C\) and labels \(N,\)"):
        pn.accuracy(torch.zeros(4, 2), torch.zeros(3, dtype=torch.long))
