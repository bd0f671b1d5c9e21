"""The speech gate offline (decode.speech_gate): `amflow decode`'s features keep the frames
`amflow serve`'s gate keeps (the same rows as served), and its workers, hybrid and CTC,
give no words for digital silence, a constant signal or -40 dBFS noise (an utterance with
no speech is decoded to nothing, not rejected). The workers run in this process (no Ray)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from core.config import FeaturesConfig, StorageConfig
from tasks.speech_activity import GateSettings
from tests.test_serving import tiny_system  # noqa: F401  (the module fixture)


def test_the_offline_gate_keeps_the_rows_the_served_gate_keeps(tiny_corpus):
    """featurize_stream(gate=) against serving.features.StreamFeatures(gate=) fed in 100 ms
    chunks: one speaker's utterances, one of them behind 2 s of -40 dBFS noise, and a
    second of digital silence (no rows either way)."""
    from tasks.features import featurize_stream
    from tests.test_serving import _speaker_waves
    from tests.test_speech_activity import _gated_rows

    _, waves = _speaker_waves(tiny_corpus, limit=3)
    noise = (0.01 * np.random.default_rng(5).standard_normal(32000)).astype(np.float32)
    waves = [waves[0], np.concatenate([noise, waves[1]]), np.zeros(16000, np.float32),
             waves[2]]
    offline = featurize_stream(waves, FeaturesConfig(), gate=GateSettings())
    served = _gated_rows(waves, GateSettings())
    assert [len(x) for x in offline] == [len(x) for x in served]
    assert len(offline[2]) == 0 and all(len(offline[i]) > 50 for i in (0, 1, 3))
    assert len(offline[1]) < len(featurize_stream(waves, FeaturesConfig())[1]) - 30
    for a, b in zip(offline, served):
        if len(a):
            assert float(np.abs(a - b).max()) <= 1e-4


def _faults(n: int = 32000) -> list[np.ndarray]:
    noise = 0.01 * np.random.default_rng(7).standard_normal(n)  # -40 dBFS white noise
    return [x.astype(np.float32) for x in (np.zeros(n), np.full(n, 32767 / 32768), noise)]


@pytest.fixture
def fault_audio(monkeypatch):
    """Every record's audio is one of the faults, in the order they are read."""
    from tasks import features
    from tasks.audio import AudioResult

    waves = iter(_faults() * 10)
    monkeypatch.setattr(features, "decode_audio",
                        lambda data, fcfg, duration: AudioResult(next(waves)))


def _words(worker, recs, setting) -> tuple[list, list]:
    scored = worker.score(recs)
    hyps = worker.search(scored["utts"], setting)["hyps"]
    return [w for _, w, _ in hyps], scored["rejects"]


def test_the_hybrid_decode_worker_gives_no_words_without_speech(tiny_system, tiny_corpus,  # noqa: F811
                                                                fault_audio):
    from decoding.decode import DecodeWorker

    a = tiny_system["assets"]
    recs = tiny_system["recs"]
    words = {}
    for gate in (GateSettings(), None):
        worker = DecodeWorker(a["model"], tiny_system["graph_dir"], a["log_prior"],
                              str(tiny_corpus), StorageConfig(root=str(tiny_corpus.parent)),
                              a["beam"], a["max_active"], gate=gate)
        words[gate is not None], rejects = _words(worker, recs, 1.0)
        assert rejects == [] and len(words[gate is not None]) == 3
    assert words[True] == [[], [], []]
    assert any(words[False]), words  # what the gate is for


def test_the_ctc_decode_worker_gives_no_words_without_speech(tiny_corpus, tmp_path,
                                                             fault_audio):
    from decoding.ctc_decode import CtcDecodeWorker
    from tasks.select import records_of_split
    from core.storage import Storage
    from tests.test_export_ctc import _ctc_model
    from training.checkpoint import model_payload, to_bytes
    from training.ctc.tokens import train_tokenizer

    recs, _ = records_of_split(Storage(), str(tiny_corpus), "labeled")
    tok = train_tokenizer([r.text for r in recs if r.text], "char")
    payload = model_payload(_ctc_model(tok.num_classes),
                            cmvn={"count": 10, "sum": [20.0] * 64, "sumsq": [90.0] * 64},
                            phones=tok.symbols, features=dataclasses.asdict(FeaturesConfig()),
                            info={"tokenizer": tok.to_dict()})
    three = sorted(recs, key=lambda r: (r.speaker_id, r.created_ts, r.utt_id))[:3]
    words = {}
    for gate in (GateSettings(), None):
        worker = CtcDecodeWorker(to_bytes(payload), "", str(tiny_corpus),
                                 StorageConfig(root=str(tmp_path)), 10.0, 2000,
                                 mode="greedy", gate=gate)
        words[gate is not None], rejects = _words(worker, three, {"blank_penalty": 0.0})
        assert rejects == [] and len(words[gate is not None]) == 3
    assert words[True] == [[], [], []]
    assert any(words[False]), words


def test_decode_speech_gate_is_off_by_default_and_takes_the_serve_settings():
    from core.config import load_config
    from decoding.decode import decode_gate

    assert decode_gate(load_config(None, [])) is None
    cfg = load_config(None, ["decode.speech_gate=true", "serve.speech_threshold_db=9"])
    assert decode_gate(cfg) == GateSettings(threshold_db=9.0)
    # serve.speech_gate turns the served gate off, not decode's
    cfg = load_config(None, ["decode.speech_gate=true", "serve.speech_gate=false"])
    assert decode_gate(cfg) == GateSettings()
