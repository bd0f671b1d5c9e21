"""Pseudo-labels (amflow pseudolabel): the filter's counts balance per reason, the threshold
rule on a synthetic dev set, and one tiny end-to-end run on the tiny corpus."""
from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest

from decoding import pseudolabel as PL
from decoding.search import BestPath


def _label(i: int, conf: float, errors: int = 0, words: int = 10, failure: str = "",
           duration: float = 1.0) -> PL.Label:
    return PL.Label(f"u{i:03d}", "a b", conf, -10.0, -5.0, duration, failure=failure,
                    errors=errors, ref_words=words)


# ----------------------------------------------------------------- the filter
def test_filter_counts_balance_per_reason():
    labels = ([_label(i, c) for i, c in enumerate([0.9, 0.8, 0.5, 0.3, 0.7])]
              + [_label(10, 0.0, failure=PL.EMPTY), _label(11, 0.95, failure=PL.NOT_FINAL),
                 _label(12, 0.0, failure=PL.DECODE_FAILED),
                 _label(13, 0.0, failure="unreadable_audio")])
    filtered = PL.apply_filter(labels, 0.6)
    kept = [lab.utt_id for lab, r in filtered if not r]
    assert kept == ["u000", "u001", "u004"]  # 0.95 is not kept: its path never ended
    dropped = PL.drop_counts(filtered)
    assert dropped == {PL.DECODE_FAILED: 1, PL.EMPTY: 1, PL.LOW_CONFIDENCE: 2,
                       PL.NOT_FINAL: 1, "unreadable_audio": 1}
    assert len(labels) == len(kept) + sum(dropped.values())
    # tallies per shard add up to the tally of all, and balance too
    whole = PL.rates(PL.tally(filtered))
    merged = PL.rates(PL.merge_tallies([PL.tally(filtered[:4]), PL.tally(filtered[4:])]))
    assert merged == whole
    assert whole["utts"] == whole["kept_utts"] + sum(whole["dropped_by_reason"].values())
    assert whole["kept_audio_fraction"] == pytest.approx(3 / 9)
    table = PL.labels_table(filtered)
    assert table.schema == PL.LABELS_SCHEMA and table.num_rows == len(labels)
    rows = table.to_pylist()
    assert all((r["reason"] == "") == r["kept"] for r in rows)
    assert {r["reason"] for r in rows if not r["kept"]} == set(dropped)


def test_a_label_carries_the_paths_scores_and_its_failure():
    rec = SimpleNamespace(utt_id="u", duration=0.09, speaker_id="s", condition="DP1",
                          audio_uri="a.wav", text="b c")
    log_post = np.log(np.array([[0.8, 0.2], [0.4, 0.6], [0.1, 0.9]], np.float32))
    path = BestPath(["b"], graph_cost=3.0, am_cost=-2.0, final=True, classes=np.array([0, 1, 1]))
    lab = PL.label_of(rec, log_post, path, acwt=0.5)
    assert lab.confidence == pytest.approx((0.8 + 0.6 + 0.9) / 3, rel=1e-6)
    assert lab.am_score == pytest.approx(4.0) and lab.lm_score == pytest.approx(-3.0)
    assert (lab.text, lab.failure, lab.errors, lab.ref_words) == ("b", "", 1, 2)
    assert PL.label_of(rec, log_post, dataclasses.replace(path, final=False), 0.5).failure \
        == PL.NOT_FINAL
    assert PL.label_of(rec, log_post, dataclasses.replace(path, words=[]), 0.5).failure == PL.EMPTY
    failed = PL.label_of(rec, log_post, BestPath([], float("inf"), float("inf"), False, ok=False),
                         0.5)
    assert failed.failure == PL.DECODE_FAILED and failed.errors == 2


# ----------------------------------------------------------------- the threshold rule
def _dev(seed: int = 0, n: int = 400) -> list[PL.Label]:
    """A dev set where low confidence means errors: errors ~ Binomial(10, 1 - conf)."""
    rng = np.random.default_rng(seed)
    conf = rng.uniform(0, 1, n)
    errs = rng.binomial(10, 1 - conf)
    return [_label(i, float(c), int(e), duration=float(rng.uniform(1, 3)))
            for i, (c, e) in enumerate(zip(conf, errs))]


def _kept_wer(labels, t):
    kept = [x for x in labels if x.confidence >= t and not x.failure]
    return sum(x.errors for x in kept) / sum(x.ref_words for x in kept)


def test_the_threshold_is_the_lowest_that_meets_the_wer_ratio():
    dev = _dev()
    unfiltered = sum(x.errors for x in dev) / sum(x.ref_words for x in dev)
    ch = PL.choose_threshold(dev, max_wer_ratio=0.7, min_kept=0.5)
    assert ch.rule_met and ch.unfiltered_wer == pytest.approx(unfiltered)
    assert ch.kept_wer == pytest.approx(_kept_wer(dev, ch.threshold))
    assert ch.kept_wer <= 0.7 * unfiltered and ch.kept_fraction >= 0.5
    # every lower candidate threshold misses the ratio
    lower = sorted({x.confidence for x in dev if x.confidence < ch.threshold})
    assert lower and all(_kept_wer(dev, t) > 0.7 * unfiltered for t in lower)
    # a looser ratio keeps more
    assert PL.choose_threshold(dev, 0.9, 0.5).threshold < ch.threshold


def test_an_unreachable_ratio_keeps_min_kept_at_the_lowest_wer():
    dev = _dev(1)
    ch = PL.choose_threshold(dev, max_wer_ratio=0.05, min_kept=0.8)
    assert not ch.rule_met and ch.kept_fraction >= 0.8
    audio = sum(x.duration for x in dev)
    candidates = [t for t in {x.confidence for x in dev} | {0.0}
                  if sum(x.duration for x in dev if x.confidence >= t) / audio >= 0.8]
    assert ch.kept_wer == pytest.approx(min(_kept_wer(dev, t) for t in candidates))


def test_failures_never_count_as_kept_when_choosing():
    dev = _dev(2, 100) + [_label(900 + i, 0.99, errors=10, failure=PL.EMPTY) for i in range(20)]
    ch = PL.choose_threshold(dev, 0.7, 0.3)
    # the unfiltered WER holds the empty hypotheses' deletions; the kept set never does
    assert ch.unfiltered_wer > sum(x.errors for x in dev[:100]) / 1000
    assert ch.kept_wer == pytest.approx(_kept_wer(dev, ch.threshold))
    with pytest.raises(ValueError, match="no label has a reference"):
        PL.choose_threshold([dataclasses.replace(x, ref_words=None) for x in dev], 0.7, 0.3)


# ----------------------------------------------------------------- end to end
def _teacher(corpus, path):
    """A small random model over the corpus's phones (peaky: the search finds words), with
    priors and CMVN: what decode needs of a trained teacher."""
    import torch

    from core.config import FeaturesConfig
    from training.checkpoint import model_payload, to_bytes
    from training.models import StudentLSTM

    classes = [p.strip() for p in (corpus / "phones.txt").read_text().splitlines()]
    torch.manual_seed(0)
    model = StudentLSTM(192, 32, 1, len(classes), lookahead=3)
    with torch.no_grad():
        model.output.weight.mul_(8.0)
    payload = model_payload(model, cmvn={"count": 1, "sum": [0.0] * 64, "sumsq": [1.0] * 64},
                            phones=classes, features=dataclasses.asdict(FeaturesConfig()))
    payload["priors"] = {"counts": [1.0] * len(classes), "source": "test"}
    path.write_bytes(to_bytes(payload))
    return str(path)


@pytest.mark.slow  # a Ray pool started three times: ~3 min on a loaded 2-core machine
def test_pseudolabel_end_to_end_on_the_tiny_corpus(tiny_corpus, tmp_path, local_cfg, ray_local):
    from amflow.steps import pseudolabel, select
    from core.runs import SUCCESS, StepContext
    from decoding import lexicon as L
    from decoding import lm

    lex = L.read_lexicon((tiny_corpus / "lexicon.txt").read_text())
    arpa = tmp_path / "lm.arpa"
    arpa.write_text(lm.estimate(lm.generator_sentences(300, 5), 2, vocabulary=lex.prons).to_arpa())
    sets = [f"data.corpus={tiny_corpus}", "select.splits=[unlabeled]", "select.hours=0.01",
            "select.shard_hours=0.003",
            f"decode.lm={arpa}", "decode.acwt=[0.5, 1.0]", "decode.workers=2",
            "decode.beam=8", "decode.max_active=500", "pseudolabel.min_kept=0.5"]
    cfg = local_cfg(*sets)
    select.run(StepContext(cfg, "r", "select"))
    args = SimpleNamespace(model=_teacher(tiny_corpus, tmp_path / "teacher.pt"))
    done = pseudolabel.run(StepContext(cfg, "r", "pseudolabel"), args)
    step = tmp_path / "store" / "runs" / "r" / "pseudolabel"
    labels = pq.read_table(step / "labels").to_pylist()
    c, m = done["counts"], done["metrics"]
    assert labels and c["in"] == len(labels) == c["out"] + c["rejected"]
    assert c["out"] == sum(r["kept"] for r in labels)
    assert c["rejected"] == sum(c["dropped_by_reason"].values())
    assert c["dropped_by_reason"] == dict(sorted(
        {r["reason"]: sum(x["reason"] == r["reason"] for x in labels)
         for r in labels if not r["kept"]}.items()))
    rejects = pq.read_table(step / "rejects").to_pylist() if (step / "rejects").exists() else []
    assert len(rejects) == c["rejected"]
    assert all(0 <= r["confidence"] <= 1 for r in labels)
    assert all(r["text"] for r in labels if r["kept"])
    dev = json.loads((step / "dev.json").read_text())
    assert dev["acwt"] in (0.5, 1.0) and m["threshold"] == dev["threshold"]
    assert all(r["confidence"] >= dev["threshold"] for r in labels if r["kept"])
    # the corpus's unlabeled records carry their transcripts: the calibration is reported
    assert m["wer_all"] is not None and m["ref_words"] > 0 and m["rtf"]["x_real_time"] > 0
    assert 0 <= m["kept_audio_fraction"] <= 1
    # the same inputs: handed back; killed before one shard's marker: that shard redone
    again = pseudolabel.run(StepContext(cfg, "r", "pseudolabel"), args)
    assert again["finished_at"] == done["finished_at"]
    markers = sorted((step / "_shards").iterdir())
    assert len(markers) == m["shards"] >= 2
    markers[0].unlink()
    (step / SUCCESS).unlink()
    resumed = pseudolabel.run(StepContext(cfg, "r", "pseudolabel"), args)
    assert resumed["metrics"]["shards_skipped"] == m["shards"] - 1
    assert resumed["counts"] == c and pq.read_table(step / "labels").to_pylist() == labels
    # another threshold: labelled again, every one under it dropped
    strict = local_cfg(*sets, "pseudolabel.threshold=1.0")
    redo = pseudolabel.run(StepContext(strict, "r", "pseudolabel"), args)
    assert redo["counts"]["in"] == c["in"]
    assert redo["counts"]["out"] == sum(r["kept"] and r["confidence"] >= 1.0 for r in labels)
    assert json.loads((step / SUCCESS).read_text())["metrics"]["threshold"] == 1.0


def test_select_shard_paths_of_a_relative_corpus_reach_the_decode_actors(tmp_path, monkeypatch):
    """select stores audio_uri joined to data.corpus; with a relative corpus (local.yaml's
    ./data/corpus) the actors' second join made ./data/corpus/./data/corpus/...: every
    unlabeled utterance was dropped as missing_audio. shard_records makes them absolute."""
    from core.config import load_config
    from core.runs import StepContext
    from amflow.steps.pseudolabel import shard_records
    from tasks.audio import resolve_uri
    from tasks.select import Record, manifest_table

    monkeypatch.chdir(tmp_path)
    wav = tmp_path / "data" / "corpus" / "audio" / "u1.wav"
    wav.parent.mkdir(parents=True)
    wav.write_bytes(b"RIFF")
    cfg = load_config(None, ["storage.root=./data", "data.corpus=./data/corpus"])
    ctx = StepContext(cfg, "r", "pseudolabel")
    rec = Record(utt_id="u1", speaker_id="s", duration=1.0, created_at="", created_ts=0,
                 locale="en", condition="DP1", text="", audio_uri="audio/u1.wav", split="unlabeled")
    ctx.storage.write_parquet(ctx.other("select", "shards", "s0.parquet"),
                              manifest_table("s0", "unlabeled", [rec], cfg.data.corpus))
    (got,) = shard_records(ctx, "s0")
    assert got.audio_uri == str(wav)
    assert resolve_uri(cfg.data.corpus, got.audio_uri) == str(wav)  # what the actors open
