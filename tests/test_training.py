"""The one training loop, its History, eval mode and seeded generators."""

import math

import pytest
import torch
from torch import nn

import papernotes as pn
from papernotes import chapter, training


def regression(seed=0):
    """A linear model and a loss of one update that fits y = 3x."""
    with pn.seeded(seed):
        model = nn.Linear(1, 1)
    x = torch.linspace(-1, 1, 32).unsqueeze(1)

    def loss_of_update(i):
        return ((model(x) - 3 * x) ** 2).mean()

    return model, x, loss_of_update


def test_train_fits_and_logs_on_schedule_and_after_the_last_update():
    model, x, loss_of_update = regression()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3)
    history = pn.train(
        model, optimizer, loss_of_update, 25,
        evaluate=lambda: {"slope": model.weight.item()}, eval_every=10,
    )  # fmt: skip
    assert history.steps == [10, 20, 25]
    assert history["loss"][0] > history["loss"][-1]
    assert abs(history.final("slope") - 3) < 0.05
    assert history.mean("slope") == pytest.approx(sum(history["slope"]) / 3)
    assert not model.training  # handed back ready to be measured


def test_evaluation_runs_in_eval_mode_without_gradients_and_training_in_train_mode():
    seen = []
    model = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5))
    x = torch.ones(4, 2)

    def loss_of_update(i):
        seen.append(("update", model.training))
        return model(x).sum()

    def evaluate():
        seen.append(("eval", model.training, torch.is_grad_enabled()))
        return {}

    pn.train(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_of_update, 3,
             evaluate=evaluate, eval_every=2)  # fmt: skip
    assert seen == [
        ("update", True), ("update", True), ("eval", False, False), ("update", True),
        ("eval", False, False),
    ]  # fmt: skip


def test_clipping_bounds_the_gradient_norm():
    model = nn.Linear(3, 1, bias=False)
    norms = []

    class Recorder(torch.optim.SGD):
        def step(self, closure=None):
            norms.append(model.weight.grad.norm().item())
            return super().step(closure)

    def loss_of_update(i):
        return 1000 * model(torch.ones(1, 3)).sum()

    pn.train(model, Recorder(model.parameters(), lr=0.0), loss_of_update, 2, clip=1.0)
    assert norms and all(n == pytest.approx(1.0) for n in norms)


def test_a_diverged_run_stops_updating_and_keeps_its_schedule():
    model = nn.Linear(1, 1)
    before = model.weight.detach().clone()
    history = pn.train(
        model, torch.optim.SGD(model.parameters(), lr=1.0),
        lambda i: model(torch.ones(1, 1)).sum() * (math.inf if i >= 1 else 1.0), 6,
        evaluate=lambda: {"w": model.weight.item()}, eval_every=2,
    )  # fmt: skip
    assert history.diverged and history.steps == [2, 4, 6]
    assert history["w"][0] == history["w"][-1] != before.item()  # one update, then none


def test_history_finds_the_first_step_reaching_a_level():
    history = training.History()
    for step, acc in [(10, 0.2), (20, 0.6), (30, 0.5), (40, 0.9)]:
        history.log(step, {"acc": acc})
    assert history.first_step_reaching("acc", 0.55) == 20
    assert history.first_step_reaching("acc", 0.95) is None
    assert history.first_step_reaching("acc", 0.5, above=False) == 10
    assert "acc" in history and history.final("acc") == 0.9
    with pytest.raises(KeyError, match="no metric 'loss' was logged; logged: acc"):
        history["loss"]
    with pytest.raises(ValueError, match="the same metrics"):
        history.log(50, {"accuracy": 1.0})


@pytest.mark.parametrize(("steps", "eval_every", "clip"), [(0, 1, None), (3, 0, None), (3, 1, -1)])
def test_bad_schedules_are_rejected(steps, eval_every, clip):
    model, _, loss_of_update = regression()
    with pytest.raises(ValueError, match="steps|eval_every|clip"):
        pn.train(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_of_update, steps,
                 eval_every=eval_every, clip=clip)  # fmt: skip


def test_evaluating_restores_the_mode_even_when_the_block_raises():
    model = nn.Linear(1, 1).train()
    with pytest.raises(RuntimeError), pn.evaluating(model):
        assert not model.training
        raise RuntimeError
    assert model.training
    model.eval()
    with pn.evaluating(model):
        pass
    assert not model.training


def test_seeded_fixes_initial_weights_and_leaves_the_global_generator_alone():
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    with pn.seeded(5):
        a = nn.Linear(4, 4).weight.detach().clone()
    assert torch.equal(torch.rand(1), expected_next)
    with pn.seeded(5):
        assert torch.equal(nn.Linear(4, 4).weight, a)
    with pn.seeded(6):
        assert not torch.equal(nn.Linear(4, 4).weight, a)


def test_generators_repeat_per_seed_and_stream_and_differ_across_them():
    def draw(seed, stream):
        return torch.rand(4, generator=pn.generator(seed, stream))

    assert torch.equal(draw(0, 1), draw(0, 1))
    draws = [draw(0, 0), draw(0, 1), draw(1, 0), draw(1, 1)]
    assert all(not torch.equal(a, b) for i, a in enumerate(draws) for b in draws[i + 1 :])
    with pytest.raises(ValueError, match="seed"):
        pn.generator(-1)


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
    with pytest.raises(ValueError, match=r"labels must have shape \(N,\) with N = 4; got \(3,\)"):
        pn.accuracy(torch.zeros(4, 2), torch.zeros(3, dtype=torch.long))
