"""Arms trained together (papernotes.together): a stack of K members trains each member as its
own run would, one forward and backward for all."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import gen
from papernotes import data, together, training

N, D, H, C, B = 96, 8, 16, 3, 12
X = torch.randn(N, D, generator=gen(0))
Y = torch.randint(C, (N,), generator=gen(1))
VAL_X = torch.randn(40, D, generator=gen(2))
VAL_Y = torch.randint(C, (40,), generator=gen(3))
STACKS = [together.MLPStack, together.Stack]


def mlp(seed: int, dropout: float = 0.0) -> nn.Sequential:
    with training.seeded(seed):
        return nn.Sequential(nn.Linear(D, H), nn.ReLU(), nn.Dropout(dropout), nn.Linear(H, C))


def bn_net(seed: int) -> nn.Sequential:
    with training.seeded(seed):
        return nn.Sequential(
            nn.Linear(D, H, bias=False), nn.BatchNorm1d(H), nn.Tanh(), nn.Linear(H, C)
        )


class SliceDropout(nn.Module):
    """Member k's dropout as a stack of K draws it: uniform numbers (K, *shape) from the
    generator, member k's row kept below its keep probability (float32, as the stack's)."""

    def __init__(self, p: float, generator: torch.Generator, k: int, members: int):
        super().__init__()
        self.p, self.generator, self.k, self.members = p, generator, k, members

    def forward(self, x):
        if not self.training:
            return x
        keep = 1.0 - torch.tensor(self.p, dtype=torch.float32)
        draws = torch.rand((self.members, *x.shape), generator=self.generator)[self.k]
        return x * (draws < keep) / keep


def alone(member, k, members, *, masks_seed=7):
    """Member k of a stack of `members` as a plain module whose dropout draws what the stack's
    masks generator (seeded `masks_seed`) gives member k."""
    model = copy.deepcopy(member)
    for name, layer in list(model.named_modules()):
        if isinstance(layer, nn.Dropout):
            setattr(model, name, SliceDropout(layer.p, gen(masks_seed), k, members))
    return model


def torch_optimizer(kind, params, lr, weight_decay):
    if kind == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=weight_decay, nesterov=True)


def member_optimizer(kind, params, lr, weight_decay):
    if kind == "adam":
        return together.Adam(params, lr=lr, weight_decay=weight_decay)
    return together.SGD(params, lr=lr, momentum=0.9, weight_decay=weight_decay, nesterov=True)


def separate_run(model, kind, lr, weight_decay, batch_seed, steps, clip=None, scale=None):
    """The plain loop: training.train with torch.optim on one model."""
    optimizer = torch_optimizer(kind, model.parameters(), lr, weight_decay)
    batches = data.minibatches(N, B, gen(batch_seed))

    def loss_of_update(i):
        index = next(batches)
        loss = F.cross_entropy(model(X[index]), Y[index])
        return loss if scale is None else loss * scale(i)

    history = training.train(
        model,
        optimizer,
        loss_of_update,
        steps,
        evaluate=lambda: {"val_accuracy": training.accuracy(model(VAL_X), VAL_Y)},
        eval_every=4,
        clip=clip,
    )
    return model, history


def together_run(stack, kind, lrs, decays, batch_seeds, steps, clip=None, scales=None, x=X):
    optimizer = member_optimizer(kind, stack.parameters(), lrs, decays)
    batches = together.minibatches(N, B, [gen(s) for s in batch_seeds])

    def losses_of_update(i):
        index = next(batches)  # (K, B)
        losses = together.cross_entropy(stack(x[index]), Y[index])
        return losses if scales is None else losses * scales(i)

    histories = together.train(
        stack,
        optimizer,
        losses_of_update,
        steps,
        evaluate=lambda: {"val_accuracy": together.accuracy(stack.on_all(VAL_X), VAL_Y)},
        eval_every=4,
        clip=clip,
    )
    return stack, histories


def same_tensors(a: nn.Module, b: nn.Module) -> list[bool]:
    return [
        torch.equal(p, q)
        for p, q in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    ]


# -- a stack of one is the plain loop --------------------------------------------------------------


@pytest.mark.parametrize("kind", ["adam", "sgd"])
@pytest.mark.parametrize("make", STACKS + ["bn"])
def test_a_stack_of_one_reproduces_the_plain_loop_bit_for_bit(make, kind):
    member = bn_net(0) if make == "bn" else mlp(0, dropout=0.3)
    stack = (together.Stack if make == "bn" else make)([member], masks=gen(7))
    plain, history = separate_run(alone(member, 0, 1), kind, 0.05, 0.01, 11, 10, clip=0.5)
    stack, (together_history,) = together_run(stack, kind, 0.05, 0.01, [11], 10, clip=0.5)
    assert all(same_tensors(stack.member(0), plain))
    assert together_history.metrics == history.metrics
    assert together_history.steps == history.steps == [4, 8, 10]


# -- each member of K > 1 is its own run -----------------------------------------------------------


@pytest.mark.parametrize("kind", ["adam", "sgd"])
@pytest.mark.parametrize("make", STACKS)
def test_each_member_matches_its_own_run_with_its_rate_decay_dropout_and_batches(make, kind):
    rates, decays, dropouts = [0.03, 0.01, 0.1], [0.0, 0.05, 0.01], [0.0, 0.5, 0.2]
    members = [mlp(seed, p) for seed, p in zip([0, 1, 2], dropouts, strict=True)]
    stack, histories = together_run(
        make(members, masks=gen(7)), kind, rates, decays, [20, 21, 22], 12, clip=1.0
    )
    for k, member in enumerate(members):
        plain, history = separate_run(
            alone(member, k, 3), kind, rates[k], decays[k], 20 + k, 12, clip=1.0
        )
        trained = stack.member(k)
        for p, q in zip(trained.parameters(), plain.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
        assert histories[k].steps == history.steps
        assert histories[k]["loss"] == pytest.approx(history["loss"], rel=1e-5)
        assert trained[2].p == dropouts[k] and not trained.training


def test_batch_norm_members_keep_their_own_running_statistics():
    members = [bn_net(seed) for seed in range(3)]
    stack, _ = together_run(together.Stack(members), "adam", [0.01, 0.02, 0.03], 0.0, [5, 6, 7], 8)
    for k, member in enumerate(members):
        plain, _ = separate_run(copy.deepcopy(member), "adam", [0.01, 0.02, 0.03][k], 0.0, 5 + k, 8)
        for (name, p), q in zip(
            stack.member(k).state_dict().items(), plain.state_dict().values(), strict=True
        ):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


def test_both_paths_draw_the_same_dropout_masks():
    members = [mlp(seed, p) for seed, p in zip([0, 1], [0.5, 0.25], strict=True)]
    x = torch.randn(2, 5, D, generator=gen(4))
    fast, general = together.MLPStack(members, masks=gen(9)), together.Stack(members, masks=gen(9))
    torch.testing.assert_close(fast.train()(x), general.train()(x))
    dropped = fast.train()(x) != fast.eval()(x)
    assert dropped.any()  # masks were drawn in train mode, and none in eval mode
    torch.testing.assert_close(fast.eval()(x), general.eval()(x))


# -- members do not leak into one another ----------------------------------------------------------


@pytest.mark.parametrize("make", STACKS + ["bn"])
def test_a_members_loss_has_no_gradient_in_another_members_parameters(make):
    if make == "bn":
        stack = together.Stack([bn_net(s) for s in range(3)])
    else:
        stack = make([mlp(s, 0.5) for s in range(3)], masks=gen(1))
    losses = together.cross_entropy(stack.train()(X[:30].view(3, 10, D)), Y[:30].view(3, 10))
    for j in range(3):
        grads = torch.autograd.grad(losses[j], list(stack.parameters()), retain_graph=True)
        for grad in grads:
            others = torch.cat([grad[k].flatten() for k in range(3) if k != j])
            assert torch.equal(others, torch.zeros_like(others))
            assert grad[j].abs().sum() > 0


@pytest.mark.parametrize("make", STACKS)
def test_perturbing_one_members_data_leaves_the_others_trajectories_alone(make):
    members = [mlp(s, 0.3) for s in range(3)]
    first, first_histories = together_run(
        make(members, masks=gen(7)), "adam", 0.02, 0.0, [1, 2, 3], 9
    )
    noisy = X + 0.5 * torch.randn(N, D, generator=gen(8))
    second, second_histories = together_run(
        make(members, masks=gen(7)), "adam", 0.02, 0.0, [1, 2, 3], 9, x=_own_x(noisy, member=1)
    )
    assert not all(same_tensors(first.member(1), second.member(1)))
    for k in (0, 2):
        assert all(same_tensors(first.member(k), second.member(k)))
        assert first_histories[k].metrics == second_histories[k].metrics


class _own_x:
    """X for every member but `member`, which reads `other`: indexing with (K, B) rows."""

    def __init__(self, other, member):
        self.other, self.member = other, member

    def __getitem__(self, index):
        rows = X[index].clone()
        rows[self.member] = self.other[index[self.member]]
        return rows


# -- a member that diverges stops; the others carry on ---------------------------------------------


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_a_diverging_member_stops_updating_and_the_others_carry_on(kind):
    members = [mlp(s) for s in range(3)]

    def scales(i):  # member 1's loss stops being finite at update 3
        return torch.tensor([1.0, math.inf if i >= 3 else 1.0, 1.0])

    reference, _ = together_run(together.MLPStack(members), kind, 0.02, 0.0, [1, 2, 3], 9)
    stack, histories = together_run(
        together.MLPStack(members), kind, 0.02, 0.0, [1, 2, 3], 9, scales=scales
    )
    three, _ = together_run(together.MLPStack(members), kind, 0.02, 0.0, [1, 2, 3], 3)
    assert [h.diverged for h in histories] == [False, True, False]
    assert all(same_tensors(stack.member(1), three.member(1)))  # three updates, then none
    for k in (0, 2):
        assert all(same_tensors(stack.member(k), reference.member(k)))
    assert math.isinf(histories[1]["loss"][-1]) and histories[1].steps == [4, 8, 9]
    # as training.train does for one run
    _, history = separate_run(
        members[1], kind, 0.02, 0.0, 2, 9, scale=lambda i: math.inf if i >= 3 else 1.0
    )
    assert history.diverged and history.steps == histories[1].steps


def test_when_every_member_diverges_the_schedule_still_runs():
    stack = together.MLPStack([mlp(s) for s in range(2)])
    _, histories = together_run(
        stack, "adam", 0.02, 0.0, [1, 2], 6, scales=lambda i: torch.full((2,), math.nan)
    )
    assert all(h.diverged and h.steps == [4, 6] for h in histories)
    assert all(same_tensors(stack.member(0), mlp(0)))


# -- the optimizers are torch.optim's, one rate a member -------------------------------------------


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_each_members_update_is_torch_optims_on_its_own_slice(kind):
    rates, decays = [1e-3, 3e-2, 1e-1], [0.0, 1e-4, 0.5]
    start = torch.randn(3, 7, 5, generator=gen(0))
    stacked = nn.Parameter(start.clone())
    optimizer = member_optimizer(kind, [stacked], rates, decays)
    own = [nn.Parameter(start[k].clone()) for k in range(3)]
    references = [torch_optimizer(kind, [own[k]], rates[k], decays[k]) for k in range(3)]
    for step in range(20):
        grad = torch.randn(3, 7, 5, generator=gen(step + 1))
        stacked.grad = grad.clone()
        optimizer.step()
        for k in range(3):
            own[k].grad = grad[k].clone()
            references[k].step()
    for k in range(3):
        assert torch.equal(stacked[k], own[k])


def test_each_members_gradient_is_clipped_on_its_own():
    stacked = nn.Parameter(torch.zeros(2, 3))
    stacked.grad = torch.tensor([[30.0, 40.0, 0.0], [0.3, 0.4, 0.0]])  # norms 50 and 0.5
    together.SGD([stacked], lr=1.0).step(max_norm=1.0)
    torch.testing.assert_close(stacked.detach(), -torch.tensor([[0.6, 0.8, 0.0], [0.3, 0.4, 0.0]]))


def test_an_inactive_member_does_not_move():
    stacked = nn.Parameter(torch.ones(2, 3))
    stacked.grad = torch.ones(2, 3)
    optimizer = together.Adam([stacked], lr=0.1)
    optimizer.step(active=torch.tensor([True, False]))
    assert torch.equal(stacked[1], torch.ones(3)) and (stacked[0] < 1).all()


# -- the helpers -----------------------------------------------------------------------------------


def test_stack_picks_the_fast_path_for_mlps_and_torch_func_for_the_rest():
    assert type(together.stack([mlp(0), mlp(1)])) is together.MLPStack
    assert type(together.stack([bn_net(0), bn_net(1)])) is together.Stack


def test_minibatches_are_each_members_own_order():
    stacked = together.minibatches(N, B, [gen(1), gen(2)])
    own = [data.minibatches(N, B, gen(1)), data.minibatches(N, B, gen(2))]
    for _ in range(10):  # past an epoch's end
        index = next(stacked)
        assert index.shape == (2, B)
        assert all(torch.equal(index[k], next(own[k])) for k in range(2))


def test_per_member_cross_entropy_and_accuracy():
    logits = torch.randn(3, 5, C, generator=gen(0))
    labels = torch.randint(C, (3, 5), generator=gen(1))
    expected = torch.stack([F.cross_entropy(logits[k], labels[k]) for k in range(3)])
    torch.testing.assert_close(together.cross_entropy(logits, labels), expected)
    probabilities = F.one_hot(labels, C).float()
    torch.testing.assert_close(together.cross_entropy(logits, probabilities), expected)
    hits = torch.tensor([training.accuracy(logits[k], labels[k]) for k in range(3)])
    assert torch.equal(together.accuracy(logits, labels), hits)


def test_member_is_a_copy_in_eval_mode():
    stack = together.MLPStack([mlp(0, 0.5), mlp(1, 0.5)])
    member = stack.member(1)
    with torch.no_grad():
        stack.weights[0].add_(1.0)
    assert all(same_tensors(member, mlp(1, 0.5))) and not member.training
    runs = together.runs(stack, [training.History(), training.History()])
    assert isinstance(runs[0], training.Run) and len(runs) == 2


def test_the_loop_evaluates_in_eval_mode_without_gradients():
    stack = together.MLPStack([mlp(0, 0.5), mlp(1, 0.5)])
    seen = []

    def losses_of_update(i):
        seen.append(("update", stack.training))
        return together.cross_entropy(stack.on_all(X[:B]), Y[:B])

    def evaluate():
        seen.append(("eval", stack.training, torch.is_grad_enabled()))
        return {"constant": [1.0, 2.0]}

    histories = together.train(
        stack,
        together.Adam(stack.parameters()),
        losses_of_update,
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
    assert histories[1]["constant"] == [2.0, 2.0] and not stack.training


# -- bad input -------------------------------------------------------------------------------------


def test_bad_members_are_refused_with_what_is_wrong():
    with pytest.raises(ValueError, match="at least one module"):
        together.MLPStack([])
    with pytest.raises(TypeError, match="list of nn.Modules"):
        together.Stack(mlp(0))
    with pytest.raises(ValueError, match="same parameters"):
        together.Stack(
            [mlp(0), nn.Sequential(nn.Linear(D, 5), nn.ReLU(), nn.Dropout(), nn.Linear(5, C))]
        )
    with pytest.raises(ValueError, match="one class"):
        together.Stack([mlp(0), nn.Linear(D, C)])
    with pytest.raises(TypeError, match="use Stack"):
        together.MLPStack([bn_net(0)])
    with pytest.raises(ValueError, match="dropout rate"):
        together.MLPStack([mlp(0, 1.0)])
    with pytest.raises(TypeError, match="masks must be a torch.Generator"):
        together.MLPStack([mlp(0)], masks=0)


def test_bad_inputs_and_hyper_parameters_are_refused():
    stack = together.MLPStack([mlp(0), mlp(1)])
    with pytest.raises(ValueError, match=r"x must have shape \(K, B, ...\) with K = 2"):
        stack(X)
    with pytest.raises(ValueError, match="lr must be one number or 2"):
        together.Adam(stack.parameters(), lr=[0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match=r"weight_decay\[1\] must be a finite number"):
        together.SGD(stack.parameters(), lr=0.1, weight_decay=[0.0, -1.0])
    with pytest.raises(ValueError, match="lr must be a finite number"):
        together.Adam(stack.parameters(), lr=0.0)
    with pytest.raises(ValueError, match="leading member axis"):
        together.Adam([nn.Parameter(torch.zeros(2, 3)), nn.Parameter(torch.zeros(3))])
    with pytest.raises(ValueError, match="momentum"):
        together.SGD(stack.parameters(), lr=0.1, momentum=1.0)
    with pytest.raises(ValueError, match=r"active must have shape \(K,\) with K = 2"):
        together.SGD(stack.parameters(), lr=0.1).step(active=torch.ones(3, dtype=torch.bool))
    other = together.Adam(together.MLPStack([mlp(0)]).parameters())
    with pytest.raises(ValueError, match="1 members, the stack 2"):
        together.train(stack, other, lambda i: torch.zeros(2), 3)
    with pytest.raises(TypeError, match="together.Adam or together.SGD"):
        together.train(stack, torch.optim.Adam(stack.parameters()), lambda i: torch.zeros(2), 3)
    optimizer = together.Adam(stack.parameters())
    with pytest.raises(
        ValueError, match=r"losses_of_update\(i\) must have shape \(K,\) with K = 2"
    ):
        together.train(stack, optimizer, lambda i: torch.zeros(3), 3)
    with pytest.raises(ValueError, match="clip"):
        together.train(stack, optimizer, lambda i: torch.zeros(2), 3, clip=0.0)

    def losses_of_update(i):
        return together.cross_entropy(stack.on_all(X[:B]), Y[:B])

    with pytest.raises(ValueError, match="one value a member"):
        together.train(stack, optimizer, losses_of_update, 3, evaluate=lambda: {"a": [1.0]})


# -- what chapters with other architectures need ---------------------------------------------------


class Recurrent(nn.Module):
    """A small recurrent net with two inputs: sequences (B, T, D) and a first state (B, H)."""

    def __init__(self):
        super().__init__()
        self.inputs, self.state = nn.Linear(D, H), nn.Linear(H, H, bias=False)
        self.dropout, self.out = nn.Dropout(0.2), nn.Linear(H, C)

    def forward(self, x, h):
        for t in range(x.shape[1]):  # h_t = tanh(W x_t + U h_{t-1} + b)
            h = torch.tanh(self.inputs(x[:, t]) + self.state(h))
        return self.out(self.dropout(h))


def test_a_stack_takes_several_inputs_and_matches_each_members_own_forward():
    with training.seeded(0):
        members = [Recurrent() for _ in range(3)]
    x, h = torch.randn(3, 4, 5, D, generator=gen(1)), torch.randn(3, 4, H, generator=gen(2))
    stack = together.Stack(members, masks=gen(3))
    out = stack.eval()(x, h)
    for k, member in enumerate(members):
        torch.testing.assert_close(out[k], member.eval()(x[k], h[k]))
    trained = stack.train()(x, h)
    for k, member in enumerate(members):
        own = alone(member, k, 3, masks_seed=3).train()(x[k], h[k])
        torch.testing.assert_close(trained[k], own)
    assert stack.on_all(x[0], h[0]).shape == (3, 4, C)


def test_per_member_rates_per_parameter_group_match_torch_optim():
    first, second = torch.randn(2, 4, generator=gen(0)), torch.randn(2, 3, generator=gen(1))
    a, b = nn.Parameter(first.clone()), nn.Parameter(second.clone())
    groups = [{"params": [a], "lr": [0.1, 0.2]}, {"params": [b], "lr": 0.05, "weight_decay": 0.1}]
    optimizer = together.Adam(groups, weight_decay=[0.0, 0.3])
    own = [[nn.Parameter(first[k].clone()), nn.Parameter(second[k].clone())] for k in range(2)]
    references = [
        torch.optim.Adam(
            [
                {"params": [own[k][0]], "lr": [0.1, 0.2][k], "weight_decay": [0.0, 0.3][k]},
                {"params": [own[k][1]], "lr": 0.05, "weight_decay": 0.1},
            ]
        )
        for k in range(2)
    ]
    for step in range(5):
        grads = torch.randn(2, 4, generator=gen(10 + step)), torch.randn(2, 3, generator=gen(step))
        a.grad, b.grad = grads[0].clone(), grads[1].clone()
        optimizer.step()
        for k in range(2):
            own[k][0].grad, own[k][1].grad = grads[0][k].clone(), grads[1][k].clone()
            references[k].step()
    for k in range(2):
        assert torch.equal(a[k], own[k][0]) and torch.equal(b[k], own[k][1])


def test_a_hand_written_stack_trains_through_the_loop():
    class Scales(nn.Module):  # K linear models y = w x, one weight a member
        members = 3

        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(3))

    model = Scales()
    x = torch.linspace(-1, 1, 8)
    target = torch.tensor([1.0, 2.0, 3.0]).unsqueeze(1) * x

    def losses_of_update(i):
        return ((model.w.unsqueeze(1) * x - target) ** 2).mean(1)

    histories = together.train(
        model, together.SGD(model.parameters(), lr=0.5), losses_of_update, 60
    )
    torch.testing.assert_close(model.w.detach(), torch.tensor([1.0, 2.0, 3.0]))
    assert len(histories) == 3 and histories[2]["loss"][-1] < 1e-6


def test_a_schedule_may_set_the_rate_between_updates_as_with_torch_optim():
    stacked, own = nn.Parameter(torch.ones(2, 3)), nn.Parameter(torch.ones(3))
    optimizer, reference = together.SGD([stacked], lr=[0.1, 0.1]), torch.optim.SGD([own], lr=0.1)
    for step, lr in enumerate([0.1, 0.05, 0.025]):
        optimizer.param_groups[0]["lr"], reference.param_groups[0]["lr"] = lr, lr
        stacked.grad, own.grad = torch.full((2, 3), step + 1.0), torch.full((3,), step + 1.0)
        optimizer.step()
        reference.step()
    assert torch.equal(stacked[0], own) and torch.equal(stacked[1], own)
