"""A synthetic stand-in for IRMAS, written as real audio files in exactly the IRMAS layout. ::

    root/IRMAS-TrainingData/<class>/[<class>][<genre>]NNNN__N.wav     3 s, stereo, 44.1 kHz, PCM 16
    root/IRMAS-TestingData-Part1/Part1/synth-NNNN.wav + .txt          5–10 s mixes of 1–2 instruments

The 11 classes (``irmas.CLASSES``) are additive synthesisers whose timbres differ in the ways
that survive the paper's features (MFCCs standardised over time keep the *dynamics* of the
spectrum, not its average): harmonic spectra (odd-only, bright, drawbar, formant-filtered),
envelopes (bowed, blown, plucked, struck, organ gate), vibrato/tremolo rates and depths, breath
noise, distortion, inharmonic partials, note rates. Pitch, tempo, depths, level, panning and a
background-noise floor are drawn at random per clip, so pitch ranges overlap and no single
number gives the class away. Everything is deterministic from ``seed``. ::

    make_synthetic_irmas("data/synth-irmas", clips_per_class=20, seed=0)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from experiments.data.irmas import CLASSES, CLIP_SAMPLES, SAMPLE_RATE, TRAIN_DIR

__all__ = ["make_synthetic_irmas", "ensure_synthetic_irmas", "synthesize_clip", "TEST_DIR", "GENRES"]

TEST_DIR = "IRMAS-TestingData-Part1/Part1"
GENRES = ("cla", "pop_roc", "jaz_blu", "cou_fol", "lat_sou")
_MARKER = ".synth-irmas.json"
_VERSION = 1
_NYQ_MARGIN = 1000.0


def _midi_hz(m):
    return 440.0 * 2.0 ** ((np.asarray(m, float) - 69.0) / 12.0)


def _envelope(n, sr, attack, release, decay=None):
    """(n,) attack ramp, optional exponential decay (time constant ``decay`` s), release ramp."""
    t = np.arange(n, dtype=np.float32) / np.float32(sr)
    env = np.minimum(np.float32(1.0), t / np.float32(max(attack, 1e-4)))
    if decay is not None:
        env = env * np.exp(-np.maximum(t - np.float32(attack), 0) / np.float32(decay))
    r = int(release * sr)
    if 0 < r < n:
        env[-r:] *= np.linspace(1.0, 0.0, r, dtype=np.float32)
    return env


def _tone(n, f0, amps, *, sr=SAMPLE_RATE, vibrato=(0.0, 0.0), rng=None, stretch=0.0,
          harmonic_decay=None, harmonics=None):
    """Additive tone, (n,): partial k (1-based) at k·f0·sqrt(1 + stretch·k²) with amplitude amps[k-1].

    vibrato = (rate Hz, depth as a fraction of f0); harmonic_decay = τ (s): partial k decays
    with time constant τ / k (plucked/struck strings lose their high partials first).
    """
    t = np.arange(n) / sr
    rate, depth = vibrato
    phase0 = rng.uniform(0, 2 * np.pi) if rng is not None else 0.0
    f = f0 * (1.0 + depth * np.sin(2 * np.pi * rate * t + phase0))
    cycles = np.cumsum(f) / sr  # float64, unwrapped; each partial is wrapped before float32 sin
    t32 = t.astype(np.float32)
    out = np.zeros(n, np.float32)
    ks = harmonics if harmonics is not None else range(1, len(amps) + 1)
    for k, a in zip(ks, amps):
        ratio = k * np.sqrt(1.0 + stretch * k * k)
        if ratio * f0 * (1 + depth) >= sr / 2 - _NYQ_MARGIN or a == 0:
            continue
        c = ratio * cycles + (rng.uniform() if rng is not None else 0.0)
        part = np.float32(a) * np.sin(np.float32(2 * np.pi) * (c - np.floor(c)).astype(np.float32))
        if harmonic_decay is not None:
            part *= np.exp(t32 * np.float32(-k / harmonic_decay))
        out += part
    return out.astype(np.float64)


def _noise(n, rng, lo, hi, sr=SAMPLE_RATE):
    """Band-limited noise (lo..hi Hz), unit RMS, by masking an FFT."""
    spec = np.fft.rfft(rng.standard_normal(n))
    freqs = np.fft.rfftfreq(n, 1 / sr)
    spec[(freqs < lo) | (freqs > hi)] = 0
    x = np.fft.irfft(spec, n)
    return x / (np.sqrt(np.mean(x * x)) + 1e-12)


def _formant_filter(x, formants, sr=SAMPLE_RATE):
    """Shape x's spectrum with Gaussian resonances [(centre Hz, bandwidth Hz, gain)]."""
    spec = np.fft.rfft(x)
    freqs = np.fft.rfftfreq(len(x), 1 / sr)
    g = 0.05 + sum(a * np.exp(-0.5 * ((freqs - c) / bw) ** 2) for c, bw, a in formants)
    return np.fft.irfft(spec * g, len(x))


def _schedule(rng, n, count, legato=True):
    """``count`` note (start, length) pairs tiling n samples with jittered boundaries."""
    edges = np.sort(rng.uniform(0.15, 0.85, count - 1)) if count > 1 else np.array([])
    edges = np.concatenate([[0.0], edges, [1.0]]) * n
    out = []
    for a, b in zip(edges[:-1], edges[1:]):
        a, b = int(a), int(b)
        if not legato:
            b = a + int((b - a) * rng.uniform(0.5, 0.85))
        out.append((a, max(b - a, 1)))
    return out


def _add(buf, start, sig):
    end = min(len(buf), start + len(sig))
    buf[start:end] += sig[:end - start]


def _saw(n_h, power=1.0):
    return 1.0 / np.arange(1, n_h + 1) ** power


def _struck(buf, start, f0, decay, amps, attack, rng, **tone_kw):
    """Add a struck or plucked note at ``start``: an exponential decay, cut after 5 time constants
    (below -43 dB) or at the end of ``buf``."""
    n = min(len(buf) - start, int(5 * decay * SAMPLE_RATE))
    tone = _tone(n, f0, amps, rng=rng, **tone_kw)
    _add(buf, start, tone * _envelope(n, SAMPLE_RATE, attack, 0.0, decay=decay))


def _cel(rng, n):
    buf = np.zeros(n)
    for s, l in _schedule(rng, n, rng.integers(1, 3)):
        f0 = _midi_hz(rng.uniform(36, 60))
        amps = _saw(20) * (1 + 2.0 * np.exp(-0.5 * ((np.arange(1, 21) * f0 - 250) / 150) ** 2))
        tone = _tone(l, f0, amps, vibrato=(rng.uniform(4.5, 5.5), rng.uniform(0.003, 0.006)), rng=rng)
        _add(buf, s, tone * _envelope(l, SAMPLE_RATE, rng.uniform(0.15, 0.3), 0.1))
    return buf + 0.02 * _noise(n, rng, 2000, 8000)  # bow noise


def _cla(rng, n):
    buf = np.zeros(n)
    for s, l in _schedule(rng, n, rng.integers(1, 3)):
        f0 = _midi_hz(rng.uniform(50, 77))
        amps = np.where(np.arange(1, 16) % 2 == 1, 1.0, 0.08) / np.arange(1, 16) ** 0.8
        tone = _tone(l, f0, amps, rng=rng)
        _add(buf, s, tone * _envelope(l, SAMPLE_RATE, rng.uniform(0.03, 0.06), 0.05))
    return buf + 0.01 * _noise(n, rng, 1000, 6000)


def _flu(rng, n):
    buf = np.zeros(n)
    for s, l in _schedule(rng, n, rng.integers(2, 4)):
        f0 = _midi_hz(rng.uniform(60, 88))
        tone = _tone(l, f0, [1.0, 0.35, 0.12, 0.05], vibrato=(rng.uniform(4, 5), rng.uniform(0.004, 0.008)),
                     rng=rng)
        env = _envelope(l, SAMPLE_RATE, rng.uniform(0.05, 0.1), 0.08)
        breath = rng.uniform(0.15, 0.3) * _noise(l, rng, f0, 4 * f0)
        _add(buf, s, (tone + breath) * env)
    return buf


def _gac(rng, n):
    buf = np.zeros(n)
    period = int(SAMPLE_RATE * rng.uniform(0.25, 0.5))
    root = rng.uniform(40, 55)
    for start in range(int(rng.uniform(0, 0.1) * SAMPLE_RATE), n, period):
        for iv in rng.choice([0, 4, 7, 12, 16], size=rng.integers(1, 4), replace=False):
            f0 = _midi_hz(root + iv + rng.integers(-2, 3))
            _struck(buf, start, f0, rng.uniform(0.3, 0.6), _saw(12, 1.2), 0.002, rng,
                    harmonic_decay=rng.uniform(0.8, 1.5), stretch=1e-5)
    return buf


def _gel(rng, n):
    buf = np.zeros(n)
    for s, l in _schedule(rng, n, rng.integers(2, 5)):
        f0 = _midi_hz(rng.uniform(40, 64))
        tone = _tone(l, f0, _saw(8), rng=rng) + _tone(l, f0 * 1.5, _saw(6), rng=rng)
        chug = 1.0 - rng.uniform(0.2, 0.5) * (np.sin(2 * np.pi * rng.uniform(6, 9) * np.arange(l) / SAMPLE_RATE) > 0)
        _add(buf, s, np.tanh(rng.uniform(4, 10) * tone) * chug * _envelope(l, SAMPLE_RATE, 0.005, 0.03))
    return buf


def _org(rng, n):
    buf = np.zeros(n)
    for s, l in _schedule(rng, n, rng.integers(1, 3)):
        root = rng.uniform(45, 65)
        for iv in (0, 4, 7):
            f0 = _midi_hz(root + iv)
            tone = _tone(l, f0, [1, 1, 0.8, 0.7, 0, 0.5], harmonics=[1, 2, 3, 4, 6, 8], rng=rng)
            _add(buf, s, tone * _envelope(l, SAMPLE_RATE, 0.01, 0.01))
    return buf


def _pia(rng, n):
    buf = np.zeros(n)
    starts = np.sort(rng.integers(0, int(0.8 * n), size=rng.integers(3, 7)))
    for start in starts:
        f0 = _midi_hz(rng.uniform(33, 84))
        _struck(buf, start, f0, rng.uniform(0.6, 1.2), _saw(16, 1.5), 0.003, rng,
                stretch=rng.uniform(1e-4, 4e-4), harmonic_decay=rng.uniform(1.5, 3.0))
    return buf


def _sax(rng, n):
    buf = np.zeros(n)
    for s, l in _schedule(rng, n, rng.integers(4, 7)):
        f0 = _midi_hz(rng.uniform(45, 77))
        tone = _tone(l, f0, _saw(20, 0.7), vibrato=(rng.uniform(5, 6), rng.uniform(0.006, 0.012)), rng=rng)
        tone = _formant_filter(tone, [(rng.uniform(1200, 1800), 500, 1.5), (500, 300, 1.0)])
        env = _envelope(l, SAMPLE_RATE, 0.03, 0.04)
        _add(buf, s, (tone + 0.08 * _noise(l, rng, 1500, 7000)) * env)
    return buf


def _tru(rng, n):
    buf = np.zeros(n)
    for s, l in _schedule(rng, n, rng.integers(3, 6), legato=False):
        f0 = _midi_hz(rng.uniform(55, 82))
        k = np.arange(1, 17)
        amps = np.minimum(k / 3.0, 1.0) / k ** 0.5
        t = np.arange(l) / SAMPLE_RATE
        bright = 1.0 - np.exp(-t / 0.04)  # brass "blip": the upper partials come in late
        tone = _tone(l, f0, amps[:2], rng=rng) + bright * _tone(l, f0, np.r_[0, 0, amps[2:]], rng=rng)
        _add(buf, s, tone * _envelope(l, SAMPLE_RATE, 0.015, 0.05))
    return buf


def _vio(rng, n):
    buf = np.zeros(n)
    for s, l in _schedule(rng, n, rng.integers(2, 5)):
        f0 = _midi_hz(rng.uniform(55, 90))
        tone = _tone(l, f0, _saw(20), vibrato=(rng.uniform(6, 7), rng.uniform(0.01, 0.02)), rng=rng)
        tone = _formant_filter(tone, [(2800, 900, 1.5), (450, 200, 1.0)])
        _add(buf, s, tone * _envelope(l, SAMPLE_RATE, rng.uniform(0.06, 0.12), 0.06))
    return buf + 0.02 * _noise(n, rng, 3000, 9000)


_VOWELS = ((730, 1090, 2440), (270, 2290, 3010), (300, 870, 2240), (530, 1840, 2480), (570, 840, 2410))


def _voi(rng, n):
    buf = np.zeros(n)
    for s, l in _schedule(rng, n, rng.integers(3, 7), legato=False):
        f0 = _midi_hz(rng.uniform(45, 72))
        tone = _tone(l, f0, _saw(30, 0.5), vibrato=(rng.uniform(4.5, 5.5), rng.uniform(0.01, 0.02)), rng=rng)
        v = _VOWELS[rng.integers(len(_VOWELS))]
        tone = _formant_filter(tone, [(v[0], 90, 1.0), (v[1], 110, 0.7), (v[2], 150, 0.4)])
        _add(buf, s, tone * _envelope(l, SAMPLE_RATE, 0.05, 0.08))
    return buf


_SYNTHS = dict(zip(CLASSES, (_cel, _cla, _flu, _gac, _gel, _org, _pia, _sax, _tru, _vio, _voi)))


def synthesize_clip(cls: str, rng: np.random.Generator, num_samples: int = CLIP_SAMPLES) -> np.ndarray:
    """One stereo excerpt of instrument ``cls``: (2, num_samples) float32 in [-1, 1]."""
    if cls not in _SYNTHS:
        raise ValueError(f"cls must be one of {list(CLASSES)}; got {cls!r}")
    mono = _SYNTHS[cls](rng, num_samples)
    mono = mono / (np.max(np.abs(mono)) + 1e-9)
    pan = rng.uniform(0.2, 0.8)
    delay = rng.integers(0, 40)  # a few samples of inter-channel delay: the channels differ
    right = np.roll(mono, delay)
    stereo = np.stack([np.sqrt(1 - pan) * mono, np.sqrt(pan) * right])
    stereo += 10 ** (-rng.uniform(25, 45) / 20) * rng.standard_normal(stereo.shape)  # noise floor
    return (rng.uniform(0.3, 0.9) * stereo / np.max(np.abs(stereo))).astype(np.float32)


def _write(path: Path, audio: np.ndarray):
    import soundfile as sf

    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), audio.T, SAMPLE_RATE, subtype="PCM_16")


def make_synthetic_irmas(root, clips_per_class: int = 20, seed: int = 0, test_clips: int = 0,
                         test_seconds=(5.0, 10.0)) -> Path:
    """Write the stand-in under ``root`` (see the module docstring); return ``root``.

    clips_per_class: training excerpts per class (3 s each). test_clips: test excerpts
    (``test_seconds`` long, 1–2 instruments mixed, labels in a ``.txt`` beside each).
    """
    if clips_per_class < 1:
        raise ValueError(f"clips_per_class must be >= 1; got {clips_per_class}")
    if test_clips < 0:
        raise ValueError(f"test_clips must be >= 0; got {test_clips}")
    lo, hi = test_seconds
    if not 3.0 <= lo <= hi:
        raise ValueError(f"test_seconds must be (lo, hi) with 3 <= lo <= hi; got {test_seconds}")
    root = Path(root)
    (root / _MARKER).unlink(missing_ok=True)
    for k, cls in enumerate(CLASSES):
        for i in range(clips_per_class):
            rng = np.random.default_rng([seed, k, i])
            genre = GENRES[rng.integers(len(GENRES))]
            name = f"[{cls}][{genre}]{i // 3 + 1:04d}__{i % 3 + 1}.wav"
            _write(root / TRAIN_DIR / cls / name, synthesize_clip(cls, rng))
    for i in range(test_clips):
        rng = np.random.default_rng([seed, 1000, i])
        n = int(rng.uniform(lo, hi) * SAMPLE_RATE)
        present = rng.choice(len(CLASSES), size=rng.integers(1, 3), replace=False)
        mix = sum(synthesize_clip(CLASSES[c], rng, n) for c in present)
        mix = (0.9 * mix / np.max(np.abs(mix))).astype(np.float32)
        path = root / TEST_DIR / f"synth-{i:04d}.wav"
        _write(path, mix)
        path.with_suffix(".txt").write_text("".join(f"{CLASSES[c]}\n" for c in sorted(present)))
    (root / _MARKER).write_text(json.dumps(_params(clips_per_class, seed, test_clips, test_seconds)) + "\n")
    return root


def _params(clips_per_class, seed, test_clips, test_seconds):
    return {"version": _VERSION, "clips_per_class": clips_per_class, "seed": seed, "test_clips": test_clips,
            "test_seconds": list(map(float, test_seconds))}


def ensure_synthetic_irmas(root, clips_per_class: int = 20, seed: int = 0, test_clips: int = 0,
                           test_seconds=(5.0, 10.0), log=print) -> Path:
    """Generate the stand-in under ``root`` unless a complete one with the same parameters is there."""
    root = Path(root)
    marker = root / _MARKER
    want = _params(clips_per_class, seed, test_clips, test_seconds)
    try:
        if json.loads(marker.read_text()) == want:
            return root
        import shutil  # a different stand-in of ours is there: replace it, leave nothing stale

        for sub in (TRAIN_DIR, TEST_DIR.split("/")[0]):
            shutil.rmtree(root / sub, ignore_errors=True)
    except (OSError, ValueError):
        pass
    log(f"generating the synthetic IRMAS stand-in in {root} ({clips_per_class} clips per class"
        f"{f', {test_clips} test clips' if test_clips else ''}, seed {seed}) ...")
    return make_synthetic_irmas(root, clips_per_class, seed, test_clips, test_seconds)
