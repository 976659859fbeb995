r"""RandomOut: rescue the convolutional filters that lose the filter lottery.

Cohen, Lo & Ding 2016, *RandomOut: Using a convolutional gradient norm to rescue convolutional
filters* (arXiv:1602.05931; its first version was titled *...to win The Filter Lottery*). The
chapter (chapters/randomout.ipynb, "The idea") derives it; this module is the mechanism alone,
in the paper's order, each equation above the line that computes it:

1. the convolutional gradient norm (`conv_gradient_norm`): per output filter, the L1 norm of the
   loss's gradient; a dead filter's is exactly 0;
2. RandomOut (`randomout_`): every filter whose CGN is below a threshold tau gets its weights
   drawn again from the layer's initial distribution and keeps its bias, as in the authors'
   code. Two choices are the book's: the check runs after the backward pass and before the
   update (the authors' code checks after the update), and the filter's optimizer state is
   cleared. The authors' demo uses tau = 1e-30, which resets only filters whose gradient is
   exactly zero; tau is in units of the loss's gradient, so it depends on the loss's reduction
   (we take the mean) and the batch size;
3. `RandomOut`, the same as a hook just before each optimizer step, so that the book's training
   loop runs unchanged, with a log of what it saw.

`randomout_` reads `conv_gradient_norm`, `filters_to_reset`, `reinitialise_filters_` and
`clear_filter_state_` from the module when called, so that a patched module
(tests/mutants/randomout.py) is seen everywhere, the experiment's runs included. The experiment
(the filter lottery on the digits: `FilterNet`, `Lottery`, `train_lottery`) is in
`papernotes.randomout.experiment`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from papernotes import checks

# -- 1. the convolutional gradient norm -----------------------------------------------------------


def _check_conv(conv) -> nn.Conv2d:
    if not isinstance(conv, nn.Conv2d):
        raise TypeError(f"conv must be a torch.nn.Conv2d; got {type(conv).__name__}")
    return conv


def conv_gradient_norm(conv: nn.Conv2d) -> torch.Tensor:
    r"""$\mathrm{CGN}(k) = \sum_i |\partial L / \partial w^k_i|$ for every output filter $k$:
    a tensor (out,), the gradient's absolute values summed over input channels and kernel
    positions (dimensions 1, 2, 3 of the (out, in, kh, kw) weight)."""
    _check_conv(conv)
    if conv.weight.grad is None:
        raise ValueError(
            "conv.weight has no gradient: compute the CGN after loss.backward() and before "
            "optimizer.zero_grad()"
        )
    return _conv_gradient_norm(conv)


def _conv_gradient_norm(conv: nn.Conv2d) -> torch.Tensor:
    """`conv_gradient_norm` of a convolution already checked, its gradient in place."""
    # CGN(k) = sum_i |dL/dw^k_i|: the L1 norm of one *output* filter's gradient. It measures how
    # much the filter can still change the loss; a dead filter's (ReLU output 0 on every input)
    # is exactly 0.
    return conv.weight.grad.detach().abs().sum(dim=(1, 2, 3))


# -- 2 and 3. RandomOut -------------------------------------------------------------------------


def filters_to_reset(cgn: torch.Tensor, threshold: float) -> torch.Tensor:
    r"""The indices $k$ with $\mathrm{CGN}(k) < \tau$, as a LongTensor."""
    # reset k if CGN(k) < tau
    return torch.nonzero(cgn < threshold).flatten()


def reinitialise_filters_(
    conv: nn.Conv2d,
    index: torch.Tensor,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
) -> None:
    r"""Draw the weights of filters `index` again from $U(-1/\sqrt{n}, 1/\sqrt{n})$, the layer's
    default initial distribution ($n$ = in x kh x kw), and keep their biases, as the authors'
    code does.

    `generator` is one generator for every filter, or a sequence of G generators, one per
    block of out / G consecutive filters (one per network when several networks' filters are
    the rows of one layer): each filter then draws from its own block's generator, in the
    order of `index`, so that a block's draws do not depend on the other blocks'."""
    # PyTorch's default for a convolution, Kaiming-uniform: U(-1/sqrt(n), 1/sqrt(n))
    bound = 1.0 / math.sqrt(conv.weight[0].numel())
    shape = conv.weight.shape[1:]
    if generator is None or isinstance(generator, torch.Generator):
        fresh = torch.empty((len(index), *shape), dtype=conv.weight.dtype)
        fresh.uniform_(-bound, bound, generator=generator)
    else:
        block = conv.out_channels // len(generator)
        fresh = (
            torch.stack(
                [
                    torch.empty(shape, dtype=conv.weight.dtype).uniform_(
                        -bound, bound, generator=generator[k // block]
                    )
                    for k in index.tolist()
                ]
            )
            if len(index)
            else torch.empty((0, *shape), dtype=conv.weight.dtype)
        )
    with torch.no_grad():
        # w^k ~ the layer's initial distribution; the bias b^k stays
        conv.weight[index] = fresh


def clear_filter_state_(
    optimizer: torch.optim.Optimizer, conv: nn.Conv2d, index: torch.Tensor
) -> None:
    """Zero the optimizer's per-element state (SGD's momentum buffer, Adam's moments) in the
    slots of filters `index`, for the weight and the bias; scalar state (Adam's step) stays."""
    for parameter in (conv.weight, conv.bias):
        if parameter is None:
            continue
        for value in optimizer.state.get(parameter, {}).values():
            if isinstance(value, torch.Tensor) and value.shape == parameter.shape:
                value[index] = 0.0


def randomout_(
    conv: nn.Conv2d,
    threshold: float,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> torch.Tensor:
    r"""RandomOut on one layer: re-initialise every filter with $\mathrm{CGN}(k) < \tau$ =
    `threshold` (weights redrawn, bias kept, and its optimizer state cleared when `optimizer`
    is given; `generator` as in `reinitialise_filters_`). Call it between `loss.backward()` and
    `optimizer.step()`. Returns the indices of the filters it reset (a LongTensor, empty when
    none)."""
    _check_conv(conv)
    threshold = checks.number("threshold", threshold, 0.0)
    _check_generators(conv, generator)
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"optimizer must be a torch.optim.Optimizer; got {type(optimizer).__name__}"
        )
    return _randomout_(conv, threshold, generator, optimizer)


def _check_generators(conv: nn.Conv2d, generator) -> None:
    if generator is None or isinstance(generator, torch.Generator):
        return
    if not isinstance(generator, Sequence) or not generator:
        raise TypeError("generator must be a torch.Generator or a non-empty sequence of them")
    if not all(isinstance(g, torch.Generator) for g in generator):
        raise TypeError("generator must be a torch.Generator or a non-empty sequence of them")
    if conv.out_channels % len(generator):
        raise ValueError(
            f"{len(generator)} generators cannot split {conv.out_channels} filters into "
            "equal blocks"
        )


def _randomout_(
    conv: nn.Conv2d,
    threshold: float,
    generator,
    optimizer: torch.optim.Optimizer | None,
) -> torch.Tensor:
    """`randomout_` on arguments already checked."""
    index = filters_to_reset(conv_gradient_norm(conv), threshold)
    # A fresh ticket: new weights, and none of the optimizer's motion that killed the old one.
    if len(index):
        reinitialise_filters_(conv, index, generator)
        if optimizer is not None:
            clear_filter_state_(optimizer, conv, index)
    return index


class RandomOut:
    """RandomOut before every optimizer step, and a log of what it saw.

    `RandomOut(conv, threshold).attach(optimizer)` registers a hook that runs just before each
    `optimizer.step()`, when the gradients of the update are in place: it logs the CGN of every
    filter and, when `enabled`, calls `randomout_`. With `enabled=False` it only logs (the
    baseline). `cgn` is (steps, filters) after training; `resets` lists (update, filter) pairs.
    """

    def __init__(
        self,
        conv: nn.Conv2d,
        threshold: float,
        *,
        enabled: bool = True,
        generator: torch.Generator | Sequence[torch.Generator] | None = None,
    ):
        self.conv = _check_conv(conv)
        _check_generators(conv, generator)
        self.threshold = checks.number("threshold", threshold, 0.0)
        self.enabled = checks.boolean("enabled", enabled)
        self.generator = generator
        # one list of floats an update: a small tensor kept at every update would pin the
        # allocator's heap under the update's large temporaries, and the process would grow
        self._cgn: list[list[float]] = []
        self.resets: list[tuple[int, int]] = []

    def attach(self, optimizer: torch.optim.Optimizer):
        """Run before every step of `optimizer`; returns the hook's handle (`.remove()`)."""
        return optimizer.register_step_pre_hook(lambda opt, args, kwargs: self._before_step(opt))

    def _before_step(self, optimizer: torch.optim.Optimizer) -> None:
        update = len(self._cgn)
        self._cgn.append(conv_gradient_norm(self.conv).tolist())
        if self.enabled:
            index = randomout_(self.conv, self.threshold, self.generator, optimizer)
            self.resets += [(update, k) for k in index.tolist()]

    @property
    def cgn(self) -> torch.Tensor:
        return torch.tensor(self._cgn) if self._cgn else torch.empty(0, self.conv.out_channels)
