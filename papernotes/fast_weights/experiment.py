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

from papernotes import checks, fast_weights, together, training
from papernotes.data import minibatches

# The random streams of a run (papernotes.training.generator(seed, stream)): the training
# set, the order of its minibatches, the validation sequences and the test sequences each come
# from their own; the chapter's checks of the equations draw their random states and inputs
# from EQUATIONS.
# BOOTSTRAP resamples the test sequences for the attention row's standard error; CAPACITY draws
# the test sequences of other numbers of pairs.
EQUATIONS, BATCHES, VALIDATION, TEST, TRAIN, BOOTSTRAP, CAPACITY = 0, 1, 2, 3, 4, 5, 6


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


def capacity_sets(seed: int, pair_counts, size: int = 2000) -> dict[int, tuple]:
    """Test sequences with each number of pairs in `pair_counts` ({n_pairs: (tokens, answers)},
    `size` each), drawn in that order from the seed's CAPACITY stream: for reading networks
    trained on one number of pairs at others."""
    generator = training.generator(seed, CAPACITY)
    counts = [checks.integer(f"pair_counts[{i}]", n) for i, n in enumerate(pair_counts)]
    return {n: retrieval_batch(size, n, generator) for n in counts}


def pairs_remembered(accuracy: float, n_pairs: int) -> float:
    """The number of pairs m a network remembers if it answers their keys and guesses the digit
    of the others: accuracy = m / n + (1 - m / n) / 10, so m = n (accuracy - 1/10) / (9/10)."""
    checks.number("accuracy", accuracy, 0.0, 1.0)
    checks.integer("n_pairs", n_pairs)
    chance = 1 / len(VALUES)
    return n_pairs * (accuracy - chance) / (1 - chance)


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
    """The fast-weights network without its fast weights, written apart from the mechanism,
    with an optional leaky memory of its past states inside LN:

        m(t) = memory_decay * m(t-1) + memory_rate * h(t),  m(0) = 0,
        h(t+1) = ReLU(LN[W h(t) + C x(t) + m(t)]),

    W starting at recurrent_init * I, C with a bias. With memory_rate = 0 (the default) m stays
    0: the chapter's ablation, h(t+1) = ReLU(LN[W h(t) + C x(t)]) (the same as FastWeightsRNN
    with fast_lr = 0, which a unit test checks, computed by code that a bug in the mechanism
    cannot reach). With memory_rate = 0.5 and memory_decay = 0.95 it is the leaky-memory null:
    m(t) = 0.5 sum_tau 0.95^(t - tau) h(tau) is the fast weights' read A(t) q with every dot
    product h(tau)^T q replaced by 1, the same reach without the content addressing.

    The memory's rate and decay are buffers, so that a stack of these networks (papernotes.
    together) can hold ablations and leaky memories side by side. forward(x (B, T, input_size))
    returns the hidden states (B, T, H) and the last (B, H); run(drive) the hidden states from
    C x(t) + b computed already.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        *,
        recurrent_init: float = 0.5,
        memory_rate: float = 0.0,
        memory_decay: float = 0.95,
    ):
        super().__init__()
        self.input_size = checks.integer("input_size", input_size)
        self.hidden_size = checks.integer("hidden_size", hidden_size)
        checks.number("recurrent_init", recurrent_init, 0.0)
        checks.number("memory_rate", memory_rate, 0.0)
        checks.number("memory_decay", memory_decay, 0.0, 1.0)
        self.input_weights = nn.Linear(input_size, hidden_size)  # C and its bias
        self.recurrent_weights = nn.Linear(hidden_size, hidden_size, bias=False)  # W
        self.norm = nn.LayerNorm(hidden_size)
        self.register_buffer("memory_rate", torch.tensor(float(memory_rate)))
        self.register_buffer("memory_decay", torch.tensor(float(memory_decay)))
        with torch.no_grad():
            self.recurrent_weights.weight.copy_(recurrent_init * torch.eye(hidden_size))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        checks.tensor("x", x, "(B, T, D)", dtype="floating", D=self.input_size)
        hidden = self.run(self.input_weights(x))  # C x(t) + b for every t at once
        return hidden, hidden[:, -1]

    def run(self, drive: torch.Tensor) -> torch.Tensor:
        """h(1..T) (B, T, H) from the slow input drive(t) = C x(t) + b (B, T, H)."""
        h = drive.new_zeros(drive.shape[0], self.hidden_size)
        memory = torch.zeros_like(h)  # m(0) = 0
        states = []
        for slow_input in drive.unbind(1):
            # h(t+1) = ReLU(LN[W h(t) + C x(t) + m(t)]): the past, read without a query
            h = torch.relu(self.norm(slow_input + self.recurrent_weights(h) + memory))
            # m(t+1) = decay m(t) + rate h(t+1): the newest state is in the next step's read
            memory = self.memory_decay * memory + self.memory_rate * h
            states.append(h)
        return torch.stack(states, 1)


class LSTM(nn.Module):
    """An LSTM of torch's arithmetic and initialisation, written out so that a stack of them runs
    under torch.func's vmap (torch's fused LSTM kernel has no batching rule):

        i, f, g, o = C x(t) + b + U h(t)  (torch's gate order),
        c(t+1) = sigmoid(f) * c(t) + sigmoid(i) * tanh(g),  h(t+1) = sigmoid(o) * tanh(c(t+1)).

    C, U and b are drawn uniform in +-1/sqrt(H), as torch draws them; the forget gate's bias is
    then set to `forget_bias` (1 by default: the common choice, which keeps the cell's memory
    open from the first update; torch's default draws it near 0).

    forward(x (B, T, input_size)) returns the hidden states (B, T, H) and the last (B, H);
    run(drive) the hidden states from C x(t) + b computed already.
    """

    def __init__(self, input_size: int, hidden_size: int, *, forget_bias: float = 1.0):
        super().__init__()
        self.input_size = checks.integer("input_size", input_size)
        self.hidden_size = checks.integer("hidden_size", hidden_size)
        checks.number("forget_bias", forget_bias)
        self.input_weights = nn.Linear(input_size, 4 * hidden_size)  # C and b
        self.recurrent_weights = nn.Linear(hidden_size, 4 * hidden_size, bias=False)  # U
        bound = 1 / math.sqrt(hidden_size)
        with torch.no_grad():
            for weight in (*self.input_weights.parameters(), self.recurrent_weights.weight):
                weight.uniform_(-bound, bound)
            self.input_weights.bias[hidden_size : 2 * hidden_size] = forget_bias

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        checks.tensor("x", x, "(B, T, D)", dtype="floating", D=self.input_size)
        hidden = self.run(self.input_weights(x))  # C x(t) + b for every t at once
        return hidden, hidden[:, -1]

    def run(self, drive: torch.Tensor) -> torch.Tensor:
        """h(1..T) (B, T, H) from drive(t) = C x(t) + b (B, T, 4H)."""
        h = drive.new_zeros(drive.shape[0], self.hidden_size)
        c = torch.zeros_like(h)
        states = []
        for slow_input in drive.unbind(1):
            i, f, g, o = (slow_input + self.recurrent_weights(h)).chunk(4, dim=1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            states.append(h)
        return torch.stack(states, 1)


# The recurrent cores a RetrievalNet can have: each core's class and the settings that make it
CORES = {
    "fast weights": (fast_weights.FastWeightsRNN, {}),
    "no fast weights": (LayerNormRNN, {}),
    "leaky memory": (LayerNormRNN, {"memory_rate": 0.5, "memory_decay": 0.95}),
    "LSTM": (LSTM, {}),
}


class RetrievalNet(nn.Module):
    """Token ids (B, T) -> embedding -> a recurrent core -> the last hidden state -> a hidden
    layer of `readout_size` ReLUs -> 10 logits (readout_size=0, the default: a linear read-out;
    the paper's is a layer of 100 ReLUs).

    `core` names the recurrent core (CORES): the fast-weights RNN (the default), the same RNN
    without fast weights ("no fast weights", a LayerNormRNN written apart), the same RNN with a
    query-free leaky memory ("leaky memory") or an LSTM, each with `hidden_size` units; keyword
    settings go to the core's class. Everything but the core is shared.

    The core's first map, C x(t) + b of the token's embedding x(t), is computed once for each
    of the 37 tokens and looked up (`hidden_states`): the same numbers and gradients as mapping
    every position's embedding, for a fraction of the work. forward checks the tokens' shape
    and type only (it runs inside a stack of arms under vmap, where a tensor's values cannot be
    looked at); the entry points that take sequences check their values too.
    """

    def __init__(
        self,
        hidden_size: int = 32,
        embedding_size: int = 100,
        *,
        readout_size: int = 0,
        core: str = "fast weights",
        **core_settings,
    ):
        super().__init__()
        checks.one_of("core", core, tuple(CORES))
        self.embedding = nn.Embedding(
            len(VOCABULARY), checks.integer("embedding_size", embedding_size)
        )
        kind, defaults = CORES[core]
        try:
            self.core = kind(embedding_size, hidden_size, **{**defaults, **core_settings})
        except TypeError as error:
            raise ValueError(f"the {core!r} core does not take {core_settings}: {error}") from None
        checks.integer("readout_size", readout_size, 0)
        if readout_size:
            self.readout = nn.Sequential(
                nn.Linear(hidden_size, readout_size),
                nn.ReLU(),
                nn.Linear(readout_size, len(VALUES)),
            )
        else:
            self.readout = nn.Linear(hidden_size, len(VALUES))

    def hidden_states(self, tokens: torch.Tensor) -> torch.Tensor:
        """The core's hidden states (B, T, H) on token ids (B, T)."""
        checks.tensor("tokens", tokens, "(B, T)", dtype=torch.long)
        table = self.core.input_weights(self.embedding.weight)  # C e + b for each token's e
        states = self.core.run(table[tokens])
        return states.hidden if isinstance(states, fast_weights.FastWeightsTrace) else states

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.readout(self.hidden_states(tokens)[:, -1])


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
        batch_size: int = 512,
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


@dataclass
class Grid:
    """One network's tuning: each learning rate of its grid (`lrs`), that rate's History, and
    the trained models of the rates that went to the end of the budget (by their index)."""

    lrs: tuple[float, ...]
    histories: list[training.History]
    models: dict[int, RetrievalNet]

    @property
    def chosen(self) -> float:
        """Among the rates that went furthest, the one with the lowest validation cross-entropy
        at the end of the budget (where the claims are read); the first on a tie."""
        furthest = max(h.steps[-1] for h in self.histories)
        finalists = [i for i, h in enumerate(self.histories) if h.steps[-1] == furthest]
        return self.lrs[min(finalists, key=lambda i: _finite(self.histories[i].final("val_loss")))]

    @property
    def run(self) -> training.Run:
        """The chosen rate's trained model and History."""
        i = self.lrs.index(self.chosen)
        return training.Run(self.models[i], self.histories[i])


def tune_together(
    train: tuple[torch.Tensor, torch.Tensor],
    validation: tuple[torch.Tensor, torch.Tensor],
    *,
    seed: int,
    arms: dict[str, dict],
    lrs,
    rung: int,
    steps: int,
    keep: int = 2,
    batch_size: int = 512,
    eval_every: int = 50,
    clip: float = 5.0,
) -> dict[str, Grid]:
    """Successive halving over the learning rates `lrs`, the same for every network: each rate
    trains for `rung` updates; for each network the `keep` rates with the lowest mean validation
    cross-entropy over their evaluations so far (a diverged run's is infinite) go on to `steps`.

    `arms` maps each network's name to its RetrievalNet settings; every (network, rate) pair is
    one member of a stacked model (papernotes.together: one forward and backward an update for
    all of them, then for the kept ones), so the networks must be of one class and shape (the
    ablation and the leaky memory are). Every member starts from the initial weights of `seed`
    and sees the same minibatches of `batch_size` in the same order: Adam at its own rate, its
    gradient norm clipped at `clip` on its own. Returns each network's Grid."""
    train = _check_sequences("train", train)
    validation = _check_sequences("validation", validation)
    checks.integer("rung", rung)
    checks.integer("steps", steps)
    checks.integer("keep", keep)
    checks.integer("eval_every", eval_every)
    if not rung < steps:
        raise ValueError(f"rung ({rung}) must come before the budget's end ({steps})")
    lrs = tuple(checks.number(f"lrs[{i}]", lr, 0.0, low_open=True) for i, lr in enumerate(lrs))
    if not isinstance(arms, dict) or not arms:
        raise TypeError("arms must map each network's name to its RetrievalNet settings")
    kinds = {name: _core_class(settings) for name, settings in arms.items()}
    if len(set(kinds.values())) > 1:
        raise ValueError(f"networks trained together must share a core class; got {kinds}")
    pairs = [(name, i) for name in arms for i in range(len(lrs))]  # the members, in order
    members = []
    for name, _ in pairs:
        with training.seeded(seed):
            members.append(RetrievalNet(**arms[name]))
    # a stack runs the first member's code on every member's tensors: settings kept as plain
    # attributes (the fast weights' decay, say) must be the same for all, or they would be lost
    plain = {name: _plain_settings(members[m].core) for m, (name, _) in enumerate(pairs)}
    if len({repr(sorted(v.items())) for v in plain.values()}) > 1:
        raise ValueError(f"networks trained together must differ only in tensors; got {plain}")
    batches = minibatches(len(train[1]), batch_size, training.generator(seed, BATCHES))
    group = _Group(members, list(range(len(pairs))), [lrs[i] for _, i in pairs], batches)
    histories = [training.History() for _ in pairs]
    group.advance(rung, train, validation, histories, eval_every, clip)
    kept = []
    for name in arms:
        at_rung = {
            m: _finite(histories[m].mean("val_loss")) for m, p in enumerate(pairs) if p[0] == name
        }
        kept += sorted(at_rung, key=at_rung.get)[:keep]
    group = group.kept(sorted(kept))
    group.advance(steps - rung, train, validation, histories, eval_every, clip)
    models = {m: group.stack.member(k) for k, m in enumerate(group.indices)}
    return {
        name: Grid(
            lrs,
            [histories[m] for m, p in enumerate(pairs) if p[0] == name],
            {p[1]: models[m] for m, p in enumerate(pairs) if p[0] == name and m in models},
        )
        for name in arms
    }


def _core_class(settings: dict) -> str:
    """The name of the class of the core that RetrievalNet settings choose."""
    core = checks.one_of("core", settings.get("core", "fast weights"), tuple(CORES))
    return CORES[core][0].__name__


def _plain_settings(core: nn.Module) -> dict:
    """A core's settings that are plain attributes, not tensors (decay, fast_lr, inner_steps...)."""
    return {
        name: value
        for name, value in vars(core).items()
        if not name.startswith("_") and not isinstance(value, torch.Tensor | nn.Module)
    }


class _Group:
    """Members of one tuning trained as one stacked model: their stack, its optimizer (Adam, a
    learning rate a member), their stream of minibatches and how far they have trained."""

    def __init__(self, members, indices, lrs, batches, optimizer_state=None):
        self.stack = together.stack(members)
        self.indices = indices  # each member's index among all the members of the tuning
        self.lrs = lrs  # every member's learning rate, by that index
        self.optimizer = together.Adam(self.stack.parameters(), lr=[lrs[i] for i in indices])
        if optimizer_state is not None:
            for p, state in zip(self.stack.parameters(), optimizer_state, strict=True):
                self.optimizer.state[p] = state
        self.batches = batches
        self.updates = 0

    def advance(self, steps, train, validation, histories, eval_every, clip) -> None:
        """`steps` more updates of every member; their evaluations logged in `histories`."""
        tokens, answers = train
        val_tokens, val_answers = validation

        def losses_of_update(_):
            index = next(self.batches)  # the same minibatch for every member
            return together.cross_entropy(self.stack.on_all(tokens[index]), answers[index])

        def evaluate():
            logits = self.stack.on_all(val_tokens)
            return {
                "val_loss": together.cross_entropy(logits, val_answers),
                "val_accuracy": together.accuracy(logits, val_answers),
            }

        parts = together.train(
            self.stack,
            self.optimizer,
            losses_of_update,
            steps,
            evaluate=evaluate,
            eval_every=eval_every,
            clip=clip,
            desc="associative retrieval",
        )
        for i, part in zip(self.indices, parts, strict=True):
            for step, *values in zip(part.steps, *part.metrics.values(), strict=True):
                histories[i].log(self.updates + step, dict(zip(part.metrics, values, strict=True)))
            histories[i].diverged = histories[i].diverged or part.diverged
        self.updates += steps

    def kept(self, indices: list[int]) -> _Group:
        """The members `indices` (of the tuning) as a group of their own, where they were:
        their trained weights, their optimizer's state (Adam's moments and step), the same
        stream of minibatches; so that they go on as if the others had never trained beside
        them."""
        rows = [self.indices.index(i) for i in indices]
        members = [self.stack.member(k).train() for k in rows]
        state = [
            {
                name: value[rows].clone() if isinstance(value, torch.Tensor) else value
                for name, value in self.optimizer.state[p].items()
            }
            for p in self.stack.parameters()
        ]
        group = _Group(members, indices, self.lrs, self.batches, state)
        group.updates = self.updates
        return group


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
    with training.evaluating(model), torch.no_grad():
        x = model.embedding(tokens)
        states = by_the_equations(core, x[:, :-1])  # h(1..T-1)
        return _read_at_query(core, states, x[:, -1], core.decay, core.fast_lr)


def slow_weights_at_query(
    model: RetrievalNet, tokens: torch.Tensor, decay: float = 0.95, fast_lr: float = 0.5
) -> torch.Tensor:
    """The weights (B, T-1) the paper's read would put on the states of a network without fast
    weights (a LayerNormRNN core: the ablation or the leaky memory): eta lambda^(T-1-tau)
    h(tau)^T h_0(T) with its own states h(1..T-1) and h_0(T) = ReLU(W h(T-1) + C x(T)) made
    from its own weights as the fast-weights network makes its query. A null of the attention
    row: training alone may make the query key's state resemble the earlier key's."""
    _check_tokens(tokens)
    core = model.core
    if not isinstance(core, LayerNormRNN):
        raise TypeError(
            f"slow_weights_at_query needs a LayerNormRNN core; got {type(core).__name__}"
        )
    with training.evaluating(model), torch.no_grad():
        x = model.embedding(tokens)
        states, _ = core(x[:, :-1])  # h(1..T-1), by the null's own code
        return _read_at_query(core, states, x[:, -1], decay, fast_lr)


def _read_at_query(core, states, last_input, decay, fast_lr) -> torch.Tensor:
    """eta lambda^(T-1-tau) h(tau)^T h_0(T) for tau = 1 .. T-1 (B, T-1), from the states
    h(1..T-1) and the last input x(T), with h_0(T) = ReLU(W h(T-1) + C x(T) + b)."""
    W, C, b = core.recurrent_weights.weight, core.input_weights.weight, core.input_weights.bias
    query = torch.relu(states[:, -1] @ W.T + last_input @ C.T + b)  # h_0(T): the read's query
    ages = torch.arange(states.shape[1] - 1, -1, -1, dtype=states.dtype)
    return fast_lr * decay**ages * (states @ query.unsqueeze(2)).squeeze(2)


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
