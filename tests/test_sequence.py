"""LF-MMI: forward-backward against brute-force path enumeration, its gradient against
autograd of the enumeration, numerator = denominator on a one-path graph, padding, the
phone n-gram denominator, and the non-finite guard."""
import itertools
import math

import numpy as np
import pytest
import torch

from training import sequence
from training.losses import IGNORE
from tests.test_sequence_recipe import ce_model  # noqa: F401 (a fixture: a CE-trained run)
from training.sequence import (Graph, NonFiniteSequenceError, PhoneNgram, SequenceCriterion,
                               alignment_logprob, chunk_graph, collapse, denominator_graph,
                               estimate_phone_ngram, expected_accuracy, graph_from_arcs,
                               log_partition, mmi_loss, numerator_graphs, phone_sequences,
                               scored_segments, smbr_loss, split_label_sequences)

torch.set_num_threads(1)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
LOG = math.log


def tiny_graph() -> Graph:
    """3 states, 3 labels, a self-loop on 1 and 2, a cycle back to 0, two initial and
    two final states with weights."""
    arcs = [(0, 1, 0, LOG(.6)), (0, 2, 1, LOG(.4)), (1, 1, 0, LOG(.5)), (1, 2, 2, LOG(.3)),
            (2, 2, 1, LOG(.7)), (2, 1, 2, LOG(.2)), (2, 0, 0, LOG(.1))]
    return graph_from_arcs(3, arcs, {0: 0.0, 1: LOG(.5)}, {1: LOG(.5), 2: 0.0})


def phone_loop_graph() -> Graph:
    """A state-labelled graph (the denominator's shape): a start and two phones, each
    with a self-loop, entered only by arcs labelled with its phone."""
    arcs = [(0, 1, 0, LOG(.7)), (0, 2, 1, LOG(.3)), (1, 1, 0, LOG(.6)), (1, 2, 1, LOG(.3)),
            (2, 2, 1, LOG(.5)), (2, 1, 0, LOG(.4))]
    return graph_from_arcs(3, arcs, {0: 0.0, 2: LOG(.2)}, {1: LOG(.1), 2: LOG(.1)})


GRAPHS = [("tiny", "arcs"), ("phone_loop", "arcs"), ("phone_loop", "dense")]


def make_graph(name: str) -> Graph:
    return tiny_graph() if name == "tiny" else phone_loop_graph()


def with_leak_arcs(g: Graph, leaky: float) -> Graph:
    """The leaky HMM written out as ordinary arcs: before a frame's arc a, any state may
    jump to src(a) with weight leaky * initial(src(a))."""
    arcs = [tuple(int(v) for v in (s, d, l)) + (float(w),) for s, d, l, w in
            zip(g.src[0], g.dst[0], g.label[0], g.weight[0])]
    init = g.initial[0]
    extra = [(s2, d, l, LOG(leaky) + float(init[s]) + w) for s, d, l, w in arcs
             for s2 in range(g.num_states) if math.isfinite(float(init[s]))]
    fin = {s: float(v) for s, v in enumerate(g.final[0]) if math.isfinite(float(v))}
    ini = {s: float(v) for s, v in enumerate(init) if math.isfinite(float(v))}
    return graph_from_arcs(g.num_states, arcs + extra, ini, fin)


def brute_logz(x: torch.Tensor, g: Graph) -> torch.Tensor:
    """log sum over every arc sequence of length T (x [T, C]) of its total weight."""
    src, dst, lab = g.src[0].tolist(), g.dst[0].tolist(), g.label[0].tolist()
    w, init, fin = g.weight[0], g.initial[0], g.final[0]
    terms = []
    for path in itertools.product(range(len(src)), repeat=x.shape[0]):
        if any(dst[a] != src[b] for a, b in zip(path, path[1:])):
            continue
        score = init[src[path[0]]] + fin[dst[path[-1]]]
        for t, a in enumerate(path):
            score = score + w[a] + x[t, lab[a]]
        terms.append(score)
    return torch.logsumexp(torch.stack(terms), 0)


def brute_expected_accuracy(x: torch.Tensor, reward: torch.Tensor, g: Graph) -> torch.Tensor:
    """Sum over paths of posterior(path) * sum_t reward[t, label of the arc at t]."""
    src, dst, lab = g.src[0].tolist(), g.dst[0].tolist(), g.label[0].tolist()
    w, init, fin = g.weight[0], g.initial[0], g.final[0]
    scores, accs = [], []
    for path in itertools.product(range(len(src)), repeat=x.shape[0]):
        if any(dst[a] != src[b] for a, b in zip(path, path[1:])):
            continue
        score = init[src[path[0]]] + fin[dst[path[-1]]]
        for t, a in enumerate(path):
            score = score + w[a] + x[t, lab[a]]
        scores.append(score)
        accs.append(sum(reward[t, lab[a]] for t, a in enumerate(path)))
    return (torch.softmax(torch.stack(scores), 0) * torch.stack(accs)).sum()


@pytest.mark.parametrize("leaky", [0.0, 0.1])
def test_expected_accuracy_and_its_gradient_equal_brute_force(leaky):
    g = phone_loop_graph()
    explicit = with_leak_arcs(g, leaky) if leaky else g
    gen = torch.Generator().manual_seed(15)
    x = (torch.randn(2, 4, 3, generator=gen, dtype=torch.float64) * 2).requires_grad_()
    reward = torch.rand(2, 4, 3, generator=gen, dtype=torch.float64)
    lengths = torch.tensor([4, 3])
    logz, acc = expected_accuracy(x, lengths, g, reward, leaky)
    assert torch.allclose(logz, log_partition(x, lengths, g, leaky).detach(), atol=1e-9)
    got, = torch.autograd.grad(acc.sum(), x)
    for b, n in enumerate(lengths.tolist()):
        ref = brute_expected_accuracy(x[b, :n], reward[b], explicit)
        assert abs(float(acc[b].detach()) - float(ref.detach())) < 1e-6
        g_ref, = torch.autograd.grad(ref, x)
        assert torch.allclose(got[b], g_ref[b], atol=1e-9)
    with pytest.raises(ValueError, match="state-labelled"):
        expected_accuracy(x, lengths, tiny_graph(), reward)


@pytest.mark.parametrize("name,method", GRAPHS)
@pytest.mark.parametrize("leaky", [0.0, 0.1])
def test_log_partition_equals_brute_force_enumeration(name, method, leaky):
    g = make_graph(name)
    explicit = with_leak_arcs(g, leaky) if leaky else g
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 3, generator=gen, dtype=torch.float64) * 2
    got = log_partition(x, torch.tensor([3, 3]), g, leaky, method=method)
    for b in range(2):
        assert abs(float(got[b]) - float(brute_logz(x[b], explicit))) < 1e-6


@pytest.mark.parametrize("name,method", GRAPHS)
@pytest.mark.parametrize("leaky", [0.0, 0.1])
def test_gradient_equals_autograd_of_brute_force(name, method, leaky):
    g = make_graph(name)
    explicit = with_leak_arcs(g, leaky) if leaky else g
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(1, 3, 3, generator=gen, dtype=torch.float64)).requires_grad_()
    logz = log_partition(x, torch.tensor([3]), g, leaky, method=method)
    got, = torch.autograd.grad(logz.sum(), x)
    ref, = torch.autograd.grad(brute_logz(x[0], explicit), x)
    assert torch.allclose(got, ref, atol=1e-9)
    # the gradient is an occupation posterior: one unit of mass per frame
    assert torch.allclose(got.sum(-1), torch.ones(1, 3, dtype=torch.float64))


def test_dense_form_only_for_state_labelled_graphs():
    assert tiny_graph().dense_form() is None  # state 1 is entered by labels 0 and 2
    trans, lab = phone_loop_graph().dense_form()
    assert lab.tolist() == [0, 0, 1] and abs(float(trans[1, 2]) - 0.3) < 1e-12
    den = denominator_graph(estimate_phone_ngram(_label_seqs(80, 6), 6, order=3, min_count=1))
    assert den.dense_form() is not None
    with pytest.raises(ValueError, match="state-labelled"):
        log_partition(torch.zeros(1, 2, 3), torch.tensor([2]), tiny_graph(), method="dense")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sparse_below", [0.0, 1.0])  # dense products / CSR ones on a CPU
def test_dense_and_arc_forward_backward_agree_on_the_denominator(device, sparse_below,
                                                                 monkeypatch):
    monkeypatch.setattr(sequence, "SPARSE_MAX_DENSITY", sparse_below)
    lm = estimate_phone_ngram(_label_seqs(80, 6, seed=12), 6, order=3, min_count=1)
    for den in (denominator_graph(lm), chunk_graph(denominator_graph(lm))):
        gen = torch.Generator().manual_seed(13)
        lengths = torch.tensor([9, 4, 6])
        for dtype, tol in ((torch.float64, 1e-9), (torch.float32, 1e-3)):
            x = (torch.randn(3, 9, 6, generator=gen, dtype=dtype) * 8).to(device)
            x.requires_grad_()
            out = {}
            for method in ("arcs", "dense"):
                z = log_partition(x, lengths, den, 0.1, method=method)
                out[method] = (z.detach(), torch.autograd.grad(z.sum(), x)[0])
            assert torch.allclose(out["arcs"][0], out["dense"][0], rtol=0, atol=tol)
            assert torch.allclose(out["arcs"][1], out["dense"][1], rtol=0, atol=tol)


@pytest.mark.parametrize("device", DEVICES)
def test_padded_batch_equals_one_sequence_at_a_time(device):
    lm = estimate_phone_ngram(_label_seqs(60, 6, seed=2), 6, order=3, min_count=1)
    den = chunk_graph(denominator_graph(lm))
    gen = torch.Generator().manual_seed(3)
    lengths = torch.tensor([7, 3, 5])
    x = torch.randn(3, 7, 6, generator=gen, dtype=torch.float64).to(device).requires_grad_()
    x_pad = x.detach().clone()
    x_pad[1, 3:] = float("nan")  # padding is never read
    x_pad.requires_grad_()
    batch = log_partition(x_pad, lengths, den, 0.1)
    grad, = torch.autograd.grad(batch.sum(), x_pad)
    for b, n in enumerate(lengths.tolist()):
        xs = x[b:b + 1, :n].detach().clone().requires_grad_()
        one = log_partition(xs, torch.tensor([n]), den, 0.1)
        g1, = torch.autograd.grad(one.sum(), xs)
        assert abs(float(batch[b].detach()) - float(one[0].detach())) < 1e-9
        assert torch.allclose(grad[b, :n], g1[0], atol=1e-10)
        assert float(grad[b, n:].abs().sum()) == 0.0


def test_flexible_numerator_sums_every_segmentation():
    """Phones [2, 0] over 4 frames: each split point k (phone 2 on frames < k) is a path
    weighted by the self-loops and the exit from phone 2."""
    loops = torch.log(torch.tensor([0.3, 0.5, 0.8], dtype=torch.float64))
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(1, 4, 3, generator=gen, dtype=torch.float64)
    g = numerator_graphs(torch.tensor([[2, 0]]), torch.tensor([2]), loops)
    terms = []
    for k in range(1, 4):
        s = x[0, :k, 2].sum() + x[0, k:, 0].sum()
        s = s + (k - 1) * loops[2] + torch.log1p(-loops[2].exp()) + (4 - k - 1) * loops[0]
        terms.append(s)
    assert abs(float(log_partition(x, torch.tensor([4]), g)[0])
               - float(torch.logsumexp(torch.stack(terms), 0))) < 1e-10


@pytest.mark.parametrize("device", DEVICES)
def test_numerator_equals_denominator_when_it_allows_only_the_reference(device):
    labels = torch.tensor([[1, 1, 0, 2, 2, 2]], device=device)
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(1, 6, 3, generator=gen, dtype=torch.float64).to(device)
    logits.requires_grad_()
    # flexible timing: the denominator is the utterance's own phone graph
    seqs, n = phone_sequences(labels, torch.tensor([6], device=device))
    assert seqs.tolist() == [[1, 0, 2]] and n.tolist() == [3]
    loops = torch.log(torch.tensor([0.4, 0.6, 0.5], dtype=torch.float64))
    den = numerator_graphs(seqs, n, loops)
    out = mmi_loss(logits, labels, den, numerator="flexible", loop_logprob=loops, leaky=0.0,
                   ce_weight=0.0)
    grad, = torch.autograd.grad(out.loss, logits)
    assert abs(out.objective) < 1e-12 and float(grad.abs().max()) < 1e-12
    # fixed alignment: the denominator is the one path through the frame labels
    chain = graph_from_arcs(7, [(t, t + 1, int(labels[0, t]), 0.0) for t in range(6)],
                            {0: 0.0}, {6: 0.0})
    out = mmi_loss(logits, labels, chain, numerator="alignment", leaky=0.0, ce_weight=0.0)
    grad, = torch.autograd.grad(out.loss, logits)
    assert abs(out.objective) < 1e-12 and float(grad.abs().max()) < 1e-12
    # sMBR on the one-path denominator: every frame is right, nothing to learn
    out = smbr_loss(logits, labels, chain, leaky=0.0, ce_weight=0.0)
    grad, = torch.autograd.grad(out.loss, logits)
    assert abs(out.objective - 1.0) < 1e-12 and float(grad.abs().max()) < 1e-12
    # a denominator with more paths puts mass elsewhere: the objective is then worse
    wider = denominator_graph(estimate_phone_ngram([np.array([1, 1, 0, 2, 2, 2])], 3))
    assert mmi_loss(logits, labels, wider, ce_weight=0.0).objective < 0
    assert smbr_loss(logits, labels, wider, ce_weight=0.0).objective < 1


def test_mmi_loss_gradient_with_regularisers():
    lm = estimate_phone_ngram(_label_seqs(40, 4, seed=6), 4)
    den = chunk_graph(denominator_graph(lm))
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(2, 5, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([[IGNORE, 1, 1, 3, IGNORE], [0, 0, 2, IGNORE, IGNORE]])
    loops = torch.from_numpy(lm.loop_logprob)
    # (sMBR's flexible reference, the numerator posteriors, is a target like CE's labels:
    # no gradient flows through it, so it is not the derivative of one function of z)
    for loss, numerator in ((mmi_loss, "alignment"), (mmi_loss, "flexible"),
                            (smbr_loss, "alignment")):
        def f(z):
            return loss(z, labels, den, numerator=numerator, loop_logprob=loops,
                        leaky=0.1, ce_weight=0.3, l2=0.01).loss
        assert torch.autograd.gradcheck(f, (logits,), eps=1e-6, atol=1e-6)


def test_scored_segments_and_the_alignment_numerator():
    logits = torch.arange(2 * 5 * 2, dtype=torch.float64).reshape(2, 5, 2)
    labels = torch.tensor([[IGNORE, 1, 0, IGNORE, IGNORE], [1, 1, 1, 0, IGNORE]])
    packed, lab, lengths = scored_segments(logits, labels)
    assert lengths.tolist() == [2, 4]
    assert torch.equal(packed[0, :2], logits[0, 1:3]) and torch.equal(packed[1], logits[1, :4])
    assert lab[0, :2].tolist() == [1, 0] and lab[1].tolist() == [1, 1, 1, 0]
    num = alignment_logprob(packed, lab, lengths)
    assert float(num[0]) == float(logits[0, 1, 1] + logits[0, 2, 0])
    with pytest.raises(ValueError, match="contiguous"):
        scored_segments(logits, torch.tensor([[0, IGNORE, 1, IGNORE, IGNORE]] * 2))


def test_non_finite_values_raise_naming_the_utterance():
    den = chunk_graph(denominator_graph(estimate_phone_ngram(_label_seqs(20, 3), 3)))
    logits = torch.zeros(2, 4, 3)
    logits[1, 2, 0] = float("nan")
    labels = torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(NonFiniteSequenceError, match="network outputs for utterance utt-b"):
        mmi_loss(logits, labels, den, utt_ids=["utt-a", "utt-b"], where="minibatch 17")
    with pytest.raises(NonFiniteSequenceError, match="minibatch 17"):
        mmi_loss(logits, labels, den, utt_ids=["utt-a", "utt-b"], where="minibatch 17")
    # a denominator that cannot emit 4 frames (a 2-arc chain, no leak) has no paths
    chain = graph_from_arcs(3, [(0, 1, 0, 0.0), (1, 2, 0, 0.0)], {0: 0.0}, {2: 0.0})
    with pytest.raises(NonFiniteSequenceError, match="denominator log-likelihood for "
                                                     "utterance row 0"):
        mmi_loss(torch.zeros(1, 4, 3), torch.zeros(1, 4, dtype=torch.long), chain, leaky=0.0)
    # NaN past a sequence's scored frames is padding, not an error
    ok = torch.zeros(1, 4, 3)
    ok[0, 3] = float("nan")
    mmi_loss(ok, torch.tensor([[0, 0, 1, IGNORE]]), den, ce_weight=0.0)


def test_phone_ngram_is_normalised_and_has_no_repeats():
    seqs = _label_seqs(200, 8, seed=8)
    for order in (2, 3, 4):
        lm = estimate_phone_ngram(seqs, 8, order=order, min_count=2)
        g = denominator_graph(lm)
        out = torch.zeros(g.num_states, dtype=torch.float64).index_add(
            0, g.src[0], g.weight[0].exp()) + g.final[0].exp()
        assert torch.allclose(out, torch.ones_like(out)), order  # every state sums to one
        last = [h[-1] for h in lm.histories]
        assert all(not math.isfinite(lm.logprob[i, q]) for i, q in enumerate(last) if q < 8)
        assert lm.histories[0] == (8,)  # the start
    bigram = denominator_graph(estimate_phone_ngram(seqs, 8, order=2))
    assert (bigram.num_states, bigram.num_arcs) == (9, 8 + 8 * 7 + 8)
    pruned = estimate_phone_ngram(seqs, 8, order=3, min_count=10 ** 6)
    assert len(pruned.histories) == 9  # every trigram history pruned: the bigram's states
    kept = estimate_phone_ngram(seqs, 8, order=3, min_count=1)
    assert len(kept.histories) > 9


def test_phone_ngram_follows_the_counts_and_round_trips():
    # phone 0 is followed by 1 nine times out of ten
    seqs = [np.repeat([0, 1, 2], 3)] * 9 + [np.repeat([0, 2], 2)]
    lm = estimate_phone_ngram(seqs, 3)
    p0 = np.exp(lm.logprob[lm.histories.index((0,))])
    assert p0[1] > 0.75 and p0[1] > 3 * p0[2] and p0[0] == 0.0
    # self-loops: phone 0 lasts 3 frames nine times, 2 frames once: 1 - 10/29
    assert abs(math.exp(lm.loop_logprob[0]) - (1 - 10 / 29)) < 1e-12
    back = PhoneNgram.from_dict(lm.to_dict())
    assert back.histories == lm.histories and np.array_equal(back.logprob, lm.logprob)
    assert np.array_equal(back.next_state, lm.next_state)
    with pytest.raises(ValueError, match="order"):
        estimate_phone_ngram(seqs, 3, order=1)
    with pytest.raises(ValueError, match="out of range"):
        estimate_phone_ngram([np.array([0, 5])], 3)


def test_chunk_graph_starts_anywhere_and_ends_anywhere():
    g = chunk_graph(denominator_graph(estimate_phone_ngram(_label_seqs(50, 5), 5)))
    assert abs(float(g.initial.exp().sum()) - 1.0) < 1e-9
    assert float(g.initial[0, 0].exp()) < 0.05  # the start state is left after one frame
    assert float(g.final.abs().max()) == 0.0


def test_phone_sequences_collapse_like_numpy():
    gen = np.random.default_rng(9)
    labels = torch.from_numpy(gen.integers(0, 3, size=(4, 12)))
    lengths = torch.tensor([12, 5, 1, 9])
    seqs, n = phone_sequences(labels, lengths)
    for b in range(4):
        ref = collapse(labels[b, :lengths[b]].numpy())
        assert seqs[b, :n[b]].tolist() == ref.tolist()


@pytest.mark.parametrize("criterion,numerator,gain", [("mmi", "flexible", 0.5),
                                                      ("smbr", "alignment", 0.2),
                                                      ("smbr", "flexible", 0.2)])
def test_criterion_trains_a_linear_model(criterion, numerator, gain):
    """LF-MMI / LF-sMBR with their regularisers fit a learnable task: the objective rises."""
    from types import SimpleNamespace

    tc = SimpleNamespace(criterion=criterion, den_ngram_order=2, den_min_count=1,
                         sequence_numerator=numerator, leaky_hmm=0.1, sequence_ce_weight=0.1,
                         sequence_l2=5e-5, sequence_prior_scale=0.0, sequence_am_scale=1.0)
    seqs = _label_seqs(30, 5, seed=10)
    crit = SequenceCriterion.from_labels(seqs, 5, tc)
    gen = torch.Generator().manual_seed(11)
    means = torch.randn(5, 8, generator=gen)
    t = max(len(s) for s in seqs)
    labels = torch.full((len(seqs), t), IGNORE)
    for i, s in enumerate(seqs):
        labels[i, :len(s)] = torch.from_numpy(s)
    x = means[labels.clamp_min(0)] + 0.8 * torch.randn(len(seqs), t, 8, generator=gen)
    lin = torch.nn.Linear(8, 5)
    opt = torch.optim.Adam(lin.parameters(), lr=0.05)
    first = None
    for _ in range(40):
        opt.zero_grad()
        out = crit(lin(x), labels, chunked=False)
        out.loss.backward()
        opt.step()
        first = out.objective if first is None else first
    assert out.objective > first + gain
    assert out.correct / out.frames > 0.8
    assert crit.graph_size() == {"states": 6, "arcs": 30, "order": 2}


def _label_seqs(n: int, num_phones: int, seed: int = 0) -> list[np.ndarray]:
    """Frame labels of random phone sequences (no repeats, 1..4 frames each)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        phones, prev = [], -1
        while len(phones) < rng.integers(2, 7):
            p = int(rng.integers(num_phones))
            if p != prev:
                phones.append(p)
                prev = p
        out.append(np.repeat(phones, rng.integers(1, 5, size=len(phones))))
    return out


def test_bench_graph_sizes_grow_with_the_order():
    from bench.sequence import _graph_sizes

    rows = _graph_sizes(_label_seqs(100, 6, seed=14), 6, min_count=2)
    assert [r["order"] for r in rows] == [2, 3, 4]
    assert rows[0]["states"] == 7 and rows[0]["arcs"] == 6 * 6 + 6
    assert rows[0]["states"] < rows[1]["states"] <= rows[2]["states"]
    assert all(r["dense"] for r in rows)


@pytest.mark.parametrize("criterion", ["mmi", "smbr"])
def test_criterion_on_the_loaders_chunk_and_full_minibatches(tmp_path, criterion):
    """What the recipe will do: the denominator from the labeled split's labels, then
    chunked minibatches (context frames unscored) and whole utterances through the
    student; finite losses and gradients."""
    from core.config import load_config
    from core.storage import Storage, join
    from amflow.services.synthetic_run import make_synthetic_run
    from training.data import BatchLoader, Normalizer, PassSpec, SplitIndex
    from training.models import StudentLSTM

    st = Storage()
    root = str(tmp_path / "runs" / "r")
    info = make_synthetic_run(st, root, num_classes=6, splits={"labeled": {"utts": 12,
                                                                           "parts": 1}})
    index = SplitIndex.load(st, info["splits"]["labeled"], "labels")
    norm = Normalizer.from_stats(st.read_json(join(root, "features", "cmvn.json")),
                                 index.feat_dim)
    full = PassSpec(mode="full", shuffle=False, minibatch_frames=400)
    seqs = split_label_sequences(st, info["splits"]["labeled"])
    from_loader = [row[:n].numpy() for b in BatchLoader(st, index, full, norm)
                   for row, n in zip(b.labels, b.lengths.tolist())]
    assert sorted(map(tuple, seqs)) == sorted(map(tuple, from_loader))
    tc = load_config(None, ["train.regime=sequence", f"train.criterion={criterion}",
                            "train.den_ngram_order=3",
                            "train.sequence_numerator=flexible"]).train
    crit = SequenceCriterion.from_labels(seqs, 6, tc.sequence)
    torch.manual_seed(0)
    model = StudentLSTM(index.feat_dim, 16, 1, 6, lookahead=2)
    chunks = PassSpec(mode="chunk", chunk_frames=8, left_context=3, right_context=2,
                      minibatch_frames=64)
    for spec, chunked in ((chunks, True), (full, False)):
        batch = next(iter(BatchLoader(st, index, spec, norm)))
        model.zero_grad()
        out = crit(model(batch.x), batch.labels, chunked=chunked)
        out.loss.backward()
        assert out.frames == batch.frames and math.isfinite(float(out.loss.detach()))
        grads = [p.grad for p in model.parameters()]
        assert all(bool(torch.isfinite(g).all()) for g in grads)
        assert any(float(g.abs().sum()) > 0 for g in grads)


@pytest.mark.parametrize("device", DEVICES)
def test_estimation_and_gradients_are_deterministic(device):
    """A resumed run repeats its steps bit for bit: the denominator does not depend on
    the order of the utterances, and the same minibatch gives the same gradient."""
    seqs = _label_seqs(60, 7, seed=16)
    a = estimate_phone_ngram(seqs, 7, order=3, min_count=2)
    b = estimate_phone_ngram(seqs[::-1], 7, order=3, min_count=2)
    assert a.histories == b.histories and np.array_equal(a.logprob, b.logprob)
    assert np.array_equal(a.loop_logprob, b.loop_logprob)
    den = chunk_graph(denominator_graph(a))
    gen = torch.Generator().manual_seed(17)
    logits = torch.randn(4, 10, 7, generator=gen).to(device).requires_grad_()
    labels = torch.from_numpy(np.stack([np.resize(s, 10) for s in seqs[:4]])).to(device)
    for loss in (mmi_loss, smbr_loss):
        grads = [torch.autograd.grad(loss(logits, labels, den).loss, logits)[0]
                 for _ in range(2)]
        assert torch.equal(grads[0], grads[1])


def test_expected_accuracy_same_with_dense_and_sparse_products(monkeypatch):
    lm = estimate_phone_ngram(_label_seqs(80, 6, seed=18), 6, order=3, min_count=1)
    gen = torch.Generator().manual_seed(19)
    x = (torch.randn(2, 7, 6, generator=gen, dtype=torch.float64) * 3).requires_grad_()
    reward = torch.rand(2, 7, 6, generator=gen, dtype=torch.float64)
    out = []
    for sparse_below in (0.0, 1.0):
        monkeypatch.setattr(sequence, "SPARSE_MAX_DENSITY", sparse_below)
        den = chunk_graph(denominator_graph(lm))
        logz, acc = expected_accuracy(x, torch.tensor([7, 5]), den, reward, 0.1)
        out.append((logz.detach(), acc.detach(), torch.autograd.grad(acc.sum(), x)[0]))
    assert float((den.dense[0] != 0).double().mean()) < 0.2  # the CSR path was taken
    for a, b in zip(*out):
        assert torch.allclose(a, b, atol=1e-10)


# ----------------------------------------------------------------- the model chosen on dev
def _rows(errors: list[int], words: int = 10) -> list[dict]:
    return [{"utt_id": f"u{i:02d}", "errors": e, "ref_words": words}
            for i, e in enumerate(errors)]


def _score(errors: list[int], acwt: float = 0.3) -> dict:
    rows = _rows(errors)
    return {"wer": sum(errors) / (10 * len(errors)), "acwt": acwt, "rows": rows,
            "tuning": [{"acwt": acwt, "wer": sum(errors) / (10 * len(errors))}]}


def test_the_lowest_dev_wer_wins_and_the_ce_model_wins_ties():
    from amflow.steps.sequence import choose, summarize

    assert choose([{"wer": 0.2}, {"wer": 0.2}, {"wer": 0.25}]) == 0  # a tie keeps CE
    assert choose([{"wer": 0.2}, {"wer": 0.15}, {"wer": 0.15}]) == 1  # earliest epoch
    names = [("ce", "ce.pt"), ("epoch 1", "e1.pt"), ("epoch 2", "model.pt")]
    # epoch 1 is better on every utterance; epoch 2 (the last) is worse than CE
    sel = summarize(names, [_score([3] * 30), _score([1] * 30), _score([4] * 30)], "dev")
    assert (sel["chosen"], sel["chosen_epoch"], sel["epochs"]) == ("epoch 1", 1, 2)
    assert sel["rule"] == "dev_wer" and sel["utterances"] == 30
    assert sel["delta"] == pytest.approx(-0.2) and sel["last_delta"] == pytest.approx(0.1)
    assert sel["significant"] and sel["p_mapsswe"] < 0.05
    assert [c["wer"] for c in sel["candidates"]] == pytest.approx([0.3, 0.1, 0.4])
    # every epoch worse: the CE model is shipped, no test to pass
    sel = summarize(names, [_score([2] * 30), _score([2] * 29 + [3]), _score([5] * 30)], "dev")
    assert sel["chosen"] == "ce" and sel["delta"] == 0.0 and not sel["significant"]


def test_an_epoch_ships_only_when_its_dev_gain_passes_the_paired_test():
    """The 2026-12-07 demo's case: an epoch a little lower on dev, by errors that move both
    ways between utterances (p well above 0.05), is not shipped: the CE model is, and the
    summary names the rejected epoch with its p. A gain on every utterance passes."""
    from amflow.steps.sequence import choose, summarize
    from tasks.report import render_sequence_choice, sequence_choice_rows

    names = [("ce", "ce.pt"), ("epoch 1", "e1.pt"), ("epoch 2", "model.pt")]
    ce = [2, 3] * 30  # 60 utterances, 150 errors
    noisy = [1, 4] * 28 + [1, 3, 1, 3]  # 148 errors: 2 fewer, half the utterances worse
    worse = [3, 3] * 30
    scores = [_score(ce), _score(noisy), _score(worse)]
    assert choose(scores, alpha=1.0) == 1  # the lowest, however small its gain
    assert choose(scores, alpha=0.05) == 0
    sel = summarize(names, scores, "dev", alpha=0.05)
    assert sel["chosen"] == "ce" and sel["delta"] == 0.0 and sel["alpha"] == 0.05
    rej = sel["rejected"]
    assert (rej["name"], rej["epoch"]) == ("epoch 1", 1) and rej["p_mapsswe"] > 0.05
    assert rej["delta"] == pytest.approx(-2 / 600)
    row = sequence_choice_rows({"ssl": sel})
    assert "| SSL | CE model (epoch 1 was -0.33 on dev, p = " in render_sequence_choice(row)
    # a gain on every utterance passes: shipped, nothing rejected
    sel = summarize(names, [_score(ce), _score([1, 2] * 30), _score(worse)], "dev", 0.05)
    assert sel["chosen"] == "epoch 1" and sel["significant"] and "rejected" not in sel
    # the significant epoch wins over a lower one the test rejects
    scores = [_score(ce), _score([2, 2, 2, 3] * 15), _score([0, 8, 0, 0] * 15)]  # 135, 120
    assert scores[2]["wer"] < scores[1]["wer"] and choose(scores, 0.05) == 1
    sel = summarize(names, scores, "dev", 0.05)
    assert sel["chosen"] == "epoch 1" and sel["rejected"]["name"] == "epoch 2"
    # frame errors (dev_frames) have no rows to test: the lowest wins
    assert choose([{"wer": 0.2}, {"wer": 0.19}], alpha=0.05) == 1


def test_dev_subset_is_fixed_whatever_the_order(monkeypatch):
    from types import SimpleNamespace

    from amflow.steps import sequence as step

    recs = [SimpleNamespace(utt_id=f"utt{i}") for i in range(20)]
    monkeypatch.setattr(step.D, "split_records", lambda st, c, s: (list(recs), []))
    ctx = SimpleNamespace(storage=None)
    a = step.dev_subset(ctx, "c", "dev", 7)
    recs.reverse()
    b = step.dev_subset(ctx, "c", "dev", 7)
    assert [r.utt_id for r in a] == [r.utt_id for r in b] and len(a) == 7
    assert len(step.dev_subset(ctx, "c", "dev", 0)) == 20
    monkeypatch.setattr(step.D, "split_records", lambda st, c, s: ([], []))
    with pytest.raises(Exception, match="sequence_select=last"):
        step.dev_subset(ctx, "c", "dev", 7)


def _train_sequence(local_cfg, *sets):
    from core.runs import StepContext
    from amflow.steps import sequence as step
    from tests.test_sequence_recipe import SEQUENCE
    from tests.test_train import TINY

    return step.run(StepContext(local_cfg(*TINY, *SEQUENCE, *sets), "r", "sequence"), None)


@pytest.mark.parametrize("winner", [0, 1])
def test_the_model_dev_chose_is_shipped_ce_model_included(ce_model, local_cfg, tmp_path,
                                                          monkeypatch, winner):
    """model.pt is the winner's bytes: the CE model's own when CE wins; the epochs are kept
    beside it, each decodable (with model.pt's priors)."""
    from core.storage import Storage
    from amflow.steps import sequence as step
    from training.checkpoint import load_model

    seen = []

    def fake_scores(ctx, candidates, result):
        seen.extend(candidates)
        return [_score([3 if i == winner else 4] * 12) for i in range(len(candidates))], "dev"

    monkeypatch.setattr(step, "dev_scores", fake_scores)
    run = tmp_path / "store" / "runs" / "r"
    last = None
    if winner == 1:  # the last epoch's own model, for comparison: trained once unchosen
        last = _train_sequence(local_cfg, "train.sequence_select=last", "train.tag=plain",
                               "train.init_model=" + ce_model["metrics"]["model_uri"])
        assert last["metrics"]["selection"] == {"rule": "last", "chosen_epoch": 2, "epochs": 2}
    out = _train_sequence(local_cfg)
    sel = out["metrics"]["selection"]
    assert [n for n, _ in seen] == ["ce", "epoch 1", "epoch 2"]
    assert sel["chosen_epoch"] == winner and sel["chosen"] == seen[winner][0]
    shipped = (run / "sequence-base" / "model.pt").read_bytes()
    if winner == 0:
        assert shipped == (run / "train-base" / "model.pt").read_bytes()
    else:
        assert shipped == (run / "sequence-base" / "epochs" / "epoch-1.pt").read_bytes()
        assert load_model(Storage(), str(run / "sequence-base" / "model.pt"))[1]["priors"]
    if last is not None:  # training itself is unchanged by the choice
        a = load_model(Storage(), last["metrics"]["model_uri"])[0].state_dict()
        b = load_model(Storage(), str(run / "sequence-base" / "epochs" / "epoch-2.pt"))[0]
        assert all(torch.equal(a[k], v) for k, v in b.state_dict().items())


def test_without_an_lm_the_choice_falls_back_to_dev_frame_error(ce_model, local_cfg):
    sel = _train_sequence(local_cfg)["metrics"]["selection"]
    assert sel["rule"] == "dev_frames" and sel["split"] == "dev" and sel["epochs"] == 2
    wers = [c["wer"] for c in sel["candidates"]]
    assert sel["chosen_wer"] == min(wers) and sel["chosen_index"] == wers.index(min(wers))
    assert sel["ce_wer"] == pytest.approx(1 - ce_model["metrics"]["dev_frame_acc"])


def test_report_row_names_the_shipped_model():
    from tasks.report import render_sequence_choice, sequence_choice_rows, sequence_section

    rows = sequence_choice_rows({
        "baseline": {"rule": "dev_wer", "chosen_epoch": 2, "epochs": 3, "ce_wer": 0.22,
                     "chosen_wer": 0.2, "delta": -0.02, "p_mapsswe": 0.04, "last_wer": 0.23},
        "ssl": {"rule": "dev_wer", "chosen_epoch": 0, "epochs": 3, "ce_wer": 0.17,
                "chosen_wer": 0.17, "delta": 0.0, "p_mapsswe": 1.0, "last_wer": 0.19},
        "teacher": None})
    assert [r["model"] for r in rows] == ["baseline", "ssl"]
    md = render_sequence_choice(rows)
    assert "| baseline | epoch 2 of 3 | 22.0 | 20.0 | -2.00 | 0.04 | 23.0 |" in md
    assert "| SSL | CE model (dev rejected every epoch) | 17.0 | 17.0 | +0.00 | 1 | 19.0 |" in md
    # a step from before the choice: its last epoch, said to be unchosen
    old = sequence_choice_rows({"ssl": {}})
    assert "not chosen on dev" in render_sequence_choice(old)
    assert "Chosen on dev" in "\n".join(sequence_section([], rows))
    assert "Chosen on dev" not in "\n".join(sequence_section([], []))


# ----------------------------------------------------------------- smoothing
@pytest.mark.parametrize("loss", [mmi_loss, smbr_loss])
def test_smoothing_weights_zero_is_the_sequence_loss_and_kd_moves_the_gradient(loss):
    lm = estimate_phone_ngram(_label_seqs(40, 4, seed=20), 4)
    den = chunk_graph(denominator_graph(lm))
    gen = torch.Generator().manual_seed(21)
    logits = torch.randn(2, 6, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    ref = torch.randn(2, 6, 4, generator=gen, dtype=torch.float64)
    labels = torch.tensor([[IGNORE, 1, 1, 3, 0, IGNORE], [0, 0, 2, 2, IGNORE, IGNORE]])

    def grad(**kw):
        out = loss(logits, labels, den, **kw)
        return out, torch.autograd.grad(out.loss, logits)[0]

    plain, g_plain = grad(ce_weight=0.0, l2=0.0)
    assert float(plain.loss.detach()) == -plain.objective  # no smoothing: the criterion alone
    off, g_off = grad(ce_weight=0.0, l2=0.0, kd_weight=0.0, ref_logits=ref)
    assert float(off.loss.detach()) == float(plain.loss.detach())
    assert torch.equal(g_off, g_plain)
    assert off.kd == 0.0
    # the CE term (train.sequence_ce_weight) and the KD term each add their gradient
    ce, g_ce = grad(ce_weight=0.5, l2=0.0)
    assert not torch.allclose(g_ce, g_plain)
    kd, g_kd = grad(ce_weight=0.0, l2=0.0, kd_weight=0.7, ref_logits=ref)
    term = sequence.reference_ce(logits, ref, labels)
    expected = float(plain.loss.detach()) + 0.7 * float(term.detach())
    assert float(kd.loss.detach()) == pytest.approx(expected)
    g_term, = torch.autograd.grad(term, logits)
    assert torch.allclose(g_kd, g_plain + 0.7 * g_term, atol=1e-12)
    assert float(g_term.abs().max()) > 1e-3 and float(g_term[labels == IGNORE].abs().max()) == 0
    # against its own posteriors (the step's first minibatch) the KD term pulls nowhere
    same, = torch.autograd.grad(sequence.reference_ce(logits, logits.detach(), labels), logits)
    assert float(same.abs().max()) < 1e-12


def test_kd_smoothing_keeps_the_sequence_model_nearer_the_ce_model(ce_model, local_cfg):
    from core.storage import Storage
    from training.checkpoint import load_model

    init = "train.init_model=" + ce_model["metrics"]["model_uri"]
    ce = load_model(Storage(), ce_model["metrics"]["model_uri"])[0].state_dict()

    def distance(kd: float) -> float:
        out = _train_sequence(local_cfg, init, "train.sequence_select=last",
                              f"train.sequence_kd_weight={kd}", f"train.tag=kd{kd}",
                              "train.lr=0.01", "train.final_lr=0.01")
        m = load_model(Storage(), out["metrics"]["model_uri"])[0].state_dict()
        return sum(float((m[k] - ce[k]).pow(2).sum()) for k in ce) ** 0.5

    near, far = distance(20.0), distance(0.0)  # 2.9 and 5.3 when written
    assert near < 0.8 * far


# ----------------------------------------------------------------- pseudo-labeled utterances
@pytest.mark.parametrize("loss", [mmi_loss, smbr_loss])
def test_confidence_weights_scale_each_utterances_objective(loss):
    lm = estimate_phone_ngram(_label_seqs(40, 4, seed=22), 4)
    den = chunk_graph(denominator_graph(lm))
    gen = torch.Generator().manual_seed(23)
    logits = torch.randn(2, 6, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([[0, 0, 1, 3, 3, IGNORE], [2, 2, 1, 1, IGNORE, IGNORE]])
    kw = dict(ce_weight=0.0, l2=0.0)
    rows = [loss(logits[i:i + 1], labels[i:i + 1], den, **kw).objective for i in range(2)]
    frames = [5, 4]
    both = loss(logits, labels, den, weights=torch.tensor([0.9, 0.3]), **kw)
    assert both.objective == pytest.approx((0.9 * rows[0] * 5 + 0.3 * rows[1] * 4) / 9)
    assert loss(logits, labels, den, **kw).objective == pytest.approx(
        sum(r * f for r, f in zip(rows, frames)) / 9)
    none = loss(logits, labels, den, weights=torch.tensor([1.0, 0.0]), **kw)
    g, = torch.autograd.grad(none.loss, logits)
    assert float(g[1].abs().max()) == 0.0 and float(g[0].abs().max()) > 0


def test_pseudo_references_and_confidences(tmp_path):
    import pyarrow as pa

    from core.runs import StepError
    from core.storage import Storage

    topk = torch.tensor([[[3, 1], [2, 0], [1, 2]]])
    mask = torch.tensor([[True, True, False]])
    assert sequence.pseudo_references(topk, mask).tolist() == [[3, 2, IGNORE]]
    st, step = Storage(), str(tmp_path / "pseudolabel")
    with pytest.raises(StepError, match="amflow pseudolabel"):
        sequence.pseudolabel_confidences(st, step)
    st.write_json(f"{step}/_SUCCESS.json", {})
    st.write_parquet(f"{step}/labels/part-0.parquet", pa.table(
        {"utt_id": ["a", "b", "c"], "confidence": [0.9, 0.2, 0.7], "kept": [True, False, True],
         "text": ["x", "y", "z"]}))
    assert sequence.pseudolabel_confidences(st, step) == {"a": 0.9, "c": 0.7}


def test_sequence_training_on_pseudo_labeled_utterances(tmp_path, local_cfg):
    """train.pseudolabels with the sequence recipe: each epoch an unlabeled pass over the
    kept utterances (top-1 teacher targets as references), then the labeled pass."""
    import json

    import pyarrow as pa

    from core.runs import StepContext
    from core.storage import Storage, join
    from amflow.steps import train as train_step
    from tests.test_sequence_recipe import STUDENT
    from tests.test_train import TINY
    from amflow.services.synthetic_run import make_synthetic_run

    st = Storage()
    run = join(str(tmp_path / "store"), "runs", "r")
    info = make_synthetic_run(st, run, noise=2.5, splits={
        "labeled": {"utts": 24, "parts": 1}, "dev": {"utts": 8, "parts": 1},
        "unlabeled": {"utts": 16, "parts": 1, "soft_k": 3}})
    train_step.run(StepContext(local_cfg(*TINY, *STUDENT), "r", "train"), None)
    utts = st.read_parquet(info["splits"]["unlabeled"][0], columns=["utt_id"]).column(0)
    utts = utts.to_pylist()
    step = join(run, "pseudolabel")
    st.write_json(join(step, "_SUCCESS.json"), {})
    st.write_parquet(join(step, "labels", "part-0.parquet"), pa.table(
        {"utt_id": utts, "confidence": [0.5 + i / 100 for i in range(len(utts))],
         "kept": [i % 2 == 0 for i in range(len(utts))]}))
    out = _train_sequence(local_cfg, "train.pseudolabels=r", "train.sequence_select=last")
    records = [json.loads(line) for line in
               st.read_text(join(run, "sequence-base", "metrics.jsonl")).splitlines()]
    kinds = {r["data"] for r in records if r["kind"] == "train"}
    assert kinds == {"labeled", "unlabeled"}
    unl = sum(r["frames"] for r in records if r["kind"] == "train" and r["data"] == "unlabeled")
    assert 0 < unl and np.isfinite(out["metrics"]["final_smbr_objective"])
    # the 8 utterances the pseudolabel step dropped are the step's rejects
    assert (out["counts"]["in"], out["counts"]["out"]) == (24 + 16, 24 + 8)
    assert out["counts"]["rejected"] == 8


def test_epochs_are_tuned_around_the_ce_models_acwt():
    from amflow.steps.sequence import acwt_near

    grid = [0.2, 0.3, 0.4, 0.5, 0.7]
    assert acwt_near(grid, 0.4) == [0.3, 0.4, 0.5]
    assert acwt_near(grid, 0.2) == [0.2, 0.3] and acwt_near(grid, 0.7) == [0.5, 0.7]
    assert acwt_near([0.5, 0.3], 0.5) == [0.3, 0.5] and acwt_near([0.3], 0.3) == [0.3]


def test_score_on_dev_tunes_acwt_like_decode(monkeypatch):
    """Each acwt of the grid searched over the same scored utterances; the WER is the best
    one's (the first on ties), with its per-utterance rows."""
    from types import SimpleNamespace

    from amflow.steps import sequence as step

    recs = [SimpleNamespace(utt_id=f"u{i}", text="a b", condition="DP1") for i in range(4)]

    class Worker:
        def __init__(self, *args, **kwargs):
            self.scored = 0

        def score(self, records):
            self.scored += 1
            return {"utts": [(r, None) for r in records]}

        def search(self, utts, acwt):  # right words at 0.3 and 0.5, one word wrong elsewhere
            words = ["a", "b"] if acwt in (0.3, 0.5) else ["a", "c"]
            return {"hyps": [(r, words, True) for r, _ in utts]}

    assets = SimpleNamespace(model_bytes=b"", graph_dir="", log_prior=None, lexicon={"a", "b"})
    monkeypatch.setattr(step, "load_assets", lambda ctx, uri, corpus: assets)
    monkeypatch.setattr(step.D, "DecodeWorker", Worker)
    ctx = SimpleNamespace(cfg=SimpleNamespace(decode=SimpleNamespace(beam=13.0, max_active=7000),
                                              storage=None))
    out = step.score_on_dev(ctx, "m.pt", "c", recs, [0.2, 0.3, 0.5])
    assert out["acwt"] == 0.3 and out["wer"] == 0.0
    assert [t["wer"] for t in out["tuning"]] == [0.5, 0.0, 0.0]
    assert [r["utt_id"] for r in out["rows"]] == ["u0", "u1", "u2", "u3"]
    assert all(r["errors"] == 0 and r["ref_words"] == 2 for r in out["rows"])


def test_report_says_which_model_each_sequence_step_shipped(local_cfg):
    """The report's sequence section: the test WER of the shipped model beside CE, and per
    model the dev choice its sequence step recorded (here the SSL student's CE model)."""
    from core.runs import StepContext
    from amflow.steps.report import run
    from tests.test_report import _decode, _eval

    cfg = local_cfg("report.teacher_run=t1")
    t, ssl = StepContext(cfg, "t1", "evaluate-teacher"), StepContext(cfg, "s1", "evaluate")
    for ctx, rels in ((t, ("evaluate-baseline", "decode-baseline", "decode-sequence-baseline")),
                      (ssl, ("evaluate", "decode", "decode-sequence"))):
        for rel, value in zip(rels, (_eval(0.8), _decode(0.2), _decode(0.2))):
            ctx.storage.write_json(ctx.other(rel, "result.json"), value)
    done = {"run_id": "t1", "step": "sequence-baseline", "wall_s": 1.0, "counts": {}}
    t.storage.write_json(t.other("sequence-baseline", "_SUCCESS.json"), {**done, "metrics": {}})
    ssl.storage.write_json(ssl.other("sequence", "_SUCCESS.json"), {
        **done, "run_id": "s1", "step": "sequence", "metrics": {"selection": {
        "rule": "dev_wer", "chosen_epoch": 0, "epochs": 3, "ce_wer": 0.17, "chosen_wer": 0.17,
        "delta": 0.0, "p_mapsswe": 1.0, "last_wer": 0.19}}})
    out = run(StepContext(cfg, "s1", "report"))
    md = ssl.storage.read_text(ssl.other("report", "report.md"))
    assert "| SSL | CE model (dev rejected every epoch) | 17.0 | 17.0 | +0.00 | 1 | 19.0 |" in md
    assert "| baseline | last epoch (not chosen on dev) |" in md
    rows = ssl.storage.read_json(ssl.other("report", "report.json"))["sequence_choice"]
    assert [r["model"] for r in rows] == ["baseline", "ssl"] and out["metrics"]


@pytest.mark.slow  # the tiny corpus (~20 s, once per session), as test_decoding's
def test_dev_wer_decodes_each_candidate_with_the_runs_graph(tiny_corpus, local_cfg):
    """The real path, end to end on the tiny corpus: the run's LM, the graph built (and
    cached) from it, each candidate's features, forward pass and searches on a fixed
    subset of dev; the choice, its rows and paired test."""
    from core.config import FeaturesConfig, features_dict
    from core.runs import StepContext
    from decoding import lexicon as L
    from decoding import lm
    from amflow.steps import sequence as step
    from training.checkpoint import save_model
    from training.models import StudentLSTM

    cfg = local_cfg(f"data.corpus={tiny_corpus}", "decode.acwt=[0.2, 0.5, 1.0]",
                    "train.sequence_select_utts=3", "decode.beam=8", "decode.max_active=200")
    ctx = StepContext(cfg, "r", "sequence")
    lex = L.read_lexicon((tiny_corpus / "lexicon.txt").read_text())
    arpa = lm.estimate(lm.generator_sentences(500, 5), 3, vocabulary=lex.prons).to_arpa()
    ctx.storage.write_text(ctx.other("lm", "lm.arpa"), arpa)
    phones = [p.strip() for p in (tiny_corpus / "phones.txt").read_text().splitlines()]
    fcfg = FeaturesConfig()
    dim = fcfg.num_mel_bins * fcfg.stack
    cmvn = {"count": 1, "sum": [0.0] * fcfg.num_mel_bins, "sumsq": [100.0] * fcfg.num_mel_bins}
    uris = []
    for seed in range(2):
        torch.manual_seed(seed)
        uri = ctx.path(f"m{seed}.pt")
        save_model(ctx.storage, uri, StudentLSTM(dim, 8, 1, len(phones), lookahead=1),
                   cmvn=cmvn, phones=phones, features=features_dict(fcfg))
        step.attach_priors(ctx.storage, uri, np.ones(len(phones)), "uniform")
        uris.append(uri)
    candidates = [("ce", uris[0]), ("epoch 1", uris[1])]
    scores, split = step.dev_scores(ctx, candidates, {"metrics": {}})
    assert split == "dev" and len(scores) == 2
    assert [t["acwt"] for t in scores[0]["tuning"]] == [0.2, 0.5, 1.0]
    around = step.acwt_near([0.2, 0.5, 1.0], scores[0]["acwt"])  # the CE model's best
    assert [t["acwt"] for t in scores[1]["tuning"]] == around
    for s in scores:
        assert len(s["rows"]) == 3 and 0.0 <= s["wer"] and s["acwt"] in (0.2, 0.5, 1.0)
        assert s["wer"] == pytest.approx(sum(r["errors"] for r in s["rows"])
                                         / sum(r["ref_words"] for r in s["rows"]))
    assert [r["utt_id"] for r in scores[0]["rows"]] == [r["utt_id"] for r in scores[1]["rows"]]
    sel = step.summarize(candidates, scores, split)
    assert sel["chosen_wer"] == min(s["wer"] for s in scores) and "p_mapsswe" in sel
