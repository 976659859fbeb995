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
        model,
        optimizer,
        loss_of_update,
        25,
        evaluate=lambda: {"slope": model.weight.item()},
        eval_every=10,
    )
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

    pn.train(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        loss_of_update,
        3,
        evaluate=evaluate,
        eval_every=2,
    )
    assert seen == [
        ("update", True),
        ("update", True),
        ("eval", False, False),
        ("update", True),
        ("eval", False, False),
    ]


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
        model,
        torch.optim.SGD(model.parameters(), lr=1.0),
        lambda i: model(torch.ones(1, 1)).sum() * (math.inf if i >= 1 else 1.0),
        6,
        evaluate=lambda: {"w": model.weight.item()},
        eval_every=2,
    )
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
        pn.train(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            loss_of_update,
            steps,
            eval_every=eval_every,
            clip=clip,
        )


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


def test_train_classifier_fits_a_separable_problem_and_adds_the_extra_loss():
    from papernotes.data import minibatches
    from papernotes.training import accuracy_of, generator, seeded, train_classifier

    x = torch.randn(200, 2, generator=torch.Generator().manual_seed(0))
    y = (x[:, 0] > 0).long()
    with seeded(0):
        model = torch.nn.Linear(2, 2)
    history = train_classifier(
        model,
        y,
        torch.optim.Adam(model.parameters(), lr=0.1),
        100,
        batches=minibatches(200, 50, generator(0, 1)),
        logits_of=lambda index: model(x[index]),
        evaluate=lambda: {"acc": accuracy_of(model, x, y)},
    )
    assert history.final("acc") > 0.95
    # a penalty that dominates: the weights are driven to zero instead of separating the classes
    with seeded(0):
        penalised = torch.nn.Linear(2, 2)
    train_classifier(
        penalised,
        y,
        torch.optim.Adam(penalised.parameters(), lr=0.1),
        100,
        batches=minibatches(200, 50, generator(0, 1)),
        logits_of=lambda index: penalised(x[index]),
        extra_loss=lambda index: 100 * penalised.weight.pow(2).sum(),
    )
    assert penalised.weight.abs().max() < 0.05 < model.weight.abs().max()


def test_accuracy_of_measures_in_eval_mode_and_keeps_the_mode():
    from papernotes.training import accuracy_of

    model = torch.nn.Sequential(torch.nn.Dropout(0.99), torch.nn.Identity())
    x = torch.eye(3) * 10
    y = torch.arange(3)
    assert accuracy_of(model, x, y) == 1.0  # dropout would zero most logits in train mode
    assert model.training


def test_mlp_layers_in_order_and_init_layer_by_layer():
    from papernotes.training import mlp, seeded

    calls = []
    net = mlp([4, 8, 8, 3], torch.nn.Tanh, init=lambda linear, out: calls.append(out))
    kinds = [type(m).__name__ for m in net]
    assert kinds == ["Linear", "Tanh", "Linear", "Tanh", "Linear"]
    assert calls == [False, False, True]

    # init right after each layer: the same draws as making and re-initialising them one by one
    def lecun(linear, _):
        torch.nn.init.normal_(linear.weight, std=linear.in_features**-0.5)

    with seeded(1):
        a = mlp([4, 8, 3], init=lecun)
    with seeded(1):
        first = torch.nn.Linear(4, 8)
        lecun(first, False)
        second = torch.nn.Linear(8, 3)
        lecun(second, True)
    assert torch.equal(a[0].weight, first.weight) and torch.equal(a[2].weight, second.weight)
    with pytest.raises(ValueError, match="widths"):
        mlp([4])


def _fitted(targets=None, targets_of=None, steps=30):
    from papernotes.data import minibatches
    from papernotes.training import generator, seeded, train_classifier

    x = torch.randn(120, 2, generator=torch.Generator().manual_seed(0))
    with seeded(0):
        model = torch.nn.Linear(2, 2)
    train_classifier(
        model,
        targets,
        torch.optim.SGD(model.parameters(), lr=0.5),
        steps,
        batches=minibatches(120, 40, generator(0, 1)),
        logits_of=lambda index: model(x[index]),
        targets_of=None if targets_of is None else lambda index: targets_of(x, index),
    )
    return model.weight.detach().clone(), x


def test_train_classifier_takes_soft_targets_and_per_update_targets():
    labels = (torch.randn(120, generator=torch.Generator().manual_seed(1)) > 0).long()
    hard, _ = _fitted(labels)
    # one-hot rows are the labels again: the same updates, the same weights
    one_hot, _ = _fitted(torch.nn.functional.one_hot(labels, 2).float())
    assert torch.allclose(hard, one_hot, atol=1e-6)
    # smoothed targets pull less hard: smaller weights than the labels give
    smooth, _ = _fitted(0.8 * torch.nn.functional.one_hot(labels, 2).float() + 0.1)
    assert smooth.abs().sum() < hard.abs().sum()
    # targets made per update (a mixup-style batch) reach the loss, and the labels are unused
    made, _ = _fitted(targets_of=lambda x, index: (x[index, 0] > 0).long())
    wanted = made[1, 0] - made[0, 0]
    assert wanted > 0.5  # it learnt the sign of the first input, not the random labels


def test_train_classifier_rejects_targets_given_twice_or_not_distributions():
    with pytest.raises(ValueError, match="give the targets once"):
        _fitted(torch.zeros(120).long(), targets_of=lambda x, index: x[index, 0].long())
    with pytest.raises(ValueError, match="give the targets once"):
        _fitted(None)
    with pytest.raises(ValueError, match="rows that sum to 1"):
        _fitted(torch.full((120, 2), 0.7))
    with pytest.raises(TypeError, match="train_y"):
        _fitted(torch.ones(120, 2, dtype=torch.long))
