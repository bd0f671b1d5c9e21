"""select: metadata parsing, uniform sampling, speaker sharding, rejects.

`make_corpus` writes a small corpus in the public input format (noise + tone WAVs, one
FLAC, metadata JSONL partitioned by date, alignments.ctm, phones.txt), optionally with
every kind of bad input; the features and repartition tests use it too.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf

PHONES = ["a", "b", "d", "e", "i", "k", "s", "t", "ʃ", "ə"]


def _signal(rng, seconds: float, rate: int = 16000) -> np.ndarray:
    n = int(seconds * rate)
    t = np.arange(n) / rate
    f0 = rng.uniform(100, 300)
    x = 0.05 * rng.standard_normal(n)
    for h in range(1, 6):
        x += (0.2 / h) * np.sin(2 * np.pi * f0 * h * t + rng.uniform(0, 6.28))
    x *= 0.5 + 0.5 * np.sin(2 * np.pi * rng.uniform(1, 4) * t) ** 2
    return x.astype(np.float32)


def _ctm_lines(utt: str, seconds: float, rng, step: float = 0.1) -> list[str]:
    lines, t = [], 0.0
    while t < seconds - 1e-6:
        d = min(step, seconds - t)
        phone = PHONES[int(rng.integers(len(PHONES)))] if rng.random() > 0.05 else "zz"
        lines.append(f"{utt} 1 {t:.3f} {d:.3f} {phone}")
        t += d
    return lines


def make_corpus(root: Path, *, speakers: int = 4, utts: int = 3, seconds=(1.0, 2.0),
                labeled: int = 2, dev: int = 0, bad: bool = False, seed: int = 0,
                with_split: bool = True) -> dict:
    """Write a corpus under `root`; returns {"good": [...], "bad": {utt: reason}}."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    meta: list[dict] = []
    ctm: list[str] = []
    good: list[str] = []
    bad_utts: dict[str, str] = {}
    for s in range(speakers):
        spk = f"spk{seed}_{s:02d}"
        split = "labeled" if s < labeled else ("dev" if s < labeled + dev else "unlabeled")
        for u in range(utts):
            utt = f"{spk}_u{u:02d}"
            dur = float(rng.uniform(*seconds))
            x = _signal(rng, dur)
            ext = "flac" if (s == speakers - 1 and u == 0) else "wav"
            rel = f"audio/{spk}/{utt}.{ext}"
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            sf.write(root / rel, x, 16000, subtype="PCM_16")
            rec = {"utt_id": utt, "speaker_id": spk, "duration": round(len(x) / 16000, 4),
                   # created_at deliberately not in utterance order
                   "created_at": f"2024-01-{(u * 7) % utts + 1:02d}T10:00:00Z",
                   "locale": "en-US", "audio_uri": rel, "condition": f"DP{u % 5 + 1}",
                   "text": "hello"}
            if with_split:
                rec["split"] = split
            meta.append(rec)
            if split in ("labeled", "dev"):
                ctm += _ctm_lines(utt, len(x) / 16000, rng)
            good.append(utt)
    if bad:
        spk = f"spk{seed}_bad"
        d = root / "audio" / spk
        d.mkdir(parents=True, exist_ok=True)

        def add(utt, rel, reason, split="unlabeled", dur=1.0):
            meta.append({"utt_id": utt, "speaker_id": spk, "duration": dur,
                         "created_at": "2024-02-01T00:00:00+01:00", "locale": "en-US",
                         "audio_uri": rel, "split": split})
            bad_utts[utt] = reason

        (d / "corrupt.wav").write_bytes(b"RIFF\x24\x00\x00\x00WAVEjunkjunkjunk" + bytes(100))
        add("b_corrupt", f"audio/{spk}/corrupt.wav", "corrupt_audio")
        x = (_signal(rng, 1.0) * 32767).astype(np.int16)
        sf.write(d / "full.wav", x, 16000, subtype="PCM_16")
        data = (d / "full.wav").read_bytes()
        (d / "trunc.wav").write_bytes(data[: len(data) // 2])
        add("b_trunc", f"audio/{spk}/trunc.wav", "truncated_audio")
        sf.write(d / "empty.wav", np.zeros(0, np.int16), 16000, subtype="PCM_16")
        add("b_empty", f"audio/{spk}/empty.wav", "empty_audio")
        sf.write(d / "rate8k.wav", _signal(rng, 1.0, 8000), 8000, subtype="PCM_16")
        add("b_rate", f"audio/{spk}/rate8k.wav", "wrong_sample_rate")
        st = _signal(rng, 1.0)
        sf.write(d / "stereo.wav", np.stack([st, st * 0.5], 1), 16000, subtype="PCM_16")
        add("b_stereo", f"audio/{spk}/stereo.wav", "wrong_channels")
        add("b_missing", f"audio/{spk}/nope.wav", "missing_audio")
        y = _signal(rng, 1.0)
        y[100] = np.inf
        sf.write(d / "inf.wav", y, 16000, subtype="FLOAT")
        add("b_inf", f"audio/{spk}/inf.wav", "nonfinite_audio")
        z = np.full(16000, 3e38, np.float32)
        z[::2] = -3e38
        sf.write(d / "huge.wav", z, 16000, subtype="FLOAT")
        add("b_huge", f"audio/{spk}/huge.wav", "nonfinite_features")
        sf.write(d / "short.wav", _signal(rng, 0.02), 16000, subtype="PCM_16")
        add("b_short", f"audio/{spk}/short.wav", "too_short", dur=0.02)
        # labeled, alignment covers only the first half of 2 s
        sf.write(d / "half.wav", _signal(rng, 2.0), 16000, subtype="PCM_16")
        add("b_align", f"audio/{spk}/half.wav", "alignment_mismatch", split="labeled", dur=2.0)
        ctm += _ctm_lines("b_align", 1.0, rng)
        sf.write(d / "noali.wav", _signal(rng, 1.0), 16000, subtype="PCM_16")
        add("b_noali", f"audio/{spk}/noali.wav", "missing_alignment", split="labeled")
    (root / "alignments.ctm").write_text("\n".join(ctm) + "\n")
    (root / "phones.txt").write_text("\n".join(PHONES) + "\n")
    mdir = root / "metadata"
    half = len(meta) // 2
    for i, chunk in enumerate((meta[:half], meta[half:])):
        p = mdir / f"date=2024-01-0{i + 1}" / "bucket=0" / "part.jsonl"
        p.parent.mkdir(parents=True, exist_ok=True)
        lines = [json.dumps(r, ensure_ascii=False) for r in chunk]
        if bad and i == 1:
            lines += ['{"utt_id": "m_json", "speaker_id": ', "",
                      json.dumps({"utt_id": "m_nodur", "speaker_id": "x", "created_at":
                                  "2024-01-01T00:00:00", "locale": "en", "audio_uri": "a.wav"}),
                      json.dumps({"utt_id": "m_date", "speaker_id": "x", "duration": 1.0,
                                  "created_at": "yesterday", "locale": "en",
                                  "audio_uri": "a.wav"}),
                      json.dumps({"utt_id": "m_split", "speaker_id": "x", "duration": 1.0,
                                  "created_at": "2024-01-01", "locale": "en",
                                  "audio_uri": "a.wav", "split": "train"}),
                      json.dumps(chunk[0])]  # duplicate utt_id
            bad_utts.update({"m_json": "malformed_metadata", "m_nodur": "malformed_metadata",
                             "m_date": "malformed_metadata", "m_split": "bad_split"})
        p.write_text("\n".join(lines) + "\n")
    return {"good": good, "bad": bad_utts, "meta": meta}


def _read_manifests(cfg, run_id):
    from core.runs import run_uri
    from core.storage import Storage, join

    st = Storage(cfg.storage)
    uris = st.list(join(run_uri(cfg, run_id), "select", "shards"), suffix=".parquet")
    return {u.rsplit("/", 1)[-1][:-8]: st.read_parquet(u).to_pylist() for u in uris}


def test_parse_metadata_line_reasons():
    from tasks.select import MetadataError, parse_metadata_line

    ok = parse_metadata_line(json.dumps({
        "utt_id": "u", "speaker_id": "s", "duration": 1.5, "created_at": "2024-01-01T00:00:00Z",
        "locale": "en-US", "audio_uri": "a.wav"}))
    assert ok.utt_id == "u" and ok.split == "" and ok.created_ts == 1704067200.0
    for line, reason in [("not json", "malformed_metadata"), ("[1, 2]", "malformed_metadata"),
                         ('{"utt_id": "u"}', "malformed_metadata"),
                         ('{"utt_id": "u", "speaker_id": "s", "duration": -1, "created_at": '
                          '"2024-01-01", "locale": "x", "audio_uri": "a"}', "malformed_metadata"),
                         ('{"utt_id": "u", "speaker_id": "s", "duration": 1, "created_at": '
                          '"2024-01-01", "locale": "x", "audio_uri": "a", "split": "x"}',
                          "bad_split")]:
        with pytest.raises(MetadataError) as e:
            parse_metadata_line(line)
        assert e.value.reason == reason


def test_sample_uniform_reaches_hours_and_is_seeded():
    from tasks.select import sample_uniform

    rng = np.random.default_rng(1)
    d = rng.uniform(1, 10, size=5000)
    idx = sample_uniform(d, hours=2.0, oversample=1.05, seed=3)
    total = d[idx].sum()
    assert 7200 <= total < 7200 + 10
    assert len(set(idx.tolist())) == len(idx)
    assert np.array_equal(idx, sample_uniform(d, 2.0, 1.05, 3))
    assert not np.array_equal(np.sort(idx), np.sort(sample_uniform(d, 2.0, 1.05, 4)))
    # uniform: the mean length of the selection is close to the population's
    assert abs(d[idx].mean() - d.mean()) < 0.6
    # less audio than asked for: take everything
    assert len(sample_uniform(d[:10], hours=5.0, oversample=1.05, seed=0)) == 10


def test_shard_speakers_balanced():
    from tasks.select import shard_speakers

    rng = np.random.default_rng(0)
    secs = {f"s{i}": float(rng.uniform(10, 100)) for i in range(200)}
    groups = shard_speakers(secs, shard_seconds=1000)
    loads = [sum(secs[s] for s in g) for g in groups]
    assert sorted(s for g in groups for s in g) == sorted(secs)
    assert len(groups) == round(sum(secs.values()) / 1000)
    assert max(loads) - min(loads) <= 100


def test_select_step(tmp_path, local_cfg):
    from core.runs import StepContext
    from amflow.steps import select

    info = make_corpus(tmp_path / "corpus", speakers=6, utts=3, labeled=2, dev=1, bad=True,
                       with_split=True)
    cfg = local_cfg(f"data.corpus={tmp_path / 'corpus'}", "select.shard_hours=0.001",
                    "select.splits=labeled,unlabeled,dev")
    summary = select.run(StepContext(cfg, "r1", "select"))
    c = summary["counts"]
    assert c["in"] == c["out"] + c["rejected"]
    assert c["rejected"] == 5  # 4 malformed lines + 1 duplicate
    manifests = _read_manifests(cfg, "r1")
    rows = [r for rs in manifests.values() for r in rs]
    assert c["selected"] == len(rows)
    assert {r["split"] for r in rows} == {"labeled", "unlabeled", "dev"}
    spk_shards: dict = {}
    for sid, rs in manifests.items():
        assert {r["split"] for r in rs} == {sid.split("-")[0]}
        for r in rs:
            spk_shards.setdefault((r["split"], r["speaker_id"]), set()).add(sid)
            assert r["audio_uri"].startswith(str(tmp_path))
        # stream order: per speaker, created_at ascending
        for a, b in zip(rs, rs[1:]):
            if a["speaker_id"] == b["speaker_id"]:
                assert a["created_ts"] <= b["created_ts"]
    assert all(len(v) == 1 for v in spk_shards.values())
    rej = pq.read_table(tmp_path / "store" / "runs" / "r1" / "select" / "rejects" /
                        "select.parquet").to_pylist()
    assert {r["reason"] for r in rej} == {"malformed_metadata", "bad_split", "duplicate_utt_id"}
    assert all(r["detail"] for r in rej)
    # a re-run is a no-op
    again = select.run(StepContext(cfg, "r1", "select"))
    assert again["finished_at"] == summary["finished_at"]


def test_select_infers_split_and_samples_hours(tmp_path, local_cfg):
    from core.runs import StepContext
    from amflow.steps import select

    make_corpus(tmp_path / "corpus", speakers=8, utts=4, labeled=3, with_split=False)
    cfg = local_cfg(f"data.corpus={tmp_path / 'corpus'}", "select.hours=0.004",
                    "select.shard_hours=0.002")
    summary = select.run(StepContext(cfg, "r2", "select"))
    rows = [r for rs in _read_manifests(cfg, "r2").values() for r in rs]
    total = sum(r["duration"] for r in rows)
    assert 0.004 * 3600 <= total < 0.004 * 3600 + 2.0
    for r in rows:
        want = "labeled" if int(r["speaker_id"].split("_")[1]) < 3 else "unlabeled"
        assert r["split"] == want
    assert summary["counts"]["not_selected"] == 32 - len(rows)


def test_a_selection_is_handed_back_only_for_its_own_corpus_and_select_keys(tmp_path, local_cfg):
    """Another select.hours (a contract key) selects again, and so does a corpus made from
    other inputs (its fingerprint); the same keys and corpus hand the selection back. A
    selection finished before select kept its plan is taken, unchecked."""
    from core.runs import StepContext
    from amflow.steps import select

    make_corpus(tmp_path / "corpus", speakers=8, utts=4, labeled=3, with_split=False)
    sets = [f"data.corpus={tmp_path / 'corpus'}", "select.shard_hours=0.002"]
    small = select.run(StepContext(local_cfg(*sets, "select.hours=0.002"), "r", "select"))
    assert select.run(StepContext(local_cfg(*sets, "select.hours=0.002"), "r", "select")) == small
    large = select.run(StepContext(local_cfg(*sets, "select.hours=0.006"), "r", "select"))
    assert large["metrics"] != small["metrics"]
    assert sum(r["duration"] for rs in _read_manifests(local_cfg(*sets), "r").values()
               for r in rs) >= 0.006 * 3600
    plan = tmp_path / "store" / "runs" / "r" / "select" / "_plan.json"
    # written by other tools (no _SUCCESS.json): known by its metadata files' versions
    hand_made = json.loads(plan.read_text())["corpus_fingerprint"]
    assert hand_made.startswith("files-")
    meta = tmp_path / "corpus" / "metadata" / "date=2024-01-02" / "bucket=0" / "part.jsonl"
    lines = meta.read_text().splitlines(keepends=True)
    meta.write_text("".join(lines[:-1]))  # a record taken out in place: selected again
    fewer = select.run(StepContext(local_cfg(*sets, "select.hours=0.006"), "r", "select"))
    assert fewer["counts"]["in"] == large["counts"]["in"] - 1
    assert json.loads(plan.read_text())["corpus_fingerprint"] not in (hand_made, None)
    # a selection an older amflow kept with no fingerprint for such a corpus is taken
    kept = json.loads(plan.read_text())
    plan.write_text(json.dumps({**kept, "corpus_fingerprint": None}))
    assert select.run(StepContext(local_cfg(*sets, "select.hours=0.006"), "r", "select")) == \
        fewer
    assert json.loads(plan.read_text()) == kept  # known by its files from now on
    # the corpus made (again) by amflow import: selected again, under its fingerprint
    (tmp_path / "corpus" / "_SUCCESS.json").write_text('{"fingerprint": "f1", "wall_s": 1}')
    remade = select.run(StepContext(local_cfg(*sets, "select.hours=0.006"), "r", "select"))
    assert json.loads(plan.read_text())["corpus_fingerprint"] == "f1"
    # the same corpus made twice (its timings aside) is the same corpus
    (tmp_path / "corpus" / "_SUCCESS.json").write_text('{"fingerprint": "f1", "wall_s": 2}')
    assert select.run(StepContext(local_cfg(*sets, "select.hours=0.006"), "r", "select")) == \
        remade
    plan.unlink()  # as an older amflow left it
    assert select.run(StepContext(local_cfg(*sets, "select.hours=1"), "r", "select")) == remade


def test_wav_truncation_detection():
    from tasks.audio import wav_truncation

    hdr = b"RIFF" + struct.pack("<I", 100) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + \
        struct.pack("<HHIIHH", 1, 1, 16000, 32000, 2, 16)
    assert wav_truncation(hdr + b"data" + struct.pack("<I", 8) + bytes(8)) is None
    assert wav_truncation(hdr + b"data" + struct.pack("<I", 80) + bytes(8))[0] == \
        "truncated_audio"
    assert wav_truncation(hdr + b"junk" + struct.pack("<I", 80) + bytes(8))[0] == "corrupt_audio"
    assert wav_truncation(b"fLaC....") is None
