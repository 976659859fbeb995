"""Unit tests of papernotes.bert (the masking, the encoder's two attention modes, the losses) and
papernotes.bert.experiment (the bracket language, pre-training, the probe and the
measurements)."""

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import gen
from papernotes import bert, training
from papernotes.bert import CLS, IGNORE, MASK, PAD, SEP, SPECIAL_IDS, experiment
from papernotes.bert.experiment import CLOSE, OPEN, VOCAB_SIZE


def corpus(n=4000, seed=0, **kwargs):
    return experiment.dyck_sequences(n, generator=gen(seed), **kwargs)


def within(share, p, n, k=5.0):
    """A binomial share over n draws within k standard errors of p."""
    return abs(share - p) <= k * math.sqrt(p * (1 - p) / n)


# -- the masking ----------------------------------------------------------------------------------


def test_masking_fractions_are_the_papers_in_expectation():
    tokens = corpus(20000)
    eligible = ~torch.isin(tokens, torch.tensor(SPECIAL_IDS))
    n = eligible.sum().item()
    m = bert.choose_masking(tokens, 0.15, gen(1), SPECIAL_IDS)
    kept = m.selected & ~m.masked & ~m.randomized
    # 15% selected; of the eligible tokens 12% masked, 1.5% random, 1.5% unchanged.
    for decisions, p in (
        (m.selected, 0.15),
        (m.masked, 0.12),
        (m.randomized, 0.015),
        (kept, 0.015),
    ):
        assert within(decisions.sum().item() / n, p, n), p
    assert not (m.masked & m.randomized).any()


def test_mask_tokens_outputs_follow_the_decisions():
    tokens = corpus(3000)
    m = bert.choose_masking(tokens, 0.15, gen(2), SPECIAL_IDS)
    inputs, labels = bert.mask_tokens(tokens, MASK, VOCAB_SIZE, 0.15, gen(2), SPECIAL_IDS)
    # The loss covers exactly the selected positions, with the original token as label.
    assert torch.equal(labels != IGNORE, m.selected)
    assert torch.equal(labels[m.selected], tokens[m.selected])
    assert (labels[~m.selected] == -100).all()
    assert (inputs[m.masked] == MASK).all()
    kept = m.selected & ~m.masked & ~m.randomized
    assert torch.equal(inputs[kept], tokens[kept])
    assert torch.equal(inputs[~m.selected], tokens[~m.selected])
    # Random replacements are ordinary tokens (brackets), never special nor [MASK].
    assert torch.isin(inputs[m.randomized], torch.tensor(OPEN + CLOSE)).all()
    # A random token differs from the original one 5 times in 6 (six brackets to draw from).
    changed = (inputs[m.randomized] != tokens[m.randomized]).float().mean().item()
    assert within(changed, 5 / 6, m.randomized.sum().item())


def test_special_tokens_are_never_selected():
    tokens = corpus(2000)
    inputs, labels = bert.mask_tokens(tokens, MASK, VOCAB_SIZE, 1.0, gen(3), SPECIAL_IDS)
    special = torch.isin(tokens, torch.tensor(SPECIAL_IDS))
    assert (labels[special] == IGNORE).all() and torch.equal(inputs[special], tokens[special])
    assert (labels[~special] != IGNORE).all()  # mask_prob = 1: every other token is selected


def test_masking_shares_read_back_the_papers_mix():
    tokens = corpus(20000)
    inputs, labels = bert.mask_tokens(tokens, MASK, VOCAB_SIZE, 0.15, gen(4), SPECIAL_IDS)
    shares = experiment.masking_shares(tokens, inputs, labels)
    expected = experiment.expected_shares()
    assert expected["other token"] == pytest.approx(0.1 * 5 / 6)
    assert within(shares["selected"], 0.15, shares["eligible"])
    for name in ("mask", "other token", "unchanged"):
        assert within(shares[name], expected[name], shares["selected_count"]), name
    # With the mask never applied the shares give it away.
    bare = experiment.masking_shares(tokens, tokens, labels)
    assert bare["mask"] == 0.0 and bare["unchanged"] == 1.0


def test_masking_follows_the_generator():
    tokens = corpus(200)
    a = bert.mask_tokens(tokens, MASK, VOCAB_SIZE, 0.15, gen(5), SPECIAL_IDS)
    b = bert.mask_tokens(tokens, MASK, VOCAB_SIZE, 0.15, gen(5), SPECIAL_IDS)
    c = bert.mask_tokens(tokens, MASK, VOCAB_SIZE, 0.15, gen(6), SPECIAL_IDS)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[1], c[1])


def test_masking_extremes():
    tokens = corpus(100)
    inputs, labels = bert.mask_tokens(tokens, MASK, VOCAB_SIZE, 0.0, gen(7), SPECIAL_IDS)
    assert torch.equal(inputs, tokens) and (labels == IGNORE).all()
    inputs, _ = bert.mask_tokens(
        tokens, MASK, VOCAB_SIZE, 1.0, gen(7), SPECIAL_IDS, mask_fraction=1.0, random_fraction=0.0
    )
    special = torch.isin(tokens, torch.tensor(SPECIAL_IDS))
    assert (inputs[~special] == MASK).all()


def test_mask_tokens_rejects_bad_input():
    with pytest.raises(ValueError, match="tokens must have shape"):
        bert.mask_tokens(torch.tensor([1, 4, 7, 2]), MASK, VOCAB_SIZE)
    with pytest.raises(ValueError, match="mask_prob must be"):
        bert.mask_tokens(corpus(4), MASK, VOCAB_SIZE, mask_prob=1.5)
    with pytest.raises(ValueError, match="random_fraction must be"):
        bert.mask_tokens(corpus(4), MASK, VOCAB_SIZE, mask_fraction=0.95, random_fraction=0.1)
    with pytest.raises(ValueError, match="mask_id must lie"):
        bert.mask_tokens(corpus(4), VOCAB_SIZE, VOCAB_SIZE)


def test_the_core_of_mask_tokens_is_mask_tokens_without_its_checks():
    tokens = corpus(200)
    ordinary = torch.tensor(OPEN + CLOSE)
    core = bert._mask_tokens(tokens, MASK, ordinary, 0.3, gen(11), SPECIAL_IDS, 0.8, 0.1)
    checked = bert.mask_tokens(tokens, MASK, VOCAB_SIZE, 0.3, gen(11), SPECIAL_IDS)
    assert torch.equal(core[0], checked[0]) and torch.equal(core[1], checked[1])


def test_masking_z_counts_selected_among_eligible_and_the_rest_among_selected():
    expected = experiment.expected_shares()
    shares = {"eligible": 10000, "selected_count": 1500, **expected}
    assert all(v == 0.0 for v in experiment.masking_z(shares, expected).values())
    shares |= {"selected": 0.16, "mask": 0.82}
    z = experiment.masking_z(shares, expected)
    assert z["selected"] == pytest.approx(0.01 / math.sqrt(0.15 * 0.85 / 10000))
    assert z["mask"] == pytest.approx(0.02 / math.sqrt(0.8 * 0.2 / 1500))
    assert z["other token"] == 0.0 and z["unchanged"] == 0.0
    # the paper's masking, read back from a large corpus, is within a few standard errors
    tokens = corpus(20000)
    inputs, labels = bert.mask_tokens(tokens, MASK, VOCAB_SIZE, 0.15, gen(12), SPECIAL_IDS)
    assert (
        max(
            experiment.masking_z(
                experiment.masking_shares(tokens, inputs, labels), expected
            ).values()
        )
        < 4
    )
    # a masking that hides nothing is far off
    bare = experiment.masking_shares(tokens, tokens, labels)
    assert experiment.masking_z(bare, expected)["mask"] > 100


# -- the encoder ----------------------------------------------------------------------------------


def encoder(causal, seed=0):
    return experiment.new_encoder(causal=causal, seed=seed, max_len=22)


def test_causal_features_ignore_the_right_and_bidirectional_ones_do_not():
    tokens = corpus(8, min_pairs=10)
    for j in (5, 12, 20):
        changed = tokens.clone()
        changed[:, j] = torch.where(changed[:, j] == OPEN[0], OPEN[1], OPEN[0])
        for causal in (True, False):
            model = encoder(causal)
            before, after = model.features(tokens), model.features(changed)
            moved = (after - before).abs().amax(-1)  # (B, T)
            assert moved[:, :j].max().item() < 1e-5 if causal else moved[:, :j].min() > 1e-3
            assert moved[:, j:].min().item() > 1e-3  # the token itself and what follows move


def test_the_causal_mask_is_torchs_square_subsequent_mask():
    mask = bert.attention_mask(7, causal=True)
    torchs = torch.nn.Transformer.generate_square_subsequent_mask(7)
    assert torch.equal(mask, torch.isinf(torchs))
    assert bert.attention_mask(7, causal=False) is None


def test_influence_is_zero_above_the_diagonal_only_for_the_causal_encoder():
    tokens = corpus(16, min_pairs=10)
    causal = experiment.influence(encoder(True), tokens, gen(8))
    both = experiment.influence(encoder(False), tokens, gen(8))
    assert causal.shape == (22, 22)
    upper = torch.ones(22, 22, dtype=torch.bool).triu(1)
    assert causal[upper].abs().max().item() < 1e-5
    assert both[1:21, 1:21][upper[1:21, 1:21]].min().item() > 1e-3
    assert (causal[:, [0, 21]] == 0).all()  # [CLS] and [SEP] are never replaced


def test_padding_does_not_leak_into_the_features():
    tokens = corpus(8)
    longer = torch.cat([tokens, torch.full((8, 6), PAD)], 1)
    for causal in (True, False):
        model = experiment.new_encoder(causal=causal, seed=1, max_len=28)
        real = tokens != PAD
        a, b = model.features(tokens), model.features(longer)[:, :22]
        assert torch.allclose(a[real], b[real], atol=1e-5)


def test_mlm_and_ltr_encoders_start_from_the_same_weights():
    a, b = encoder(False, seed=3).state_dict(), encoder(True, seed=3).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["tokens.weight"], encoder(False, seed=4).state_dict()["tokens.weight"])


def test_encoder_uses_torchs_transformer_layers():
    model = encoder(False)
    layer = model.layers.layers[0]
    assert isinstance(layer, torch.nn.TransformerEncoderLayer) and layer.self_attn.batch_first
    assert len(model.layers.layers) == 2 and model(corpus(3)).shape == (3, 22, VOCAB_SIZE)


def test_encoder_rejects_bad_input():
    with pytest.raises(TypeError, match="tokens must be a torch.int64 tensor"):
        encoder(False).features(torch.zeros(2, 5))
    with pytest.raises(ValueError, match="tokens must have at most max_len"):
        encoder(False).features(torch.ones(2, 30, dtype=torch.long))
    with pytest.raises(ValueError, match="d_model must be a multiple of n_heads"):
        bert.Encoder(causal=False, vocab_size=VOCAB_SIZE, d_model=30, n_heads=4)
    with pytest.raises(TypeError, match="causal must be True or False"):
        bert.Encoder(causal=1, vocab_size=VOCAB_SIZE)


# -- the losses -----------------------------------------------------------------------------------


def test_mlm_loss_averages_over_the_selected_positions_only():
    tokens, model = corpus(16), encoder(False)
    loss = bert.mlm_loss(model, tokens, gen(9))
    inputs, labels = bert.mask_tokens(tokens, MASK, VOCAB_SIZE, 0.15, gen(9), SPECIAL_IDS)
    log_p = model(inputs).log_softmax(-1)
    rows, cols = (labels != IGNORE).nonzero(as_tuple=True)
    by_hand = -log_p[rows, cols, labels[rows, cols]].mean()
    assert loss.item() == pytest.approx(by_hand.item(), rel=1e-5)


def test_ltr_loss_predicts_the_next_real_token():
    tokens, model = corpus(16), encoder(True)
    log_p = model(tokens).log_softmax(-1)
    terms = [
        -log_p[b, t, tokens[b, t + 1]]
        for b in range(16)
        for t in range(21)
        if tokens[b, t + 1] != PAD
    ]
    assert bert.ltr_loss(model, tokens).item() == pytest.approx(
        torch.stack(terms).mean().item(), rel=1e-5
    )
    assert F.cross_entropy(model(tokens)[0, :1], tokens[0, 1:2]).item() > 0


# -- the bracket language -------------------------------------------------------------------------


def test_dyck_sequences_are_balanced_and_framed():
    tokens = corpus(500, max_pairs=6)
    assert tokens.shape == (500, 14)
    assert (tokens[:, 0] == CLS).all()
    for row in tokens.tolist():
        end = row.index(SEP)
        assert 2 <= end - 1 <= 12 and (end - 1) % 2 == 0
        assert all(t == PAD for t in row[end + 1 :])
        stack = []
        for t in row[1:end]:
            if t in OPEN:
                stack.append(t)
            else:
                assert stack and CLOSE.index(t) == OPEN.index(stack.pop())
        assert not stack
    lengths = (tokens != PAD).sum(1) - 2
    assert set(lengths.tolist()) == {2, 4, 6, 8, 10, 12}
    assert (corpus(50, min_pairs=10) != PAD).all()


def test_dyck_sequences_follow_the_generator_and_reject_bad_sizes():
    assert torch.equal(corpus(50, seed=1), corpus(50, seed=1))
    assert not torch.equal(corpus(50, seed=1), corpus(50, seed=2))
    with pytest.raises(ValueError, match="min_pairs must be at most"):
        experiment.dyck_sequences(5, max_pairs=3, min_pairs=4)


def test_spell_writes_the_symbols_without_padding():
    o, c = OPEN, CLOSE
    assert experiment.spell([CLS, o[0], o[2], c[2], c[0], SEP, PAD, PAD]) == "C({})S"
    assert experiment.spell(torch.tensor([CLS, o[1], c[1], SEP])) == "C[]S"


# -- the probe ------------------------------------------------------------------------------------


def test_probe_set_by_hand():
    o, c = OPEN, CLOSE  # ( [ {  and  ) ] }
    tokens = torch.tensor([[CLS, o[0], c[0], o[1], o[2], c[2], c[1], SEP, PAD]])
    rows, cols, labels = experiment.probe_set(tokens)
    assert cols.tolist() == [1, 3, 4] and rows.tolist() == [0, 0, 0]
    assert labels.tolist() == [1, 0, 1]
    with pytest.raises(ValueError, match="tokens must have shape"):
        experiment.probe_set(tokens[0])


def test_majority_accuracy_by_hand():
    assert experiment.majority_accuracy(torch.tensor([1, 1, 0]), torch.tensor([1, 0, 0, 0])) == 0.25
    assert experiment.majority_accuracy(torch.tensor([0, 0, 1]), torch.tensor([1, 0, 0, 0])) == 0.75


def test_train_probe_learns_a_separable_problem():
    x = torch.randn(400, 6, generator=gen(10))
    y = (x[:, 2] > 0).long()
    run = experiment.train_probe(x[:300], y[:300], x[300:], y[300:], seed=0, steps=200)
    assert run.history.steps == [200]
    assert run.history.final("val_accuracy") > 0.95
    with pytest.raises(ValueError, match="train_y must have shape"):
        experiment.train_probe(x, y[:10], x, y, seed=0)


# -- pre-training ---------------------------------------------------------------------------------


def test_pretrain_keeps_snapshots_and_lowers_the_loss():
    tokens, val = corpus(512), corpus(64, seed=1)
    run = experiment.pretrain(
        tokens,
        val,
        causal=False,
        seed=0,
        steps=40,
        eval_every=20,
        batch_size=32,
        d_model=32,
        n_heads=2,
        n_layers=1,
        d_ff=32,
    )
    assert run.history.steps == [20, 40] and sorted(run.snapshots) == [20, 40]
    assert run.history["val_loss"][-1] < math.log(VOCAB_SIZE)
    at_40 = run.at(40)
    assert all(torch.equal(v, run.model.state_dict()[k]) for k, v in at_40.state_dict().items())
    assert not torch.equal(run.at(20).head.weight, run.model.head.weight)
    with pytest.raises(ValueError, match="step must be one of"):
        run.at(30)
    with pytest.raises(ValueError, match="val must have shape"):
        experiment.pretrain(tokens, val[:, :10], causal=True, seed=0, steps=1)


def test_pretrain_returns_a_training_run():
    run = experiment.pretrain(
        corpus(64),
        corpus(16, seed=1),
        causal=True,
        seed=0,
        steps=2,
        eval_every=1,
        d_model=8,
        n_heads=2,
        n_layers=1,
        d_ff=8,
    )
    assert isinstance(run, training.Run) and run.history.steps == [1, 2]


def test_the_probe_standardises_on_the_training_features():
    x = 3.0 + 2.0 * torch.randn(200, 4, generator=gen(13))
    y = (x[:, 0] > 3.0).long()
    run = experiment.train_probe(x[:150], y[:150], x[150:], y[150:], seed=0, steps=50)
    assert isinstance(run, training.Run) and isinstance(run.model, torch.nn.Linear)
    by_hand = (x[150:] - x[:150].mean(0)) / (x[:150].std(0) + 1e-6)
    assert torch.allclose(run.standardize(x[150:]), by_hand)
    with torch.no_grad():
        expected = (run.model(by_hand).argmax(1) == y[150:]).float().mean().item()
    assert run.accuracy(x[150:], y[150:]) == pytest.approx(expected)
    assert run.history.final("val_accuracy") == run.accuracy(x[150:], y[150:])


def test_probe_accuracy_trains_on_train_validates_on_validation_and_tests_on_test():
    model = encoder(False)
    tokens = {
        name: corpus(40, seed=s) for name, s in (("train", 1), ("validation", 2), ("test", 3))
    }
    items = {name: experiment.probe_set(t) for name, t in tokens.items()}
    features = {
        name: experiment.probe_features(model, tokens[name], rows, cols)
        for name, (rows, cols, _) in items.items()
    }
    run = experiment.train_probe(
        features["train"], items["train"][2], features["validation"], items["validation"][2], seed=0
    )
    val, test = experiment.probe_accuracy(model, tokens, items, seed=0)
    assert val == run.history.final("val_accuracy")
    assert test == run.accuracy(features["test"], items["test"][2])


def test_difference_noise_is_k_standard_errors_of_a_difference_of_accuracies():
    assert experiment.difference_noise(0.9, 0.6, 100) == pytest.approx(
        3 * math.sqrt((0.9 * 0.1 + 0.6 * 0.4) / 100)
    )
    assert experiment.difference_noise(1.0, 0.0, 50) == 0.0
    assert experiment.difference_noise(0.5, 0.5, 100, standard_errors=2) == pytest.approx(
        2 * math.sqrt(0.5 / 100)
    )


def test_influence_by_side_by_hand():
    moved = torch.arange(16.0).view(4, 4)  # entry (i, j) = 4 i + j
    sides = experiment.influence_by_side(moved)
    assert sides["left"] == pytest.approx((4 + 8 + 9 + 12 + 13 + 14) / 6)
    assert sides["right"] == pytest.approx((1 + 2 + 3 + 6 + 7 + 11) / 6)
    assert sides["next"] == pytest.approx((1 + 6 + 11) / 3)
    causal = experiment.influence(encoder(True), corpus(8, min_pairs=10), gen(14))
    assert experiment.influence_by_side(causal)["right"] < 1e-6
