"""IRMAS (Bosch et al., ISMIR 2012) as used by BPPSA (Wang et al., MLSys 2020, §5.2).

Training set: ``IRMAS-TrainingData/<class>/[<class>][<genre>]NNNN__N.wav``, 11 predominant
instruments, stereo 3-second excerpts at 44.1 kHz. Features (the paper's): librosa MFCC on each
channel separately, the 0th coefficient dropped, each coefficient standardised over time, the
two channels concatenated. Three settings (n_mfcc, n_fft, hop) on 132,300 samples, librosa's
centred frames giving T = 1 + 132300 // hop: :data:`SETTINGS` and :data:`SHAPES`, the one home
of the (F, T) shapes: s = (20, 4096, 512) -> x (N, 259, 38), m -> (N, 517, 24), l -> (N, 1034, 12).

Test set: ``IRMAS-TestingData-Part{1,2,3}/…/<name>.wav`` excerpts of 5–20 s, each with a
``<name>.txt`` listing one or more instruments (one per line). A model is evaluated on 3-second
windows; a clip's class scores are the mean of its windows' softmax outputs, normalised by their
maximum and thresholded (Han et al., 2017), then per-class, micro and macro F1 are reported. ::

    feats = load_features("data/IRMAS-TrainingData", setting="m", cache_dir="data/cache")
    feats.x  # (N, 517, 24) float32,  feats.y  # (N,) int32,  feats.skipped  # [(path, reason)]
    feats.skipped_folders  # {"Violin": 3}: audio outside the class folders, not used

The folder layout (class names, file lists, test labels) is :mod:`experiments.data.irmas_files`,
re-exported here. A data folder with no usable audio raises :class:`bppsa.errors.UsageError`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
import os
import warnings
from pathlib import Path

import numpy as np

from bppsa.errors import UsageError
from experiments.data.cache import cache_key, check_cache_dir, load_cache, save_cache
from experiments.data.irmas_files import (
    AUDIO_EXTENSIONS,
    CLASSES,
    LAYOUT,
    TEST_LAYOUT,
    TRAIN_DIR,
    find_training_root,
    list_test_files,
    list_training_files,
    non_class_folders,
    read_test_labels,
)

__all__ = [
    "CLASSES", "SETTINGS", "SHAPES", "SAMPLE_RATE", "CLIP_SAMPLES", "TRAIN_DIR", "AUDIO_EXTENSIONS",
    "IrmasFeatures", "IrmasTestFeatures", "num_frames", "num_features", "read_audio", "mfcc_features",
    "extract_features", "find_training_root", "list_training_files", "non_class_folders", "load_features",
    "list_test_files", "read_test_labels", "load_test_features", "clip_predictions", "multilabel_f1"]

SETTINGS = {  # name -> (n_mfcc, n_fft, hop_length)
    "s": (20, 4096, 512),
    "m": (13, 2048, 256),
    "l": (7, 1024, 128),
}
SAMPLE_RATE = 44100
CLIP_SECONDS = 3
CLIP_SAMPLES = SAMPLE_RATE * CLIP_SECONDS  # 132,300
_STD_EPS = 1e-8


def _check_setting(setting):
    if setting not in SETTINGS:
        raise ValueError(f"setting must be one of {sorted(SETTINGS)} (s, m, l of the paper); got {setting!r}")
    return SETTINGS[setting]


def num_frames(setting: str) -> int:
    """T for a setting: librosa's centred frames on 3 s at 44.1 kHz (259 / 517 / 1034)."""
    return 1 + CLIP_SAMPLES // _check_setting(setting)[2]


def num_features(setting: str) -> int:
    """F for a setting: two channels × (n_mfcc − 1) (38 / 24 / 12)."""
    return 2 * (_check_setting(setting)[0] - 1)


#: setting -> (F, T) of its feature arrays x (N, T, F): {"s": (38, 259), "m": (24, 517), "l": (12, 1034)}.
SHAPES = {name: (num_features(name), num_frames(name)) for name in SETTINGS}


# --- Audio and features --------------------------------------------------------------------------

def read_audio(path, *, offset: int = 0, num_samples: int | None = CLIP_SAMPLES) -> np.ndarray:
    """Read a file as stereo float32 at 44.1 kHz: (2, num_samples) (or the whole file if None).

    Mono is duplicated to both channels (more than two channels: the first two are kept); other
    sample rates are resampled with librosa; ``offset`` (samples at 44.1 kHz) skips the start;
    the result is zero-padded or cropped to ``num_samples``. Raises on undecodable files.
    """
    import librosa
    import soundfile as sf

    data, sr = sf.read(str(path), dtype="float32", always_2d=True)  # (n, channels)
    if data.shape[1] == 0:
        raise ValueError(f"{path}: no audio channels")
    audio = data.T
    audio = np.concatenate([audio, audio]) if audio.shape[0] == 1 else audio[:2]
    if sr != SAMPLE_RATE:
        audio = librosa.resample(audio, orig_sr=sr, target_sr=SAMPLE_RATE, axis=-1).astype(np.float32)
    audio = audio[:, offset:]
    if num_samples is not None:
        if audio.shape[1] < num_samples:
            audio = np.pad(audio, ((0, 0), (0, num_samples - audio.shape[1])))
        audio = audio[:, :num_samples]
    if not np.all(np.isfinite(audio)):
        raise ValueError(f"{path}: audio contains NaN or inf")
    return np.ascontiguousarray(audio, dtype=np.float32)


def mfcc_features(audio: np.ndarray, setting: str = "m") -> np.ndarray:
    """The paper's features of one clip: audio (2, 132300) -> (T, F) float32.

    MFCC per channel, 0th coefficient dropped, each coefficient standardised over time (zero
    mean, unit variance; a constant coefficient becomes 0), channels concatenated.
    """
    import librosa

    n_mfcc, n_fft, hop = _check_setting(setting)
    audio = np.asarray(audio, np.float32)
    if audio.ndim != 2 or audio.shape[0] != 2:
        raise ValueError(f"audio must have shape (2, samples) (stereo); got {audio.shape}")
    m = librosa.feature.mfcc(y=audio, sr=SAMPLE_RATE, n_mfcc=n_mfcc, n_fft=n_fft, hop_length=hop)
    m = m[:, 1:, :]  # (2, n_mfcc - 1, T): drop the 0th (energy) coefficient
    m = (m - m.mean(-1, keepdims=True)) / (m.std(-1, keepdims=True) + _STD_EPS)
    return np.ascontiguousarray(m.reshape(-1, m.shape[-1]).T, dtype=np.float32)


def _clip_features(path, setting, offset=0):
    """Worker: (features (T, F) or None, error message or None)."""
    try:
        return mfcc_features(read_audio(path, offset=offset), setting), None
    except Exception as e:  # any decoding failure is reported, never fatal
        return None, f"{type(e).__name__}: {e}"


def _clip_features_batch(jobs, setting):
    return [_clip_features(p, setting, off) for p, off in jobs]


def extract_features(jobs, setting, *, workers=None, progress=False, desc=None):
    """MFCC features (T, F) of ``setting`` for [(path, offset in samples)], in order: a list of
    (features or None, error message or None). ``workers`` > 1: spawned processes (default: 1,
    or up to 8 for 1000 jobs or more)."""
    from tqdm.auto import tqdm

    if workers is None:
        workers = min(os.cpu_count() or 1, 8) if len(jobs) >= 1000 else 1
    results = []
    bar = tqdm(total=len(jobs), desc=desc, unit="clip", disable=not progress)
    try:
        if workers <= 1:
            for p, off in jobs:
                results.append(_clip_features(p, setting, off))
                bar.update(1)
        else:
            # spawn, not fork: the parent usually has JAX's threads running
            batches = [jobs[i:i + 32] for i in range(0, len(jobs), 32)]
            with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as ex:
                for out in ex.map(_clip_features_batch, batches, [setting] * len(batches)):
                    results.extend(out)
                    bar.update(len(out))
    finally:
        bar.close()
    return results


# --- Training set --------------------------------------------------------------------------------

@dataclasses.dataclass
class IrmasFeatures:
    """Features of the IRMAS training set (or its stand-in).

    x: (N, T, F) float32; y: (N,) int32 indices into ``classes``; paths: the N files (relative
    to the training root); skipped: [(path, reason)] for files that could not be decoded;
    skipped_folders: {folder: audio files} outside the class folders, not used (``non_class_folders``).
    """

    x: np.ndarray
    y: np.ndarray
    classes: tuple
    skipped: list
    paths: list
    setting: str
    skipped_folders: dict = dataclasses.field(default_factory=dict)


def _cache_key(kind, root, files, setting, extra=()):
    from librosa.version import version as librosa_version  # what librosa.__version__ is

    return cache_key((kind, setting, SETTINGS[setting], librosa_version, extra), root, files)


def _check_decoded(n_decoded, skipped, root, expected):
    if n_decoded == 0 and skipped:  # every file failed: the folder is not what it should be
        first = " ".join(f"{skipped[0][0]}: {skipped[0][1]}".split())[:200]
        raise UsageError(f"none of the {len(skipped)} audio files under {str(root)!r} could be read (first: "
                         f"{first}); expected {expected}")


def _warn_folders(folders, root):
    if folders:
        shown = ", ".join(f"{d}/ ({n})" for d, n in folders.items())
        warnings.warn(f"IRMAS: ignored {sum(folders.values())} audio files in folders that are not class folders "
                      f"of {str(root)!r}: {shown}; expected <class>/ with <class> one of {', '.join(CLASSES)}",
                      RuntimeWarning, stacklevel=3)


def _warn_silent(x, paths, what="files"):
    """Warn about examples whose features are all zero: empty (0 frames) or silent audio."""
    silent = [p for p, zero in zip(paths, ~np.any(x, axis=tuple(range(1, x.ndim)))) if zero]
    if silent:
        shown = ", ".join(silent[:3]) + (", …" if len(silent) > 3 else "")
        warnings.warn(f"IRMAS: {len(silent)} of {len(paths)} {what} are empty or silent (all-zero audio, so "
                      f"all-zero features): {shown}; expected audible clips", RuntimeWarning, stacklevel=3)
    return silent


def _warn_skipped(skipped, total):
    if skipped:
        shown = "; ".join(f"{p}: {r}" for p, r in skipped[:3])
        warnings.warn(f"IRMAS: skipped {len(skipped)} of {total} files that could not be decoded "
                      f"({shown}{'; …' if len(skipped) > 3 else ''})", RuntimeWarning, stacklevel=3)


def load_features(root, setting: str = "m", cache_dir=None, *, max_per_class: int | None = None,
                  workers: int | None = None, progress: bool = True) -> IrmasFeatures:
    """Features of the IRMAS training set under ``root`` (``IRMAS-TrainingData`` or its parent).

    Args:
      root: the training folder; labels come from the class folder names (``CLASSES``).
      setting: "s" | "m" | "l" (see the module docstring).
      cache_dir: where to keep an ``.npz`` cache keyed by the file list (names, sizes, mtimes),
        the setting and librosa's version; None disables caching.
      max_per_class: use only the first k files (sorted) of each class.
      workers: feature-extraction processes (default: the CPU count for ≥ 1000 files, else 1;
        more than 1 uses "spawn", so a calling script needs the `if __name__ == "__main__":` guard).
      progress: show a tqdm bar while extracting.

    Files that cannot be decoded are skipped, listed in ``.skipped`` and reported in a warning;
    audio outside the class folders is counted in ``.skipped_folders`` and reported in a warning.
    Raises UsageError when the folder has no class folders, no audio, or no file that decodes.
    """
    _check_setting(setting)
    if max_per_class is not None and max_per_class < 1:
        raise ValueError(f"max_per_class must be >= 1 or None; got {max_per_class}")
    troot = find_training_root(root)
    files = list_training_files(troot)
    folders = non_class_folders(troot)
    _warn_folders(folders, troot)
    if max_per_class is not None:
        files = [f for k in range(len(CLASSES)) for f in [f for f in files if f[1] == k][:max_per_class]]
    rel = [str(p.relative_to(troot)) for p, _ in files]
    key = _cache_key("train", troot, files, setting)
    cache = check_cache_dir(cache_dir) / f"irmas-train-{setting}-{key[:16]}.npz" if cache_dir is not None else None
    if cache is not None and (z := load_cache(cache, key)) is not None:
        skipped = list(zip(z["skipped_paths"].tolist(), z["skipped_reasons"].tolist()))
        _check_decoded(len(z["y"]), skipped, troot, LAYOUT)
        _warn_skipped(skipped, len(files))
        _warn_silent(z["x"], z["paths"].tolist())
        return IrmasFeatures(z["x"], z["y"], CLASSES, skipped, z["paths"].tolist(), setting, folders)

    results = extract_features([(p, 0) for p, _ in files], setting, workers=workers, progress=progress,
                       desc=f"IRMAS features ({setting})")
    xs, ys, paths, skipped = [], [], [], []
    for (p, k), r, (feat, err) in zip(files, rel, results):
        if feat is None:
            skipped.append((r, err))
        else:
            xs.append(feat)
            ys.append(k)
            paths.append(r)
    _check_decoded(len(xs), skipped, troot, LAYOUT)
    x = np.stack(xs).astype(np.float32)
    y = np.asarray(ys, np.int32)
    if cache is not None:
        save_cache(cache, key=np.array(key), x=x, y=y, paths=np.array(paths, dtype=str),
                    skipped_paths=np.array([s[0] for s in skipped], dtype=str),
                    skipped_reasons=np.array([s[1] for s in skipped], dtype=str))
    _warn_skipped(skipped, len(files))
    _warn_silent(x, paths)
    return IrmasFeatures(x, y, CLASSES, skipped, paths, setting, folders)


# --- Test set: variable-length excerpts, multi-label, evaluated on 3-second windows --------------

@dataclasses.dataclass
class IrmasTestFeatures:
    """Windows of the IRMAS test set.

    x: (W, T, F) float32 windows; clip: (W,) int index of each window's clip; labels: (C, 11)
    bool multi-hot per clip; paths: the C clips; skipped: [(path, reason)]; lengths: (W,) int,
    the frames of each window that hold real audio (T but for a clip's zero-padded last window:
    the ``seq_lengths`` of a padded batch, :func:`window_frames`).
    """

    x: np.ndarray
    clip: np.ndarray
    labels: np.ndarray
    classes: tuple
    skipped: list
    paths: list
    setting: str
    lengths: np.ndarray | None = None


def window_frames(valid_samples, setting: str, T: int):
    """Frames of a window whose first ``valid_samples`` samples are audio (the rest zero padding):
    librosa's centred framing gives 1 + valid // hop_length frames, at most T."""
    hop = _check_setting(setting)[2]
    return np.minimum(1 + np.asarray(valid_samples, np.int64) // hop, T).astype(np.int32)


def _num_samples(path) -> int:
    import soundfile as sf
    info = sf.info(str(path))
    return int(round(info.frames * SAMPLE_RATE / info.samplerate))


def load_test_features(root, setting: str = "m", cache_dir=None, *, hop_seconds: float = 3.0,
                       workers: int | None = None, progress: bool = True) -> IrmasTestFeatures:
    """Features of 3-second windows of every test clip under ``root`` (searched recursively).

    Windows start every ``hop_seconds`` (3.0: non-overlapping); a final partial window is kept
    (zero-padded) when it is at least half a window long, and every clip gets at least one.
    Raises UsageError when no clip under ``root`` can be used.
    """
    _check_setting(setting)
    if not hop_seconds > 0:
        raise ValueError(f"hop_seconds must be > 0; got {hop_seconds}")
    root = Path(root)
    pairs = list_test_files(root)
    key = _cache_key("test", root, [(p, 0) for p, _ in pairs] + [(t, 1) for _, t in pairs], setting,
                     extra=(hop_seconds,))  # audio and label files
    cache = check_cache_dir(cache_dir) / f"irmas-test-{setting}-{key[:16]}.npz" if cache_dir is not None else None
    if cache is not None and (z := load_cache(cache, key)) is not None and "lengths" in z:
        skipped = list(zip(z["skipped_paths"].tolist(), z["skipped_reasons"].tolist()))
        _check_decoded(len(z["paths"]), skipped, root, TEST_LAYOUT)
        _warn_skipped(skipped, len(pairs))
        _warn_silent(_clip_maxima(z["x"], z["clip"], len(z["paths"])), z["paths"].tolist(), "test clips")
        return IrmasTestFeatures(z["x"], z["clip"], z["labels"], CLASSES, skipped, z["paths"].tolist(), setting,
                                 z["lengths"])

    hop = int(round(hop_seconds * SAMPLE_RATE))
    jobs, owner, valid, labels, paths, skipped = [], [], [], [], [], []
    for audio, txt in pairs:
        r = str(audio.relative_to(root))
        try:
            lab = read_test_labels(txt)
            n = _num_samples(audio)
        except Exception as e:
            skipped.append((r, f"{type(e).__name__}: {e}"))
            continue
        starts = [s for s in range(0, max(n, 1), hop) if s == 0 or n - s >= CLIP_SAMPLES // 2]
        owner.extend([len(paths)] * len(starts))
        valid.extend(max(1, min(CLIP_SAMPLES, n - s)) for s in starts)
        jobs.extend((audio, s) for s in starts)
        labels.append(lab)
        paths.append(r)
    results = extract_features(jobs, setting, workers=workers, progress=progress,
                               desc=f"IRMAS test windows ({setting})")
    bad = {owner[i]: err for i, (f, err) in enumerate(results) if f is None}
    keep = [c for c in range(len(paths)) if c not in bad]
    skipped.extend((paths[c], bad[c]) for c in sorted(bad))
    _check_decoded(len(keep), skipped, root, TEST_LAYOUT)
    renum = {c: i for i, c in enumerate(keep)}
    xs = [f for (f, _), c in zip(results, owner) if c in renum]
    clip = np.array([renum[c] for c in owner if c in renum], np.int32)
    x = np.stack(xs).astype(np.float32)
    lengths = window_frames([v for v, c in zip(valid, owner) if c in renum], setting, x.shape[1])
    lab = np.array([labels[c] for c in keep], bool).reshape(len(keep), len(CLASSES))
    paths = [paths[c] for c in keep]
    if cache is not None:
        save_cache(cache, key=np.array(key), x=x, clip=clip, labels=lab, lengths=lengths,
                    paths=np.array(paths, dtype=str),
                    skipped_paths=np.array([s[0] for s in skipped], dtype=str),
                    skipped_reasons=np.array([s[1] for s in skipped], dtype=str))
    _warn_skipped(skipped, len(pairs))
    _warn_silent(_clip_maxima(x, clip, len(paths)), paths, "test clips")
    return IrmasTestFeatures(x, clip, lab, CLASSES, skipped, paths, setting, lengths)


def _clip_maxima(x, clip, num_clips):
    """(C,) the largest |feature| over each clip's windows: 0 for a clip that is silent throughout."""
    out = np.zeros(num_clips, np.float32)
    np.maximum.at(out, clip, np.abs(x).max(axis=(1, 2)))
    return out


def clip_predictions(window_probs, clip, num_clips: int, threshold: float = 0.5) -> np.ndarray:
    """Multi-label predictions per clip from window class probabilities.

    window_probs: (W, 11) softmax outputs; clip: (W,) clip index of each window. A clip's
    scores are the mean over its windows divided by their maximum; classes with a normalised
    score >= ``threshold`` are predicted (so at least one class always is). Returns (C, 11) bool.
    """
    p = np.asarray(window_probs, np.float64)
    clip = np.asarray(clip)
    if p.ndim != 2 or len(p) != len(clip):
        raise ValueError(f"window_probs must be (W, classes) with W = len(clip) = {len(clip)}; got {p.shape}")
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1]; got {threshold}")
    sums = np.zeros((num_clips, p.shape[1]))
    np.add.at(sums, clip, p)
    counts = np.bincount(clip, minlength=num_clips)
    if np.any(counts == 0):
        raise ValueError(f"every clip needs at least one window; clips without: {np.flatnonzero(counts == 0)[:5]}")
    mean = sums / counts[:, None]
    return mean / mean.max(1, keepdims=True) >= threshold


def multilabel_f1(y_true, y_pred, classes=CLASSES) -> dict:
    """Per-class precision/recall/F1 and micro/macro F1 of (C, K) bool arrays.

    Micro pools true/false positives/negatives over classes; macro averages the per-class F1
    over classes that occur in y_true or y_pred (an absent, never-predicted class is skipped).
    """
    t = np.asarray(y_true, bool)
    p = np.asarray(y_pred, bool)
    if t.shape != p.shape or t.ndim != 2 or t.shape[1] != len(classes):
        raise ValueError(f"y_true and y_pred must both be (clips, {len(classes)}); got {t.shape} and {p.shape}")
    tp = (t & p).sum(0)
    fp = (~t & p).sum(0)
    fn = (t & ~p).sum(0)

    def f1(tp, fp, fn):
        d = 2 * tp + fp + fn
        return float(2 * tp / d) if d else 0.0

    per_class = {c: {"precision": float(tp[k] / (tp[k] + fp[k])) if tp[k] + fp[k] else 0.0,
                     "recall": float(tp[k] / (tp[k] + fn[k])) if tp[k] + fn[k] else 0.0,
                     "f1": f1(tp[k], fp[k], fn[k]), "support": int(t[:, k].sum())}
                 for k, c in enumerate(classes)}
    present = [k for k in range(len(classes)) if tp[k] + fp[k] + fn[k] > 0]
    return {"per_class": per_class,
            "micro_f1": f1(tp.sum(), fp.sum(), fn.sum()),
            "macro_f1": float(np.mean([per_class[classes[k]]["f1"] for k in present])) if present else 0.0,
            "micro_precision": float(tp.sum() / (tp.sum() + fp.sum())) if tp.sum() + fp.sum() else 0.0,
            "micro_recall": float(tp.sum() / (tp.sum() + fn.sum())) if tp.sum() + fn.sum() else 0.0}
