"""The short steps' storage round trips: metadata files read concurrently (in file order),
and `amflow lm` reads the corpus's metadata once for all its splits."""
from __future__ import annotations

import json
import threading
import time

from core.storage import Storage
from tests.test_select import make_corpus


def test_read_records_keeps_file_and_line_order_when_reading_concurrently(tmp_path, local_cfg):
    from tasks.select import metadata_files, read_records

    make_corpus(tmp_path / "corpus", speakers=6, utts=3, labeled=2, dev=1)
    cfg = local_cfg(f"data.corpus={tmp_path / 'corpus'}")
    plain = Storage(cfg.storage)
    files = metadata_files(plain, str(tmp_path / "corpus"))
    assert len(files) >= 2
    sequential = [line for f in files for line in plain.read_text(f).splitlines() if line]

    class FirstFileLast(Storage):  # the first file's read finishes after the others
        def read_text(self, uri: str) -> str:
            if uri == files[0]:
                time.sleep(0.2)
            return super().read_text(uri)

    records, rejects, n = read_records(FirstFileLast(cfg.storage), str(tmp_path / "corpus"))
    assert n == len(sequential) and not rejects
    assert [r.utt_id for r in records] == [
        json.loads(line)["utt_id"] for line in sequential]


def test_lm_reads_the_corpus_metadata_once(tmp_path, local_cfg, monkeypatch):
    from core.runs import StepContext
    from amflow.steps import lm
    from tasks.select import metadata_files

    make_corpus(tmp_path / "corpus", speakers=6, utts=3, labeled=2, dev=2)
    cfg = local_cfg(f"data.corpus={tmp_path / 'corpus'}", "lm.sentences=200",
                    "lm.text_split=labeled", "lm.source=both")
    files = set(metadata_files(Storage(cfg.storage), str(tmp_path / "corpus")))
    reads: list[str] = []
    lock = threading.Lock()
    real = Storage.read_text

    def counting(self, uri):
        with lock:
            reads.append(uri)
        return real(self, uri)

    monkeypatch.setattr(Storage, "read_text", counting)
    summary = lm.run(StepContext(cfg, "r1", "lm"))
    assert sorted(u for u in reads if u in files) == sorted(files)  # once each
    assert summary["metrics"]["dev"]["sentences"] == 6
    assert summary["metrics"]["sentences"] == 200 + 6  # generator + labeled transcripts


def _featurize_one_read_at_a_time(storage, corpus, records, fcfg, computer, rejects, accept):
    """featurize_records as it was before it read ahead: the reference."""
    import collections

    from core.runs import Reject
    from tasks.audio import load_audio_result, resolve_uri
    from tasks.features import featurize_stream

    by_speaker = collections.defaultdict(list)
    for r in sorted(records, key=lambda r: (r.speaker_id, r.created_ts, r.utt_id)):
        by_speaker[r.speaker_id].append(r)
    for recs in by_speaker.values():
        stream = []
        for r in recs:
            if not accept(r):
                continue
            res = load_audio_result(storage, resolve_uri(corpus, r.audio_uri), fcfg, r.duration)
            if res.samples is None:
                rejects.append(Reject(r.utt_id, res.reason or "unreadable_audio", res.detail))
                continue
            stream.append((r, res.samples))
        feats = featurize_stream([w for _, w in stream], fcfg, computer) if stream else []
        for (r, wave), x in zip(stream, feats):
            if x.shape[0] == 0:
                rejects.append(Reject(r.utt_id, "too_short", f"{len(wave)} samples"))
                continue
            yield r, wave, x


def test_featurize_records_reads_ahead_and_yields_and_rejects_as_in_order(tmp_path, local_cfg):
    """Evaluate and decode read a speaker's audio concurrently: the same utterances,
    samples, features and rejects, in the same order, as one read at a time."""
    import numpy as np

    from core.runs import Reject
    from tasks.fbank import FbankComputer
    from tasks.features import featurize_records
    from tasks.select import read_records

    corpus = str(tmp_path / "corpus")
    make_corpus(tmp_path / "corpus", speakers=4, utts=3, labeled=4, bad=True)
    cfg = local_cfg(f"data.corpus={corpus}", "features.io_threads=4")
    st = Storage(cfg.storage)
    records = read_records(st, corpus)[0]
    refuse = {records[1].utt_id, records[-1].utt_id}

    def run(fn):
        rejects: list = []

        def accept(r):
            if r.utt_id in refuse:
                rejects.append(Reject(r.utt_id, "refused", ""))
                return False
            return True

        out = list(fn(st, corpus, records, cfg.features, FbankComputer(cfg.features), rejects,
                      accept=accept))
        return out, rejects

    got, got_rejects = run(featurize_records)
    want, want_rejects = run(_featurize_one_read_at_a_time)
    assert len(got) == len(want) >= 8
    for (r1, w1, x1), (r2, w2, x2) in zip(got, want):
        assert r1.utt_id == r2.utt_id and np.array_equal(w1, w2)
        assert np.array_equal(x1, x2, equal_nan=True)
    assert got_rejects == want_rejects
    assert {x.reason for x in got_rejects} - {"refused"}  # some audio was unreadable
