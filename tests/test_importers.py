"""`amflow import`: Kaldi data dirs and lhotse manifests into the input corpus format."""
from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from amflow.cli import SUMMARY_PREFIX, main
from core.config import ConfigError, load_config
from core.storage import Storage
from tasks.importers import REASONS, import_corpus, read_kaldi, read_lhotse
from tasks.importers.kaldi import parse_kaldi_dir, parse_segment, wav_path
from tasks.importers.lhotse import parse_lhotse
from tasks.select import parse_metadata_line

ROOT = Path(__file__).resolve().parents[1]
LEXICON = "hello h @ l oU\nworld w 3 l d\ngood g U d\nmorning m O r n I N\n"


def _tone(seconds: float, rate: int, channels: int = 1, freq: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    x = 0.3 * np.sin(2 * np.pi * freq * t)
    return np.stack([x * (1 + 0.1 * c) for c in range(channels)], axis=1) if channels > 1 else x


def _write(path: Path, seconds: float, rate: int = 16000, channels: int = 1,
           subtype: str = "PCM_16") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, _tone(seconds, rate, channels), rate, subtype=subtype)
    return path


def _cfg(tmp_path: Path, *overrides: str):
    return load_config(ROOT / "configs" / "local.yaml",
                       [f"storage.root={tmp_path / 'store'}", *overrides])


def _records(out: Path) -> dict[str, dict]:
    recs = {}
    for part in sorted((out / "metadata").rglob("*.jsonl")):
        for line in part.read_text().splitlines():
            parse_metadata_line(line)  # every record is valid input format
            rec = json.loads(line)
            recs[rec["utt_id"]] = rec
    return recs


def _rejects(out: Path) -> dict[str, str]:
    table = pq.read_table(out / "rejects.parquet").to_pylist()
    return {r["utt_id"]: r["reason"] for r in table}


@pytest.fixture()
def kaldi_dir(tmp_path):
    """A Kaldi data dir with segments: 4 good utterances and one of each bad kind."""
    d = tmp_path / "kaldi"
    audio = tmp_path / "audio"
    rec1 = _write(audio / "rec1.wav", 3.0)                          # 16 kHz mono
    _write(d / "wav" / "rec2.flac", 2.0, rate=8000, channels=2)      # relative, 8 kHz stereo
    rec6 = _write(audio / "rec6.flac", 1.5)                          # read through flac -d
    (audio / "bad.wav").write_bytes(b"RIFF not really audio")
    (d / "wav.scp").write_text(
        f"rec1 {rec1}\nrec2 wav/rec2.flac\nrecpipe sox {rec1} -t wav - |\n"
        f"recflac flac -c -d -s {rec6} |\nrecmissing {audio / 'nope.wav'}\n"
        f"reccorrupt {audio / 'bad.wav'}\n")
    (d / "segments").write_text(
        "u1 rec1 0.0 1.0\nu2 rec1 1.0 2.5\nu3 rec2 0.2 1.2\nu4 rec1 2.0 1.5\n"
        "u5 rec1 2.5 9.0\nu6 recpipe 0 1\nu7 recmissing 0 1\nu8 reccorrupt 0 1\n"
        "u9 rec1 0 1\nu10 rec1 0 1\nu11 rec1 0 1\nu1 rec1 0.0 1.0\nu12 recflac 0 -1\n"
        "u13 nosuchrec 0 1\n")
    spk = {f"u{i}": f"spk{i % 2}" for i in range(1, 14) if i != 9}
    spk["u14"] = "spk0"  # in utt2spk only: no audio
    (d / "utt2spk").write_text("".join(f"{u} {s}\n" for u, s in spk.items()))
    (d / "text").write_text(
        "u1 hello world\nu3 Good morning\nu4 hello\nu5 hello\nu6 hello\nu7 hello\n"
        "u8 hello\nu9 hello\nu10\nu11 hello zyzzyva\nu12 HELLO WORLD\n")
    (tmp_path / "lexicon.txt").write_text(LEXICON)
    return d


EXPECTED_REJECTS = {
    "u1": "duplicate_utt_id", "u4": "bad_segment", "u5": "bad_segment",
    "u6": "wav_scp_pipe_unsupported", "u7": "missing_audio", "u8": "unreadable_audio",
    "u9": "no_speaker", "u10": "empty_text", "u11": "oov_words", "u13": "missing_audio",
    "u14": "missing_audio",
}


def test_kaldi_dir_records_rejects_and_conservation(kaldi_dir, tmp_path):
    cfg = _cfg(tmp_path, f"ingest.lexicon={tmp_path / 'lexicon.txt'}",
               "ingest.created_at=2026-01-02T03:04:05+00:00", "ingest.locale=en-GB")
    out = tmp_path / "corpus"
    st = Storage(cfg.storage)
    summary = import_corpus(st, read_kaldi(st, str(kaldi_dir)), str(out), cfg.ingest)
    recs, rejects = _records(out), _rejects(out)
    assert sorted(recs) == ["u1", "u12", "u2", "u3"]
    assert rejects == EXPECTED_REJECTS
    assert summary["counts"] == {"in": 15, "out": 4, "rejected": 11}
    assert summary["rejects_by_reason"]["missing_audio"] == 3
    assert set(REASONS) >= set(rejects.values())
    # transcribed -> labeled with text; untranscribed -> unlabeled without
    assert recs["u1"]["split"] == "labeled" and recs["u1"]["text"] == "hello world"
    assert recs["u2"]["split"] == "unlabeled" and "text" not in recs["u2"]
    assert recs["u1"]["locale"] == "en-GB" and recs["u1"]["created_at"].startswith("2026-01-02")
    # segments are cut into 16 kHz mono WAVs under audio/; lengths from the audio
    for utt, seconds in (("u1", 1.0), ("u2", 1.5), ("u3", 1.0)):
        rel = recs[utt]["audio_uri"]
        assert rel.startswith(f"audio/{recs[utt]['split']}/")
        info = sf.info(out / rel)
        assert (info.samplerate, info.channels, info.subtype) == (16000, 1, "PCM_16")
        assert abs(info.duration - seconds) < 1e-3 and recs[utt]["duration"] == \
            pytest.approx(seconds, abs=1e-3)
    # the cut is sample-exact for 16 kHz 16-bit input
    src, _ = sf.read(tmp_path / "audio" / "rec1.wav", dtype="int16")
    cut, _ = sf.read(out / recs["u2"]["audio_uri"], dtype="int16")
    np.testing.assert_array_equal(cut, src[16000:40000])
    # a whole file already in the format (via `flac -c -d -s FILE |`) is referenced in place
    assert recs["u12"]["audio_uri"] == str(tmp_path / "audio" / "rec6.flac")
    assert recs["u12"]["duration"] == pytest.approx(1.5)
    assert summary["audio_files_written"] == 3 and summary["audio_referenced"] == 1
    assert summary["per_split"] == {"labeled": 3, "unlabeled": 1}
    assert (out / "lexicon.txt").read_text() == LEXICON
    assert json.loads((out / "_SUCCESS.json").read_text())["counts"]["in"] == 15


def test_kaldi_without_segments_durations_and_rerun(tmp_path):
    d = tmp_path / "kaldi"
    a = _write(tmp_path / "a.wav", 1.0)
    b = _write(tmp_path / "b.wav", 2.0, rate=44100)
    c = _write(tmp_path / "c.wav", 1.0)
    (d).mkdir()
    (d / "wav.scp").write_text(f"a {a}\nb {b}\nc {c}\n")
    (d / "utt2spk").write_text("a s1\nb s1\nc s2\n")
    (d / "text").write_text("a hello\nb world\nc good\n")
    (d / "utt2dur").write_text("a 1.0\nb 2.0\nc 3.0\n")
    cfg = _cfg(tmp_path)
    st = Storage(cfg.storage)
    out = tmp_path / "corpus"
    s1 = import_corpus(st, read_kaldi(st, str(d)), str(out), cfg.ingest)
    recs = _records(out)
    assert _rejects(out) == {"c": "duration_mismatch"}
    assert recs["a"]["audio_uri"] == str(a)  # in the format already: referenced
    assert recs["b"]["audio_uri"].startswith("audio/labeled/s1/")  # 44.1 kHz: resampled
    assert sf.info(out / recs["b"]["audio_uri"]).samplerate == 16000
    assert recs["b"]["duration"] == pytest.approx(2.0, abs=1e-3)
    assert recs["a"]["created_at"]  # the file's mtime, ISO 8601
    assert s1["skipped"] is False and s1["counts"] == {"in": 3, "out": 2, "rejected": 1}
    again = _cfg(tmp_path, "ingest.workers=1").ingest  # threads do not change the output
    assert import_corpus(st, read_kaldi(st, str(d)), str(out), again)["skipped"] is True
    (out / "_SUCCESS.json").unlink()  # as if killed before the end: redone, not refused
    assert import_corpus(st, read_kaldi(st, str(d)), str(out), cfg.ingest)["skipped"] is False
    # another config of the same split is refused without --force (never replace an
    # import's records unasked); with it the split is redone: copy_audio writes every
    # file, and the old ones are kept only where the new import has them
    cfg2 = _cfg(tmp_path, "ingest.copy_audio=true")
    from core.runs import StepError
    with pytest.raises(StepError, match="--force replaces split labeled"):
        import_corpus(st, read_kaldi(st, str(d)), str(out), cfg2.ingest)
    s2 = import_corpus(st, read_kaldi(st, str(d)), str(out), cfg2.ingest, force=True)
    recs2 = _records(out)
    assert s2["audio_files_written"] == 2 and recs2["a"]["audio_uri"].startswith("audio/")
    (out / recs2["b"]["audio_uri"]).unlink()  # so the next import must write it again
    # the same audio as another split is a clash, refused before anything is written
    cfg3 = _cfg(tmp_path, "ingest.split=unlabeled")
    with pytest.raises(StepError, match="two splits.*a: in split labeled"):
        import_corpus(st, read_kaldi(st, str(d)), str(out), cfg3.ingest)
    assert _records(out).keys() == recs2.keys()
    # copy_audio off again (forced): a is referenced, its copy goes stale and is removed
    s4 = import_corpus(st, read_kaldi(st, str(d)), str(out), cfg.ingest, force=True)
    assert s4["audio_files_written"] == 1 and not (out / recs2["a"]["audio_uri"]).exists()
    assert (out / _records(out)["b"]["audio_uri"]).exists()
    parts = sorted(str(p.relative_to(out)) for p in (out / "metadata").rglob("*.jsonl"))
    assert parts == ["metadata/split=labeled/labeled-part-00000.jsonl"]


def test_refuses_foreign_corpus_and_missing_files(tmp_path):
    cfg = _cfg(tmp_path)
    st = Storage(cfg.storage)
    d = tmp_path / "kaldi"
    d.mkdir()
    (d / "wav.scp").write_text("")
    from core.runs import StepError
    with pytest.raises(StepError, match="utt2spk"):
        read_kaldi(st, str(d))
    (d / "utt2spk").write_text("")
    foreign = tmp_path / "foreign"
    (foreign / "metadata").mkdir(parents=True)
    (foreign / "metadata" / "x.jsonl").write_text("{}\n")
    with pytest.raises(StepError, match="did not write"):
        import_corpus(st, read_kaldi(st, str(d)), str(foreign), cfg.ingest)
    with pytest.raises(ConfigError, match="ingest.lexicon"):
        import_corpus(st, read_kaldi(st, str(d)), str(tmp_path / "new"),
                      _cfg(tmp_path, f"ingest.lexicon={tmp_path / 'nope.txt'}").ingest)
    with pytest.raises(ConfigError, match="ingest.split"):
        _cfg(tmp_path, "ingest.split=train")


def test_kaldi_parsers():
    assert wav_path("/a/b.wav") == ("/a/b.wav", "", "")
    assert wav_path("flac -c -d -s /a/b.flac |")[0] == "/a/b.flac"
    assert wav_path("flac -cds /a/b.flac |")[0] == "/a/b.flac"
    assert wav_path("flac -c -d -s - |")[1] == "wav_scp_pipe_unsupported"
    assert wav_path("sph2pipe -f wav /a/b.sph |")[1] == "wav_scp_pipe_unsupported"
    assert wav_path("flac -d /a/b.flac | sox - -r 8000 - |")[1] == "wav_scp_pipe_unsupported"
    assert parse_segment("r 1.5 -1") == (("r", 1.5, None), "")
    assert parse_segment("r 2 1")[0] is None and parse_segment("r -1 2")[0] is None
    assert parse_segment("r a b")[0] is None and parse_segment("r 1")[0] is None
    # utt2spk conflict -> duplicate; identical repeat is harmless; no text file -> untranscribed
    p = parse_kaldi_dir({"wav.scp": "a /a.wav\nb /b.wav\n",
                         "utt2spk": "a s\na t\nb s\nb s\n"}, "/base")
    assert [(r.utt_id, r.reason) for r in p.rejects] == [("a", "duplicate_utt_id")]
    assert [(e.utt_id, e.text) for e in p.entries] == [("b", None)] and p.items_in == 2
    p = parse_kaldi_dir({"wav.scp": "a rel/a.wav\n", "utt2spk": "a s\n"}, "s3://bkt/data")
    assert p.entries[0].audio_uri == "s3://bkt/data/rel/a.wav"


LHOTSE_RECS = [
    {"id": "r1", "sources": [{"type": "file", "channels": [0], "source": "r1.wav"}],
     "sampling_rate": 16000, "num_samples": 48000, "duration": 3.0, "channel_ids": [0]},
    {"id": "r2", "sources": [{"type": "file", "channels": [0, 1], "source": "r2.flac"}],
     "sampling_rate": 8000, "num_samples": 16000, "duration": 2.0, "channel_ids": [0, 1]},
    {"id": "r3", "sources": [{"type": "url", "channels": [0], "source": "http://x/y.wav"}],
     "sampling_rate": 16000, "num_samples": 16000, "duration": 1.0, "channel_ids": [0]},
    {"id": "r4", "sources": [{"type": "file", "channels": [0], "source": "r1.wav"}],
     "sampling_rate": 16000, "num_samples": 48000, "duration": 3.0, "channel_ids": [0],
     "transforms": [{"name": "Speed", "kwargs": {"factor": 1.1}}]},
]


def _sup(sid, rid, start, dur, **kw):
    return {"id": sid, "recording_id": rid, "start": start, "duration": dur, "channel": 0,
            "speaker": "spkA", "language": "English", **kw}


LHOTSE_SUPS = [
    _sup("s1", "r1", 0.0, 3.0, text="hello world"),             # whole file: in place
    _sup("s2", "r1", 0.5, 1.0),                                 # untranscribed: unlabeled
    _sup("s3", "r2", 0.0, 1.0, text="good morning", channel=1),  # channel 1 of 2, 8 kHz
    _sup("s4", "r3", 0.0, 1.0, text="hello"),                   # url source
    _sup("s5", "r4", 0.0, 1.0, text="hello"),                   # speed transform
    _sup("s6", "r1", 2.5, 2.0, text="hello"),                   # past the end
    _sup("s7", "r9", 0.0, 1.0, text="hello"),                   # no such recording
    _sup("s8", "r1", 0.0, 1.0, text="  "),                      # empty text
    _sup("s9", "r1", 0.0, 1.0, text="hello", speaker=None),     # no speaker
    _sup("s1", "r1", 0.0, 1.0, text="hello"),                   # duplicate id
]
LHOTSE_REJECTS = {"s4": "unsupported_source", "s5": "unsupported_transform",
                  "s6": "bad_segment", "s7": "missing_audio", "s8": "empty_text",
                  "s9": "no_speaker", "s1": "duplicate_utt_id", "supervisions:11":
                  "malformed_entry"}


@pytest.mark.parametrize("gz", [False, True])
def test_lhotse_manifests(tmp_path, gz):
    _write(tmp_path / "m" / "r1.wav", 3.0)
    _write(tmp_path / "m" / "r2.flac", 2.0, rate=8000, channels=2)
    suffix = ".jsonl.gz" if gz else ".jsonl"
    opener = gzip.open if gz else open
    with opener(tmp_path / "m" / f"recordings{suffix}", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in LHOTSE_RECS)
    with opener(tmp_path / "m" / f"supervisions{suffix}", "wt") as f:
        f.writelines(json.dumps(s) + "\n" for s in LHOTSE_SUPS)
        f.write("{not json\n")
    out = tmp_path / "corpus"
    rc = main(["import", "--from", "lhotse", "--src", str(tmp_path / "m"), "--out", str(out),
               "--set", f"storage.root={tmp_path / 'store'}"])
    assert rc == 0
    recs = _records(out)
    assert _rejects(out) == LHOTSE_REJECTS
    assert sorted(recs) == ["s1", "s2", "s3"]
    assert recs["s1"]["audio_uri"] == str(tmp_path / "m" / "r1.wav")
    assert recs["s2"]["split"] == "unlabeled" and recs["s3"]["split"] == "labeled"
    x, rate = sf.read(out / recs["s3"]["audio_uri"])
    assert rate == 16000 and x.ndim == 1 and len(x) == 16000
    summary = json.loads((out / "_SUCCESS.json").read_text())
    assert summary["counts"] == {"in": 11, "out": 3, "rejected": 8}


def test_lhotse_made_by_lhotse(tmp_path):
    lhotse = pytest.importorskip("lhotse")
    a = _write(tmp_path / "a.wav", 2.0)
    b = _write(tmp_path / "b.wav", 1.0, rate=22050)
    recs = lhotse.RecordingSet.from_recordings(
        [lhotse.Recording.from_file(a), lhotse.Recording.from_file(b).resample(16000)])
    sups = lhotse.SupervisionSet.from_segments([
        lhotse.SupervisionSegment(id="ua", recording_id="a", start=0.0, duration=2.0,
                                  channel=0, text="hello", speaker="s1", language="English"),
        lhotse.SupervisionSegment(id="ua2", recording_id="a", start=0.5, duration=1.0,
                                  channel=0, text="world", speaker="s2"),
        lhotse.SupervisionSegment(id="ub", recording_id="b", start=0.0, duration=1.0,
                                  channel=0, text="good", speaker="s1")])
    recs.to_file(tmp_path / "recs.jsonl.gz")
    sups.to_file(tmp_path / "sups.jsonl")
    cfg = _cfg(tmp_path)
    st = Storage(cfg.storage)
    src = read_lhotse(st, str(tmp_path / "recs.jsonl.gz"), str(tmp_path / "sups.jsonl"))
    summary = import_corpus(st, src, str(tmp_path / "corpus"), cfg.ingest)
    assert summary["counts"] == {"in": 3, "out": 3, "rejected": 0}
    out = _records(tmp_path / "corpus")
    assert out["ua"]["audio_uri"] == str(a) and out["ub"]["audio_uri"].startswith("audio/")
    assert out["ua2"]["duration"] == pytest.approx(1.0)
    assert sf.info(tmp_path / "corpus" / out["ub"]["audio_uri"]).samplerate == 16000


def test_parse_lhotse_pure():
    p = parse_lhotse("\n".join(json.dumps(r) for r in LHOTSE_RECS),
                     json.dumps(_sup("x", "r2", 0.0, 2.0, channel=None, text="hi")), "/m")
    (e,) = p.entries
    # both channels of r2 over the whole file: no cut, no channel pick (the writer still
    # converts it: 8 kHz stereo is not in the format)
    assert (e.channels, e.end, e.audio_uri) == (None, None, "/m/r2.flac")


def test_cli_import_then_select(kaldi_dir, tmp_path, capsys):
    out = tmp_path / "corpus"
    sets = ["--set", f"storage.root={tmp_path / 'store'}"]
    assert main(["import", "--from", "kaldi", "--src", str(kaldi_dir), "--out", str(out),
                 *sets]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1]
                         [len(SUMMARY_PREFIX):])
    assert summary["counts"] == {"in": 15, "out": 5, "rejected": 10}  # no lexicon: u11 kept
    # the imported corpus (text, no alignments.ctm) goes through select as it is
    assert not (out / "alignments.ctm").exists()
    assert main(["select", "--run-id", "imp", "--set", f"data.corpus={out}",
                 "--set", "select.splits=labeled,unlabeled", *sets]) == 0
    sel = json.loads(capsys.readouterr().out.strip().splitlines()[-1][len(SUMMARY_PREFIX):])
    assert sel["counts"]["in"] == 5 and sel["counts"]["rejected"] == 0
    assert sel["metrics"]["per_split"]["labeled"]["utts"] == 4
    table = pq.read_table(tmp_path / "store" / "runs" / "imp" / "select" / "shards").to_pylist()
    assert {r["utt_id"]: r["text"] for r in table}["u1"] == "hello world"
    # bad flags are clear errors
    assert main(["import", "--from", "kaldi", "--out", str(out), *sets]) == 1
    assert "--src" in capsys.readouterr().err


@pytest.mark.integration
def test_s3_round_trip(kaldi_dir, tmp_path, s3_bucket):
    """Kaldi dir and audio on S3 (relative wav.scp paths), corpus written to S3."""
    bucket, overrides = s3_bucket
    cfg = _cfg(tmp_path, f"storage.root=s3://{bucket}/store", *overrides)
    st = Storage(cfg.storage)
    src = f"s3://{bucket}/kaldi"
    _write(tmp_path / "s3src" / "r.wav", 2.0)
    _write(tmp_path / "s3src" / "r8k.wav", 1.0, rate=8000)
    for name, text in {"wav.scp": "r r.wav\nr8k r8k.wav\ngone gone.wav\n",
                       "utt2spk": "a s\nb s\nc s\n", "text": "a hello\nb world\n",
                       "segments": "a r 0 1\nb r8k 0 -1\nc gone 0 1\n"}.items():
        st.write_text(f"{src}/{name}", text)
    for name in ("r.wav", "r8k.wav"):
        st.write_bytes(f"{src}/{name}", (tmp_path / "s3src" / name).read_bytes())
    out = f"s3://{bucket}/corpus"
    summary = import_corpus(st, read_kaldi(st, src), out, cfg.ingest)
    assert summary["counts"] == {"in": 3, "out": 2, "rejected": 1}
    assert summary["rejects_by_reason"] == {"missing_audio": 1}
    lines = st.read_text(f"{out}/metadata/split=labeled/labeled-part-00000.jsonl").splitlines()
    recs = {r["utt_id"]: r for r in map(json.loads, lines)}
    assert recs["a"]["source_uri"] == f"{src}/r.wav"
    for r in recs.values():
        data = st.read_bytes(f"{out}/{r['audio_uri']}")
        x, rate = sf.read(io.BytesIO(data))
        assert rate == 16000 and len(x) == 16000
    assert st.exists(f"{out}/_SUCCESS.json") and st.exists(f"{out}/rejects.parquet")


def _split_dir(root: Path, name: str, utts: dict[str, str]) -> Path:
    """A Kaldi data dir of 16 kHz utterances (utt_id -> text), one speaker per two."""
    d = root / name
    d.mkdir(parents=True)
    wavs = {u: _write(root / "wav" / f"{u}.wav", 0.5) for u in utts}
    (d / "wav.scp").write_text("".join(f"{u} {w}\n" for u, w in wavs.items()))
    (d / "utt2spk").write_text("".join(f"{u} {name}{i // 2}\n" for i, u in enumerate(utts)))
    (d / "text").write_text("".join(f"{u} {t}\n" for u, t in utts.items()))
    return d


def test_several_splits_one_corpus(tmp_path, capsys):
    """train + dev at once, then test added: nothing earlier is lost; counts balance per
    source; clashes and a second source of one split are refused with the reason."""
    tr = _split_dir(tmp_path, "train", {"t1": "hello", "t2": "world", "t3": ""})
    dv = _split_dir(tmp_path, "dev", {"d1": "good", "d2": "morning"})
    te = _split_dir(tmp_path, "test", {"e1": "hello world"})
    out = tmp_path / "corpus"
    sets = ["--set", f"storage.root={tmp_path / 'store'}", "--out", str(out)]

    def summary() -> dict:
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1]
                          [len(SUMMARY_PREFIX):])

    assert main(["import", "--from", "kaldi", "--src", f"train={tr}", "--src", f"dev={dv}",
                 "--set", "ingest.clean=true", *sets]) == 0
    s1 = summary()
    assert s1["imported"] == ["dev", "labeled"] and s1["per_split"] == {"dev": 2, "labeled": 2}
    assert s1["sources"]["labeled"]["counts"] == {"in": 3, "out": 2, "rejected": 1}
    assert all(r.get("clean") is True for r in _records(out).values())
    # the clean sources align.audio=clean and the teacher's example servers read
    from training.example_servers import load_clean_sources
    st = Storage(_cfg(tmp_path).storage)
    assert sorted(load_clean_sources(st, str(out))) == ["d1", "d2", "t1", "t2"]
    assert main(["import", "--from", "kaldi", "--src", f"test={te}", *sets]) == 0
    s2 = summary()
    assert s2["imported"] == ["test"]
    assert s2["per_split"] == {"dev": 2, "labeled": 2, "test": 1}
    assert sorted(_records(out)) == ["d1", "d2", "e1", "t1", "t2"]
    for src in s2["sources"].values():  # in = out + rejected, per source and in all
        assert src["counts"]["in"] == src["counts"]["out"] + src["counts"]["rejected"]
    assert s2["counts"] == {"in": 6, "out": 5, "rejected": 1}
    assert _rejects(out) == {"t3": "empty_text"}
    assert "clean" not in _records(out)["e1"]
    # the same command again: nothing to do
    assert main(["import", "--from", "kaldi", "--src", f"test={te}", *sets]) == 0
    assert summary()["skipped"] is True
    # dev's utterances once more as test: refused, nothing written
    err = main(["import", "--from", "kaldi", "--src", f"test={dv}", "--force", *sets])
    assert err == 1 and "d1: in split dev" in capsys.readouterr().err
    assert sorted(_records(out)) == ["d1", "d2", "e1", "t1", "t2"]
    assert main(["import", "--from", "kaldi", "--src", f"dev={dv}", "--src", f"dev={te}",
                 *sets]) == 1
    assert "two sources for split dev" in capsys.readouterr().err
    assert main(["import", "--from", "kaldi", "--src", f"eval={te}", *sets]) == 1
    assert "eval=" in capsys.readouterr().err  # not a split: read as a directory name


def test_refuses_older_import_layout(tmp_path):
    """A root an older amflow import wrote (part-NNNNN.jsonl): replaced only with --force."""
    d = _split_dir(tmp_path, "train", {"a": "hello"})
    out = tmp_path / "corpus"
    cfg = _cfg(tmp_path)
    st = Storage(cfg.storage)
    import_corpus(st, read_kaldi(st, str(d)), str(out), cfg.ingest)
    new = out / "metadata" / "split=labeled" / "labeled-part-00000.jsonl"
    new.rename(new.with_name("part-00000.jsonl"))
    from core.runs import StepError
    with pytest.raises(StepError, match="older `amflow import`"):
        import_corpus(st, read_kaldi(st, str(d)), str(out), cfg.ingest)
    import_corpus(st, read_kaldi(st, str(d)), str(out), cfg.ingest, force=True)
    parts = sorted(p.name for p in (out / "metadata").rglob("*.jsonl"))
    assert parts == ["labeled-part-00000.jsonl"]


def test_8khz_audio_native_or_upsampled_with_a_warning(tmp_path, caplog):
    """8 kHz recordings: upsampled to 16 kHz by default, with a WARNING naming both ways
    out; kept at 8 kHz (referenced in place) with ingest.sample_rate=8000."""
    d = tmp_path / "kaldi"
    d.mkdir()
    a = _write(tmp_path / "a.wav", 1.0, rate=8000)
    (d / "wav.scp").write_text(f"a {a}\n")
    (d / "utt2spk").write_text("a s\n")
    (d / "text").write_text("a hello\n")
    st = Storage(_cfg(tmp_path).storage)
    with caplog.at_level("WARNING", logger="tasks.importers.writer"):
        up = import_corpus(st, read_kaldi(st, str(d)), str(tmp_path / "up"),
                           _cfg(tmp_path).ingest)
    assert "recorded at 8000 Hz were upsampled to 16000 Hz" in caplog.text
    assert "ingest.sample_rate=8000" in caplog.text and "features.high_freq=4000" in caplog.text
    rec = _records(tmp_path / "up")["a"]
    assert rec["source_rate"] == 8000 and up["source_rates"] == {"8000": 1}
    assert sf.info(tmp_path / "up" / rec["audio_uri"]).samplerate == 16000
    caplog.clear()
    with caplog.at_level("WARNING", logger="tasks.importers.writer"):
        import_corpus(st, read_kaldi(st, str(d)), str(tmp_path / "native"),
                      _cfg(tmp_path, "ingest.sample_rate=8000").ingest)
    assert "upsampled" not in caplog.text
    assert _records(tmp_path / "native")["a"]["audio_uri"] == str(a)  # in the format: as is


def test_features_at_8khz_put_the_mel_bins_below_4khz():
    from tasks.fbank import kaldi_mel_banks

    banks = kaldi_mel_banks(64, 256, 8000, 20.0, 0.0)  # [fft bins, mel bins]
    top = np.nonzero(banks[:, -1])[0].max() * 8000 / 256
    assert 3900 <= top <= 4000
    up = kaldi_mel_banks(64, 512, 16000, 20.0, 0.0)  # the same audio upsampled
    empty = sum(np.nonzero(up[:, b])[0].min() * 16000 / 512 >= 4000 for b in range(64))
    assert empty >= 14  # ~15 of 64 bins see only the empty band
