"""features: rows, labels, CMVN stats, rejects with reasons, idempotent and resumable."""
from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from core import records
from tests.conftest import CTM_LABELS
from tests.test_select import make_corpus


def _steps(cfg, run_id, *names, force=False):
    from core.runs import StepContext
    from amflow.steps import features, repartition, select

    mods = {"select": select, "features": features, "repartition": repartition}
    return [mods[n].run(StepContext(cfg, run_id, n, force=force)) for n in names]


def _feature_rows(root, run_id):
    d = root / "runs" / run_id / "features" / "shards"
    return {p.stem: pq.read_table(p).to_pylist() for p in sorted(d.glob("*.parquet"))}


@pytest.fixture()
def corpus(tmp_path):
    info = make_corpus(tmp_path / "corpus", speakers=5, utts=3, labeled=2, dev=1, bad=True,
                       seconds=(0.8, 2.0))
    return tmp_path / "corpus", info


def test_features_step(corpus, local_cfg, ray_local, tmp_path):
    root, info = corpus
    cfg = local_cfg(CTM_LABELS, f"data.corpus={root}", "select.shard_hours=0.0005",
                    "select.splits=labeled,unlabeled,dev", "features.resample=false",
                    "features.downmix=false")
    sel, feat = _steps(cfg, "f1", "select", "features")
    c = feat["counts"]
    assert c["in"] == sel["counts"]["selected"] == c["out"] + c["rejected"]
    assert c["out"] == len(info["good"])
    store = tmp_path / "store" / "runs" / "f1" / "features"
    rej = {r["utt_id"]: r for p in (store / "rejects").glob("*.parquet")
           for r in pq.read_table(p).to_pylist()}
    want = {u: r for u, r in info["bad"].items() if u.startswith("b_")}
    assert {u: r["reason"] for u, r in rej.items()} == want
    assert all(r["detail"] for r in rej.values())
    assert feat["metrics"]["reject_reasons"]["wrong_sample_rate"] == 1

    phones = json.loads((store / "phones.json").read_text())
    assert phones[-1] == "<unk>" and "ʃ" in phones
    meta = {m["utt_id"]: m for m in info["meta"]}
    n_rows = 0
    for shard, rows in _feature_rows(tmp_path / "store", "f1").items():
        for r in rows:
            x = records.decode_feats(r)
            assert x.shape[1] == 192 and r["feat_dtype"] == "uint8"
            samples = int(round(meta[r["utt_id"]]["duration"] * 16000))
            frames = 1 + (samples - 400) // 160
            assert r["num_frames"] == frames // 3
            if r["split"] in ("labeled", "dev"):
                fl = records.decode_int16(r["frame_labels"])
                assert len(fl) == frames and fl.max() < len(phones)
                lab = records.decode_int16(r["labels"])
                assert np.array_equal(lab, records.offset_labels(fl, 0, 3, r["num_frames"]))
            else:
                assert r["labels"] is None and r["frame_labels"] is None
            assert r["shard"] == shard
            n_rows += r["num_frames"]
    cmvn = json.loads((store / "cmvn.json").read_text())
    assert len(cmvn["sum"]) == 192
    mean, inv_std = records.load_cmvn(cmvn)
    assert np.isfinite(inv_std).all()
    assert 0 < cmvn["count"] <= n_rows
    m = feat["metrics"]
    assert m["mb_per_audio_hour"] > 0 and m["xrt"] > 0 and m["audio_hours"] > 0
    # a re-run is a no-op
    (again,) = _steps(cfg, "f1", "features")
    assert again["finished_at"] == feat["finished_at"]


def test_decode_resamples_and_downmixes(tmp_path):
    from core.config import FeaturesConfig
    from core.storage import Storage
    from tasks.audio import load_audio

    x = np.sin(2 * np.pi * 440 * np.arange(8000) / 8000).astype(np.float32) * 0.5
    sf.write(tmp_path / "a.wav", np.stack([x, x], 1), 8000, subtype="PCM_16")
    y, reason = load_audio(Storage(), str(tmp_path / "a.wav"), FeaturesConfig(), 1.0)
    assert reason is None and len(y) == 16000 and abs(np.abs(y).max() - 0.5) < 0.02
    _, reason = load_audio(Storage(), str(tmp_path / "a.wav"), FeaturesConfig(resample=False))
    assert reason == "wrong_sample_rate"
    _, reason = load_audio(Storage(), str(tmp_path / "a.wav"), FeaturesConfig(downmix=False))
    assert reason == "wrong_channels"
    _, reason = load_audio(Storage(), str(tmp_path / "a.wav"), FeaturesConfig(), 3.0)
    assert reason == "duration_mismatch"
    _, reason = load_audio(Storage(), str(tmp_path / "none.wav"), FeaturesConfig())
    assert reason == "missing_audio"


def test_killed_features_rerun_matches_clean_run(tmp_path, local_cfg, ray_local):
    root = tmp_path / "corpus"
    make_corpus(root, speakers=6, utts=2, labeled=2, seconds=(0.6, 1.2))
    cfg = local_cfg(CTM_LABELS, f"data.corpus={root}", "select.shard_hours=0.0003")
    _steps(cfg, "clean", "select", "features")
    _steps(cfg, "crash", "select", "features")
    clean = _feature_rows(tmp_path / "store", "clean")
    assert len(clean) >= 4
    feat = tmp_path / "store" / "runs" / "crash" / "features"
    # Simulate a kill at every stage a shard can be in: never started (outputs and marker
    # gone), outputs published but no marker, a stale temp file; and no _SUCCESS.
    shards = sorted(clean)
    (feat / "_SUCCESS.json").unlink()
    (feat / "cmvn.json").unlink()
    for s in shards[:2]:
        (feat / "_shards" / f"{s}.json").unlink()
        (feat / "shards" / f"{s}.parquet").unlink()
    (feat / "_shards" / f"{shards[2]}.json").unlink()
    (feat / "shards" / f"{shards[3]}.parquet.tmp-dead").write_bytes(b"partial")
    (resumed,) = _steps(cfg, "crash", "features")
    assert resumed["counts"]["in"] == resumed["counts"]["out"] + resumed["counts"]["rejected"]
    crashed = _feature_rows(tmp_path / "store", "crash")
    assert crashed.keys() == clean.keys()
    for s in clean:
        assert clean[s] == crashed[s], s
    cm = [(tmp_path / "store" / "runs" / r / "features" / "cmvn.json").read_text()
          for r in ("clean", "crash")]
    assert cm[0] == cm[1]


def test_resampled_and_downmixed_audio_survive_a_poisoned_stream(corpus, local_cfg, ray_local,
                                                                tmp_path):
    """b_rate (8 kHz) and b_stereo share a speaker stream with b_huge (inf fbank): they are
    resampled/downmixed and featurised, and the inf utterance does not poison their CMN."""
    root, info = corpus
    cfg = local_cfg(CTM_LABELS, f"data.corpus={root}", "select.shard_hours=0.0005")
    _, feat = _steps(cfg, "f2", "select", "features")
    reasons = feat["metrics"]["reject_reasons"]
    assert reasons["nonfinite_features"] == 1
    assert "wrong_sample_rate" not in reasons and "wrong_channels" not in reasons
    rows = {r["utt_id"]: r for rs in _feature_rows(tmp_path / "store", "f2").values()
            for r in rs}
    for utt in ("b_rate", "b_stereo"):
        x = records.decode_feats(rows[utt])
        assert x.shape == (32, 192) and np.isfinite(x).all()


def test_pipeline_on_tiny_espeak_corpus(tiny_corpus, local_cfg, ray_local, tmp_path):
    """The embedded corpus goes through clean: every utterance featurised, its alignments
    cover the (reverberant) audio, labels use the corpus inventory, partitions balance."""
    cfg = local_cfg(CTM_LABELS, f"data.corpus={tiny_corpus}",
                    "select.splits=labeled,unlabeled,dev,test",
                    "select.shard_hours=0.005", "train.workers=2",
                    "repartition.partition_hours=0.005")
    sel, feat, rep = _steps(cfg, "tiny", "select", "features", "repartition")
    assert sel["counts"]["rejected"] == 0
    assert feat["counts"]["rejected"] == 0, feat["metrics"]["reject_reasons"]
    assert feat["counts"]["out"] == sel["counts"]["selected"] == rep["counts"]["out"]
    store = tmp_path / "store" / "runs" / "tiny"
    phones = json.loads((store / "features" / "phones.json").read_text())
    corpus_phones = [p.split()[0] for p in (tiny_corpus / "phones.txt").read_text().split("\n")
                     if p.strip()]
    assert set(corpus_phones) <= set(phones) and "<unk>" in phones
    for rows in _feature_rows(tmp_path / "store", "tiny").values():
        for r in rows:
            assert (r["labels"] is not None) == (r["split"] != "unlabeled")
            assert r["condition"] in ("DP1", "DP2", "DP3", "DP4", "DP5")
    for split in ("labeled", "unlabeled", "dev", "test"):
        index = json.loads((store / "repartition" / split / "_index.json").read_text())
        assert len(index["partitions"]) % 2 == 0


def test_features_that_reject_everything_say_why(tmp_path):
    """Every utterance rejected (8 kHz audio, features.resample off): the error counts
    the reasons and names the key to change."""
    from core.config import load_config
    from core.runs import StepError
    from core.storage import Storage
    from tasks.features import publish

    cfg = load_config(None, [f"storage.root={tmp_path}"])
    stats = [{"split": "labeled", "count": 0, "sum": [0.0], "sumsq": [0.0], "in": 3,
              "reasons": {"wrong_sample_rate": 3}}]
    with pytest.raises(StepError) as err:
        publish(Storage(cfg.storage), str(tmp_path / "features"), cfg.features, stats, [],
                ["s0"], 1.0)
    msg = str(err.value)
    assert "all 3 utterances were rejected" in msg and "wrong_sample_rate 3" in msg
    assert "features.sample_rate" in msg
