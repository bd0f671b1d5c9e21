"""`amflow corpus`: the plan, one utterance, the corpus layout contract, local and S3."""
from __future__ import annotations

import dataclasses
import datetime as dt
import io
import json
import shutil
import subprocess
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from scipy import signal

from core.config import ConfigError, load_config
from tasks import corpus as C
from tasks.speech import espeak

from .conftest import ROOT, TINY_CORPUS_OVERRIDES, amflow_bin


@pytest.fixture(scope="module")
def variant_names():
    return [v.variant_name for v in espeak.variants()]


def _cfg(*overrides: str):
    return load_config(ROOT / "configs" / "local.yaml", list(overrides))


# -- the plan (pure) -------------------------------------------------------------------

def test_plan_is_deterministic_and_balanced(variant_names):
    cc = _cfg("corpus.hours=0.2").corpus
    plan = C.plan_corpus(cc, variant_names)
    again = C.plan_corpus(cc, variant_names)
    assert plan.fingerprint() == again.fingerprint()
    assert [dataclasses.asdict(u) for u in plan.utterances] == \
        [dataclasses.asdict(u) for u in again.utterances]
    other = C.plan_corpus(_cfg("corpus.hours=0.2", "corpus.seed=1").corpus, variant_names)
    assert other.fingerprint() != plan.fingerprint()

    utts = plan.utterances
    assert len({u.utt_id for u in utts}) == len(utts)
    assert plan.estimated_seconds == pytest.approx(720, rel=0.05)
    by_split = defaultdict(set)
    for u in utts:
        by_split[u.split].add(u.speaker_id)
    for b in plan.batches:
        assert 1 <= len(b.utts) <= cc.batch_utts
        assert {u.speaker_id for u in b.utts} == {b.speaker.speaker_id}
    test_spk = {s.speaker_id for s in plan.speakers if s.test}
    assert by_split["test"] == test_spk and len(test_spk) == cc.test_speakers
    for split in ("labeled", "unlabeled", "dev"):
        assert by_split[split] and not by_split[split] & test_spk
    # every condition in every split
    conds = defaultdict(set)
    for u in utts:
        conds[u.split].add(u.condition)
    assert all(conds[s] == set(cc.conditions) for s in C.SPLITS)
    # the unlabeled pool is several times the labeled one
    counts = Counter(u.split for u in utts)
    assert counts["unlabeled"] >= 4 * counts["labeled"]
    # voices: many distinct speakers
    voices = {(s.variant, s.pitch, s.rate) for s in plan.speakers}
    assert len(voices) == cc.speakers
    assert len({s.variant for s in plan.speakers}) >= cc.speakers // 2


def test_plan_timestamps_order_each_speaker_stream(variant_names):
    cc = _cfg("corpus.hours=0.2").corpus
    plan = C.plan_corpus(cc, variant_names)
    per_spk = defaultdict(list)
    for u in plan.utterances:
        per_spk[u.speaker_id].append(u)
    start = dt.datetime.fromisoformat(cc.start_date + "T00:00:00+00:00")
    days = set()
    for spk, us in per_spk.items():
        times = [dt.datetime.fromisoformat(u.created_at) for u in us]
        assert times == sorted(times) and len(set(times)) == len(times)
        assert [u.utt_id for u in us] == sorted(u.utt_id for u in us)
        for t in times:
            assert t.tzinfo is not None and start <= t < start + dt.timedelta(days=cc.days + 1)
            days.add(t.date())
    assert len(days) >= 7


def test_config_rejects_bad_shares():
    with pytest.raises(ConfigError, match="corpus.labeled_share"):
        _cfg("corpus.labeled_share=0.5")
    with pytest.raises(ConfigError, match="corpus.start_date"):
        _cfg("corpus.start_date=March")


# -- one utterance ---------------------------------------------------------------------

def _one(variant_names, condition: str, text: str, seed: int = 5):
    cc = _cfg().corpus
    plan = C.plan_corpus(cc, variant_names)
    u = dataclasses.replace(plan.utterances[0], condition=condition, text=text, seed=seed)
    spk = plan.batches[0].speaker
    return C.synthesize_utterance(u, spk, plan.ctx), u, plan.ctx


def _hf_contrast(x, fs, segs, shift_ms):
    hop = int(fs * 0.005)
    f, t, s = signal.stft(x, fs, nperseg=256, noverlap=256 - hop)
    p = np.abs(s) ** 2
    hf = p[f > 4000].sum(0) / (p.sum(0) + 1e-12)
    lab = np.zeros(len(t), bool)
    for ph, a, b in segs:
        if ph in {"s", "S", "z", "f"}:
            lab |= (t * fs >= a + shift_ms * fs / 1000) & (t * fs < b + shift_ms * fs / 1000)
    return float(hf[lab].mean() - hf[~lab].mean())


@pytest.mark.parametrize("condition,late_ms", [("DP1", 5.0), ("DP2", 5.0), ("DP3", 10.0)])
def test_utterance_alignment_is_frame_accurate_after_the_room(variant_names, condition,
                                                             late_ms):
    """After resampling, padding, the room and the delay compensation, fricatives still
    line up with high-frequency energy: within +-5 ms close up; farther away the
    reverberation smears energy later (by up to ~10 ms at DP3), never earlier."""
    texts = ["She sells sea shells, so she says.", "Sixty six sisters fixed six fish sauces.",
             "Please pass the salt and the fish, Sam sighed."]
    items = []
    for i, t in enumerate(texts):
        out, _, ctx = _one(variant_names, condition, t, seed=11 + i)
        x, fs = sf.read(io.BytesIO(out.wav), dtype="float64")
        items.append((x, fs, out.segments))
    shifts = np.arange(-30, 31, 2.5)
    scores = [np.mean([_hf_contrast(x, fs, segs, s) for x, fs, segs in items]) for s in shifts]
    best = float(shifts[int(np.argmax(scores))])
    assert -5.0 <= best <= late_ms, (condition, best)


def test_utterance_is_16k_int16_with_complete_alignment(variant_names):
    out, u, ctx = _one(variant_names, "DP5", "Turn off the lights in the kitchen.")
    info = sf.info(io.BytesIO(out.wav))
    assert (info.samplerate, info.channels, info.subtype, info.format) == \
        (16000, 1, "PCM_16", "WAV")
    assert info.frames == out.num_samples
    assert out.record["duration"] == out.num_samples / 16000
    assert ctx.min_duration <= out.record["duration"] <= ctx.max_duration
    segs = out.segments
    assert segs[0][1] == 0 and segs[-1][2] == out.num_samples
    assert all(a[2] == b[1] for a, b in zip(segs, segs[1:]))
    assert segs[0][0] == segs[-1][0] == "sil"
    lines = C.ctm_lines(u.utt_id, segs, 16000)
    t = 0.0
    for line in lines:
        utt, ch, start, dur, phone = line.split()
        assert utt == u.utt_id and ch == "1" and float(start) == pytest.approx(t, abs=1e-9)
        t = float(start) + float(dur)
    assert t == pytest.approx(out.record["duration"], abs=1e-4)


def test_far_conditions_are_harder(variant_names):
    """Same sentence and speaker: DP5 is noisier and more reverberant than DP1."""
    text = "Please play some jazz music in the living room."
    pcm = {}
    for cond in ("DP1", "DP5"):
        out, _, _ = _one(variant_names, cond, text, seed=21)
        x, _ = sf.read(io.BytesIO(out.wav), dtype="float64")
        speech = np.zeros(len(x), bool)
        for p, a, b in out.segments:
            speech[a:b] = p != "sil"
        pcm[cond] = (x, speech, out.record)
    assert pcm["DP1"][2]["snr_db"] > 25 > 10 > pcm["DP5"][2]["snr_db"]
    assert pcm["DP5"][2]["rt60_s"] > 0.7 > 0.3 > pcm["DP1"][2]["rt60_s"]

    # energy in the pauses relative to speech: a crude measured SNR
    def floor(x, speech):
        return 10 * np.log10(np.mean(x[speech] ** 2) / np.mean(x[~speech] ** 2))

    assert floor(*pcm["DP1"][:2]) > floor(*pcm["DP5"][:2]) + 10


# -- the corpus contract (on the session's tiny corpus) --------------------------------

def _records(root: Path) -> list[dict]:
    recs = []
    for p in sorted((root / "metadata").rglob("*.jsonl")):
        rel = p.relative_to(root / "metadata").parts
        assert rel[0].startswith("date=") and rel[1].startswith("bucket=")
        for line in p.read_text().splitlines():
            r = json.loads(line)
            assert rel[0] == f"date={r['created_at'][:10]}"
            recs.append(r)
    return recs


def _ctm(root: Path) -> dict[str, list[tuple[float, float, str]]]:
    out = defaultdict(list)
    for line in (root / "alignments.ctm").read_text().splitlines():
        utt, ch, start, dur, phone = line.split()
        assert ch == "1"
        out[utt].append((float(start), float(dur), phone))
    return out


def test_tiny_corpus_layout_contract(tiny_corpus):
    root = tiny_corpus
    recs = _records(root)
    keys = {"utt_id", "speaker_id", "duration", "created_at", "locale", "audio_uri", "text",
            "condition", "split"}
    total = 0.0
    for r in recs:
        assert keys <= set(r)
        assert isinstance(r["duration"], float) and r["text"] and r["locale"] == "en-US"
        dt.datetime.fromisoformat(r["created_at"])
        assert r["split"] in C.SPLITS and r["condition"] in {"DP1", "DP2", "DP3", "DP4", "DP5"}
        path = root / r["audio_uri"]
        assert path.is_file(), r["audio_uri"]
        info = sf.info(str(path))
        assert (info.samplerate, info.channels, info.subtype) == (16000, 1, "PCM_16")
        assert abs(info.frames / 16000 - r["duration"]) < 1e-6
        assert 1.5 <= r["duration"] <= 5.0
        total += r["duration"]
    assert total >= 150.0
    assert len({r["utt_id"] for r in recs}) == len(recs)
    assert len({r["condition"] for r in recs}) >= 4
    assert {r["split"] for r in recs} == set(C.SPLITS)
    # every WAV on disk is referenced
    wavs = {p.relative_to(root).as_posix() for p in (root / "audio").rglob("*.wav")}
    assert wavs == {r["audio_uri"] for r in recs}
    # test speakers are unseen elsewhere
    spk = defaultdict(set)
    for r in recs:
        spk[r["split"]].add(r["speaker_id"])
    assert not spk["test"] & (spk["labeled"] | spk["unlabeled"] | spk["dev"])
    assert sum(r["duration"] for r in recs if r["split"] == "unlabeled") > \
        3 * sum(r["duration"] for r in recs if r["split"] == "labeled")


def test_tiny_corpus_alignments(tiny_corpus):
    root = tiny_corpus
    recs = {r["utt_id"]: r for r in _records(root)}
    ctm = _ctm(root)
    aligned = {u for u, r in recs.items() if r["split"] in C.ALIGNED_SPLITS}
    assert set(ctm) == aligned
    phones = (root / "phones.txt").read_text().splitlines()
    assert phones == sorted(phones) and len(set(phones)) == len(phones)
    assert {"<unk>", "sil"} <= set(phones) and len(phones) >= 30
    # the inventory is the vocabulary's: the same for a corpus of any size or seed
    assert phones == C.phone_inventory(C.vocabulary_phones("en-us"))
    for utt, segs in ctm.items():
        dur = recs[utt]["duration"]
        assert segs[0][0] == 0.0
        for (s0, d0, _), (s1, _, _) in zip(segs, segs[1:]):
            assert s1 == pytest.approx(s0 + d0, abs=1e-6)  # contiguous
        covered = sum(d for _, d, _ in segs)
        assert covered >= 0.9 * dur and segs[-1][0] + segs[-1][1] <= dur + 1e-4
        assert all(p in phones for _, _, p in segs)
        assert sum(p != "sil" for _, _, p in segs) >= 5


def test_tiny_corpus_success_counts(tiny_corpus):
    root = tiny_corpus
    recs = _records(root)
    ok = json.loads((root / "_SUCCESS.json").read_text())
    assert ok["utterances"] == len(recs)
    assert ok["per_split"] == dict(sorted(Counter(r["split"] for r in recs).items()))
    assert ok["per_condition"] == dict(sorted(Counter(r["condition"] for r in recs).items()))
    assert ok["audio_s"] == pytest.approx(sum(r["duration"] for r in recs), abs=0.01)
    assert ok["speakers"] == len({r["speaker_id"] for r in recs})
    assert ok["audio_s_per_wall_s"] > 1.0 and ok["wall_s"] > 0


def test_rerun_is_a_noop_and_resumes_missing_batches(tiny_corpus, tmp_path):
    root = tmp_path / "c"
    shutil.copytree(tiny_corpus, root)
    cfg = _cfg(*TINY_CORPUS_OVERRIDES)
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}
    assert C.build_corpus(cfg, str(root), use_ray=False)["skipped"] is True
    assert before == {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}

    # A run killed half-way: no _SUCCESS, one batch without its marker and a WAV missing.
    (root / "_SUCCESS.json").unlink()
    victim = next(iter(sorted((root / "_batches").glob("*.json"))))
    batch_id = victim.stem
    victim.unlink()
    part = next((root / "metadata").rglob(f"part-{int(batch_id[1:]):05d}.jsonl"))
    rec = json.loads(part.read_text().splitlines()[0])
    (root / rec["audio_uri"]).unlink()
    summary = C.build_corpus(cfg, str(root), use_ray=False)
    assert summary["batches_written"] == 1 and summary["skipped"] is False
    assert _tree(root) == _tree(tiny_corpus)

    forced = C.build_corpus(cfg, str(root), force=True, use_ray=False)
    assert forced["batches_written"] == forced["batches"]
    assert _tree(root) == _tree(tiny_corpus)


def test_labeled_utterances_keep_their_clean_source(tiny_corpus):
    """The dry rendering of the splits in corpus.clean_splits (local.yaml: labeled, which
    the example servers re-render, and dev, which align reads): listed as clean_audio_uri,
    same length as the far-field file, and aligned with it (the speech's cross-correlation
    peaks at the direct path's delay of at most a few ms, not at 0)."""
    kept = set(_cfg().corpus.clean_splits)
    assert kept == {"labeled", "dev"}
    recs = _records(tiny_corpus)
    labeled = [r for r in recs if r["split"] == "labeled"]
    kept_recs = [r for r in recs if r["split"] in kept]
    assert labeled and all("clean_audio_uri" in r for r in kept_recs)
    assert not any("clean_audio_uri" in r for r in recs if r["split"] not in kept)
    clean_files = {p.relative_to(tiny_corpus).as_posix()
                   for p in (tiny_corpus / "audio_clean").rglob("*.wav")}
    assert clean_files == {r["clean_audio_uri"] for r in kept_recs}
    for r in labeled[:4]:
        far, fs = sf.read(str(tiny_corpus / r["audio_uri"]))
        dry, fs2 = sf.read(str(tiny_corpus / r["clean_audio_uri"]))
        assert fs == fs2 == 16000 and len(far) == len(dry)
        assert -45 < 20 * np.log10(np.sqrt(np.mean(dry ** 2)) + 1e-12) < -15  # as the far field
        if r["condition"] == "DP1":  # close talk: the far-field file is the dry speech, wet
            xc = signal.correlate(far, dry, mode="full", method="fft")
            lag = int(np.argmax(np.abs(xc))) - (len(dry) - 1)
            assert abs(lag) <= 40, lag


def test_clean_splits_keep_a_close_talk_test_set_that_evaluate_scores(tmp_path):
    """corpus.clean_splits=labeled,test also keeps the test split's dry rendering (a
    close-talk test set); `evaluate.audio=clean` scores those files as condition "dry"
    and rejects records without one. The default leaves corpus fingerprints as they were."""
    from core.runs import StepError
    from core.storage import Storage
    from tasks.select import records_of_split
    from training.evaluate import clean_renderings

    ctx = C.SynthContext(1, "en-us", "en-US", 16000, 1.5, 5.0, 4)
    assert "clean_splits" not in ctx.fingerprinted()
    assert dataclasses.replace(ctx, clean_splits=("labeled", "test")).fingerprinted()[
        "clean_splits"] == ("labeled", "test")
    root = tmp_path / "c"
    C.build_corpus(_cfg("corpus.hours=0.02", "corpus.clean_splits=labeled,test"), str(root),
                   use_ray=False)
    recs = _records(root)
    test = [r for r in recs if r["split"] == "test"]
    assert test and all((root / r["clean_audio_uri"]).is_file() for r in test)
    assert not any("clean_audio_uri" in r for r in recs if r["split"] in ("dev", "unlabeled"))
    st, rejects = Storage(), []
    split, _ = records_of_split(st, str(root), "test")
    dry = clean_renderings(st, str(root), split, rejects)
    assert not rejects and {r.condition for r in dry} == {"dry"}
    assert sorted(r.audio_uri for r in dry) == sorted(str(root / r["clean_audio_uri"])
                                                      for r in test)
    dev, _ = records_of_split(st, str(root), "dev")
    with pytest.raises(StepError, match="clean_audio_uri"):
        clean_renderings(st, str(root), dev, rejects)
    assert len(rejects) == len(dev) and {r.reason for r in rejects} == {"no_clean_audio"}


def test_changed_plan_removes_stale_files(tiny_corpus, tmp_path):
    root = tmp_path / "c"
    shutil.copytree(tiny_corpus, root)
    mine = root / "audio" / "notes" / "readme.wav"
    mine.parent.mkdir()
    mine.write_bytes(b"a user's file")
    cfg = _cfg("corpus.hours=0.02")
    C.build_corpus(cfg, str(root), use_ray=False)
    assert mine.read_bytes() == b"a user's file"  # only files the step names are removed
    recs = _records(root)
    ok = json.loads((root / "_SUCCESS.json").read_text())
    assert ok["utterances"] == len(recs) < json.loads(
        (tiny_corpus / "_SUCCESS.json").read_text())["utterances"]
    wavs = {p.relative_to(root).as_posix() for p in (root / "audio").rglob("*.wav")}
    assert wavs == {r["audio_uri"] for r in recs} | {"audio/notes/readme.wav"}
    assert set(_ctm(root)) == {r["utt_id"] for r in recs if r["split"] != "unlabeled"}


def test_refuses_to_write_into_a_foreign_corpus(tmp_path):
    root = tmp_path / "theirs"
    (root / "metadata").mkdir(parents=True)
    (root / "metadata" / "part.jsonl").write_text('{"utt_id": "x"}\n')
    with pytest.raises(C.StepError, match="did not write"):
        C.build_corpus(_cfg("corpus.hours=0.01"), str(root), use_ray=False)
    assert not (root / "audio").exists()


def _tree(root: Path, skip=("_SUCCESS.json",)) -> dict[str, bytes]:
    """Every published file's bytes (markers hold timings, so only their names count)."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if not p.is_file() or rel in skip:
            continue
        out[rel] = b"" if rel.startswith("_batches/") and rel.endswith(".json") else p.read_bytes()
    return out


# -- the CLI, on Ray, to local disk and to S3 --------------------------------------------

def _cli(out: str, *overrides: str, cwd: Path = ROOT) -> dict:
    cmd = [*amflow_bin().split(), "corpus", "--config", str(ROOT / "configs" / "local.yaml"),
           "--out", out]
    for o in (*TINY_CORPUS_OVERRIDES, *overrides):
        cmd += ["--set", o]
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("AMFLOW_SUMMARY ")
    summary = json.loads(last[len("AMFLOW_SUMMARY "):])
    if not summary["skipped"]:
        assert "[corpus]" in r.stderr  # the progress bar
    return summary


@pytest.mark.integration
@pytest.mark.slow  # a Ray start on 2 busy cores: ~20-30 s
def test_cli_on_ray_matches_the_in_process_build(tiny_corpus, tmp_path):
    """`amflow corpus --out DIR --set corpus.hours=0.05`: same bytes as the fixture (built
    without Ray): deterministic for the seed, whatever the order and the process."""
    out = tmp_path / "c"
    summary = _cli(str(out))
    assert summary["audio_s"] >= 150 and summary["audio_s_per_wall_s"] > 0
    assert _tree(out) == _tree(tiny_corpus)


@pytest.mark.integration
@pytest.mark.slow  # two CLI runs, a Ray start and a moto server: ~35 s on 2 busy cores
def test_cli_writes_the_same_objects_to_s3(tiny_corpus, s3_bucket, tmp_path):
    bucket, overrides = s3_bucket
    summary = _cli(f"s3://{bucket}/c", *overrides)
    assert summary["utterances"] == json.loads(
        (tiny_corpus / "_SUCCESS.json").read_text())["utterances"]
    from core.storage import Storage

    storage = Storage(load_config(None, overrides).storage)
    objs = storage.list(f"s3://{bucket}/c", recursive=True)
    rel = {u[len(f"s3://{bucket}/c/"):]: u for u in objs}
    local = _tree(tiny_corpus)
    assert set(rel) - {"_SUCCESS.json"} == set(local)
    for name, data in local.items():
        if name.startswith("_batches/") and name.endswith(".json"):
            continue
        assert storage.read_bytes(rel[name]) == data, name
    # and a second run finds it complete
    again = _cli(f"s3://{bucket}/c", *overrides)
    assert again["skipped"] is True
