"""Arms trained together: K models of one shape trained as one model.

A chapter's arms (the paper's model, its ablation, its nulls, each at every rate of a grid and
over seeds) are often K networks of one architecture. Trained one after another, small networks
spend their time in per-operation overhead, not in arithmetic. Stacked, every parameter gets a
leading member axis (K, ...), one forward and one backward per update serve the whole set, and
each member still gets exactly the updates of its own run: members share no parameter, the loss
is the sum of the members' losses (so member k's gradient is its own loss's), and the optimizers
here are elementwise with a learning rate and a weight decay per member.

    members = []
    for seed, rate in arms:                      # K arms of one architecture
        with training.seeded(seed):
            members.append(training.mlp([64, 100, 10]))
    stack = together.stack(members)              # MLPStack: batched matrix products
    optimizer = together.Adam(stack.parameters(), lr=[rate for _, rate in arms])
    batches = together.minibatches(len(train_x), 64, [training.generator(s, 1) for s, _ in arms])

    def losses_of_update(i):                     # (K,): each member's own mean loss
        index = next(batches)                    # (K, B): each member's own batch
        return together.cross_entropy(stack(train_x[index]), train_y[index])

    histories = together.train(stack, optimizer, losses_of_update, 300,
        evaluate=lambda: {"val_accuracy": together.accuracy(stack.on_all(val_x), val_y)})
    best = stack.member(0)                       # a plain nn.Sequential with its trained weights

Two forward paths, one interface (`forward(x)` takes (K, B, ...) and gives (K, B, ...);
`on_all(x)` gives every member the same x; `member(k)` is member k as a plain module):

- `MLPStack`: members are `nn.Sequential`s of `nn.Linear`, elementwise activations and
  `nn.Dropout`; each linear layer is one `torch.baddbmm` over the members. The fast path.
- `Stack`: any `nn.Module` of one shape (recurrent nets, small transformers, BatchNorm nets),
  through torch.func: `stack_module_state` stacks the members' parameters and buffers,
  `functional_call` runs the first member's code on member k's tensors, `vmap` maps it over the
  members. A Python loop inside the module runs once per forward, not once per member.

`stack(members)` picks `MLPStack` when every member is such a Sequential, `Stack` otherwise.

Measured (ten 64-100-10 ReLU MLPs, Adam, 300 updates of 64 digits each, one thread, median CPU
seconds of 5 on a 2-core machine under other work; `python -m papernotes.together` prints them):
one after another through `training.train_classifier` 2.06 s, as one `Stack` (vmap) 0.98 s, as
one `MLPStack` (bmm) 0.79 s. At these sizes the loop's per-operation overhead (autograd, the
optimizer's elementwise steps, Python) is most of the cost, which a stack pays once for all K
members. Use `MLPStack` for MLPs (`stack` picks it); `Stack` for the rest, where vmap's batching
rules cost a little over hand-written batched products but save writing them.

Dropout. A member's `nn.Dropout(p)` keeps its own rate p; its masks come from the stack's
`masks` (a `torch.Generator`; None: torch's global generator): each dropout call draws uniform
numbers of shape (K, *shape) at once, and member k keeps a unit where its number is below
1 - p_k (then divides by 1 - p_k), so members' masks are independent. Both paths draw the same
numbers in the same order. Inside vmap torch's own `nn.Dropout` could not take a per-member
rate and cannot take a generator, so `Stack` runs its members' dropout layers as this rule.

What does not work under vmap, and the supported way:

- In-place updates of a parameter or buffer that is not stacked fail; every parameter and
  buffer of a member is stacked here, so BatchNorm's running statistics are updated per member
  (in train mode) as they would be in a plain run.
- `.item()`, `.tolist()` or Python control flow on a tensor's value inside a member's forward
  fail ("data-dependent control flow"); compute such values outside the stack.
- Some of torch's fused kernels have no batching rule: `nn.LSTM` and `nn.LSTMCell` fail
  under vmap; `nn.GRUCell` and `nn.TransformerEncoderLayer` (its fused attention) fall back to
  a loop over the members, with a warning. Write the gates or the attention with `nn.Linear`
  and elementwise operations (as the book's mechanisms do) and they batch.
- Random draws inside a member's forward other than dropout (noise, sampling) run under vmap's
  `randomness="different"`: one draw (K, *shape) from their generator, a row a member. For a
  draw a chapter wants to control, draw (K, ...) outside the stack and pass it in as an input.

K = 1 runs the member's own code on its own tensors (`F.linear`, an un-vmapped call), and the
optimizers do torch.optim's arithmetic in torch.optim's order: a stack of one reproduces the
plain loop bit for bit (tests/test_together.py checks it, dropout, clipping and BatchNorm
included). For K > 1 each member matches its own run to float rounding, not bit for bit: the
batched kernels (bmm, vmap's batching rules, a mean over each member's row) sum in another order.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from papernotes import checks, data, training

# Elementwise modules an MLPStack applies to its (K, B, H) activations as they are.
ELEMENTWISE = (
    nn.ReLU,
    nn.LeakyReLU,
    nn.ELU,
    nn.SELU,
    nn.CELU,
    nn.GELU,
    nn.SiLU,
    nn.Mish,
    nn.Tanh,
    nn.Sigmoid,
    nn.Softplus,
    nn.Hardtanh,
    nn.Identity,
)


# -- the stacks ------------------------------------------------------------------------------------


class _Members(nn.Module):
    """What both stacks share: K members of one shape, their dropout masks, and each member
    back as a plain module."""

    def __init__(self, members: Sequence[nn.Module], masks: torch.Generator | None):
        super().__init__()
        _check_members(members)
        if masks is not None and not isinstance(masks, torch.Generator):
            raise TypeError(f"masks must be a torch.Generator or None; got {type(masks).__name__}")
        self.members = len(members)
        self.masks = masks
        # plain copies (not submodules), the skeletons that member(k) fills with trained tensors
        self._plain = [copy.deepcopy(m) for m in members]

    def __len__(self) -> int:
        return self.members

    def on_all(self, *inputs):
        """Every member on the same inputs (B, ...) (each tensor expanded to (K, B, ...),
        without a copy); `forward`'s output."""
        expanded = [
            x.expand(self.members, *x.shape) if isinstance(x, torch.Tensor) else x for x in inputs
        ]
        return self(*expanded)

    def member(self, k: int) -> nn.Module:
        """Member k as a plain module (its own class, dropout rate and trained tensors) in eval
        mode; a copy, so that training the stack further leaves it as it is."""
        k = checks.integer("k", k, 0)
        if k >= self.members:
            raise ValueError(f"k must be below the {self.members} members; got {k}")
        plain = copy.deepcopy(self._plain[k])
        with torch.no_grad():
            for name, tensor in self._member_tensors(k).items():
                _tensor_of(plain, name).copy_(tensor)
        return plain.eval()

    def _member_tensors(self, k: int) -> dict[str, torch.Tensor]:
        """Member k's parameters and buffers, by their names in the plain module."""
        raise NotImplementedError

    def _check_input(self, x, name: str = "x") -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a tensor (K, B, ...); got {type(x).__name__}")
        if x.dim() < 2 or x.shape[0] != self.members:
            raise ValueError(
                f"{name} must have shape (K, B, ...) with K = {self.members} members (on_all "
                f"gives every member the same input); got {tuple(x.shape)}"
            )


def _tensor_of(module: nn.Module, name: str) -> torch.Tensor:
    """The parameter or buffer `name` ("0.weight") of a module."""
    owner, _, leaf = name.rpartition(".")
    return getattr(module.get_submodule(owner) if owner else module, leaf)


def _stacked(tensors: list[torch.Tensor]) -> nn.Parameter:
    return nn.Parameter(torch.stack([t.detach() for t in tensors]))


def _keep(dropouts: list[nn.Dropout]) -> torch.Tensor:
    """Each member's keep probability 1 - p, (K,), computed in float32."""
    for k, dropout in enumerate(dropouts):
        checks.number(f"members[{k}]'s dropout rate", dropout.p, 0.0, 1.0, high_open=True)
    return 1.0 - torch.tensor([d.p for d in dropouts], dtype=torch.float32)


class MLPStack(_Members):
    """K MLPs of one shape as one model, each `nn.Linear` one batched matrix product.

    `members` are K `nn.Sequential`s with the same layers (`nn.Linear`, elementwise
    activations, `nn.Dropout` at each member's own rate), each with its own initial weights.
    Layer l's weights are stacked transposed, as (K, in, out) (`weights[l]`: `x @ w` needs no
    copy, and batched products run faster on it than on (K, out, in)), its biases as (K, out)
    (`biases[l]`; None without one), every parameter in the members' own order (`stacked`).
    `forward(x)` takes (K, B, ..., D) and gives (K, B, ..., C); dropout masks come from `masks`
    (see the module's docstring)."""

    def __init__(self, members: Sequence[nn.Module], *, masks: torch.Generator | None = None):
        super().__init__(members, masks)
        why = _not_an_mlp(self._plain)
        if why:
            raise TypeError(f"MLPStack takes nn.Sequentials of linear layers ({why}); use Stack")
        names = [name for name, _ in self._plain[0].named_parameters()]
        self._names = names  # the plain member's names of `stacked`, in its order
        self.stacked = nn.ParameterList()
        self._transposed = [name.endswith("weight") for name in names]  # a Linear's weight
        for name, transposed in zip(names, self._transposed, strict=True):
            tensors = [m.get_parameter(name) for m in self._plain]
            self.stacked.append(_stacked([t.T for t in tensors] if transposed else tensors))
            self.stacked[-1]._together_transposed = transposed  # see _MemberOptimizer._clip
        # the layers: ("linear", (weight, bias)), ("dropout", keep (K,)), ("elementwise", f)
        self._layers: list[tuple[str, object]] = []
        for position, layer in enumerate(self._plain[0]):
            if isinstance(layer, nn.Linear):
                bias = names.index(f"{position}.bias") if layer.bias is not None else None
                self._layers.append(("linear", (names.index(f"{position}.weight"), bias)))
            elif isinstance(layer, nn.Dropout):
                self._layers.append(("dropout", _keep([m[position] for m in self._plain])))
            else:
                self._layers.append(("elementwise", layer))

    @property
    def weights(self) -> list[nn.Parameter]:
        """Each linear layer's stacked weights, transposed: (K, in, out)."""
        return [self.stacked[w] for kind, (w, _) in self._linears()]

    @property
    def biases(self) -> list[nn.Parameter | None]:
        """Each linear layer's stacked biases (K, out), None where it has none."""
        return [None if b is None else self.stacked[b] for kind, (_, b) in self._linears()]

    def _linears(self) -> list[tuple[str, tuple[int, int | None]]]:
        return [layer for layer in self._layers if layer[0] == "linear"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (K, B, ..., D) -> (K, B, ..., C)."""
        self._check_input(x)
        middle = x.shape[1:-1]
        x = x.reshape(self.members, -1, x.shape[-1])
        for kind, what in self._layers:
            if kind == "linear":
                w, b = what
                x = self._linear(x, self.stacked[w], None if b is None else self.stacked[b])
            elif kind == "dropout" and self.training:
                keep = what.view(-1, 1, 1)
                draws = torch.rand(x.shape, generator=self.masks)  # (K, B, H): one call, all
                x = x * (draws < keep) / keep
            elif kind == "elementwise":
                x = what(x)
        return x.reshape(self.members, *middle, x.shape[-1])

    def _linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        if self.members == 1:  # the member's own kernel: a stack of one is the plain run
            own = w[0].T.contiguous()  # (out, in), as nn.Linear holds it
            return F.linear(x[0], own, None if b is None else b[0]).unsqueeze(0)
        if b is None:
            return torch.bmm(x, w)
        return torch.baddbmm(b.unsqueeze(1), x, w)

    def _member_tensors(self, k: int) -> dict[str, torch.Tensor]:
        tensors = zip(self._names, self.stacked, self._transposed, strict=True)
        return {name: p[k].T if transposed else p[k] for name, p, transposed in tensors}


class _StackedDropout(nn.Module):
    """A member's dropout layer inside `Stack`: its keep probability is a buffer (stacked
    (K,) over the members, one number each inside vmap) and its uniform draws come from the
    stack's generator (vmap draws (K, *shape) at once)."""

    def __init__(self, generator: torch.Generator | None):
        super().__init__()
        self.generator = generator
        self.register_buffer("keep", torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        return x * (torch.rand(x.shape, generator=self.generator) < self.keep) / self.keep


class Stack(_Members):
    """K modules of one shape as one model, through torch.func: any architecture.

    `members` are K instances of one module class with parameters and buffers of the same
    names and shapes, each with its own initial values. `stack_module_state` stacks them
    ((K, ...) each, in `stacked` and the buffers), `functional_call` runs the first member's
    code on member k's tensors and `vmap` maps it over the members. `forward(x)` takes
    (K, B, ...) and gives the members' outputs stacked the same way (a tuple or dict of tensors
    too). Dropout layers keep each member's rate and draw from `masks`; BatchNorm keeps
    running statistics per member."""

    def __init__(self, members: Sequence[nn.Module], *, masks: torch.Generator | None = None):
        super().__init__(members, masks)
        params, buffers = stack_module_state(self._plain)
        self._param_names = list(params)
        self.stacked = nn.ParameterList(nn.Parameter(params[n].detach()) for n in params)
        self._buffer_names = list(buffers)
        for i, name in enumerate(self._buffer_names):
            self.register_buffer(f"buffer{i}", buffers[name].clone())
        # the code every member runs: the first member's, without tensors of its own, each
        # dropout layer swapped for one that reads its keep probability from the stacked buffers
        base = copy.deepcopy(self._plain[0]).to("meta")
        self._keep: dict[str, torch.Tensor] = {}
        for name, layer in list(base.named_modules()):
            if isinstance(layer, nn.modules.dropout._DropoutNd) and type(layer) is not nn.Dropout:
                raise TypeError(
                    f"members' {name} is a {type(layer).__name__}: Stack runs nn.Dropout at each "
                    "member's rate; draw other noise outside the stack and pass it in"
                )
            if isinstance(layer, nn.Dropout):
                _replace(base, name, _StackedDropout(masks))
                column = [m.get_submodule(name) for m in self._plain]
                self._keep[f"{name}.keep"] = _keep(column)
        self._base = [base]  # in a list: not a submodule, so .train()/.eval() reach it by hand

    def train(self, mode: bool = True) -> Stack:
        super().train(mode)
        self._base[0].train(mode)
        return self

    def _tensors(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        params = dict(zip(self._param_names, self.stacked, strict=True))
        buffers = {n: getattr(self, f"buffer{i}") for i, n in enumerate(self._buffer_names)}
        return params, {**buffers, **self._keep}

    def forward(self, *inputs):
        """inputs (K, B, ...) each (a tensor input of every member, stacked; other arguments
        are passed to every member as they are) -> the members' outputs, stacked (K, ...)."""
        for i, x in enumerate(inputs):
            if isinstance(x, torch.Tensor):
                self._check_input(x, f"inputs[{i}]")
        params, buffers = self._tensors()
        base = self._base[0]
        if self.members == 1:  # the member's own code on its own tensors: the plain run
            one = {n: t[0] for n, t in params.items()}, {n: t[0] for n, t in buffers.items()}
            own = [x[0] if isinstance(x, torch.Tensor) else x for x in inputs]
            out = functional_call(base, one, tuple(own))
            return torch.utils._pytree.tree_map(lambda t: t.unsqueeze(0), out)

        def run(params, buffers, *inputs):
            return functional_call(base, (params, buffers), inputs)

        in_dims = (0, 0, *(0 if isinstance(x, torch.Tensor) else None for x in inputs))
        return vmap(run, in_dims=in_dims, randomness="different")(params, buffers, *inputs)

    def _member_tensors(self, k: int) -> dict[str, torch.Tensor]:
        params, buffers = self._tensors()
        found = {n: t[k] for n, t in params.items()}
        found.update({n: t[k] for n, t in buffers.items() if n not in self._keep})
        return found


def _replace(module: nn.Module, name: str, new: nn.Module) -> None:
    owner, _, leaf = name.rpartition(".")
    setattr(module.get_submodule(owner) if owner else module, leaf, new)


def stack(
    members: Sequence[nn.Module], *, masks: torch.Generator | None = None
) -> MLPStack | Stack:
    """The members as one model: an `MLPStack` (batched matrix products, the fast path) when
    every member is an `nn.Sequential` of linear layers, elementwise activations and dropout,
    a `Stack` (torch.func's vmap) otherwise."""
    _check_members(members)
    if _not_an_mlp(members) is None:
        return MLPStack(members, masks=masks)
    return Stack(members, masks=masks)


def _check_members(members) -> None:
    if isinstance(members, nn.Module) or not isinstance(members, Sequence):
        raise TypeError(f"members must be a list of nn.Modules; got {type(members).__name__}")
    if len(members) < 1:
        raise ValueError("members must hold at least one module (K >= 1); got none")
    for k, member in enumerate(members):
        if not isinstance(member, nn.Module):
            raise TypeError(f"members[{k}] must be an nn.Module; got {type(member).__name__}")
    first = members[0]
    shapes = _shapes(first)
    for k, member in enumerate(members[1:], 1):
        if type(member) is not type(first):
            raise ValueError(
                f"members must be of one class; members[0] is a {type(first).__name__}, "
                f"members[{k}] a {type(member).__name__}"
            )
        if _shapes(member) != shapes:
            raise ValueError(
                f"members must have the same parameters and buffers; members[{k}] has "
                f"{_differing(_shapes(member), shapes)}"
            )
        layers = [type(m) for m in member.modules()]
        if layers != [type(m) for m in first.modules()]:
            raise ValueError(f"members[{k}] has other layers than members[0]")


def _shapes(module: nn.Module) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    tensors = [*module.named_parameters(), *module.named_buffers()]
    return {name: (tuple(t.shape), t.dtype) for name, t in tensors}


def _differing(found: dict, expected: dict) -> str:
    for name in sorted(set(found) | set(expected)):
        if found.get(name) != expected.get(name):
            return f"{name}: {found.get(name, 'none')} where members[0] has " + str(
                expected.get(name, "none")
            )
    return "the same"


def _not_an_mlp(members: Sequence[nn.Module]) -> str | None:
    """Why these members are not MLPs an MLPStack can run (None: they are)."""
    for k, member in enumerate(members):
        if not isinstance(member, nn.Sequential):
            return f"members[{k}] is a {type(member).__name__}"
        for position, layer in enumerate(member):
            if not isinstance(layer, (nn.Linear, nn.Dropout, *ELEMENTWISE)):
                return f"members[{k}][{position}] is a {type(layer).__name__}"
            if isinstance(layer, nn.Dropout) and type(layer) is not nn.Dropout:
                return f"members[{k}][{position}] is a {type(layer).__name__}"
            if isinstance(layer, ELEMENTWISE) and repr(layer) != repr(members[0][position]):
                return (
                    f"members[{k}][{position}] is {layer!r}, members[0]'s {members[0][position]!r}"
                )
    return None


# -- the optimizers: one learning rate and weight decay per member ---------------------------------


class _MemberOptimizer(torch.optim.Optimizer):
    """An optimizer of stacked parameters (K, ...) whose learning rate and weight decay are one
    number per member (each a float for every member, or K of them; per parameter group too).
    `step(active=..., max_norm=...)` moves only the active members and clips each member's
    gradient norm on its own."""

    def __init__(self, params, defaults: dict):
        super().__init__(params, defaults)
        sizes = {p.shape[0] if p.dim() else None for g in self.param_groups for p in g["params"]}
        if len(sizes) != 1 or None in sizes:
            raise ValueError(
                "every parameter must be stacked with one leading member axis (K, ...); got "
                f"leading sizes {sorted(s for s in sizes if s is not None)}"
            )
        self.members = sizes.pop()
        for group in self.param_groups:
            group["lr"] = _per_member("lr", group["lr"], self.members, low_open=True)
            decay = _per_member("weight_decay", group["weight_decay"], self.members)
            group["weight_decay"] = decay

    @torch.no_grad()
    def step(
        self, closure=None, *, active: torch.Tensor | None = None, max_norm: float | None = None
    ) -> None:
        """One update of every active member (`active`: (K,) bools; None: all), each member's
        gradient first clipped at `max_norm` on its own (when given)."""
        if closure is not None:
            raise ValueError(f"together.{type(self).__name__} takes no closure")
        if active is not None:
            checks.tensor("active", active, "(K,)", K=self.members, dtype=torch.bool)
        if max_norm is not None:
            self._clip(max_norm)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                decay = _values(group["weight_decay"])
                if decay.any():
                    # g + lambda_k theta: torch's coupled weight decay, a lambda a member
                    grad = torch.addcmul(grad, p, _along(decay, p))
                self._update(p, grad, group, active)

    def _update(self, p: torch.Tensor, grad: torch.Tensor, group: dict, active) -> None:
        """Move the active members of p along their (decayed) gradient."""
        raise NotImplementedError

    def _clip(self, max_norm: float) -> None:
        """Each member's gradient scaled as `nn.utils.clip_grad_norm_` scales a run's: by
        max_norm / (||g_k|| + 1e-6), at most 1, ||g_k|| the norm of all of member k's
        gradients."""
        params = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
        if not params:
            return
        grads = [p.grad for p in params]
        # each norm summed in the plain member's order (an MLPStack holds weights transposed)
        plain = [
            g.mT if getattr(p, "_together_transposed", False) else g
            for p, g in zip(params, grads, strict=True)
        ]
        norms = [torch.linalg.vector_norm(g.reshape(self.members, -1), dim=1) for g in plain]
        total = torch.linalg.vector_norm(torch.stack(norms, dim=1), dim=1)
        scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for grad in grads:
            grad.mul_(_along(scale, grad))


def _values(value) -> torch.Tensor:
    """A group's rate as float64 numbers: its K rates, or one for all (a schedule may set a
    float or a tensor between updates, as with torch.optim)."""
    return torch.as_tensor(value, dtype=torch.float64)


def _along(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Per-member values (K,) shaped to broadcast over a stacked tensor (K, ...)."""
    return values.to(like.dtype).view(-1, *[1] * (like.dim() - 1))


def _per_member(name: str, value, members: int, *, low_open: bool = False) -> torch.Tensor:
    """A hyper-parameter as K float64 numbers (one a member), checked."""
    if isinstance(value, torch.Tensor):
        checks.tensor(name, value, "(K,)", K=members)
        value = value.tolist()
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != members:
            raise ValueError(
                f"{name} must be one number or {members} (one a member); got {len(value)}"
            )
        numbers = [
            checks.number(f"{name}[{k}]", v, 0.0, low_open=low_open) for k, v in enumerate(value)
        ]
    else:
        numbers = [checks.number(name, value, 0.0, low_open=low_open)] * members
    return torch.tensor(numbers, dtype=torch.float64)


class Adam(_MemberOptimizer):
    """Adam (torch.optim.Adam's arithmetic, with its coupled weight decay) with a learning rate
    and a weight decay per member: member k's updates are those of
    `torch.optim.Adam(its parameters, lr=lr[k], weight_decay=weight_decay[k])` on its own run."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        if not isinstance(betas, Sequence) or len(betas) != 2:
            raise TypeError(f"betas must be a pair of numbers; got {betas!r}")
        for i, beta in enumerate(betas):
            checks.number(f"betas[{i}]", beta, 0.0, 1.0, high_open=True)
        checks.number("eps", eps, 0.0, low_open=True)
        super().__init__(
            params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        )

    def _update(self, p: torch.Tensor, grad: torch.Tensor, group: dict, active) -> None:
        (beta1, beta2), eps, state = group["betas"], group["eps"], self.state[p]
        if not state:
            state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
        state["step"] += 1
        step, exp_avg, exp_avg_sq = state["step"], state["exp_avg"], state["exp_avg_sq"]
        # m <- beta1 m + (1 - beta1) g;  v <- beta2 v + (1 - beta2) g^2
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        # theta <- theta - lr_k / (1 - beta1^t) m / (sqrt(v / (1 - beta2^t)) + eps)
        step_size = _along(_values(group["lr"]) / (1 - beta1**step), p)
        denom = (exp_avg_sq.sqrt() / (1 - beta2**step) ** 0.5).add_(eps)
        p.add_(_only(active, (-step_size) * exp_avg / denom))


class SGD(_MemberOptimizer):
    """SGD with momentum (torch.optim.SGD's arithmetic: coupled weight decay, dampening,
    Nesterov) with a learning rate and a weight decay per member: member k's updates are those
    of `torch.optim.SGD(its parameters, lr=lr[k], weight_decay=weight_decay[k], ...)`."""

    def __init__(
        self, params, lr, momentum=0.0, weight_decay=0.0, *, dampening=0.0, nesterov=False
    ):
        checks.number("momentum", momentum, 0.0, 1.0, high_open=True)
        checks.number("dampening", dampening, 0.0, 1.0)
        checks.boolean("nesterov", nesterov)
        if nesterov and (momentum == 0 or dampening != 0):
            raise ValueError("nesterov needs a momentum above 0 and no dampening")
        defaults = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay}
        super().__init__(params, {**defaults, "dampening": dampening, "nesterov": nesterov})

    def _update(self, p: torch.Tensor, grad: torch.Tensor, group: dict, active) -> None:
        momentum, state = group["momentum"], self.state[p]
        if momentum != 0:
            # b <- mu b + (1 - dampening) g (b = g at the first step)
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = grad.detach().clone()
            else:
                state["momentum_buffer"].mul_(momentum).add_(grad, alpha=1 - group["dampening"])
            buf = state["momentum_buffer"]
            grad = grad.add(buf, alpha=momentum) if group["nesterov"] else buf
        # theta <- theta - lr_k g
        p.addcmul_(_only(active, grad), _along(-_values(group["lr"]), p))


def _only(active: torch.Tensor | None, update: torch.Tensor) -> torch.Tensor:
    """The update of the active members, zero for the others (who keep their values)."""
    if active is None or bool(active.all()):
        return update
    return torch.where(active.view(-1, *[1] * (update.dim() - 1)), update, 0.0)


# -- the loop: training.train over the whole set, a History per member -----------------------------


class _Stepper:
    """What `training.train` steps: the members' optimizer, told which members still train and
    where each member's gradient norm is clipped."""

    def __init__(self, optimizer: _MemberOptimizer, active: torch.Tensor, clip: float | None):
        self.optimizer, self.active, self.clip = optimizer, active, clip

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    def step(self) -> None:
        self.optimizer.step(active=self.active, max_norm=self.clip)


def train(
    stack: MLPStack | Stack,
    optimizer: Adam | SGD,
    losses_of_update: Callable[[int], torch.Tensor],
    steps: int,
    *,
    evaluate: Callable[[], dict[str, torch.Tensor | Sequence[float]]] | None = None,
    eval_every: int | None = None,
    clip: float | None = None,
    desc: str = "arms together",
) -> list[training.History]:
    """Make `steps` updates of every member of `stack` through the book's loop
    (`training.train`) and return each member's History.

    `stack` is an `MLPStack` or a `Stack`, or a hand-written stacked module with a `members`
    count (K) whose parameters all lead with the member axis. `losses_of_update(i)` returns the
    members' losses of update i, (K,): member k's own loss, from its own batch. One backward of
    their sum gives each member its own gradient (members share no parameter); `optimizer`
    (`together.Adam` or `together.SGD`) updates each at its own rate, after clipping each
    member's gradient norm at `clip` (when given) on its own. A member whose loss stops being
    finite stops updating (its History's `diverged`); the others carry on. Every `eval_every`
    updates and after the last, `evaluate()` runs in eval mode without gradients and returns
    per-member metrics ({name: (K,) values}); member k's History logs its values and its
    training loss of that update as "loss", as `training.train` logs one run's.
    """
    if not isinstance(stack, nn.Module) or not hasattr(stack, "members"):
        raise TypeError(
            "stack must be a together.MLPStack or Stack (or a module with a `members` count); "
            f"got {type(stack).__name__}"
        )
    checks.integer("stack.members", stack.members)
    if not isinstance(optimizer, _MemberOptimizer):
        raise TypeError(
            f"optimizer must be a together.Adam or together.SGD (a learning rate per member); "
            f"got {type(optimizer).__name__}"
        )
    if optimizer.members != stack.members:
        raise ValueError(
            f"the optimizer's parameters have {optimizer.members} members, the stack "
            f"{stack.members}"
        )
    if clip is not None:
        checks.number("clip", clip, 0.0, low_open=True)
    members = stack.members
    active = torch.ones(members, dtype=torch.bool)
    histories = [training.History() for _ in range(members)]
    losses = [math.nan] * members  # each member's loss of its last update
    logged: list[tuple[list[float], dict[str, list[float]]]] = []

    def loss_of_update(i: int) -> torch.Tensor:
        found = losses_of_update(i)
        checks.tensor("losses_of_update(i)", found, "(K,)", K=members, dtype="floating")
        for k, value in enumerate(found.detach().tolist()):
            if active[k]:
                losses[k] = value
                if not math.isfinite(value):  # diverged: no more updates of member k
                    active[k] = False
                    histories[k].diverged = True
        if not active.any():
            return found.sum()  # not finite: the loop stops updating
        return found.sum() if active.all() else found[active].sum()

    def evaluate_all() -> dict[str, float]:
        metrics = evaluate() if evaluate is not None else {}
        logged.append(
            (list(losses), {n: _per_member_values(n, v, members) for n, v in metrics.items()})
        )
        return {}

    run = training.train(
        stack,
        _Stepper(optimizer, active, clip),
        loss_of_update,
        steps,
        evaluate=evaluate_all,
        eval_every=eval_every,
        desc=desc,
    )
    for step, (member_losses, metrics) in zip(run.steps, logged, strict=True):
        for k, history in enumerate(histories):
            history.log(step, {"loss": member_losses[k], **{n: v[k] for n, v in metrics.items()}})
    return histories


def _per_member_values(name: str, values, members: int) -> list[float]:
    if isinstance(values, torch.Tensor):
        checks.tensor(f"evaluate()[{name!r}]", values, "(K,)", K=members)
        return [float(v) for v in values.tolist()]
    if not isinstance(values, Sequence) or len(values) != members:
        raise ValueError(
            f"evaluate()[{name!r}] must hold one value a member ({members}); got {values!r}"
        )
    return [float(v) for v in values]


def runs(stack: MLPStack | Stack, histories: Sequence[training.History]) -> list[training.Run]:
    """Each member as a `training.Run`: its plain module (`stack.member(k)`) and its History."""
    if len(histories) != stack.members:
        raise ValueError(
            f"histories must hold one History a member ({stack.members}); got {len(histories)}"
        )
    return [training.Run(stack.member(k), h) for k, h in enumerate(histories)]


# -- batches, losses and accuracies of every member at once ----------------------------------------


def minibatches(
    n: int, batch_size: int, generators: Sequence[torch.Generator | None]
) -> Iterator[torch.Tensor]:
    """Each member's own minibatches (`data.minibatches` with its own generator), stacked:
    index tensors (K, B) forever, row k the batch member k's separate run would draw."""
    if isinstance(generators, torch.Generator) or not isinstance(generators, Sequence):
        raise TypeError("generators must be a list of torch.Generators, one a member")
    if len(generators) < 1:
        raise ValueError("generators must hold one generator a member (K >= 1); got none")
    orders = [data.minibatches(n, batch_size, g) for g in generators]
    while True:
        yield torch.stack([next(order) for order in orders])


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Each member's mean cross-entropy, (K,): logits (K, B, C) against class labels (K, B)
    (or (B,), the same for every member) or probabilities (K, B, C)."""
    k, b, c = (checks.tensor("logits", logits, "(K, B, C)", dtype="floating")[d] for d in "KBC")
    if targets.dim() == 1:
        targets = targets.expand(k, b)
    if targets.dim() == 2:
        checks.tensor("targets", targets, "(K, B)", K=k, B=b)
    else:
        checks.tensor("targets", targets, "(K, B, C)", K=k, B=b, C=c, dtype="floating")
    if k == 1:  # the plain run's loss, bit for bit
        return F.cross_entropy(logits[0], targets[0]).unsqueeze(0)
    each = F.cross_entropy(logits.flatten(0, 1), targets.flatten(0, 1), reduction="none")
    return each.view(k, b).mean(1)


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Each member's accuracy, (K,): logits (K, N, C) against labels (K, N) or (N,)."""
    k, n = (checks.tensor("logits", logits, "(K, N, C)")[d] for d in "KN")
    if labels.dim() == 1:
        checks.tensor("labels", labels, "(N,)", N=n)
    else:
        checks.tensor("labels", labels, "(K, N)", K=k, N=n)
    return (logits.argmax(-1) == labels).float().mean(-1)


def timings(repeats: int = 5, members: int = 10, steps: int = 300) -> dict[str, float]:
    """Median CPU seconds, over `repeats`, of training `members` 64-100-10 ReLU MLPs with Adam for
    `steps` updates of 64 digits each on one thread: one after another through
    `training.train_classifier` ("plain"), as one `Stack` ("vmap") and as one `MLPStack`
    ("bmm"). The figures of the module's docstring (`python -m papernotes.together`)."""
    import os
    import statistics
    import time

    checks.integer("repeats", repeats)
    checks.integer("members", members)
    checks.integer("steps", steps)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    digits = data.load_digits_split()
    x, y = digits.train_x, digits.train_y

    def nets() -> list[nn.Sequential]:
        found = []
        for seed in range(members):
            with training.seeded(seed):
                found.append(training.mlp([64, 100, 10]))
        return found

    def plain() -> None:
        for seed, net in enumerate(nets()):
            training.train_classifier(
                net,
                y,
                torch.optim.Adam(net.parameters(), lr=1e-3),
                steps,
                batches=data.minibatches(len(x), 64, training.generator(seed, 1)),
                logits_of=lambda index, net=net: net(x[index]),
            )

    def together(kind) -> None:
        model = kind(nets())
        batches = minibatches(len(x), 64, [training.generator(s, 1) for s in range(members)])

        def losses_of_update(_: int) -> torch.Tensor:
            index = next(batches)
            return cross_entropy(model(x[index]), y[index])

        train(model, Adam(model.parameters(), lr=1e-3), losses_of_update, steps)

    quiet, os.environ["PAPERNOTES_QUIET"] = os.environ.get("PAPERNOTES_QUIET"), "1"  # no bars
    ways = {"plain": plain, "vmap": lambda: together(Stack), "bmm": lambda: together(MLPStack)}
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    try:
        for _ in range(repeats):
            for name, way in ways.items():  # interleaved, so that a change of load hits all
                start = time.process_time()
                way()
                seconds[name].append(time.process_time() - start)
    finally:
        torch.set_num_threads(threads)
        if quiet is None:
            del os.environ["PAPERNOTES_QUIET"]
        else:
            os.environ["PAPERNOTES_QUIET"] = quiet
    return {name: statistics.median(found) for name, found in seconds.items()}


if __name__ == "__main__":
    for name, median in timings().items():
        print(f"{name}: {median:.2f} s")
