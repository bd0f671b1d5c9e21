"""Far-field acoustics: image-method room impulse responses and synthetic noise.

Room impulse response (`room_impulse_response`): the image-source method of Allen &
Berkley (1979) for a shoebox room, vectorised over all images at once. Walls share one
reflection coefficient derived from the target RT60 with Eyring's formula. Images are
enumerated up to `image_time` seconds of propagation (every image closer than
c * image_time is included), each placed with a Hann-windowed sinc fractional delay.
The later, diffuse part of the response is a noise tail decaying at the RT60
(faster above `tail_split_hz`, as air and walls absorb high frequencies more), whose
level continues the image response's energy envelope at the crossover.

Noise (unit-RMS generators, all from a numpy Generator): coloured 1/f^beta noise, mains
hum with harmonics, fan/HVAC rumble, sparse clatter transients, and babble built from
other speakers' speech. `mix_at_snr` scales a noise to a target SNR measured over the
active-speech samples.

Far-field conditions DP1..DP5 (`CONDITIONS`, `sample_scene`, `render`): DP1 is
close-talk (30-50 cm, short RT60, high SNR); each next one is farther, more reverberant
and noisier, down to DP5 at 3.5-5 m, RT60 ~0.8 s and SNR ~5 dB.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
from scipy import fft as sfft
from scipy import signal

C_SOUND = 343.0  # m/s


@lru_cache(maxsize=512)
def _butter(order: int, cutoff: float | tuple[float, float], btype: str, fs: int) -> np.ndarray:
    return signal.butter(order, cutoff, btype, fs=fs, output="sos")


# -- room impulse responses --------------------------------------------------------------

@dataclass(frozen=True)
class Room:
    dims: tuple[float, float, float]  # metres
    source: tuple[float, float, float]
    mic: tuple[float, float, float]
    rt60: float  # seconds

    def __post_init__(self) -> None:
        for name in ("source", "mic"):
            p = getattr(self, name)
            if not all(0.0 < c < d for c, d in zip(p, self.dims)):
                raise ValueError(f"{name} {p} is outside the room {self.dims}")
        if self.rt60 <= 0:
            raise ValueError("rt60 must be > 0")

    @property
    def distance(self) -> float:
        return float(np.linalg.norm(np.subtract(self.source, self.mic)))

    def direct_delay(self, fs: int) -> float:
        """Propagation delay of the direct path, in samples."""
        return self.distance / C_SOUND * fs


def reflection_coefficient(dims: tuple[float, float, float], rt60: float) -> float:
    """Wall pressure reflection coefficient beta for a target RT60 (Eyring).

    RT60 = 0.161 V / (-S ln(1 - alpha)), beta = sqrt(1 - alpha).
    """
    lx, ly, lz = dims
    volume = lx * ly * lz
    surface = 2.0 * (lx * ly + lx * lz + ly * lz)
    return float(math.exp(-0.161 * volume / (2.0 * surface * rt60)))


def _axis_images(s: float, m: float, length: float, order: int) -> tuple[np.ndarray, np.ndarray]:
    """Per axis: squared source-image-to-mic offsets and reflection counts.

    Image coordinate (1 - 2q) s + 2 n L with q in {0, 1}, n in [-order, order]; it has
    |n - q| + |n| wall reflections on this axis.
    """
    n = np.arange(-order, order + 1)
    q = np.array([0, 1])
    nn, qq = np.meshgrid(n, q, indexing="ij")
    pos = (1 - 2 * qq) * s + 2 * nn * length
    refl = np.abs(nn - qq) + np.abs(nn)
    return ((pos - m) ** 2).ravel(), refl.ravel()


def image_method(room: Room, fs: int, max_time: float, half_width: int = 8) -> np.ndarray:
    """Early impulse response from every image within c * max_time metres."""
    beta = reflection_coefficient(room.dims, room.rt60)
    reach = C_SOUND * max_time
    axes = []
    for s, m, length in zip(room.source, room.mic, room.dims):
        order = int(math.ceil(reach / (2.0 * length))) + 1
        axes.append(_axis_images(s, m, length, order))
    (dx2, rx), (dy2, ry), (dz2, rz) = axes
    d2 = dx2[:, None, None] + dy2[None, :, None] + dz2[None, None, :]
    refl = rx[:, None, None] + ry[None, :, None] + rz[None, None, :]
    keep = d2 <= reach * reach
    dist = np.sqrt(d2[keep])
    gain = beta ** refl[keep] / (4.0 * math.pi * np.maximum(dist, 1e-3))
    delay = dist / C_SOUND * fs
    n_out = int(math.ceil(max_time * fs)) + 2 * half_width + 2
    base = np.floor(delay).astype(np.int64)
    frac = delay - base
    k = np.arange(-half_width + 1, half_width + 1)
    taps = k[None, :] - frac[:, None]
    window = 0.5 * (1.0 + np.cos(np.pi * taps / (half_width + 1)))
    weights = gain[:, None] * np.sinc(taps) * window
    idx = base[:, None] + k[None, :]
    ok = (idx >= 0) & (idx < n_out)
    return np.bincount(idx[ok], weights=weights[ok], minlength=n_out)


def room_impulse_response(room: Room, fs: int, rng: np.random.Generator,
                          image_time: float = 0.08, tail_split_hz: float = 2000.0,
                          hf_decay: float = 0.6) -> np.ndarray:
    """Full RIR (float64), long enough for the response to decay by 60 dB.

    Image sources up to `image_time` (or the RT60, if shorter), then a noise tail whose
    energy decays by 60 dB per RT60 below `tail_split_hz` and per `hf_decay` * RT60
    above it, scaled to continue the image response's energy at the crossover.
    """
    t_img = min(image_time, room.rt60)
    direct = room.distance / C_SOUND
    t_img = max(t_img, direct + 0.01)
    early = image_method(room, fs, t_img)
    n_img = int(t_img * fs)
    n_total = max(int(math.ceil((direct + room.rt60) * fs)), n_img + 1)
    h = np.zeros(n_total)
    m = min(len(early), n_total)
    h[:m] = early[:m]
    if n_total <= n_img:
        return h
    # Energy envelope of the early response just before the crossover, fitted by the
    # decay the tail will follow, sets the tail's level.
    win = max(int(0.02 * fs), 8)
    lo = max(n_img - win, int(direct * fs) + 1)
    seg = early[lo:n_img]
    t_seg = np.arange(lo, n_img) / fs
    decay = 6.0 * math.log(10.0) / room.rt60  # energy decay rate, 1/s (60 dB per RT60)
    env = np.exp(-decay * t_seg)
    level = float(np.sum(seg ** 2) / max(np.sum(env), 1e-12)) if len(seg) else 0.0
    t = np.arange(n_img, n_total) / fs
    noise = rng.standard_normal((2, len(t)))
    low = signal.sosfilt(_butter(4, tail_split_hz, "low", fs), noise[0]) * np.exp(-0.5 * decay * t)
    high = signal.sosfilt(_butter(4, tail_split_hz, "high", fs), noise[1]) * np.exp(-0.5 * decay / hf_decay * t)
    tail = low + high
    # Unit expected energy density at the crossover, then the fitted level.
    ref = np.exp(-decay * t[0])
    tail *= math.sqrt(level * ref) / max(float(np.sqrt(np.mean(tail[:win] ** 2))), 1e-12)
    fade = min(win, len(tail))
    ramp = np.ones(len(tail))
    ramp[:fade] = np.linspace(0.0, 1.0, fade)
    h[n_img:] += tail * ramp
    return h


def rt60_from_rir(h: np.ndarray, fs: int) -> float:
    """RT60 estimated from Schroeder backward integration (T20 line fit, -5 to -25 dB)."""
    energy = np.cumsum((h ** 2)[::-1])[::-1]
    edc = 10.0 * np.log10(energy / energy[0] + 1e-30)
    idx = np.nonzero((edc <= -5.0) & (edc >= -25.0))[0]
    if len(idx) < 2:
        return float("nan")
    t = idx / fs
    slope, _ = np.polyfit(t, edc[idx], 1)
    return float(-60.0 / slope)


def reverberate(x: np.ndarray, h: np.ndarray) -> np.ndarray:
    """x convolved with h (full length)."""
    return signal.fftconvolve(x, h)


# -- noise -----------------------------------------------------------------------------

def _unit(x: np.ndarray) -> np.ndarray:
    rms = float(np.sqrt(np.mean(x ** 2))) if len(x) else 0.0
    return x / rms if rms > 0 else x


def colored_noise(rng: np.random.Generator, n: int, beta: float, fs: int = 16000,
                  f_min: float = 20.0) -> np.ndarray:
    """Unit-RMS noise with power spectrum ~ 1/f^beta (0 white, 1 pink, 2 brown)."""
    m = sfft.next_fast_len(n, real=True)
    spec = sfft.rfft(rng.standard_normal(m))
    f = np.fft.rfftfreq(m, 1.0 / fs)
    spec *= np.maximum(f, f_min) ** (-beta / 2.0)
    spec[0] = 0.0
    return _unit(sfft.irfft(spec, m)[:n])


def hum(rng: np.random.Generator, n: int, fs: int = 16000) -> np.ndarray:
    """Mains hum: 50 or 60 Hz and odd-heavy harmonics, slight drift, plus a little hiss."""
    f0 = float(rng.choice([50.0, 60.0])) * (1.0 + rng.uniform(-0.003, 0.003))
    t = np.arange(n) / fs
    drift = 1.0 + 0.002 * np.sin(2 * np.pi * rng.uniform(0.05, 0.3) * t + rng.uniform(0, 6.3))
    phase = 2 * np.pi * f0 * np.cumsum(drift) / fs
    x = np.zeros(n)
    for k in range(1, 9):
        amp = (1.0 if k % 2 else 0.5) / k ** rng.uniform(0.6, 1.2)
        x += amp * np.sin(k * phase + rng.uniform(0, 2 * np.pi))
    return _unit(_unit(x) + 0.05 * rng.standard_normal(n))


def fan(rng: np.random.Generator, n: int, fs: int = 16000) -> np.ndarray:
    """Fan / HVAC: low-passed pink noise, slow amplitude wobble, a blade-rate tone."""
    cutoff = 50.0 * round(rng.uniform(300.0, 1200.0) / 50.0)
    x = signal.sosfilt(_butter(2, cutoff, "low", fs), colored_noise(rng, n, 1.0, fs))
    t = np.arange(n) / fs
    x *= 1.0 + 0.2 * np.sin(2 * np.pi * rng.uniform(0.2, 1.0) * t + rng.uniform(0, 6.3))
    blade = rng.uniform(80.0, 200.0)
    x = _unit(x) + 0.3 * np.sin(2 * np.pi * blade * t + rng.uniform(0, 6.3))
    return _unit(x)


def clatter(rng: np.random.Generator, n: int, fs: int = 16000, rate_hz: float = 0.8) -> np.ndarray:
    """Sparse transients (dishes, doors, keys): decaying resonant noise bursts."""
    x = 1e-3 * rng.standard_normal(n)
    count = rng.poisson(rate_hz * n / fs) + 1
    for _ in range(count):
        length = int(rng.uniform(0.03, 0.25) * fs)
        start = int(rng.integers(0, max(n - 1, 1)))
        burst = rng.standard_normal(length) * np.exp(-np.arange(length) / (length / 5.0))
        centre = 100.0 * round(rng.uniform(800.0, 5000.0) / 100.0)
        band = (centre / 1.5, min(centre * 1.5, fs / 2 - 100))
        burst = signal.sosfilt(_butter(2, band, "band", fs), burst) * rng.uniform(0.3, 1.0)
        end = min(start + length, n)
        x[start:end] += burst[:end - start]
    return _unit(x)


def babble(rng: np.random.Generator, n: int, sources: list[np.ndarray],
           talkers: int) -> np.ndarray:
    """Several other speakers at once: random excerpts of `sources`, random levels."""
    if not sources:
        raise ValueError("babble needs at least one source signal")
    x = np.zeros(n)
    for _ in range(talkers):
        src = sources[int(rng.integers(len(sources)))]
        reps = int(math.ceil((n + len(src)) / max(len(src), 1))) + 1
        loop = np.tile(src, reps)
        off = int(rng.integers(0, len(src)))
        x += _unit(loop[off:off + n]) * 10 ** (rng.uniform(-6.0, 0.0) / 20.0)
    return _unit(x)


def mix_at_snr(speech: np.ndarray, noise: np.ndarray, snr_db: float,
               active: np.ndarray | None = None) -> np.ndarray:
    """`noise` scaled so that active-speech power / noise power = snr_db."""
    ref = speech[active] if active is not None and np.any(active) else speech
    p_s = float(np.mean(ref ** 2))
    p_n = float(np.mean(noise ** 2))
    if p_n <= 0 or p_s <= 0:
        return np.zeros_like(speech)
    return noise * math.sqrt(p_s / (p_n * 10 ** (snr_db / 10.0)))


def snr_db(speech: np.ndarray, noise: np.ndarray, active: np.ndarray | None = None) -> float:
    ref = speech[active] if active is not None and np.any(active) else speech
    return 10.0 * math.log10(float(np.mean(ref ** 2)) / float(np.mean(noise ** 2)))


# -- far-field conditions ----------------------------------------------------------------

@dataclass(frozen=True)
class ConditionSpec:
    distance: tuple[float, float]  # source-mic metres
    rt60: tuple[float, float]  # seconds
    snr: tuple[float, float]  # dB over active speech
    # Noise types and their relative weights (the mixture is then set to the SNR).
    noises: dict[str, float] = field(default_factory=dict)
    babble_talkers: tuple[int, int] = (3, 6)


CONDITIONS: dict[str, ConditionSpec] = {
    "DP1": ConditionSpec(distance=(0.3, 0.5), rt60=(0.15, 0.25), snr=(28.0, 35.0),
                         noises={"pink": 1.0, "fan": 0.5}),
    "DP2": ConditionSpec(distance=(0.9, 1.4), rt60=(0.3, 0.4), snr=(17.0, 22.0),
                         noises={"pink": 1.0, "fan": 1.0, "hum": 0.3}),
    "DP3": ConditionSpec(distance=(1.6, 2.4), rt60=(0.45, 0.55), snr=(12.0, 16.0),
                         noises={"babble": 1.0, "fan": 0.7, "pink": 0.5, "clatter": 0.3}),
    "DP4": ConditionSpec(distance=(2.5, 3.4), rt60=(0.6, 0.7), snr=(8.0, 11.0),
                         noises={"babble": 1.0, "fan": 0.8, "brown": 0.5, "hum": 0.3,
                                 "clatter": 0.4}),
    "DP5": ConditionSpec(distance=(3.5, 4.8), rt60=(0.75, 0.9), snr=(3.5, 6.5),
                         noises={"babble": 1.0, "brown": 0.8, "fan": 0.8, "hum": 0.4,
                                 "clatter": 0.5}, babble_talkers=(4, 8)),
}


@dataclass(frozen=True)
class Scene:
    condition: str
    room: Room
    noise_room: Room  # same room, the noise source elsewhere
    snr_db: float
    noises: dict[str, float]
    babble_talkers: int

    def summary(self) -> dict:
        return {"condition": self.condition, "distance": round(self.room.distance, 3),
                "rt60": round(self.room.rt60, 3), "snr_db": round(self.snr_db, 2),
                "room": [round(d, 2) for d in self.room.dims]}


def _place(rng: np.random.Generator, dims: np.ndarray, margin: float) -> np.ndarray:
    lo = np.array([margin, margin, 0.8])
    hi = dims - np.array([margin, margin, 0.5])
    return lo + rng.random(3) * (hi - lo)


def sample_scene(condition: str, rng: np.random.Generator) -> Scene:
    """A room, a source and mic placement, an SNR and a noise mix for one utterance."""
    spec = CONDITIONS[condition]
    distance = rng.uniform(*spec.distance)
    rt60 = rng.uniform(*spec.rt60)
    # A room big enough for the distance, bigger (and livelier) for farther conditions.
    scale = max(1.0, distance / 2.0)
    dims = np.array([rng.uniform(4.0, 7.5) * scale ** 0.5 + distance,
                     rng.uniform(3.5, 6.0) * scale ** 0.3 + 0.5 * distance,
                     rng.uniform(2.5, 3.4)])
    margin = 0.4
    for _ in range(200):
        mic = _place(rng, dims, margin)
        direction = rng.standard_normal(3)
        direction[2] *= 0.15  # mostly horizontal
        direction /= np.linalg.norm(direction)
        src = mic + distance * direction
        if np.all(src > [margin, margin, 0.8]) and np.all(src < dims - [margin, margin, 0.5]):
            break
    else:  # pragma: no cover - the room always has room for the distance
        raise RuntimeError(f"cannot place a source {distance:.2f} m from a mic in {dims}")
    noise_src = _place(rng, dims, margin)
    while np.linalg.norm(noise_src - mic) < 1.0:
        noise_src = _place(rng, dims, margin)
    dims_t = tuple(float(d) for d in dims)
    room = Room(dims_t, tuple(float(v) for v in src), tuple(float(v) for v in mic), float(rt60))
    noise_room = Room(dims_t, tuple(float(v) for v in noise_src), room.mic, float(rt60))
    noises = {k: w * rng.uniform(0.5, 1.5) for k, w in spec.noises.items()}
    talkers = int(rng.integers(spec.babble_talkers[0], spec.babble_talkers[1] + 1))
    return Scene(condition, room, noise_room, float(rng.uniform(*spec.snr)), noises, talkers)


@dataclass
class Rendered:
    audio: np.ndarray  # float64, the far-field signal (speech + noise), same rate as input
    delay: int  # direct-path delay in samples: add it to every dry alignment time
    speech: np.ndarray  # the reverberant speech alone (for analysis)
    noise: np.ndarray
    scene: Scene

    def summary(self) -> dict:
        return dict(self.scene.summary(), delay_samples=self.delay)


def make_noise(rng: np.random.Generator, n: int, fs: int, scene: Scene,
               babble_sources: list[np.ndarray] | None) -> np.ndarray:
    """The scene's noise mixture (unit RMS), before the room."""
    x = np.zeros(n)
    for kind, weight in sorted(scene.noises.items()):
        if kind == "pink":
            part = colored_noise(rng, n, 1.0, fs)
        elif kind == "brown":
            part = colored_noise(rng, n, 2.0, fs)
        elif kind == "white":
            part = colored_noise(rng, n, 0.0, fs)
        elif kind == "hum":
            part = hum(rng, n, fs)
        elif kind == "fan":
            part = fan(rng, n, fs)
        elif kind == "clatter":
            part = clatter(rng, n, fs)
        elif kind == "babble":
            if not babble_sources:
                continue
            part = babble(rng, n, babble_sources, scene.babble_talkers)
        else:
            raise ValueError(f"unknown noise type {kind!r}")
        x += math.sqrt(weight) * part
    return _unit(x)


def render(dry: np.ndarray, fs: int, scene: Scene, rng: np.random.Generator,
           active: np.ndarray | None = None,
           babble_sources: list[np.ndarray] | None = None) -> Rendered:
    """Speech `dry` as heard at the scene's microphone.

    Output length is len(dry) + the direct-path delay: the speech is shifted later by
    exactly `delay` samples (shift alignments by it) and its reverberant tail is cut
    where the dry signal ended (the dry signal should end in silence). `active` marks
    the dry signal's speech samples; the SNR is measured over them after the shift.
    """
    h = room_impulse_response(scene.room, fs, rng)
    delay = int(round(scene.room.direct_delay(fs)))
    n = len(dry) + delay
    wet = reverberate(dry, h)[:n]
    if len(wet) < n:
        wet = np.pad(wet, (0, n - len(wet)))
    act = None
    if active is not None:
        act = np.zeros(n, bool)
        act[delay:delay + len(active)] = active
    # Noise source in the same room: its own (shorter-reaching) response.
    # Generated longer than needed so that the kept part is in reverberant steady state.
    h_noise = room_impulse_response(scene.noise_room, fs, rng, image_time=0.03)
    lead = len(h_noise)
    noise_dry = make_noise(rng, n + lead, fs, scene, babble_sources)
    noise = reverberate(noise_dry, h_noise)[lead:lead + n]
    noise = mix_at_snr(wet, noise, scene.snr_db, act)
    return Rendered(audio=wet + noise, delay=delay, speech=wet, noise=noise, scene=scene)
