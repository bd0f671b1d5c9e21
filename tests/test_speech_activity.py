"""The speech gate (tasks/speech_activity.py, serving.features.StreamFeatures(gate=)):
silence, a constant signal, mains hum and steady noise give no rows to recognise (so no
words), speech keeps every row, and the gate never holds speech back."""
from __future__ import annotations

import numpy as np
import pytest

from tests.test_serving import tiny_system  # noqa: F401  (the module fixture)

from core.config import FeaturesConfig
from tasks.speech_activity import GateSettings, SpeechActivity, SpeechGate

N = 16000 * 4  # 4 s


def _faults() -> dict[str, np.ndarray]:
    from tasks.speech import room

    rng = np.random.default_rng(3)
    return {"silence": np.zeros(N), "full_scale_dc": np.full(N, 32767 / 32768),
            "hum": 0.5 * room.hum(rng, N), "white": 0.03 * rng.standard_normal(N),
            "pink": 0.1 * room.colored_noise(rng, N, 1.0), "fan": 0.1 * room.fan(rng, N)}


def _gated_rows(waves, gate):
    from serving.features import StreamFeatures

    feats = StreamFeatures(FeaturesConfig(), None, 192, gate=gate)
    out = []
    for w in waves:
        w = np.asarray(w, np.float32)
        rows = [feats.accept(w[i:i + 1600]) for i in range(0, len(w), 1600)]
        rows.append(feats.end_utterance())
        feats.new_utterance()
        out.append(np.concatenate(rows))
    return out


@pytest.mark.parametrize("name", ["silence", "full_scale_dc", "hum", "white", "pink", "fan"])
def test_no_speech_gives_no_rows_with_the_gate_and_every_row_without(name):
    wave = np.clip(_faults()[name], -1, 32767 / 32768)
    assert len(_gated_rows([wave], None)[0]) == 132  # what the model read (and made words of)
    assert len(_gated_rows([wave], GateSettings())[0]) == 0


def test_speech_keeps_its_rows_and_silence_around_it_is_cut_to_the_padding(tiny_corpus):
    from tests.test_serving import _speaker_waves

    _, waves = _speaker_waves(tiny_corpus, split="test", limit=3)
    plain = _gated_rows(waves, None)
    gated = _gated_rows(waves, GateSettings())
    for p, g in zip(plain, gated):  # only the utterance's silence beyond the padding goes
        assert 0.85 * len(p) <= len(g) <= len(p)
    # 3 s of digital silence before and after the same speech: no sound, so not even
    # padding: the rows (mean normalisation included) are those of the speech alone, but
    # for the frames whose 25 ms window straddles the speech's end (2.5e-2 at most)
    quiet = np.zeros(3 * 16000, np.float32)
    padded = _gated_rows([np.concatenate([quiet, w, quiet]) for w in waves], GateSettings())
    for p, g in zip(gated, padded):
        assert p.shape == g.shape and float(np.abs(p - g).max()) < 0.05
    # 3 s of hum 20 dB below the speech: the hum is cut to the padding (of 200 rows)
    from tasks.speech import room

    hum = room.hum(np.random.default_rng(1), 3 * 16000) * float(np.sqrt(np.mean(waves[0] ** 2))) / 10
    hummed = _gated_rows([np.concatenate([hum, waves[0], hum]).astype(np.float32)], GateSettings())
    pad_rows = round(GateSettings().pad_s / 0.03)
    assert 0 <= len(hummed[0]) - len(gated[0]) <= 2 * pad_rows + 10


def test_gate_keeps_padding_around_speech_and_never_delays_a_speech_row():
    rows = np.arange(20, dtype=np.float32)[:, None]
    flags = np.zeros(20, bool)
    flags[[8, 9]] = True
    g = SpeechGate(lead=2, trail=3)
    got = [g.accept(rows[i:i + 1], flags[i:i + 1])[:, 0].tolist() for i in range(20)]
    assert got[8] == [6.0, 7.0, 8.0]  # the lead comes out with the first speech row
    assert [x for part in got for x in part] == [6, 7, 8, 9, 10, 11, 12]
    g.end_utterance()
    assert g.kept == 7 and g.dropped == 13


def test_a_stationary_input_is_its_own_floor_at_any_level_and_a_rise_is_speech():
    sa = SpeechActivity(threshold_db=6.0, floor_frames=300, smooth_frames=9)
    quiet = np.full((200, 64), 2.0, np.float32)
    loud = np.full((50, 64), 2.0 + 6.0 / 4.343 * 2, np.float32)  # 12 dB up
    flags = np.concatenate([sa.accept(quiet), sa.accept(loud), sa.accept(quiet)])
    assert not flags[:200].any() and flags[205:250].all() and not flags[260:].any()


def test_the_served_recognizer_gates_by_default_and_gives_no_words_without_speech(tiny_system):
    """make_recognizer with the default serve config: a second of digital silence, of a
    constant full-scale signal and of hum are empty finals (without the gate the same
    model makes words of them)."""
    from core.config import ServeConfig
    from serving.app import make_recognizer
    from serving.recognizer import transcribe

    faults = _faults()
    waves = [np.clip(faults[k][:16000], -1, 32767 / 32768).astype(np.float32)
             for k in ("silence", "full_scale_dc", "hum", "white")]
    finals = {}
    for gate in (True, False):
        rec = make_recognizer(tiny_system["assets"],
                              ServeConfig(device="cpu", dtype="fp32", speech_gate=gate))
        finals[gate] = [m["final"] for m in transcribe(rec, waves)]
    assert finals[True] == ["", "", "", ""]
    assert any(finals[False]), finals  # the fault the gate is for


@pytest.mark.parametrize("w", [1, 9, 50, 300])
def test_a_chunks_windows_alone_are_the_full_computations_last(w):
    """A served chunk computes only its new frames' windows (`last`): the same values as
    every window of the history and the chunk, then its last ones, padding included."""
    from tasks.speech_activity import _sliding

    rng = np.random.default_rng(w)
    for n in (1, 5, 40, 309):
        x = rng.normal(size=n)
        for how, fill in ((np.min, np.inf), (np.max, -np.inf), (np.nanmean, np.nan)):
            every = _sliding(x, w, fill, how)
            assert len(every) == n
            for last in (1, 10, n):
                assert np.array_equal(_sliding(x, w, fill, how, last), every[-last:])
