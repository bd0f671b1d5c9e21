"""Log-mel filterbank features, batched and vectorised (numpy + scipy.fft), Kaldi-compatible.

Public API:

    FbankComputer(fcfg)                  precomputes the window and the mel matrix once
    FbankComputer.num_frames(n_samples)  frames an utterance of n samples yields
    FbankComputer.compute(waves)         list of float32 [-1, 1] signals -> list of [T_i, bins]
    kaldi_fbank(wave, fcfg)              the reference: kaldi-native-fbank on one utterance
    fbank(waves, fcfg)                   dispatch on fcfg.backend ("numpy" | "kaldi")

Both backends compute exactly Kaldi's `compute-fbank-feats` recipe on samples scaled to
the int16 range (x 32768, Kaldi's convention): per 25 ms frame (10 ms shift, `snip_edges`
as configured) remove the DC offset, pre-emphasise (y[i] = x[i] - 0.97 x[i-1], y[0] =
x[0] - 0.97 x[0]), apply the Povey window, zero-pad to 512, take the power spectrum,
apply Kaldi's triangular mel filters (mel = 1127 ln(1 + f/700), `low_freq`..`high_freq`,
Nyquist bin excluded) and take log(max(energy, FLT_EPSILON)).

How the numpy backend is fast: every utterance of a batch is framed through a strided
view into one shared, cache-sized [C, 512] float32 buffer (columns 400..511 stay zero,
so the FFT padding is free). Per-frame DC removal and pre-emphasis are linear, so they
are done on the signal instead of per frame: the signal is pre-emphasised once and each
frame then only subtracts (1 - 0.97) x its mean (mean from a cumulative sum) and has
its first sample fixed up. One `scipy.fft.rfft` transforms the whole buffer (float32 in,
complex64 out); the complex output is viewed as interleaved float32, squared in place and
multiplied by a mel matrix whose re/im rows repeat the filter weights, so the power
spectrum and the mel projection are one sgemm per band of 16 adjacent filters (each band
only spans the FFT bins its filters touch, ~4x fewer multiply-adds than one dense matmul).
The int16 scale (32768^2) is folded into that matrix. The FFT and the sgemm run on torch
(MKL) when it is importable (`features.fft_engine`), else on scipy.fft and numpy's BLAS.

Dither (`fcfg.dither`, Kaldi units, i.e. int16 LSBs) is Gaussian noise added to the signal
before framing; Kaldi draws it per frame copy instead, which differs only in that
overlapping frames share their noise. It is 0 by default (and in the parity test).
"""
from __future__ import annotations

import math

import numpy as np

from core.config import FeaturesConfig

INT16_SCALE = 32768.0
FLT_EPSILON = float(np.finfo(np.float32).eps)


def mel_scale(f: np.ndarray | float) -> np.ndarray | float:
    return 1127.0 * np.log(1.0 + np.asarray(f, dtype=np.float64) / 700.0)


def padded_window_size(frame_length: int) -> int:
    return 1 << max(0, math.ceil(math.log2(frame_length)))


def vtlp_warp(f: np.ndarray, alpha: float, sample_rate: int, f_hi: float = 4800.0) -> np.ndarray:
    """VTLP's frequency warp (Jaitly & Hinton 2013): f * alpha up to a boundary, then a
    line that keeps the Nyquist frequency fixed."""
    nyq = 0.5 * sample_rate
    edge = f_hi * min(alpha, 1.0) / alpha
    top = nyq - (nyq - f_hi * min(alpha, 1.0)) / (nyq - edge) * (nyq - f)
    return np.where(f <= edge, f * alpha, top)


def kaldi_mel_banks(num_bins: int, padded: int, sample_rate: int, low_freq: float,
                    high_freq: float, warp: float = 1.0) -> np.ndarray:
    """Kaldi's triangular mel filters as a [padded // 2, num_bins] float64 matrix.
    `warp` != 1 moves every FFT bin to its VTLP-warped frequency first (augmentation)."""
    nyquist = 0.5 * sample_rate
    high = high_freq if high_freq > 0 else nyquist + high_freq
    if not (0 <= low_freq < high <= nyquist):
        raise ValueError(f"bad mel range: low_freq={low_freq}, high_freq={high}")
    n_fft_bins = padded // 2
    mel_low, mel_high = mel_scale(low_freq), mel_scale(high)
    delta = (mel_high - mel_low) / (num_bins + 1)
    freqs = np.arange(n_fft_bins) * (sample_rate / padded)
    if warp != 1.0:
        freqs = vtlp_warp(freqs, warp, sample_rate)
    mel = mel_scale(freqs)
    out = np.zeros((n_fft_bins, num_bins), dtype=np.float64)
    for b in range(num_bins):
        left = mel_low + b * delta
        centre = left + delta
        right = centre + delta
        up = (mel > left) & (mel <= centre)
        down = (mel > centre) & (mel < right)
        out[up, b] = (mel[up] - left) / (centre - left)
        out[down, b] = (right - mel[down]) / (right - centre)
    return out


def window(kind: str, length: int) -> np.ndarray:
    i = np.arange(length, dtype=np.float64)
    a = 2 * math.pi / (length - 1)
    if kind == "povey":
        return (0.5 - 0.5 * np.cos(a * i)) ** 0.85
    if kind == "hanning":
        return 0.5 - 0.5 * np.cos(a * i)
    if kind == "hamming":
        return 0.54 - 0.46 * np.cos(a * i)
    if kind == "blackman":
        return 0.42 - 0.5 * np.cos(a * i) + 0.08 * np.cos(2 * a * i)
    if kind == "rectangular":
        return np.ones(length)
    raise ValueError(f"unknown window_type {kind!r}")


class FbankComputer:
    """Batched log-mel fbank for many utterances at once (see the module docstring)."""

    def __init__(self, fcfg: FeaturesConfig, chunk_frames: int = 1024, warp: float = 1.0):
        self.fcfg = fcfg
        sr = fcfg.sample_rate
        self.length = int(round(sr * fcfg.frame_length_ms / 1000.0))
        self.shift = int(round(sr * fcfg.frame_shift_ms / 1000.0))
        self.padded = padded_window_size(self.length)
        self.bins = fcfg.num_mel_bins
        self.coeff = np.float32(fcfg.preemph_coeff)
        self.win = window(fcfg.window_type, self.length).astype(np.float32)
        banks = kaldi_mel_banks(self.bins, self.padded, sr, fcfg.low_freq, fcfg.high_freq, warp)
        # rfft yields padded//2 + 1 bins; Kaldi's filters ignore the Nyquist bin.
        full = np.zeros((self.padded // 2 + 1, self.bins))
        full[: self.padded // 2] = banks * (INT16_SCALE ** 2)
        used = np.nonzero(full.any(axis=1))[0]
        self.lo_bin, self.hi_bin = int(used[0]), int(used[-1]) + 1
        # rows 2k and 2k+1 multiply re^2 and im^2 of bin k: power + mel in one matmul.
        self.mel2 = np.repeat(full[self.lo_bin:self.hi_bin], 2, axis=0).astype(np.float32)
        # The filters are narrow at low and wide at high frequencies: in `bands` groups of
        # adjacent filters each group only needs its own bin range (~4x fewer MACs).
        self.bands = []
        nb = min(4, self.bins)
        for g in range(nb):
            f0, f1 = g * self.bins // nb, (g + 1) * self.bins // nb
            rows = np.nonzero(full[:, f0:f1].any(axis=1))[0]
            b0, b1 = (int(rows[0]), int(rows[-1]) + 1) if len(rows) else (0, 1)
            w = np.ascontiguousarray(np.repeat(full[b0:b1, f0:f1], 2, axis=0), np.float32)
            self.bands.append((f0, f1, 2 * b0, 2 * b1, w))
        self.chunk = max(64, int(chunk_frames))
        self._buf = np.zeros((self.chunk, self.padded), dtype=np.float32)
        self._rng = np.random.default_rng(fcfg.seed)
        self._torch = _torch_fft() if fcfg.fft_engine in ("auto", "torch") else None
        if fcfg.fft_engine == "torch" and self._torch is None:
            raise RuntimeError("features.fft_engine=torch but torch is not importable")
        if self._torch is not None:
            self._bands_t = [self._torch.from_numpy(w) for *_, w in self.bands]

    def num_frames(self, n: int) -> int:
        if self.fcfg.snip_edges:
            return 0 if n < self.length else 1 + (n - self.length) // self.shift
        return (n + self.shift // 2) // self.shift

    def _prepare(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """-> (pre-emphasised signal, per-frame DC term, first-sample fix-ups, frames)."""
        x = np.asarray(x, dtype=np.float32)
        nf = self.num_frames(len(x))
        if nf == 0:
            return x, np.zeros(0, np.float32), np.zeros(0, np.float32), 0
        if self.fcfg.dither > 0:
            x = x + (self.fcfg.dither / INT16_SCALE) * self._rng.standard_normal(
                len(x)).astype(np.float32)
        if not self.fcfg.snip_edges:
            begin0 = self.shift // 2 - self.length // 2
            padl = max(0, -begin0)
            padr = max(0, (nf - 1) * self.shift + begin0 + self.length - len(x))
            x = _reflect_pad(x, padl, padr)
        starts = np.arange(nf, dtype=np.int64) * self.shift
        c = self.coeff
        if self.fcfg.remove_dc_offset:
            mean = self._frame_means(x, nf)
        else:
            mean = np.zeros(nf, np.float32)
        p = np.empty_like(x)
        p[0] = x[0]
        np.subtract(x[1:], c * x[:-1], out=p[1:])
        dc = (1.0 - c) * mean
        first = x[starts] * (1.0 - c) - dc
        return p, dc.astype(np.float32), first.astype(np.float32), nf

    def _frame_means(self, x: np.ndarray, nf: int) -> np.ndarray:
        """Mean of each frame's samples, from sums over blocks of gcd(length, shift)."""
        g = math.gcd(self.length, self.shift)
        nb = ((nf - 1) * self.shift + self.length) // g
        blocks = x[: nb * g].reshape(nb, g).sum(axis=1, dtype=np.float32)
        cs = np.zeros(nb + 1, dtype=np.float64)
        np.cumsum(blocks, dtype=np.float64, out=cs[1:])
        first = np.arange(nf) * (self.shift // g)
        sums = cs[first + self.length // g] - cs[first]
        return (sums / self.length).astype(np.float32)

    def compute(self, waves: list[np.ndarray]) -> list[np.ndarray]:
        """float32 signals in [-1, 1] -> float32 log-mel [T_i, bins] per signal.

        Absurd input (e.g. float samples near 3e38) overflows to inf/NaN features rather
        than raising; callers check `np.isfinite` and reject such utterances.
        """
        with np.errstate(over="ignore", invalid="ignore"):
            return self._compute(waves)

    def _compute(self, waves: list[np.ndarray]) -> list[np.ndarray]:
        counts = []
        prepared = []
        for w in waves:
            prep = self._prepare(w)
            prepared.append(prep)
            counts.append(prep[3])
        total = int(sum(counts))
        out = np.empty((total, self.bins), dtype=np.float32)
        buf, L, C = self._buf, self.length, self.chunk
        fill = 0
        written = 0
        for p, dc, first, nf in prepared:
            if nf == 0:
                continue
            view = np.lib.stride_tricks.as_strided(
                p, shape=(nf, L), strides=(self.shift * p.strides[0], p.strides[0]),
                writeable=False)
            j = 0
            while j < nf:
                k = min(nf - j, C - fill)
                dst = buf[fill:fill + k, :L]
                np.subtract(view[j:j + k], dc[j:j + k, None], out=dst)
                dst *= self.win  # while the rows are still in cache
                dst[:, 0] = first[j:j + k] * self.win[0]
                fill += k
                j += k
                if fill == C:
                    self._flush(fill, out[written:written + fill])
                    written += fill
                    fill = 0
        if fill:
            self._flush(fill, out[written:written + fill])
            written += fill
        np.maximum(out, FLT_EPSILON, out=out)
        np.log(out, out=out)
        res, o = [], 0
        for nf in counts:
            res.append(out[o:o + nf])
            o += nf
        return res

    def _flush(self, n: int, dst: np.ndarray) -> None:
        frames = self._buf[:n]  # already windowed
        lo, hi = 2 * self.lo_bin, 2 * self.hi_bin
        if self._torch is not None:
            torch = self._torch
            spec = torch.fft.rfft(torch.from_numpy(frames), dim=1)
            pw = torch.view_as_real(spec).reshape(n, -1)
            pw[:, lo:hi].mul_(pw[:, lo:hi])
            out = torch.from_numpy(dst)
            for (f0, f1, a, b, _), w in zip(self.bands, self._bands_t):
                out[:, f0:f1] = torch.matmul(pw[:, a:b], w)
            return
        import scipy.fft

        spec = scipy.fft.rfft(frames, axis=1)
        pw = spec.view(np.float32)
        np.multiply(pw[:, lo:hi], pw[:, lo:hi], out=pw[:, lo:hi])
        for f0, f1, a, b, w in self.bands:
            dst[:, f0:f1] = pw[:, a:b] @ w


def _torch_fft():
    """torch (its MKL/pocketfft FFT and sgemm are ~2x scipy's on one core), or None."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def _reflect_pad(x: np.ndarray, left: int, right: int) -> np.ndarray:
    """Kaldi's edge handling for snip_edges=false: s<0 -> -s-1, s>=N -> 2N-1-s."""
    n = len(x)
    idx = np.arange(-left, n + right)
    idx = np.where(idx < 0, -idx - 1, idx)
    idx = np.where(idx >= n, 2 * n - 1 - idx, idx)
    idx = np.clip(idx, 0, n - 1)
    return x[idx]


def kaldi_options(fcfg: FeaturesConfig):
    import kaldi_native_fbank as knf

    o = knf.FbankOptions()
    fo = o.frame_opts
    fo.samp_freq = float(fcfg.sample_rate)
    fo.frame_length_ms = fcfg.frame_length_ms
    fo.frame_shift_ms = fcfg.frame_shift_ms
    fo.dither = fcfg.dither
    fo.preemph_coeff = fcfg.preemph_coeff
    fo.remove_dc_offset = fcfg.remove_dc_offset
    fo.window_type = fcfg.window_type
    fo.snip_edges = fcfg.snip_edges
    o.mel_opts.num_bins = fcfg.num_mel_bins
    o.mel_opts.low_freq = fcfg.low_freq
    o.mel_opts.high_freq = fcfg.high_freq
    o.use_energy = False
    o.use_power = True
    o.use_log_fbank = True
    return o


def kaldi_fbank(wave: np.ndarray, fcfg: FeaturesConfig, opts=None) -> np.ndarray:
    """kaldi-native-fbank on one float32 [-1, 1] signal -> float32 [T, bins]."""
    import kaldi_native_fbank as knf

    fb = knf.OnlineFbank(opts or kaldi_options(fcfg))
    fb.accept_waveform(float(fcfg.sample_rate),
                       np.asarray(wave, dtype=np.float32) * np.float32(INT16_SCALE))
    fb.input_finished()
    n = fb.num_frames_ready
    if n == 0:
        return np.zeros((0, fcfg.num_mel_bins), dtype=np.float32)
    return np.stack([np.asarray(fb.get_frame(i), dtype=np.float32) for i in range(n)])


def fbank(waves: list[np.ndarray], fcfg: FeaturesConfig,
          computer: FbankComputer | None = None) -> list[np.ndarray]:
    """Log-mel fbank of each signal with the configured backend."""
    if fcfg.backend == "kaldi":
        opts = kaldi_options(fcfg)
        return [kaldi_fbank(w, fcfg, opts) for w in waves]
    return (computer or FbankComputer(fcfg)).compute(waves)
