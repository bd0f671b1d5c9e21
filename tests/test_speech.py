"""espeak-ng binding, room acoustics and the sentence generator (tasks/speech)."""
from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
from scipy import signal

from tasks.speech import espeak, room, text

FRICATIVES = {"s", "S", "z", "f", "Z", "T"}
TONGUE_TWISTERS = [
    "She sells sea shells by the sea shore, so she says.",
    "Sixty six sisters fixed six fresh fish sauces.",
    "Please pass the salt and the fish, Sam sighed.",
    "The zebra was missing its stripes since Tuesday.",
]


def _md5(a: np.ndarray) -> str:
    return hashlib.md5(a.tobytes()).hexdigest()


# -- espeak ------------------------------------------------------------------------------

def test_variants_and_version():
    vs = espeak.variants()
    names = {v.variant_name for v in vs}
    assert len(vs) >= 10 and {"f3", "m3", "klatt"} <= names
    assert all(v.identifier.startswith("!v/") for v in vs)
    assert espeak.version()
    en = espeak.voices("en-us")
    assert en and any("en" in v.identifier.lower() for v in en)


def test_synthesize_audio_and_phone_events():
    syn = espeak.synthesize("The quick brown fox.", espeak.VoiceParams(), seed=1)
    assert syn.sample_rate == 22050 and syn.audio.dtype == np.int16
    assert 0.5 < syn.duration < 3.0
    phones = [p for p, _ in syn.events]
    # "the quick brown fox": D @ k w I k b r aU n f 0 k s (espeak-ng mnemonics)
    for p in ("D", "k", "w", "b", "r", "aU", "n", "f", "s"):
        assert p in phones
    pos = [s for _, s in syn.events]
    assert pos == sorted(pos) and 0 <= pos[0] and pos[-1] <= len(syn.audio)


def test_synthesis_is_deterministic_whatever_came_before():
    v = espeak.VoiceParams(variant="f3", pitch=60, rate=160)
    a = espeak.synthesize("Hello there my friend.", v, seed=7)
    espeak.synthesize("Something else entirely, with another voice.",
                      espeak.VoiceParams(variant="klatt", rate=300), seed=3)
    b = espeak.synthesize("Hello there my friend.", v, seed=7)
    assert _md5(a.audio) == _md5(b.audio) and a.events == b.events


def test_synthesis_is_deterministic_while_other_threads_draw_from_libc_rand():
    """f3 (and whisper, f2, ...) draw noise from libc rand(), one state per process: a
    thread calling rand() meanwhile used to change the samples (a Ray worker has such
    threads). Synthesis runs in a process of its own, so it must not."""
    import ctypes
    import threading

    v = espeak.VoiceParams(variant="whisper")
    t = "She sells sea shells by the sea shore, fifty six of them."
    quiet = espeak.synthesize(t, v, seed=11).audio
    assert not np.array_equal(quiet, espeak.synthesize(t, v, seed=12).audio)  # uses rand
    libc = ctypes.CDLL("libc.so.6")
    stop = threading.Event()

    def draw() -> None:
        while not stop.is_set():
            for _ in range(1000):
                libc.rand()

    th = threading.Thread(target=draw, daemon=True)
    th.start()
    try:
        for _ in range(3):
            np.testing.assert_array_equal(espeak.synthesize(t, v, seed=11).audio, quiet)
    finally:
        stop.set()
        th.join()


def test_synthesis_process_restarts_after_a_crash():
    v = espeak.VoiceParams()
    a = espeak.synthesize("Hello there.", v, seed=1).audio
    espeak._server.proc.kill()
    espeak._server.proc.wait()
    np.testing.assert_array_equal(espeak.synthesize("Hello there.", v, seed=1).audio, a)


def test_voice_parameters_change_the_speech():
    t = "Set a timer for ten minutes."
    base = espeak.synthesize(t, espeak.VoiceParams(), seed=1)
    fast = espeak.synthesize(t, espeak.VoiceParams(rate=260), seed=1)
    high = espeak.synthesize(t, espeak.VoiceParams(pitch=90), seed=1)
    other = espeak.synthesize(t, espeak.VoiceParams(variant="m3"), seed=1)
    assert fast.duration < 0.85 * base.duration
    assert len({_md5(s.audio) for s in (base, fast, high, other)}) == 4
    assert other.voice_identifier.endswith("+m3")


def test_bad_voice_and_text_raise():
    with pytest.raises(espeak.EspeakError):
        espeak.synthesize("hello", espeak.VoiceParams(variant="no-such-variant"))
    with pytest.raises(espeak.EspeakError):
        espeak.synthesize("hello", espeak.VoiceParams(rate=20))
    with pytest.raises(espeak.EspeakError):
        espeak.synthesize("   ", espeak.VoiceParams())


def test_phone_segments_contiguous_with_silences():
    events = [("h", 10), ("@", 30), ("_:", 50), ("_", 60), ("l", 70), ("l", 70), ("oU", 90)]
    segs = espeak.phone_segments(events, 120)
    assert segs == [("sil", 0, 10), ("h", 10, 30), ("@", 30, 50), ("sil", 50, 70),
                    ("l", 70, 90), ("oU", 90, 120)]
    assert espeak.phone_segments([], 5) == [("sil", 0, 5)]


def _fricative_contrast(x: np.ndarray, fs: int, segs, shift_ms: float) -> float:
    """Mean >4 kHz energy share inside fricative segments shifted by shift_ms, minus outside."""
    hop = int(fs * 0.005)
    f, t, s = signal.stft(x, fs, nperseg=256, noverlap=256 - hop)
    p = np.abs(s) ** 2
    hf = p[f > 4000].sum(0) / (p.sum(0) + 1e-12)
    lab = np.zeros(len(t), bool)
    for ph, a, b in segs:
        if ph in FRICATIVES:
            a2, b2 = a + shift_ms * fs / 1000, b + shift_ms * fs / 1000
            lab |= (t * fs >= a2) & (t * fs < b2)
    return float(hf[lab].mean() - hf[~lab].mean())


def _best_shift(items) -> float:
    shifts = np.arange(-30, 31, 2.5)
    scores = [np.mean([_fricative_contrast(x, fs, segs, s) for x, fs, segs in items])
              for s in shifts]
    return float(shifts[int(np.argmax(scores))])


def test_phone_events_are_frame_accurate():
    """Fricative segments line up with high-frequency energy at zero shift (+-5 ms)."""
    for variant in ("", "f3", "klatt"):
        items = []
        for t in TONGUE_TWISTERS:
            syn = espeak.synthesize(t, espeak.VoiceParams(variant=variant), seed=1)
            items.append((syn.audio.astype(float), syn.sample_rate, syn.segments()))
        assert abs(_best_shift(items)) <= 5.0, variant


# -- room acoustics --------------------------------------------------------------------

def test_reflection_coefficient_follows_rt60():
    dims = (6.0, 5.0, 3.0)
    betas = [room.reflection_coefficient(dims, t) for t in (0.2, 0.4, 0.8)]
    assert 0 < betas[0] < betas[1] < betas[2] < 1


def test_image_method_direct_path():
    fs = 16000
    r = room.Room((6.0, 5.0, 3.0), (1.0, 1.2, 1.7), (2.5, 2.0, 1.1), rt60=0.3)
    h = room.image_method(r, fs, max_time=0.05)
    d = r.distance
    k = int(round(d / room.C_SOUND * fs))
    assert int(np.argmax(np.abs(h[:k + 20]))) == k
    # the sinc spreads the direct path over neighbouring taps, its sum is the gain
    assert np.sum(h[k - 8:k + 9]) == pytest.approx(1 / (4 * math.pi * d), rel=0.05)
    assert np.all(np.abs(h[:k - 8]) < 1e-9)  # nothing arrives before the direct sound


@pytest.mark.parametrize("cond", ["DP2", "DP3", "DP4", "DP5"])
def test_rir_decays_at_the_target_rt60(cond):
    rng = np.random.default_rng(3)
    errs = []
    for _ in range(3):
        scene = room.sample_scene(cond, rng)
        h = room.room_impulse_response(scene.room, 16000, rng)
        errs.append(room.rt60_from_rir(h, 16000) / scene.room.rt60 - 1)
    assert abs(float(np.mean(errs))) < 0.2


def test_conditions_get_harder_from_dp1_to_dp5():
    rng = np.random.default_rng(0)
    drr, rt, snr = [], [], []
    for cond in ("DP1", "DP2", "DP3", "DP4", "DP5"):
        vals = []
        for _ in range(4):
            scene = room.sample_scene(cond, rng)
            h = room.room_impulse_response(scene.room, 16000, rng)
            k = int(round(scene.room.direct_delay(16000)))
            w = 40  # 2.5 ms around the direct path
            vals.append(10 * np.log10(np.sum(h[max(k - w, 0):k + w] ** 2) / np.sum(h[k + w:] ** 2)))
            rt.append(scene.room.rt60)
            snr.append(scene.snr_db)
        drr.append(np.mean(vals))
    assert all(a > b for a, b in zip(drr, drr[1:])), drr
    assert drr[0] > 5 and drr[-1] < -5
    rt_c = np.array(rt).reshape(5, 4).mean(1)
    snr_c = np.array(snr).reshape(5, 4).mean(1)
    assert np.all(np.diff(rt_c) > 0) and np.all(np.diff(snr_c) < 0)
    assert 0.7 < rt_c[-1] < 0.95 and 3 < snr_c[-1] < 7


def test_noise_generators_and_snr():
    rng = np.random.default_rng(1)
    n, fs = 32000, 16000
    f, pink = signal.welch(room.colored_noise(rng, n, 1.0, fs), fs, nperseg=1024)
    _, white = signal.welch(room.colored_noise(rng, n, 0.0, fs), fs, nperseg=1024)
    band = (f > 100) & (f < 6000)
    slope_pink = np.polyfit(np.log10(f[band]), 10 * np.log10(pink[band]), 1)[0]
    slope_white = np.polyfit(np.log10(f[band]), 10 * np.log10(white[band]), 1)[0]
    assert -13 < slope_pink < -7 and abs(slope_white) < 2  # -10 dB/decade vs flat
    for gen in (room.hum, room.fan, room.clatter):
        x = gen(rng, n, fs)
        assert len(x) == n and np.isfinite(x).all()
        assert np.sqrt(np.mean(x ** 2)) == pytest.approx(1.0, rel=1e-6)
    src = [np.sin(np.arange(8000) * 0.05), rng.standard_normal(5000)]
    assert np.sqrt(np.mean(room.babble(rng, n, src, 4) ** 2)) == pytest.approx(1.0, rel=1e-6)
    speech = rng.standard_normal(n)
    active = np.zeros(n, bool)
    active[4000:20000] = True
    speech[~active] *= 0.01
    noise = room.mix_at_snr(speech, rng.standard_normal(n), 7.5, active)
    assert room.snr_db(speech, noise, active) == pytest.approx(7.5, abs=1e-9)


def test_render_shifts_speech_by_the_direct_path_delay():
    fs = 16000
    rng = np.random.default_rng(5)
    dry = np.zeros(fs)
    dry[4000] = 1.0  # an impulse: its direct path must land at 4000 + delay
    active = np.zeros(fs, bool)
    active[3990:4010] = True
    scene = room.sample_scene("DP5", rng)
    out = room.render(dry, fs, scene, rng, active=active)
    assert len(out.audio) == fs + out.delay
    assert out.delay == round(scene.room.direct_delay(fs)) > 0
    assert abs(int(np.argmax(np.abs(out.speech[:4000 + out.delay + 20]))) - (4000 + out.delay)) <= 1
    act = np.zeros(len(out.audio), bool)
    act[out.delay + 3990:out.delay + 4010] = True
    assert room.snr_db(out.speech, out.noise, act) == pytest.approx(scene.snr_db, abs=1e-6)


# -- text --------------------------------------------------------------------------------

def test_sentences_are_deterministic_and_sized():
    a = [text.sentence_for(0, 1, i, target_words=3 + i % 10) for i in range(200)]
    b = [text.sentence_for(0, 1, i, target_words=3 + i % 10) for i in range(200)]
    assert a == b
    assert len(set(a)) > 180
    for i, s in enumerate(a):
        assert 3 <= text.word_count(s) <= 16
        assert abs(text.word_count(s) - (3 + i % 10)) <= 4
        assert s[0].isupper() and s[-1] in ".?"
        assert all(c.isalpha() or c in " ,.?'" for c in s), s
    assert text.sentence_for(1, 1, 0, target_words=8) != text.sentence_for(2, 1, 0, target_words=8)


def test_vocabulary_covers_every_generated_word():
    vocab = set(text.vocabulary())
    for i in range(1000):
        s = text.sentence_for(4, i, target_words=3 + i % 12)
        for w in s.replace(",", "").replace(".", "").replace("?", "").lower().split():
            assert w in vocab, (w, s)


def test_syllables():
    assert [text.syllables(w) for w in ("cat", "table", "banana", "make", "rhythm")] == \
        [1, 2, 3, 1, 1]


def test_estimate_seconds_tracks_espeak():
    errs = []
    for i in range(30):
        rate = (140, 175, 210)[i % 3]
        s = text.sentence_for(9, i, target_words=4 + i % 9)
        syn = espeak.synthesize(s, espeak.VoiceParams(rate=rate), seed=i)
        speech = [(a, b) for p, a, b in syn.segments() if p != "sil"]
        actual = (speech[-1][1] - speech[0][0]) / syn.sample_rate
        errs.append(text.estimate_seconds(s, rate) / actual - 1)
    assert abs(float(np.mean(errs))) < 0.1 and float(np.mean(np.abs(errs))) < 0.15
