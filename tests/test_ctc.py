"""The CTC student (training/ctc/, decoding/ctc_*.py): tokens, model, training in the
existing loop (loss falls, resume is exact), T o L o G decoding of a known path."""
from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from core import records
from core.runs import StepContext, StepError
from core.storage import Storage, join
from amflow.steps import train as train_step
from decoding.ctc_decode import ctc_scores, greedy_words
from decoding.ctc_graph import build_tlg, lm_words
from decoding.lexicon import words_of
from decoding.lm import estimate
from decoding.search import Searcher
from training.checkpoint import load_model_card
from training.ctc.model import CtcModel
from training.ctc.tokens import Tokenizer, ctc_min_frames, train_tokenizer
from amflow.services.synthetic_run import make_synthetic_run
from training.loop import InjectedFailure

torch.set_num_threads(1)

TEXTS = ["The cat sat on the mat.", "the dog ran", "a cat ran to the dog", "then hello, Bob's cat",
         "all the small balls fell off the wall"]


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_tokenizer_round_trip(kind):
    tok = train_tokenizer(TEXTS, kind, vocab_size=40)
    assert tok.symbols[0] == "<blk>"
    for text in TEXTS:
        ids = tok.encode(text)
        assert 0 not in ids and tok.decode(ids) == words_of(text)
        # a transcript is its words' spellings one after another (what L spells)
        assert ids == [i for w in words_of(text) for i in tok.encode_word(w)]
    again = Tokenizer.from_dict(json.loads(json.dumps(tok.to_dict())))
    assert again.symbols == tok.symbols and again.digest == tok.digest
    assert again.encode(TEXTS[3]) == tok.encode(TEXTS[3])
    assert not tok.spellable("zebra") and tok.spellable("cat")  # z is in no transcript


def test_ctc_min_frames_counts_blanks_between_repeats():
    assert ctc_min_frames([3, 4, 4, 4, 5]) == 7 and ctc_min_frames([]) == 0


@pytest.mark.parametrize("bidirectional", [False, True])
def test_an_utterance_scores_the_same_alone_and_in_a_padded_batch(bidirectional):
    torch.manual_seed(0)
    model = CtcModel(48, 9, stack=3, channels=(4, 4), hidden=16, layers=2,
                     bidirectional=bidirectional, lookahead=2)
    model.train()
    model(torch.randn(3, 30, 48), torch.tensor([30, 22, 17]))  # BatchNorm running stats
    model.eval()
    x = torch.randn(2, 25, 48)
    x[1, 14:] = 0
    lens = torch.tensor([25, 14])
    with torch.no_grad():
        both = model(x, lens)
        alone = model(x[1:, :14], lens[1:])
    n = int(model.output_lengths(lens)[1])
    assert n == alone.shape[1] == 14  # time strides (3, 1) over 3-stacked rows: the row rate
    assert torch.allclose(both[1, :n], alone[0], atol=1e-5)


def _known_path(tok: Tokenizer, text: str) -> np.ndarray:
    """Log-probabilities whose best path spells `text`: each token 2 frames, blanks
    between tokens."""
    frames = []
    for i in tok.encode(text):
        frames += [i, i, 0]
    lp = np.full((len(frames), tok.num_classes), np.log(0.1 / (tok.num_classes - 1)), np.float32)
    lp[np.arange(len(frames)), frames] = np.log(0.9)
    return lp


@pytest.mark.parametrize("kind,repeats", [("char", "blank"), ("bpe", "blank"),
                                          ("char", "compact")])
def test_tlg_decodes_a_known_path_to_its_words(kind, repeats):
    """Both topologies (decode.ctc_topology standard: repeats="blank", the default; and
    compact) read a CTC path to its words."""
    tok = train_tokenizer(TEXTS, kind, vocab_size=40)
    arpa = estimate([words_of(t) for t in TEXTS], order=2).to_arpa()
    graph = build_tlg(tok, arpa, repeats=repeats)
    assert graph.info["unspellable"] == 0 and graph.info["words"] >= 15
    assert graph.info["kind"] == ("HLG" if repeats == "blank" else "TLG")
    search = Searcher(graph, beam=13, max_active=2000)
    for text in ("all the balls fell", "the cat ran to the dog", "hello bob's small wall"):
        lp = _known_path(tok, text)
        words, _, final = search.best_words(ctc_scores(lp, 1.0, 0.0))
        assert final and words == words_of(text)
        assert greedy_words(lp, tok) == words_of(text)
    # "ll" spelled with a blank between its l's is two l's ("all"), never one ("al")
    lp = _known_path(tok, "all")
    assert search.best_words(ctc_scores(lp, 1.0, 0.0))[0] == ["all"]


# ----------------------------------------------------------------- training in the loop
TINY = ["train.model=ctc", "train.threads=1", "train.minibatch_frames=600", "train.lr=0.003",
        "train.final_lr=0.001", "train.log_every=2", "model.ctc.hidden=48",
        "model.ctc.layers=2", "model.ctc.channels=[6,6]", "train.sortagrad=true",
        # the keys configs/local.yaml's train.ctc_preset (the demo's) sets, at local.yaml's
        # own train values: the tests train as they did before the recipe
        "train.freq_masks=0", "train.time_masks=0", "train.finetune_epochs=3"]


def _spelled(uri: str) -> list[tuple[str, str]]:
    """(utt_id, transcript) of a synthetic partition's rows: each phone of the row's
    frame labels as a one-letter word."""
    out = []
    for row in pq.read_table(uri, columns=["utt_id", "labels"]).to_pylist():
        lab = records.decode_int16(row["labels"])
        seq = [int(lab[0])] + [int(b) for a, b in zip(lab, lab[1:]) if a != b]
        out.append((row["utt_id"], " ".join("abcdefgh"[c] for c in seq)))
    return out


def _ctc_run(root: str, unlabeled: int = 0) -> str:
    """A synthetic run (features, labeled + dev (+ unlabeled) partitions) and a corpus
    whose transcripts spell each utterance's phone sequence."""
    splits = {"labeled": {"utts": 32, "parts": 2}, "dev": {"utts": 8, "parts": 1}}
    if unlabeled:
        splits["unlabeled"] = {"utts": unlabeled, "parts": 2}
    out = make_synthetic_run(Storage(), join(root, "runs", "r"), noise=1.0, splits=splits)
    lines = []
    for split, uris in out["splits"].items():
        for uri in uris:
            for utt, text in _spelled(uri):
                lines.append(json.dumps({
                    "utt_id": utt, "speaker_id": "s", "duration": 1.0,
                    "created_at": "2026-01-01T00:00:00", "locale": "en-US", "audio_uri": "a.wav",
                    "text": "" if split == "unlabeled" else text, "split": split}))
    corpus = join(root, "corpus")
    Storage().write_text(join(corpus, "metadata.jsonl"), "\n".join(lines) + "\n")
    return corpus


def _train(local_cfg, corpus, *sets, expect=None):
    ctx = StepContext(local_cfg(f"data.corpus={corpus}", *TINY, *sets), "r", "train")
    if expect is None:
        return train_step.run(ctx, None)
    with pytest.raises(expect) as err:
        train_step.run(ctx, None)
    return err.value


def _losses(path) -> list[float]:
    return [json.loads(line)["loss"] for line in open(path)
            if json.loads(line)["kind"] == "train"]


def test_ctc_student_learns_and_resumes_exactly(tmp_path, local_cfg):
    corpus = _ctc_run(str(tmp_path / "store"))
    common = ["train.epochs=3", "train.checkpoint_every=3", "model.ctc.dropout=0.1",
              "train.freq_masks=1", "train.time_masks=1"]
    ref = _train(local_cfg, corpus, *common, "train.tag=ref")
    run = tmp_path / "store" / "runs" / "r"
    losses = _losses(run / "train-ref" / "metrics.jsonl")
    assert losses[-1] < 0.8 * losses[0]  # the CTC loss falls within a few steps
    m = ref["metrics"]
    assert m["model"] == "ctc" and m["transcripts"] == {"labeled": 32, "dev": 8}
    model, card = load_model_card(Storage(), m["model_uri"])
    tok = Tokenizer.from_dict(card.tokenizer)
    assert card.kind == "ctc" and card.phones == tok.symbols and tok.kind == "char"
    assert card.priors is None  # no class priors: a CTC model is not a hybrid
    # killed mid-pass, re-run: the same model, bitwise
    fail = 5
    _train(local_cfg, corpus, *common, "train.tag=res", f"train.fail_after={fail}",
           expect=InjectedFailure)
    res = _train(local_cfg, corpus, *common, "train.tag=res", f"train.fail_after={fail}")
    assert res["resumed_from_step"] == 3
    a, b = model.state_dict(), load_model_card(Storage(), res["metrics"]["model_uri"])[0].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _losses(run / "train-res" / "metrics.jsonl") == losses


def test_ctc_trains_on_the_kept_pseudolabels_beside_the_labeled_split(tmp_path, local_cfg):
    """train.pseudolabels=<run>: the pseudolabel step's kept labels of unlabeled utterances
    join the labeled transcripts; dropped ones do not; every unlabeled row is counted."""
    import pyarrow as pa

    root = tmp_path / "store"
    corpus = _ctc_run(str(root), unlabeled=12)
    spelled = [x for u in sorted((root / "runs" / "r" / "repartition" / "unlabeled").glob("part-*"))
               for x in _spelled(str(u))]
    kept = [i % 3 != 0 for i in range(len(spelled))]  # 8 kept, 4 dropped
    labels = pa.table({"utt_id": [u for u, _ in spelled], "text": [t for _, t in spelled],
                       "confidence": [0.9] * 12, "am_score": [-1.0] * 12, "lm_score": [-2.0] * 12,
                       "kept": kept, "reason": ["" if k else "low_confidence" for k in kept]})
    step = root / "runs" / "teach" / "pseudolabel"
    Storage().write_parquet(str(step / "labels" / "part-00000.parquet"), labels)
    (step / "_SUCCESS.json").write_text("{}")
    res = _train(local_cfg, corpus, "train.epochs=1", "train.pseudolabels=teach")
    assert res["metrics"]["transcripts"] == {"labeled": 32, "dev": 8, "pseudo": 8}
    split = res["inputs"]["splits"]["unlabeled"]
    assert split["rows"] == 12 and split["usable"] == 8 and split["rejected"] == {"no_transcript": 4}
    # a rerun is handed the finished model, until the pseudo-labels are made again
    assert _train(local_cfg, corpus, "train.epochs=1", "train.pseudolabels=teach") == res
    (step / "_SUCCESS.json").write_text('{"again": true}')
    err = _train(local_cfg, corpus, "train.epochs=1", "train.pseudolabels=teach", expect=StepError)
    assert "inputs.pseudolabels" in str(err)


def _train_each(rank: int, world: int, plans: list) -> list[dict]:
    from training.loop import train_worker

    return [train_worker(p) for p in plans]


@pytest.mark.slow  # ~40-90 s: two spawned ranks, four trainings
def test_every_trainer_trains_the_ctc_student_on_two_ranks(tmp_path, local_cfg):
    """gtc, bmuf, htm and ma train the CTC model unchanged (sgd: the tests above)."""
    import dataclasses

    from amflow.services import train_plan as launch
    from training.distributed import spawn_local

    corpus = _ctc_run(str(tmp_path / "store"))
    plans = []
    for algo in ("gtc", "bmuf", "htm", "ma"):
        ctx = StepContext(local_cfg(f"data.corpus={corpus}", *TINY, "train.epochs=2",
                                    "train.workers=2", f"train.algorithm={algo}",
                                    f"train.tag={algo}", "train.block_size=2",
                                    "train.ma_samples=200"), "r", f"train-{algo}")
        plan, _ = launch.build_plan(ctx, ctx.step_uri)
        plans.append(dataclasses.replace(plan, progress=False))
    results = spawn_local(_train_each, 2, plans, timeout=600)
    for algo, res in zip(("gtc", "bmuf", "htm", "ma"), results[0]):
        m = res["metrics"]
        assert m["workers"] == 2 and m["algorithm"] == algo and m["algo_bytes_sent"] > 0
        assert res["counts"] == {"in": 32, "out": 32, "rejected": 0}
        losses = _losses(tmp_path / "store" / "runs" / "r" / f"train-{algo}" / "metrics.jsonl")
        assert np.isfinite(m["dev_loss"]) and losses[-1] < losses[0], (algo, losses)


def test_ctc_pseudolabels_must_name_a_finished_step(tmp_path, local_cfg):
    corpus = _ctc_run(str(tmp_path / "store"))
    err = _train(local_cfg, corpus, "train.epochs=1", "train.pseudolabels=nowhere",
                 expect=StepError)
    assert "train.pseudolabels" in str(err) and "amflow pseudolabel" in str(err)


# ----------------------------------------------------------------- the decode step
@pytest.mark.slow  # ~30-70 s: a tiny corpus, Ray, two decodes
def test_decode_step_scores_a_ctc_model_into_the_decode_json(tiny_corpus, ray_local, tmp_path,
                                                             local_cfg):
    """`amflow decode` with a CTC model: tuned on dev (LM weight x blank penalty), the
    hybrid's --out JSON (WER, CI, per condition), every test utterance accounted for. The
    model is untrained: this checks the plumbing, not the words."""
    import argparse

    from amflow.steps import decode as decode_step
    from core.config import features_dict
    from tasks.select import read_records
    from training.checkpoint import save_model

    st = Storage()
    recs, _, _ = read_records(st, str(tiny_corpus))
    tok = train_tokenizer([r.text for r in recs if r.split == "labeled"], "char")
    cfg = local_cfg(f"data.corpus={tiny_corpus}", "decode.workers=1",
                    "decode.ctc_lm_weights=[0.5,1.0]", "decode.blank_penalties=[0,2]")
    feat_dim = cfg.features.num_mel_bins * cfg.features.stack
    torch.manual_seed(0)
    model = CtcModel(feat_dim, tok.num_classes, cfg.features.stack, channels=(4,), time_strides=(3,),
                     freq_strides=(4,), time_kernels=(3,), hidden=16, layers=1).eval()
    uri = str(tmp_path / "ctc" / "model.pt")
    save_model(st, uri, model, cmvn={"count": 1, "sum": [0.0] * feat_dim, "sumsq": [1.0] * feat_dim},
               phones=tok.symbols, features=features_dict(cfg.features),
               info={"tokenizer": tok.to_dict()})
    ctx = StepContext(cfg, "r", "decode")
    arpa = estimate([words_of(r.text) for r in recs if r.split in ("labeled", "unlabeled")],
                    order=2, vocabulary=[w for r in recs for w in words_of(r.text)]).to_arpa()
    ctx.storage.write_text(ctx.other("lm", "lm.arpa"), arpa)
    out = tmp_path / "result.json"
    summary = decode_step.run(ctx, argparse.Namespace(model=uri, data=None, split="test",
                                                      out=str(out)))
    result = json.loads(out.read_text())
    assert result["model_kind"] == "ctc" and result["search"] == "tlg"
    # decode.ctc_topology standard (the default): CTC's reading of repeats, the graph the
    # export ships to sherpa-onnx
    assert result["graph"]["kind"] == "HLG" and result["graph"]["repeats"] == "blank"
    assert len(result["tuning"]) == 4 and result["tune_split"] == "dev"
    assert {"wer", "wer_ci95", "per_condition", "sub", "del", "ins"} <= set(result)
    assert result["tokenizer"]["digest"] == tok.digest
    # the step's metrics (summary, XCom) say what a hybrid decode's say: WER with its CI
    assert summary["metrics"]["wer_ci95"] == result["wer_ci95"]
    assert {"lm_weight", "blank_penalty", "rtf_per_core"} <= set(summary["metrics"])
    tests = sum(1 for r in recs if r.split == "test")
    assert summary["counts"]["in"] == tests == summary["counts"]["out"] + summary["counts"]["rejected"]
    hyps = [json.loads(line) for line in (tmp_path / "store" / "runs" / "r" / "decode" /
                                          "hyps.jsonl").read_text().splitlines()]
    assert len(hyps) == summary["counts"]["out"]
    vocab = set(lm_words(arpa))  # T o L o G outputs the LM's words only
    assert all(w in vocab for h in hyps for w in h["hyp"].split())
    greedy = decode_step.run(
        StepContext(local_cfg(f"data.corpus={tiny_corpus}", "decode.workers=1",
                              "decode.ctc_search=greedy", "decode.tag=greedy"), "r", "decode"),
        argparse.Namespace(model=uri, data=None, split="test", out=None))
    assert greedy["metrics"]["search"] == "greedy"
    compact = decode_step.run(
        StepContext(local_cfg(f"data.corpus={tiny_corpus}", "decode.workers=1",
                              "decode.ctc_topology=compact", "decode.tag=compact",
                              "decode.ctc_lm_weights=[1.0]", "decode.blank_penalties=[0]"),
                    "r", "decode"),
        argparse.Namespace(model=uri, data=None, split="test", out=str(tmp_path / "c.json")))
    assert compact["counts"]["out"] == summary["counts"]["out"]
    assert json.loads((tmp_path / "c.json").read_text())["graph"]["kind"] == "TLG"
    assert len(list((tmp_path / "store" / "runs" / "r" / "graph").iterdir())) == 2  # one each
    # a joint CTC/attention model: the prefix beam's n-best rescored by its decoder
    joint = CtcModel(feat_dim, tok.num_classes, cfg.features.stack, channels=(4,),
                     time_strides=(3,), freq_strides=(4,), time_kernels=(3,), hidden=16,
                     layers=1, attention_weight=0.3, decoder_hidden=8).eval()
    juri = str(tmp_path / "joint" / "model.pt")
    save_model(st, juri, joint, cmvn={"count": 1, "sum": [0.0] * feat_dim,
                                      "sumsq": [1.0] * feat_dim},
               phones=tok.symbols, features=features_dict(cfg.features),
               info={"tokenizer": tok.to_dict()})
    rescored = decode_step.run(
        StepContext(local_cfg(f"data.corpus={tiny_corpus}", "decode.workers=1",
                              "decode.ctc_search=rescore", "decode.tag=joint",
                              "decode.blank_penalties=[0]", "decode.ctc_nbest=4"), "r", "decode"),
        argparse.Namespace(model=juri, data=None, split="test", out=None))
    assert rescored["metrics"]["search"] == "rescore" and rescored["counts"]["out"] == tests


# ----------------------------------------------------------------- joint CTC/attention
def test_prefix_beam_search_scores_are_the_ctc_probabilities():
    """A wide beam's n-best carries each label sequence's total CTC log-probability (what
    torch's ctc_loss sums over all alignments), best first."""
    from decoding.ctc_prefix import prefix_beam_search, rescore

    rng = np.random.default_rng(0)
    lp = torch.log_softmax(torch.from_numpy(rng.standard_normal((6, 4))), -1).numpy()
    nbest = prefix_beam_search(lp, beam=500)
    assert [s for _, s in nbest] == sorted((s for _, s in nbest), reverse=True)
    for y, score in nbest[:10]:
        if not y:
            continue
        ref = -torch.nn.functional.ctc_loss(torch.from_numpy(lp)[:, None], torch.tensor([y]),
                                            torch.tensor([6]), torch.tensor([len(y)]),
                                            reduction="sum")
        assert abs(score - float(ref)) < 1e-6
    assert rescore(nbest[:3], [-9.0, 0.0, -9.0], weight=0.99) == 1


def test_joint_ctc_attention_student_learns(tmp_path, local_cfg):
    """model.ctc.attention_weight > 0: the decoder trains beside CTC in the same loop, and
    its scores are the log-likelihoods it trains on."""
    corpus = _ctc_run(str(tmp_path / "store"))
    res = _train(local_cfg, corpus, "train.epochs=3", "model.ctc.attention_weight=0.3",
                 "model.ctc.decoder_hidden=32")
    losses = _losses(tmp_path / "store" / "runs" / "r" / "train" / "metrics.jsonl")
    assert losses[-1] < 0.8 * losses[0]
    model, card = load_model_card(Storage(), res["metrics"]["model_uri"])
    assert model.decoder is not None and card.spec["attention_weight"] == 0.3
    with torch.no_grad():
        h, n = model.encode(torch.randn(1, 40, 48))
    y = [3, 4, 5]
    with torch.no_grad():
        nll = model.decoder.nll(h, n, torch.tensor([y]), torch.tensor([3]))
    assert abs(model.decoder.score(h[0], int(n[0]), [y])[0] + float(nll)) < 1e-4
