"""The short steps' storage round trips: metadata files read concurrently (in file order),
and `amflow lm` reads the corpus's metadata once for all its splits."""
from __future__ import annotations

import json
import threading
import time

from amflow.storage import Storage
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
    from amflow.runs import StepContext
    from decoding import lm
    from tasks.select import metadata_files

    make_corpus(tmp_path / "corpus", speakers=6, utts=3, labeled=2, dev=2)
    cfg = local_cfg(f"data.corpus={tmp_path / 'corpus'}", "lm.sentences=200",
                    "lm.text_split=labeled")
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
