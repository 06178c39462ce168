"""IRMAS loader, test-set evaluation and the synthetic stand-in, on small generated folders of real files."""

import os
import re

import jax
import jax.numpy as jnp
import librosa
import numpy as np
import pytest
import soundfile as sf

import bppsa
from bppsa import cells
from experiments.data import irmas
from experiments.data.irmas import CLASSES, CLIP_SAMPLES, SAMPLE_RATE
from bppsa.errors import UsageError
from experiments.data.synth_irmas import ensure_synthetic_irmas, make_synthetic_irmas, synthesize_clip
from tests.helpers import normal, one_line_usage_error, random_params
from tests.reference import scan_grads
from tests.tolerance import assert_close

N_VALID = 6  # decodable audio files in the small folder


def _write(path, audio_2xn, sr=SAMPLE_RATE, subtype="FLOAT"):
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), np.asarray(audio_2xn).T, sr, subtype=subtype)


@pytest.fixture(scope="module")
def small_irmas(tmp_path_factory):
    """A parent folder holding IRMAS-TrainingData with every kind of file the loader must handle."""
    parent = tmp_path_factory.mktemp("irmas")
    root = parent / "IRMAS-TrainingData"
    rng = np.random.default_rng(0)
    files = {}
    for i in range(2):  # two ordinary stereo clips
        a = synthesize_clip("cel", np.random.default_rng(i))
        _write(root / "cel" / f"[cel][cla]000{i}__1.wav", a)
        files[f"cel/[cel][cla]000{i}__1.wav"] = ("cel", a)
    mono = synthesize_clip("cla", rng)[0]
    (root / "cla").mkdir()
    sf.write(str(root / "cla" / "[cla][jaz_blu]0001__1.wav"), mono, SAMPLE_RATE, subtype="FLOAT")  # mono file
    files["cla/[cla][jaz_blu]0001__1.wav"] = ("cla", np.stack([mono, mono]))
    t = np.arange(3 * 22050) / 22050
    low = np.stack([0.5 * np.sin(2 * np.pi * 440 * t), 0.3 * np.sin(2 * np.pi * 660 * t)]).astype(np.float32)
    _write(root / "flu" / "[flu][cla]0001__1.wav", low, sr=22050)
    files["flu/[flu][cla]0001__1.wav"] = ("flu", None)  # resampled: checked separately
    short = synthesize_clip("gac", rng, SAMPLE_RATE)  # 1 s: zero-padded
    _write(root / "gac" / "[gac][pop_roc]0001__1.wav", short)
    files["gac/[gac][pop_roc]0001__1.wav"] = ("gac", np.pad(short, ((0, 0), (0, CLIP_SAMPLES - SAMPLE_RATE))))
    long = synthesize_clip("gel", rng, 5 * SAMPLE_RATE)  # 5 s: cropped
    _write(root / "gel" / "[gel][pop_roc]0001__1.wav", long)
    files["gel/[gel][pop_roc]0001__1.wav"] = ("gel", long[:, :CLIP_SAMPLES])
    (root / "org").mkdir()
    (root / "org" / "[org][cla]0001__1.wav").write_bytes(b"RIFF\x00\x01\x00\x00WAVEjunk" + rng.bytes(500))
    (root / "pia").mkdir()
    (root / "pia" / "notes.txt").write_text("not audio\n")
    (root / "pia" / ".DS_Store").write_bytes(b"\x00\x01")
    (root / "README.md").write_text("ignored\n")
    return parent, root, files


@pytest.fixture(scope="module")
def features(small_irmas):
    """{setting: IrmasFeatures} of the small folder (extracted once per module)."""
    _, root, _ = small_irmas
    out = {}
    for s in irmas.SETTINGS:
        with pytest.warns(RuntimeWarning, match=r"skipped 1 of 7 files"):
            out[s] = irmas.load_features(root, s, progress=False)
    return out


@pytest.mark.parametrize("setting,T,F", [("s", 259, 38), ("m", 517, 24), ("l", 1034, 12)])
def test_shapes_and_sizes_of_every_setting(features, setting, T, F):
    f = features[setting]
    assert (irmas.num_frames(setting), irmas.num_features(setting)) == (T, F)
    assert f.x.shape == (N_VALID, T, F) and f.x.dtype == np.float32
    assert f.y.shape == (N_VALID,) and np.issubdtype(f.y.dtype, np.integer)
    assert f.classes == CLASSES == ("cel", "cla", "flu", "gac", "gel", "org", "pia", "sax", "tru", "vio", "voi")
    assert np.all(np.isfinite(f.x))


def test_labels_come_from_class_folders_and_non_audio_is_ignored(features, small_irmas):
    f = features["m"]
    assert [p.split("/")[0] for p in f.paths] == [CLASSES[k] for k in f.y]
    assert list(f.y) == [0, 0, 1, 2, 3, 4]
    assert not any("notes" in p or "DS_Store" in p for p in f.paths + [s[0] for s in f.skipped])


def test_corrupt_file_is_skipped_and_reported(features):
    for f in features.values():
        assert len(f.skipped) == 1
        path, reason = f.skipped[0]
        assert path == "org/[org][cla]0001__1.wav" and reason


def test_each_coefficient_is_standardised_over_time(features):
    for f in features.values():
        np.testing.assert_allclose(f.x.mean(1), 0.0, atol=1e-4)
        np.testing.assert_allclose(f.x.std(1), 1.0, atol=1e-3)


def test_features_are_the_papers_mfcc_per_channel(features, small_irmas):
    """Recompute with librosa directly, channel by channel: 0th dropped, standardised, concatenated."""
    _, root, files = small_irmas
    f = features["s"]
    i = f.paths.index("cel/[cel][cla]0001__1.wav")
    audio = files[f.paths[i]][1]
    n_mfcc, n_fft, hop = irmas.SETTINGS["s"]
    chans = []
    for ch in audio:
        m = librosa.feature.mfcc(y=ch, sr=SAMPLE_RATE, n_mfcc=n_mfcc, n_fft=n_fft, hop_length=hop)[1:]
        chans.append(((m - m.mean(1, keepdims=True)) / m.std(1, keepdims=True)).T)
    np.testing.assert_allclose(f.x[i], np.concatenate(chans, axis=1), atol=2e-4)
    assert not np.allclose(f.x[i][:, :19], f.x[i][:, 19:])  # a stereo clip's channels differ


def test_mono_is_duplicated_to_both_channels(features):
    for s, f in features.items():
        i = f.paths.index("cla/[cla][jaz_blu]0001__1.wav")
        half = f.x.shape[2] // 2  # librosa computes the two channels as two rows: equal to rounding
        assert_close(f.x[i, :, :half], f.x[i, :, half:], err_msg=f"setting {s}")


def test_read_audio_pads_crops_and_resamples(small_irmas):
    _, root, files = small_irmas
    for name, (_, expected) in files.items():
        a = irmas.read_audio(root / name)
        assert a.shape == (2, CLIP_SAMPLES) and a.dtype == np.float32
        if expected is not None:
            np.testing.assert_allclose(a, expected, atol=1e-6)
    short = irmas.read_audio(root / "gac/[gac][pop_roc]0001__1.wav")
    assert np.all(short[:, SAMPLE_RATE:] == 0) and np.any(short[:, :SAMPLE_RATE] != 0)
    # 22.05 kHz -> 44.1 kHz: the tones keep their pitch (440 Hz left, 660 Hz right) and length
    a = irmas.read_audio(root / "flu/[flu][cla]0001__1.wav")
    freqs = np.fft.rfftfreq(CLIP_SAMPLES, 1 / SAMPLE_RATE)
    peaks = [freqs[np.argmax(np.abs(np.fft.rfft(ch)))] for ch in a]
    np.testing.assert_allclose(peaks, [440, 660], atol=1)
    assert np.abs(a[:, -1000:]).max() > 0.1  # 3 s at 22.05 kHz fill 3 s at 44.1 kHz


def test_parent_folder_is_accepted(small_irmas, features):
    parent, _, _ = small_irmas
    with pytest.warns(RuntimeWarning):
        f = irmas.load_features(parent, "m", progress=False, max_per_class=1)
    assert f.paths == ["cel/[cel][cla]0000__1.wav", "cla/[cla][jaz_blu]0001__1.wav", "flu/[flu][cla]0001__1.wav",
                       "gac/[gac][pop_roc]0001__1.wav", "gel/[gel][pop_roc]0001__1.wav"]
    assert_close(f.x, features["m"].x[[0, 2, 3, 4, 5]])


def test_unusable_data_folders_are_one_line_usage_errors(tmp_path):
    load = irmas.load_features
    msg = one_line_usage_error(r"IRMAS data folder '.*nowhere' does not exist", load, tmp_path / "nowhere",
                               says_expected=True)
    assert "IRMAS-TrainingData/<class>/*.wav" in msg and "cel, cla, flu" in msg
    (tmp_path / "empty").mkdir()
    one_line_usage_error(r"'.*empty' has neither class folders nor a IRMAS-TrainingData folder \(it is empty\)",
                         load, tmp_path / "empty", says_expected=True)
    (tmp_path / "other" / "Violin").mkdir(parents=True)
    one_line_usage_error(r"neither class folders .*\(it holds Violin\); expected the IRMAS layout", load,
                         tmp_path / "other", says_expected=True)
    (tmp_path / "other" / "cel").mkdir()
    one_line_usage_error(r"no audio files .* in the class folders of", load, tmp_path / "other", says_expected=True)
    junk = tmp_path / "junk" / "IRMAS-TrainingData"  # only undecodable files: text named .wav
    for c in ("cel", "vio"):
        (junk / c).mkdir(parents=True)
        (junk / c / f"[{c}][cla]0001__1.wav").write_text("not audio\nat all\n")
    for cache in (None, tmp_path / "cache", tmp_path / "cache"):  # with and without a cache, twice
        one_line_usage_error(r"none of the 2 audio files under '.*IRMAS-TrainingData' could be read \(first: "
                             r"cel/\[cel\]\[cla\]0001__1.wav: .*\); expected the IRMAS layout", load, junk.parent,
                             "s", cache, progress=False, says_expected=True)
    one_line_usage_error(r"IRMAS test folder .* does not exist", irmas.load_test_features, tmp_path / "none", says_expected=True)
    test = tmp_path / "test" / "IRMAS-TestingData-Part1"
    test.mkdir(parents=True)
    one_line_usage_error(r"no audio files with a .txt label file", irmas.load_test_features, test.parent, says_expected=True)
    (test / "a.wav").write_text("junk")
    (test / "a.txt").write_text("pia\n")
    one_line_usage_error(r"none of the 1 audio files .* could be read .*<name>.txt of instrument codes",
                         irmas.load_test_features, test.parent, "s", progress=False, says_expected=True)


def test_audio_outside_the_class_folders_is_reported(tmp_path):
    root = tmp_path / "IRMAS-TrainingData"
    clip = synthesize_clip("cel", np.random.default_rng(0), SAMPLE_RATE // 4)
    for rel in ("cel/[cel][cla]0001__1.wav", "Violin/a.wav", "Violin/b.WAV", "xyz/deep/c.flac", "cel/extra/d.wav",
                "top.wav", ".hidden/e.wav"):
        _write(root / rel, clip, subtype="PCM_16")
    (root / "xyz" / "notes.txt").write_text("not audio\n")
    expected = {".": 1, "Violin": 2, "cel/extra": 1, "xyz/deep": 1}
    assert irmas.non_class_folders(tmp_path) == expected
    for _ in range(2):  # extracted, then from the cache: reported both times
        with pytest.warns(RuntimeWarning, match=r"ignored 5 audio files in folders that are not class folders of "
                          r"'.*IRMAS-TrainingData': \./ \(1\), Violin/ \(2\), cel/extra/ \(1\), xyz/deep/ \(1\); "
                          r"expected <class>/"):
            f = irmas.load_features(tmp_path, "s", cache_dir=tmp_path / "cache", progress=False)
        assert f.skipped_folders == expected and f.paths == ["cel/[cel][cla]0001__1.wav"] and f.skipped == []


def test_bad_arguments(small_irmas):
    _, root, _ = small_irmas
    with pytest.raises(ValueError, match=r"setting must be one of .* got 'xl'"):
        irmas.load_features(root, setting="xl")
    with pytest.raises(ValueError, match="max_per_class"):
        irmas.load_features(root, max_per_class=0)
    with pytest.raises(ValueError, match="stereo"):
        irmas.mfcc_features(np.zeros((1, CLIP_SAMPLES)), "m")


def test_cache_hit_is_identical_and_a_changed_file_invalidates_it(tmp_path, monkeypatch):
    root = tmp_path / "IRMAS-TrainingData"
    for k, c in enumerate(("cel", "voi")):
        _write(root / c / f"[{c}][cla]0001__1.wav", synthesize_clip(c, np.random.default_rng(k)), subtype="PCM_16")
    cache = tmp_path / "cache"
    first = irmas.load_features(root, "s", cache_dir=cache, progress=False)
    files = list(cache.glob("*.npz"))
    assert len(files) == 1
    with np.load(files[0], allow_pickle=False) as z:  # plain arrays only: no pickled objects
        assert all(z[k].dtype != object for k in z.files)

    calls = []
    real_extract = irmas.extract_features
    monkeypatch.setattr(irmas, "extract_features", lambda *a, **k: calls.append(1) or real_extract(*a, **k))
    again = irmas.load_features(root, "s", cache_dir=cache, progress=False)
    assert calls == []  # served from the cache: the same bytes back, so compared exactly
    np.testing.assert_array_equal(again.x, first.x)
    np.testing.assert_array_equal(again.y, first.y)
    assert again.paths == first.paths and again.skipped == first.skipped

    changed = root / "voi" / "[voi][cla]0001__1.wav"
    _write(changed, synthesize_clip("voi", np.random.default_rng(99)), subtype="PCM_16")
    st = changed.stat()
    os.utime(changed, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # even on coarse-mtime filesystems
    new = irmas.load_features(root, "s", cache_dir=cache, progress=False)
    assert calls == [1]
    np.testing.assert_array_equal(new.x[0], first.x[0])  # the same extraction of the same file, in one process
    assert not np.allclose(new.x[1], first.x[1])
    other = irmas.load_features(root, "m", cache_dir=cache, progress=False)  # the setting is in the key
    assert calls == [1, 1] and other.x.shape[1] == 517


def test_generator_is_deterministic_and_writes_irmas_layout(tmp_path):
    a = make_synthetic_irmas(tmp_path / "a", clips_per_class=1, seed=3, test_clips=2, test_seconds=(3.5, 7.0))
    b = make_synthetic_irmas(tmp_path / "b", clips_per_class=1, seed=3, test_clips=2, test_seconds=(3.5, 7.0))
    c = make_synthetic_irmas(tmp_path / "c", clips_per_class=1, seed=4)
    wavs = sorted(p.relative_to(a) for p in a.rglob("*.wav"))
    assert wavs == sorted(p.relative_to(b) for p in b.rglob("*.wav"))
    assert all((a / p).read_bytes() == (b / p).read_bytes() for p in wavs)
    train = [p for p in wavs if p.parts[0] == "IRMAS-TrainingData"]
    assert len(train) == 11 and len(wavs) == 13
    differs = 0
    for p in train:
        cls = p.parts[1]
        assert re.fullmatch(rf"\[{cls}\]\[(cla|pop_roc|jaz_blu|cou_fol|lat_sou)\]\d{{4}}__\d\.wav", p.name)
        info = sf.info(str(a / p))
        assert (info.samplerate, info.channels, info.frames, info.subtype) == (44100, 2, CLIP_SAMPLES, "PCM_16")
        audio, _ = sf.read(str(a / p))
        assert 0.1 < np.abs(audio).max() <= 1.0
        other = next((c / p.parent).glob("*.wav"))
        differs += sf.read(str(a / p))[0].shape == sf.read(str(other))[0].shape and \
            (a / p).read_bytes() != other.read_bytes()
    assert differs == 11  # another seed, other clips
    for p in (a / "IRMAS-TestingData-Part1" / "Part1").glob("*.wav"):
        labels = irmas.read_test_labels(p.with_suffix(".txt"))
        assert 1 <= labels.sum() <= 2
        assert 3.5 * SAMPLE_RATE <= sf.info(str(p)).frames <= 7.0 * SAMPLE_RATE
    # ensure_* keeps a complete stand-in with the same parameters, and replaces a different one
    stamp = (a / train[0]).stat().st_mtime_ns
    ensure_synthetic_irmas(a, clips_per_class=1, seed=3, test_clips=2, test_seconds=(3.5, 7.0), log=lambda m: None)
    assert (a / train[0]).stat().st_mtime_ns == stamp
    ensure_synthetic_irmas(a, clips_per_class=2, seed=3, log=lambda m: None)
    assert len(list((a / "IRMAS-TrainingData").rglob("*.wav"))) == 22
    assert not (a / "IRMAS-TestingData-Part1").exists()


def test_test_set_windows_labels_and_f1(tmp_path):
    root = tmp_path / "IRMAS-TestingData-Part1" / "Part1"
    rng = np.random.default_rng(0)
    lengths = {"a": 3.5, "b": 7.6, "c": 2.0}  # -> 1, 3 (0, 3, 6 s; 1.6 s left >= 1.5 s), 1 window
    for name, sec in lengths.items():
        _write(root / f"{name}.wav", synthesize_clip("pia", rng, int(sec * SAMPLE_RATE)), subtype="PCM_16")
    (root / "a.txt").write_text("pia\n")
    (root / "b.txt").write_text("gel \t\nvoi\n")
    (root / "c.txt").write_text("cel\n")
    (root / "d.txt").write_text("org\n")  # a label file without audio: ignored
    _write(root / "e.wav", np.zeros((2, 1000)))  # audio without labels: ignored
    t = irmas.load_test_features(tmp_path, "s", cache_dir=tmp_path / "cache", progress=False)
    assert t.paths == ["IRMAS-TestingData-Part1/Part1/a.wav", "IRMAS-TestingData-Part1/Part1/b.wav",
                       "IRMAS-TestingData-Part1/Part1/c.wav"]
    assert t.x.shape == (5, 259, 38) and list(t.clip) == [0, 1, 1, 1, 2]
    # frames of real audio per window: b's last window holds 1.6 s, c is 2.0 s long (1 + samples // 512)
    assert list(t.lengths) == [259, 259, 259, 1 + int(1.6 * SAMPLE_RATE) // 512, 1 + 2 * SAMPLE_RATE // 512]
    assert [list(np.array(CLASSES)[row]) for row in t.labels] == [["pia"], ["gel", "voi"], ["cel"]]
    b = irmas.read_audio(root / "b.wav", offset=6 * SAMPLE_RATE)
    np.testing.assert_allclose(t.x[3], irmas.mfcc_features(b, "s"), atol=1e-5)
    assert np.all(b[:, int(1.6 * SAMPLE_RATE) + 10:] == 0)
    cached = irmas.load_test_features(tmp_path, "s", cache_dir=tmp_path / "cache", progress=False)
    np.testing.assert_array_equal(cached.x, t.x)  # read back from the cache: exactly
    np.testing.assert_array_equal(cached.labels, t.labels)
    np.testing.assert_array_equal(cached.lengths, t.lengths)
    (root / "a.txt").write_text("piano\n")  # a changed label file invalidates the cache too
    with pytest.warns(RuntimeWarning, match="skipped 1 of 3"):
        t2 = irmas.load_test_features(tmp_path, "s", cache_dir=tmp_path / "cache", progress=False)
    assert len(t2.paths) == 2 and "piano" in t2.skipped[0][1]
    with pytest.raises(UsageError, match="does not exist"):
        irmas.load_test_features(tmp_path / "none")


def test_clip_predictions_and_multilabel_f1_match_sklearn():
    from sklearn.metrics import f1_score

    probs = np.array([[0.7, 0.2, 0.1], [0.5, 0.4, 0.1], [0.1, 0.1, 0.8]])
    pred = irmas.clip_predictions(probs, np.array([0, 0, 1]), 2, threshold=0.5)
    # clip 0: mean (0.6, 0.3, 0.1) / 0.6 = (1, 0.5, 0.17) -> classes 0 and 1; clip 1: class 2 only
    np.testing.assert_array_equal(pred, [[True, True, False], [False, False, True]])
    rng = np.random.default_rng(1)
    K = len(CLASSES)
    y_true = rng.random((40, K)) < 0.2
    y_pred = rng.random((40, K)) < 0.25
    y_true[:, 5] = y_pred[:, 5] = False  # a class that never occurs: left out of the macro average
    r = irmas.multilabel_f1(y_true, y_pred)
    present = [k for k in range(K) if k != 5]
    assert r["micro_f1"] == pytest.approx(f1_score(y_true, y_pred, average="micro"))
    assert r["macro_f1"] == pytest.approx(f1_score(y_true, y_pred, average="macro", labels=present))
    for k, c in enumerate(CLASSES):
        assert r["per_class"][c]["f1"] == pytest.approx(f1_score(y_true[:, k], y_pred[:, k], zero_division=0))
    with pytest.raises(ValueError, match="y_true and y_pred"):
        irmas.multilabel_f1(y_true[:, :3], y_pred[:, :3])
    with pytest.raises(ValueError, match="threshold"):
        irmas.clip_predictions(probs, np.array([0, 0, 1]), 2, threshold=0)


@pytest.mark.parametrize("setting,B", [("s", 3), pytest.param("l", 1, marks=pytest.mark.slow)])
def test_bppsa_and_bptt_gru_gradients_agree_on_real_mfcc_inputs(features, setting, B):
    """float64, against autodiff through a plain lax.scan; T = 259 (odd) and 1034 (not a power of two)."""
    x = features[setting].x[:B].astype(np.float64)
    xs = jnp.asarray(np.swapaxes(x, 0, 1))  # (T, B, F)
    T, _, F = xs.shape
    cell = cells.GRU(F, 20)
    params = random_params(cell, seed=1)
    head = normal(2, (20, 11))
    labels = jnp.arange(B) % 11
    h0 = normal(3, (B, 20), scale=0.1)

    def loss(hs):
        logits = hs[-1] @ head
        return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(B), labels])

    def ours(method):
        return jax.jit(jax.grad(lambda p, xs, h0: loss(bppsa.rnn(cell, p, xs, h0, backward=method)),
                                argnums=(0, 1, 2)))

    ref = jax.jit(lambda p, xs, h0: scan_grads(cell, p, xs, h0, loss))
    g_ref = ref(params, xs, h0)
    for method in ("bppsa", "bptt"):
        g = ours(method)(params, xs, h0)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12), g, g_ref)
    # one step (T = 1) of the same real features
    g1 = ours("bppsa")(params, xs[:1], h0)
    g1_ref = ref(params, xs[:1], h0)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12), g1, g1_ref)


@pytest.mark.slow
def test_parallel_extraction_equals_serial(small_irmas, features):
    _, root, _ = small_irmas
    with pytest.warns(RuntimeWarning, match="skipped 1 of 7"):
        par = irmas.load_features(root, "m", workers=2, progress=False)
    assert_close(par.x, features["m"].x)  # spawned workers: another process, equal to rounding
    assert par.paths == features["m"].paths and par.skipped == features["m"].skipped


def _two_clips(root):
    """A training folder with two short audible clips (cel, voi)."""
    for k, c in enumerate(("cel", "voi")):
        _write(root / c / f"[{c}][cla]0001__1.wav", synthesize_clip(c, np.random.default_rng(k), SAMPLE_RATE // 4),
               subtype="PCM_16")


def test_a_symlinked_folder_that_is_not_a_class_folder_is_reported(tmp_path):
    """A real Violin/ was reported, a symbolic link to one was not (rglob does not follow links)."""
    root = tmp_path / "IRMAS-TrainingData"
    _two_clips(root)
    clip = synthesize_clip("vio", np.random.default_rng(5), SAMPLE_RATE // 4)
    for name in ("a.wav", "b.wav"):
        _write(tmp_path / "elsewhere" / "Violin" / name, clip, subtype="PCM_16")
    (root / "Violin").symlink_to(tmp_path / "elsewhere" / "Violin", target_is_directory=True)
    (root / "cel" / "loop").symlink_to(root, target_is_directory=True)  # a link back up: followed once, no cycle
    assert irmas.non_class_folders(root) == {"Violin": 2}
    with pytest.warns(RuntimeWarning, match=r"ignored 2 audio files in folders that are not class folders of "
                      r"'.*IRMAS-TrainingData': Violin/ \(2\)"):
        f = irmas.load_features(root, "s", progress=False)
    assert f.skipped_folders == {"Violin": 2} and len(f.paths) == 2


def test_empty_and_silent_audio_are_reported(tmp_path):
    """0-frame and silent files used to become all-zero examples without a word; they are kept, with a warning."""
    root = tmp_path / "IRMAS-TrainingData"
    _two_clips(root)
    _write(root / "cla" / "empty.wav", np.zeros((2, 0), np.float32), subtype="PCM_16")
    _write(root / "flu" / "silent.wav", np.zeros((2, SAMPLE_RATE // 4), np.float32), subtype="PCM_16")
    for _ in range(2):  # extracted, then from the cache: reported both times
        with pytest.warns(RuntimeWarning, match=r"2 of 4 files are empty or silent \(all-zero audio, so all-zero "
                          r"features\): cla/empty.wav, flu/silent.wav; expected audible clips"):
            f = irmas.load_features(root, "s", cache_dir=tmp_path / "cache", progress=False)
        assert len(f.paths) == 4 and not f.x[1].any() and not f.x[2].any() and f.x[0].any()
    test = tmp_path / "IRMAS-TestingData-Part1"
    _write(test / "loud.wav", synthesize_clip("pia", np.random.default_rng(0), SAMPLE_RATE), subtype="PCM_16")
    _write(test / "quiet.wav", np.zeros((2, 4 * SAMPLE_RATE), np.float32), subtype="PCM_16")
    for name in ("loud", "quiet"):
        (test / f"{name}.txt").write_text("pia\n")
    with pytest.warns(RuntimeWarning, match=r"1 of 2 test clips are empty or silent .*: IRMAS-TestingData-Part1/quiet"):
        irmas.load_test_features(tmp_path, "s", progress=False)


@pytest.mark.parametrize("how", ["truncated", "garbage", "empty", "no-key"])
def test_a_corrupt_cache_is_set_aside_and_recomputed(tmp_path, how):
    """A truncated cache file used to fail every later run with a 45-line traceback until deleted by hand."""
    import warnings
    root = tmp_path / "IRMAS-TrainingData"
    _two_clips(root)
    cache = tmp_path / "cache"
    first = irmas.load_features(root, "s", cache_dir=cache, progress=False)
    (path,) = cache.glob("*.npz")
    data = path.read_bytes()
    if how == "no-key":
        np.savez(tmp_path / "other.npz", x=first.x)
        bad = (tmp_path / "other.npz").read_bytes()
    else:
        bad = {"truncated": data[: len(data) // 2], "garbage": b"PK\x03\x04" + b"\x00" * 200, "empty": b""}[how]
    path.write_bytes(bad)
    with pytest.warns(RuntimeWarning, match=rf"cache file '.*{re.escape(path.name)}' cannot be read \(.*\); moved "
                      rf"it to '{re.escape(path.name)}.corrupt' and recomputing"):
        again = irmas.load_features(root, "s", cache_dir=cache, progress=False)
    np.testing.assert_array_equal(again.x, first.x)
    assert again.paths == first.paths
    assert (cache / f"{path.name}.corrupt").read_bytes() == bad  # kept for a look, never deleted
    path.write_bytes(bad)  # corrupt again: a second copy is set aside beside the first
    with pytest.warns(RuntimeWarning, match=r"\.corrupt1' and recomputing"):
        irmas.load_features(root, "s", cache_dir=cache, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rewritten cache is read back without a word
        third = irmas.load_features(root, "s", cache_dir=cache, progress=False)
    np.testing.assert_array_equal(third.x, first.x)


def test_a_cache_dir_that_is_a_file_is_a_one_line_error(tmp_path, capsys):
    from experiments import cli
    root = tmp_path / "IRMAS-TrainingData"
    _two_clips(root)
    blocker = tmp_path / "cachefile"
    blocker.write_text("mine\n")
    one_line_usage_error(r"cache_dir '.*cachefile' is a file; expected a folder for the feature cache",
                         irmas.load_features, root, "s", blocker, progress=False, says_expected=True)
    one_line_usage_error(r"cache_dir '.*cachefile/sub' is inside '.*cachefile', which is a file; expected",
                         irmas.load_features, root, "s", blocker / "sub", progress=False, says_expected=True)
    assert blocker.read_text() == "mine\n"
    argv = ["reproduce", "irmas", "--smoke", f"--config.cache_dir={blocker}", "--workdir", str(tmp_path / "w")]
    assert cli.main(argv) == 2  # refused by the task's check, before anything is written
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and "config.cache_dir" in err and "is a file" in err, err
    assert not (tmp_path / "w").exists()
