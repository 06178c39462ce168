"""IRMAS's folder layout: class names, finding the training folder, listing its files and labels.

Training set ``IRMAS-TrainingData/<class>/*.wav`` (11 class folders, ``CLASSES``); test set
``IRMAS-TestingData-Part{1,2,3}/…/<name>.wav`` with a ``<name>.txt`` of instrument codes beside
each excerpt. Re-exported by :mod:`experiments.data.irmas`, which reads and featurises the files.

A folder that is not usable as IRMAS (missing, empty, no class folders, no audio) raises
:class:`bppsa.errors.UsageError` with one line naming the folder and the layout expected.
Audio in folders that are not class folders (``Violin/``, ``xyz/``) is not used:
:func:`non_class_folders` counts it so that the loader can say so.
"""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np

from bppsa.errors import UsageError

__all__ = ["CLASSES", "TRAIN_DIR", "AUDIO_EXTENSIONS", "LAYOUT", "TEST_LAYOUT", "is_audio", "find_training_root",
           "list_training_files", "non_class_folders", "read_test_labels", "list_test_files"]

CLASSES = ("cel", "cla", "flu", "gac", "gel", "org", "pia", "sax", "tru", "vio", "voi")
TRAIN_DIR = "IRMAS-TrainingData"
AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".aif", ".aiff", ".mp3")
LAYOUT = (f"the IRMAS layout: {TRAIN_DIR}/<class>/*.wav (or its parent folder), <class> one of "
          f"{', '.join(CLASSES)}")
TEST_LAYOUT = "IRMAS-TestingData-Part*/…/<name>.wav excerpts, each with a <name>.txt of instrument codes beside it"


def is_audio(p: Path) -> bool:
    """A visible file with an audio extension (``AUDIO_EXTENSIONS``, any case)."""
    return p.is_file() and not p.name.startswith(".") and p.suffix.lower() in AUDIO_EXTENSIONS


def find_training_root(root) -> Path:
    """``root`` itself if it holds class folders, else ``root/IRMAS-TrainingData``; UsageError otherwise."""
    root = Path(root)
    if not root.is_dir():
        raise UsageError(f"IRMAS data folder {str(root)!r} does not exist or is not a folder; expected {LAYOUT}")
    if any((root / c).is_dir() for c in CLASSES):
        return root
    if (root / TRAIN_DIR).is_dir():
        return root / TRAIN_DIR
    others = sorted(p.name for p in root.iterdir() if not p.name.startswith("."))
    found = (f"it holds {', '.join(others[:5])}{', …' if len(others) > 5 else ''}" if others else "it is empty")
    raise UsageError(f"IRMAS data folder {str(root)!r} has neither class folders nor a {TRAIN_DIR} folder "
                     f"({found}); expected {LAYOUT}")


def list_training_files(root) -> list[tuple[Path, int]]:
    """[(path, class index)] of every audio file under ``<root>/<class>/``, sorted by path."""
    root = find_training_root(root)
    files = []
    for k, c in enumerate(CLASSES):
        d = root / c
        if d.is_dir():
            files.extend((p, k) for p in sorted(d.iterdir()) if is_audio(p))
    if not files:
        raise UsageError(f"no audio files ({', '.join(AUDIO_EXTENSIONS)}) in the class folders of {str(root)!r}; "
                         f"expected {LAYOUT}")
    return files


def _visible_audio(folder: Path, ancestors: frozenset = frozenset()):
    """Audio files under ``folder``, symbolic links to folders followed (a link back to a folder
    above it is not: no cycles); hidden files and folders, and unreadable folders, left out."""
    real = folder.resolve()
    if real in ancestors:
        return
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return
    for p in entries:
        if p.name.startswith("."):
            continue
        if p.is_dir():
            yield from _visible_audio(p, ancestors | {real})
        elif is_audio(p):
            yield p


def non_class_folders(root) -> dict[str, int]:
    """{folder: number of audio files} for audio under the training root that is not directly in a
    class folder: ``Violin/``, ``xyz/``, ``cel/extra/``, or the root itself (``"."``); sorted.
    A folder that is a symbolic link counts like a real one; hidden files and folders are left out."""
    root = find_training_root(root)
    counts = collections.Counter()
    for p in _visible_audio(root):
        rel = p.relative_to(root)
        if len(rel.parts) == 2 and rel.parts[0] in CLASSES:
            continue
        counts[rel.parent.as_posix()] += 1
    return dict(sorted(counts.items()))


def read_test_labels(path) -> np.ndarray:
    """The (11,) bool multi-hot of a test ``.txt`` (instrument codes separated by whitespace)."""
    tokens = Path(path).read_text().split()
    unknown = [t for t in tokens if t not in CLASSES]
    if unknown or not tokens:
        raise ValueError(f"{path}: expected instrument codes from {list(CLASSES)}; got {tokens!r}")
    return np.isin(np.array(CLASSES), tokens)


def list_test_files(root) -> list[tuple[Path, Path]]:
    """[(audio, label .txt)] for every audio file under ``root`` (recursively) with a .txt beside it."""
    root = Path(root)
    if not root.is_dir():
        raise UsageError(f"IRMAS test folder {str(root)!r} does not exist or is not a folder; expected {TEST_LAYOUT}")
    pairs = [(p, p.with_suffix(".txt")) for p in sorted(root.rglob("*"))
             if is_audio(p) and p.with_suffix(".txt").is_file()]
    if not pairs:
        raise UsageError(f"no audio files with a .txt label file beside them under {str(root)!r}; expected "
                         f"{TEST_LAYOUT}")
    return pairs
