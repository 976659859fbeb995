"""The fast_weights chapter's experiment: the associative-retrieval task, the three networks
trained on it alike (the fast-weights RNN, the same RNN without fast weights, an LSTM of the same
size), and the measurements of the memory's read.

Associative retrieval, the paper's first task: read key-value pairs such as ``c9k8j3f1``, then
``??`` and one of the keys, and answer its value: ``c9k8j3f1??c`` -> ``9``.

The chapter also checks the mechanism against the paper's equations written out independently
(`written_out_read`, `by_the_equations`): those references share no code with the module.

The mechanism is `papernotes.fast_weights`, called through the module
(`fast_weights.FastWeightsRNN(...)`) so that a mutant patched onto it reaches these runs.
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass

import torch
from torch import nn

from papernotes import checks, fast_weights, training
from papernotes.data import minibatches

# The random streams of a run (papernotes.training.generator(seed, stream)): the training
# set, the order of its minibatches, the validation sequences and the test sequences each come
# from their own; the chapter's checks of the equations draw their random states and inputs
# from EQUATIONS.
# BOOTSTRAP resamples the test sequences for the attention row's standard error.
EQUATIONS, BATCHES, VALIDATION, TEST, TRAIN, BOOTSTRAP = 0, 1, 2, 3, 4, 5


# -- The written-out equations, for the chapter's checks ------------------------------------------


def written_out_read(
    hs: torch.Tensor, query: torch.Tensor, decay: float, fast_lr: float, *, shared: bool = False
) -> torch.Tensor:
    """eta * sum_tau lambda^(t - tau) h(tau) (h(tau)^T q) for states hs (B, t, H) and queries
    (B, H), written out with einsum; shared=True pools every sequence's states (a memory shared
    by the batch)."""
    checks.boolean("shared", shared)
    age = torch.arange(hs.shape[1] - 1, -1, -1, dtype=hs.dtype)  # t - tau
    if shared:
        weights = fast_lr * decay**age * torch.einsum("ctd,bd->bct", hs, query)
        return torch.einsum("bct,ctd->bd", weights, hs)
    weights = fast_lr * decay**age * torch.einsum("btd,bd->bt", hs, query)
    return torch.einsum("bt,btd->bd", weights, hs)


def by_the_equations(
    core: fast_weights.FastWeightsRNN, x: torch.Tensor, *, late: bool = False
) -> torch.Tensor:
    """h(1..T) (B, T, H) of `core` on x (B, T, D) from the paper's equations, with an explicit
    A(t) per sequence and layer normalisation written out from the core's gain and bias (the
    core must have LN); late=True stores h(t) instead of h(t+1) (a memory one step late)."""
    checks.boolean("late", late)
    W, C = core.recurrent_weights.weight, core.input_weights.weight
    b = core.input_weights.bias
    gain, shift, eps = core.norm.weight, core.norm.bias, core.norm.eps

    def layer_norm(z):  # LN[z] = gain * (z - mean) / sqrt(var + eps) + shift, over the units
        mean = z.mean(1, keepdim=True)
        var = ((z - mean) ** 2).mean(1, keepdim=True)
        return gain * (z - mean) / torch.sqrt(var + eps) + shift

    h = x.new_zeros(len(x), core.hidden_size)
    A = x.new_zeros(len(x), core.hidden_size, core.hidden_size)  # A(0) = 0
    states = []
    for t in range(x.shape[1]):
        slow = h @ W.T + x[:, t] @ C.T + b  # W h(t) + C x(t)
        stored = h if late else None
        h = torch.relu(slow)  # h_0(t+1)
        for _ in range(core.inner_steps):  # h_{s+1}(t+1) = f(LN[slow + A(t) h_s(t+1)])
            h = torch.relu(layer_norm(slow + (A @ h.unsqueeze(2)).squeeze(2)))
        stored = h if stored is None else stored  # A(t+1) gets h(t+1), or h(t) if late
        A = core.decay * A + core.fast_lr * stored.unsqueeze(2) * stored.unsqueeze(1)
        states.append(h)
    return torch.stack(states, 1)


# -- Associative retrieval ------------------------------------------------------------------------

KEYS = string.ascii_lowercase  # 26 letters
VALUES = string.digits  # 10 digits: the classes
QUERY_MARK = "?"
VOCABULARY = KEYS + VALUES + QUERY_MARK  # 37 tokens


def retrieval_batch(
    batch_size: int, n_pairs: int = 4, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences like "c9k8j3f1??c" as token ids (B, 2 n_pairs + 3), and their answers (B,).

    Each sequence has n_pairs distinct letter keys, each followed by a random digit; then two
    query marks and one of the keys, chosen uniformly. The answer is that key's digit (0..9).
    """
    batch_size = checks.integer("batch_size", batch_size)
    n_pairs = checks.integer("n_pairs", n_pairs)
    checks.number("n_pairs", n_pairs, 1, len(KEYS))  # the keys of a sequence are distinct
    keys = torch.rand(batch_size, len(KEYS), generator=generator).argsort(1)[:, :n_pairs]
    values = torch.randint(len(VALUES), (batch_size, n_pairs), generator=generator)
    asked = torch.randint(n_pairs, (batch_size, 1), generator=generator)
    pairs = torch.stack([keys, len(KEYS) + values], dim=2).flatten(1)  # k1 v1 k2 v2 ...
    mark = torch.full((batch_size, 2), VOCABULARY.index(QUERY_MARK))
    tokens = torch.cat([pairs, mark, keys.gather(1, asked)], dim=1)
    return tokens, values.gather(1, asked).squeeze(1)


@dataclass(frozen=True)
class RetrievalSets:
    """The sequences of one seed: a fixed training set, validation (for choices) and test (for
    claims), each a pair (tokens (N, T), answers (N,)) from its own random stream."""

    train: tuple[torch.Tensor, torch.Tensor]
    validation: tuple[torch.Tensor, torch.Tensor]
    test: tuple[torch.Tensor, torch.Tensor]


def retrieval_sets(
    seed: int,
    size: int = 2000,
    n_pairs: int = 4,
    train_size: int = 100_000,
    validation_size: int | None = None,
) -> RetrievalSets:
    """A training set of `train_size` sequences (the paper's 100,000), a test set of `size` and
    a validation set of `validation_size` (`size` by default), that follow the run's seed, each
    from its own stream."""
    checks.integer("train_size", train_size)
    validation_size = size if validation_size is None else validation_size
    checks.integer("validation_size", validation_size)
    return RetrievalSets(
        train=retrieval_batch(train_size, n_pairs, training.generator(seed, TRAIN)),
        validation=retrieval_batch(validation_size, n_pairs, training.generator(seed, VALIDATION)),
        test=retrieval_batch(size, n_pairs, training.generator(seed, TEST)),
    )


def decode(tokens: torch.Tensor) -> str:
    """Token ids (T,) back to text, e.g. "c9k8j3f1??c"."""
    return "".join(VOCABULARY[i] for i in tokens.tolist())


def _check_tokens(tokens) -> int:
    """Token ids (B, T) in [0, 37); returns B."""
    batch = checks.tensor("tokens", tokens, "(B, T)", dtype=torch.long)["B"]
    if tokens.numel() and (tokens.min() < 0 or tokens.max() >= len(VOCABULARY)):
        raise ValueError(f"token ids must lie in [0, {len(VOCABULARY) - 1}]")
    return batch


def _check_sequences(name: str, sequences) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(sequences, tuple) or len(sequences) != 2:
        raise TypeError(f"{name} must be a pair (tokens (N, T), answers (N,))")
    tokens, answers = sequences
    checks.tensor(f"{name} answers", answers, "(N,)", N=_check_tokens(tokens))
    return tokens, answers


# -- Three models on the task, trained alike ------------------------------------------------------


class LayerNormRNN(nn.Module):
    """The fast-weights network without its fast weights, written apart from the mechanism:
    h(t+1) = ReLU(LN[W h(t) + C x(t)]), W starting at recurrent_init * I, C with a bias; the
    ablation of the chapter (the same as FastWeightsRNN with fast_lr = 0, which a unit test
    checks, but computed by code that a bug in the mechanism cannot reach).

    forward(x (B, T, input_size)) returns the hidden states (B, T, H) and the last (B, H).
    """

    def __init__(self, input_size: int, hidden_size: int, *, recurrent_init: float = 0.5):
        super().__init__()
        self.input_size = checks.integer("input_size", input_size)
        self.hidden_size = checks.integer("hidden_size", hidden_size)
        checks.number("recurrent_init", recurrent_init, 0.0)
        self.input_weights = nn.Linear(input_size, hidden_size)
        self.recurrent_weights = nn.Linear(hidden_size, hidden_size, bias=False)
        self.norm = nn.LayerNorm(hidden_size)
        with torch.no_grad():
            self.recurrent_weights.weight.copy_(recurrent_init * torch.eye(hidden_size))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        checks.tensor("x", x, "(B, T, D)", dtype="floating", D=self.input_size)
        drive = self.input_weights(x)
        h = x.new_zeros(x.shape[0], self.hidden_size)
        states = []
        for t in range(x.shape[1]):
            h = torch.relu(self.norm(drive[:, t] + self.recurrent_weights(h)))
            states.append(h)
        hidden = torch.stack(states, 1)
        return hidden, hidden[:, -1]


class RetrievalNet(nn.Module):
    """Token ids (B, T) -> embedding -> a recurrent core -> the last hidden state -> a hidden
    layer of `readout_size` ReLUs -> 10 logits (readout_size=0, the default: a linear read-out;
    the paper's is a layer of 100 ReLUs).

    The core is the fast-weights RNN (the default; keyword settings go to FastWeightsRNN), the
    same RNN without fast weights written apart (`ablation=True`, a LayerNormRNN), or an LSTM
    with the same number of hidden units (`lstm=True`). Everything but the core is shared.
    """

    def __init__(
        self,
        hidden_size: int = 32,
        embedding_size: int = 100,
        *,
        readout_size: int = 0,
        lstm: bool = False,
        ablation: bool = False,
        **fast_weight_settings,
    ):
        super().__init__()
        checks.boolean("lstm", lstm)
        checks.boolean("ablation", ablation)
        if lstm and ablation:
            raise ValueError("choose one core: lstm=True or ablation=True")
        if lstm and fast_weight_settings:
            raise ValueError(f"an LSTM takes no fast-weight settings; got {fast_weight_settings}")
        allowed = {"recurrent_init"}
        if ablation and set(fast_weight_settings) - allowed:
            raise ValueError(
                f"the ablation has no fast weights; it takes only {sorted(allowed)}; "
                f"got {fast_weight_settings}"
            )
        self.embedding = nn.Embedding(
            len(VOCABULARY), checks.integer("embedding_size", embedding_size)
        )
        if lstm:
            self.core = nn.LSTM(
                embedding_size, checks.integer("hidden_size", hidden_size), batch_first=True
            )
        elif ablation:
            self.core = LayerNormRNN(embedding_size, hidden_size, **fast_weight_settings)
        else:
            self.core = fast_weights.FastWeightsRNN(
                embedding_size, hidden_size, **fast_weight_settings
            )
        checks.integer("readout_size", readout_size, 0)
        if readout_size:
            self.readout = nn.Sequential(
                nn.Linear(hidden_size, readout_size),
                nn.ReLU(),
                nn.Linear(readout_size, len(VALUES)),
            )
        else:
            self.readout = nn.Linear(hidden_size, len(VALUES))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        _check_tokens(tokens)
        outputs, _ = self.core(self.embedding(tokens))
        return self.readout(outputs[:, -1])


def retrieval_accuracy(model: RetrievalNet, sequences: tuple[torch.Tensor, torch.Tensor]) -> float:
    """Fraction of the sequences (tokens, answers) whose answer digit gets the largest logit."""
    tokens, answers = _check_sequences("sequences", sequences)
    return training.accuracy_of(model, tokens, answers)


def retrieval_scores(
    model: RetrievalNet, sequences: tuple[torch.Tensor, torch.Tensor]
) -> dict[str, float]:
    """From one pass over the sequences (tokens, answers): "val_accuracy", the fraction whose
    answer gets the largest logit, and "val_loss", the mean cross-entropy of the answers, a
    continuous score that ties far less often than the accuracy."""
    tokens, answers = _check_sequences("sequences", sequences)
    with training.evaluating(model), torch.no_grad():
        logits = model(tokens)
    return {
        "val_accuracy": training.accuracy(logits, answers),
        "val_loss": nn.functional.cross_entropy(logits, answers).item(),
    }


class RetrievalTraining:
    """A RetrievalNet (`model_settings` choose the core) trained with Adam on minibatches of
    the fixed training set `train` (tokens, answers), through papernotes.training.train_classifier,
    that can be continued: `advance(steps)` makes that many more updates with the same
    optimizer and the same stream of minibatches, so a run advanced by 200 and then 400 updates
    is the run of 600.

    The seed fixes the initial weights and the order of the minibatches (its own stream), so
    models trained with the same seed see the same sequences in the same order. The history
    logs the training loss and the accuracy and cross-entropy on `validation` every
    `eval_every` updates.
    """

    def __init__(
        self,
        train: tuple[torch.Tensor, torch.Tensor],
        validation: tuple[torch.Tensor, torch.Tensor],
        *,
        seed: int,
        batch_size: int = 128,
        lr: float = 1e-2,
        clip: float = 5.0,
        eval_every: int = 100,
        **model_settings,
    ):
        self.train_tokens, self.train_answers = _check_sequences("train", train)
        self.validation = _check_sequences("validation", validation)
        self.lr = checks.number("lr", lr, 0.0, low_open=True)
        batch_size = checks.integer("batch_size", batch_size)
        self.eval_every = checks.integer("eval_every", eval_every)
        self.clip = clip
        with training.seeded(seed):
            self.model = RetrievalNet(**model_settings)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.batches = minibatches(
            len(self.train_answers), batch_size, training.generator(seed, BATCHES)
        )
        self.history = training.History()
        self.updates = 0

    def advance(self, steps: int) -> RetrievalTraining:
        """Make `steps` more updates (a multiple of eval_every) and log their evaluations."""
        steps = checks.integer("steps", steps)
        if steps % self.eval_every:
            raise ValueError(f"steps must be a multiple of eval_every ({self.eval_every})")
        model = self.model
        part = training.train_classifier(
            model,
            self.train_answers,
            self.optimizer,
            steps,
            batches=self.batches,
            logits_of=lambda index: model(self.train_tokens[index]),
            evaluate=lambda: retrieval_scores(model, self.validation),
            eval_every=self.eval_every,
            clip=self.clip,
            desc="associative retrieval",
        )
        for step, *values in zip(part.steps, *part.metrics.values(), strict=True):
            self.history.log(self.updates + step, dict(zip(part.metrics, values, strict=True)))
        self.history.diverged = self.history.diverged or part.diverged
        self.updates += steps
        return self

    @property
    def run(self) -> training.Run:
        return training.Run(self.model, self.history)


def train_retrieval(
    train: tuple[torch.Tensor, torch.Tensor],
    validation: tuple[torch.Tensor, torch.Tensor],
    *,
    seed: int,
    steps: int = 1000,
    eval_every: int = 100,
    **settings,
) -> training.Run:
    """One RetrievalTraining of `steps` updates (`settings` are its keyword arguments)."""
    checks.integer("steps", steps)
    every = min(eval_every, steps)
    return (
        RetrievalTraining(train, validation, seed=seed, eval_every=every, **settings)
        .advance(steps)
        .run
    )


def tune_learning_rate(
    train: tuple[torch.Tensor, torch.Tensor],
    validation: tuple[torch.Tensor, torch.Tensor],
    *,
    seed: int,
    lrs,
    rung: int,
    steps: int,
    keep: int = 2,
    eval_every: int = 100,
    **settings,
) -> dict[float, RetrievalTraining]:
    """Successive halving over the learning rates `lrs`, the same for every network: each rate
    trains for `rung` updates; the `keep` rates with the lowest mean validation cross-entropy
    over their evaluations so far go on to `steps` (a diverged run's is infinite). Returns every
    rate's run (the others stopped at `rung`); `chosen_rate` picks among those that reached
    `steps`."""
    checks.integer("rung", rung)
    checks.integer("steps", steps)
    checks.integer("keep", keep)
    if not rung < steps:
        raise ValueError(f"rung ({rung}) must come before the budget's end ({steps})")
    runs = {
        lr: RetrievalTraining(
            train, validation, seed=seed, lr=lr, eval_every=eval_every, **settings
        ).advance(rung)
        for lr in lrs
    }
    for lr in sorted(runs, key=lambda lr: _finite(runs[lr].history.mean("val_loss")))[:keep]:
        runs[lr].advance(steps - rung)
    return runs


def chosen_rate(runs: dict[float, RetrievalTraining]) -> float:
    """Among the runs that went furthest, the rate with the lowest validation cross-entropy at
    the end of the budget (where the claims are read); the first on a tie."""
    furthest = max(run.updates for run in runs.values())
    finalists = [lr for lr, run in runs.items() if run.updates == furthest]
    return min(finalists, key=lambda lr: _finite(runs[lr].history.final("val_loss")))


def _finite(loss: float) -> float:
    """A validation loss to rank by: a diverged run's NaN ranks last."""
    return loss if math.isfinite(loss) else math.inf


# -- What the memory reads at the query -----------------------------------------------------------


def attention_at_query(model: RetrievalNet, tokens: torch.Tensor) -> torch.Tensor:
    """What the last step reads from the memory, as weights on the earlier states h(1..T-1),
    (B, T-1).

    At the last step the network has just read the query key; its first inner-loop read is
    A(T-1) h_0(T). Both come from the module: the memory as its own steps left it after T-1
    tokens (the states it holds, in the order it wrote them), read with its own preliminary
    vector h_0(T), and the weights are those of the memory view, eta lambda^(age) h^T h_0(T),
    on the states the memory holds. A memory that holds fewer states has them aligned to the
    newest positions; the positions it does not hold get no weight.
    """
    if not isinstance(model.core, fast_weights.FastWeightsRNN):
        raise TypeError(
            f"attention_at_query needs a fast-weights core; got {type(model.core).__name__}"
        )
    _check_tokens(tokens)
    core = model.core
    with training.evaluating(model), core.settings(memory="attention"):
        x = model.embedding(tokens)
        memory = core.trace(x[:, :-1]).memory  # A(T-1), as the module's steps wrote it
        query = core.trace(x).preliminary[:, -1]  # h_0(T)
        weights = tokens.new_zeros(tokens.shape[0], tokens.shape[1] - 1, dtype=x.dtype)
        if memory.states:
            held = torch.stack(memory.states, 1)
            read = fast_weights.attention_weights(held, query, core.decay, core.fast_lr)
            weights[:, weights.shape[1] - held.shape[1] :] = read
        return weights


def formula_weights_at_query(model: RetrievalNet, tokens: torch.Tensor) -> torch.Tensor:
    """The same weights from the memory view's formula, eta lambda^(t - tau) h(tau)^T h_0(T),
    with the states of the module's trace (B, T-1): what attention_at_query recovers when the
    memory is the paper's."""
    _check_tokens(tokens)
    core = model.core
    with training.evaluating(model):
        trace = core.trace(model.embedding(tokens))
        return fast_weights.attention_weights(
            trace.hidden[:, :-1], trace.preliminary[:, -1], core.decay, core.fast_lr
        )


def equation_weights_at_query(model: RetrievalNet, tokens: torch.Tensor) -> torch.Tensor:
    """The same weights (B, T-1) with every state from the paper's equations, written out apart
    from the module (`by_the_equations`): the read of a null, which no broken memory reaches.
    The model's core must have layer normalisation."""
    _check_tokens(tokens)
    core = model.core
    W, C = core.recurrent_weights.weight, core.input_weights.weight
    with training.evaluating(model), torch.no_grad():
        x = model.embedding(tokens)
        states = by_the_equations(core, x[:, :-1])  # h(1..T-1)
        # h_0(T) = f(W h(T-1) + C x(T)): the preliminary vector, the read's query
        query = torch.relu(states[:, -1] @ W.T + x[:, -1] @ C.T + core.input_weights.bias)
        # eta lambda^(T-1-tau) h(tau)^T h_0(T), for tau = 1 .. T-1
        ages = torch.arange(states.shape[1] - 1, -1, -1, dtype=x.dtype)
        return core.fast_lr * core.decay**ages * (states @ query.unsqueeze(2)).squeeze(2)


ROLES = ("queried key", "its value", "other keys", "other values", "'?' marks")


def mean_weight_by_role(weights: torch.Tensor, tokens: torch.Tensor) -> dict[str, float]:
    """The mean read weight (from `attention_at_query`) on the stored states of each role: the
    queried key and its value, the other keys and values, and the two query marks.

    weights is (B, T-1), tokens (B, T) with T = 2 n_pairs + 3.
    """
    batch, length = _check_tokens(tokens), tokens.shape[1]
    checks.tensor("weights", weights, "(B, T)", B=batch, T=length - 1)
    n_pairs = (length - 3) // 2
    rows = torch.arange(batch)
    key = 2 * (tokens[:, : 2 * n_pairs : 2] == tokens[:, -1:]).long().argmax(1)  # its position
    pairs = weights[:, : 2 * n_pairs]
    queried = torch.zeros_like(pairs, dtype=torch.bool)
    queried[rows, key] = queried[rows, key + 1] = True
    is_key = (torch.arange(2 * n_pairs) % 2 == 0).expand_as(pairs)
    means = (
        weights[rows, key],
        weights[rows, key + 1],
        pairs[~queried & is_key],
        pairs[~queried & ~is_key],
        weights[:, 2 * n_pairs :],
    )
    return {role: values.mean().item() for role, values in zip(ROLES, means, strict=True)}


def pair_weights(weights: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sequence, the mean read weight on the queried pair (its key and value) and on the
    other pairs' keys and values: two tensors (B,), from weights (B, T-1) and tokens (B, T)."""
    batch, length = _check_tokens(tokens), tokens.shape[1]
    checks.tensor("weights", weights, "(B, T)", B=batch, T=length - 1)
    n_pairs = (length - 3) // 2
    rows = torch.arange(batch)
    key = 2 * (tokens[:, : 2 * n_pairs : 2] == tokens[:, -1:]).long().argmax(1)
    pairs = weights[:, : 2 * n_pairs]
    queried = torch.zeros_like(pairs, dtype=torch.bool)
    queried[rows, key] = queried[rows, key + 1] = True
    return (pairs * queried).sum(1) / 2, (pairs * ~queried).sum(1) / (2 * n_pairs - 2)


def queried_over_others(model: RetrievalNet, tokens: torch.Tensor) -> float:
    """Mean read weight at the last step on the queried pair, over that on the other pairs
    (means over the sequences, then the ratio)."""
    queried, others = pair_weights(attention_at_query(model, tokens), tokens)
    return (queried.mean() / others.mean()).item()


def ratio_gap_standard_error(
    first: tuple[torch.Tensor, torch.Tensor],
    second: tuple[torch.Tensor, torch.Tensor],
    generator: torch.Generator,
    rounds: int = 500,
) -> float:
    """The bootstrap standard error of ratio(first) - ratio(second), where ratio(q, o) =
    mean(q) / mean(o) over sequences and both pairs (from `pair_weights`) are of the same
    sequences: the sequences are resampled with replacement, the same for both, `rounds`
    times."""
    n = checks.tensor("first queried", first[0], "(N,)")["N"]
    for name, values in (("first others", first[1]), ("second queried", second[0])):
        checks.tensor(name, values, "(N,)", N=n)
    checks.tensor("second others", second[1], "(N,)", N=n)
    checks.integer("rounds", rounds, 2)
    index = torch.randint(n, (rounds, n), generator=generator)

    def ratio(pair):
        q, o = pair
        return q[index].mean(1) / o[index].mean(1)

    return (ratio(first) - ratio(second)).std().item()


def relative_to_other_pairs(by_role: dict[str, float]) -> list[float]:
    """Each role's mean weight (`mean_weight_by_role`) over the mean of the other pairs' keys
    and values, in the order of ROLES."""
    others = (by_role["other keys"] + by_role["other values"]) / 2
    return [value / others for value in by_role.values()]


def read_with_settings(
    model: RetrievalNet,
    sequences: tuple[torch.Tensor, torch.Tensor],
    *,
    decay: float,
    fast_lr: float,
    inner_steps: int,
    accuracy: bool = True,
) -> tuple[float | None, torch.Tensor, dict[str, float]]:
    """At these test-time settings of the model's fast-weights core, on `sequences` (tokens,
    answers): the accuracy (None unless `accuracy`), the read weights at the last step and their
    mean by role. The model's own settings are restored after."""
    tokens, _ = _check_sequences("sequences", sequences)
    checks.boolean("accuracy", accuracy)
    with model.core.settings(decay=decay, fast_lr=fast_lr, inner_steps=inner_steps):
        weights = attention_at_query(model, tokens)
        measured = retrieval_accuracy(model, sequences) if accuracy else None
    return measured, weights, mean_weight_by_role(weights, tokens)
