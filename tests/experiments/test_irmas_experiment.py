"""`bppsa reproduce irmas` (experiments.paper_bppsa.irmas): training on the stand-in, the timing table, the command end to end."""

import json
import re
import shutil

import jax
import numpy as np
import pytest

from bppsa import cells
from experiments import cli
from experiments.paper_bppsa import irmas as ie
from experiments.data import irmas
from experiments.data.synth_irmas import make_synthetic_irmas
from bppsa.errors import UsageError

@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
    return make_synthetic_irmas(tmp_path_factory.mktemp("synth"), clips_per_class=6, seed=0)


@pytest.mark.slow  # the smoke run in tests/experiments/test_configs.py trains the same task in the default run
def test_short_training_run_learns_the_stand_in_above_chance(stand_in, tmp_path):
    cel = sorted((stand_in / "IRMAS-TrainingData" / "cel").iterdir())[0]
    (stand_in / "IRMAS-TrainingData" / "Violin").mkdir()  # not a class folder: reported, not used
    shutil.copy(cel, stand_in / "IRMAS-TrainingData" / "Violin" / "a.wav")
    with pytest.warns(RuntimeWarning, match=r"ignored 1 audio files .*: Violin/ \(1\)"):
        rec = ie.training_comparison(stand_in, setting="s", steps=40, batch_size=16, learning_rate=1e-2,
                                     eval_every=20, seed=0, cache_dir=tmp_path, log=lambda m: None)
    assert rec["skipped"] == {"files": [], "folders": {"Violin": 1}}
    assert rec["config"]["num_train"] == 55 and rec["config"]["num_heldout"] == 11  # one per class held out
    for m in ("bptt", "bppsa"):
        assert len(rec["curves"][m]) == 40
        assert rec["curves"][m][-1]["loss"] < rec["curves"][m][0]["loss"]
        assert rec["heldout"][m]["accuracy"] >= 3 / 11  # chance is 1/11
    # the same start, the same batches: the two backward passes give the same run (float32 rounding)
    assert rec["max_loss_diff"] < 1e-4
    ie.save_training(rec, tmp_path)
    md = (tmp_path / "irmas_train.md").read_text()
    assert "| BPTT |" in md and "| BPPSA |" in md
    assert (tmp_path / "irmas_train.png").stat().st_size > 10_000
    saved = json.loads((tmp_path / "irmas_train.json").read_text())
    assert saved["max_loss_diff"] == rec["max_loss_diff"] and saved["skipped"]["folders"] == {"Violin": 1}


def test_stratified_split_holds_out_every_class():
    y = np.repeat(np.arange(11), 10)
    tr, te = ie.stratified_split(y, 0.2, seed=0)
    assert len(np.intersect1d(tr, te)) == 0 and len(tr) + len(te) == 110
    assert np.all(np.bincount(y[te], minlength=11) == 2)
    assert np.array_equal(ie.stratified_split(y, 0.2, seed=0)[1], te)
    with pytest.raises(ValueError, match="holdout"):
        ie.stratified_split(y, 1.0, seed=0)


def test_grid_table_layout_and_plot(tmp_path):
    def t(ms):
        return {"median": ms / 1e3, "min": ms / 1e3, "max": ms / 1e3, "repeats": 3}

    row = {"setting": "m", "T": 517, "F": 24, "B": 16, "forward": t(8), "jacobian": t(40), "bppsa_backward": t(30),
           "param_grads": t(10), "bppsa_backward_full": t(90), "bptt_backward": t(45), "step_bppsa": t(120),
           "step_bptt": t(60), "speedup_backward": 0.5, "speedup_step": 0.5}
    rec = {"rows": [row, dict(row, B=32, bptt_backward=t(180), speedup_backward=2.0)], "hidden_size": 20,
           "backend": "cpu", "repeats": 3, "timer": "experiments.bench.time_components", "data": {"kind": "synthetic"}}
    lines = ie.grid_markdown(rec).strip().splitlines()
    assert lines[0].startswith("GRU(F, 20), float32 on cpu, times in ms (median of 3 interleaved repeats")
    assert lines[2].startswith("| setting | T | F | B | forward | Jacobian gen. | BPPSA scan | param. grads | "
                               "BPPSA backward | BPTT backward | backward speedup |")
    assert lines[4] == ("| m | 517 | 24 | 16 | 8.00 | 40.00 | 30.00 | 10.00 | 90.00 | 45.00 | **0.50×** | "
                        "120.00 | 60.00 | **0.50×** |")
    assert lines[5].startswith("| m | 517 | 24 | 32 |") and "| 180.00 | **2.00×** |" in lines[5]
    ie.plot_grid(rec, tmp_path / "g.png")
    assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"


def test_batches_are_time_major_and_cycle_when_there_are_too_few_clips():
    x = np.arange(3 * 5 * 2, dtype=np.float32).reshape(3, 5, 2)  # (N, T, F)
    xs = ie.batch_clips(x, 4)
    assert xs.shape == (5, 4, 2)
    np.testing.assert_array_equal(xs[:, 3], x[0])
    np.testing.assert_array_equal(xs[:, 1], x[1])


def test_irmas_timing_times_each_setting_at_its_feature_shape(tmp_path, monkeypatch):
    from experiments import bench, runner
    assert irmas.SHAPES == {"s": (38, 259), "m": (24, 517), "l": (12, 1034)}
    assert all(irmas.SHAPES[s] == (irmas.num_features(s), irmas.num_frames(s)) for s in irmas.SETTINGS)
    seen = []

    def point(cell, T, B, **kw):  # the real bench_point, on a tiny GRU: only the shapes are checked here
        seen.append((type(cell).__name__, cell.input_size, cell.hidden_size, T, B, kw["memory"], kw["baselines"]))
        return bench.bench_point(cells.GRU(2, 3), 4, B, repeats=1, scan_variants=(), memory=False, baselines=False,
                                 log=lambda s: None)

    monkeypatch.setattr(ie, "bench_point", point)
    config = runner.load_config(cli.config_path("irmas_timing"), "smoke")
    config.settings, config.batches = ("m", "l"), (3,)
    summary = ie.shapes_task(config, tmp_path)
    assert [s[:5] for s in seen] == [("GRU", 24, 20, 517, 3), ("GRU", 12, 20, 1034, 3)]
    assert seen[0][5:] == (False, {"unrolls": tuple(config.unrolls)})
    assert set(summary) == {"m/B=3", "l/B=3"}
    md = (tmp_path / "irmas-timing.md").read_text()
    assert bench.TABLE_HEADER in md and "experiments.gradient.loss" in md


def test_the_grid_reports_each_point_as_it_finishes(monkeypatch):
    """`make reproduce` is visible: a line as each setting's features load, one per point with its number
    and the elapsed time, in order (the features and the timings are stand-ins here)."""
    from types import SimpleNamespace
    shapes = {"s": (4, 3), "m": (6, 2)}  # (T, F)
    monkeypatch.setattr(ie.irmas, "load_features", lambda root, setting, *a, **k: SimpleNamespace(
        x=np.zeros((5, *shapes[setting]), np.float32), skipped=[], skipped_folders=[]))
    stat = {"median": 1e-3}
    monkeypatch.setattr(ie, "time_components", lambda *a, **k: {
        k: stat for k in ("bptt_backward", "bppsa_backward_full", "bppsa_backward", "step_bptt", "step_bppsa")})
    lines = []
    rec = ie.timing_grid("unused", settings=("s", "m"), batches=(2, 3), repeats=1, hidden_size=2, log=lines.append)
    assert len(rec["rows"]) == 4
    points = [line for line in lines if re.match(r"\s+\[\d/4, +\d+ s\] ", line)]
    assert [re.match(r"\s+\[(\d)/4", line).group(1) for line in points] == ["1", "2", "3", "4"], lines
    assert [line.split("] ")[1].split()[0] for line in points] == ["s", "s", "m", "m"]
    assert len(lines) == 6 and lines[0].strip().startswith("setting s: MFCC features") and "setting m" in lines[3]


def test_bad_settings_and_missing_data_are_clear_errors(tmp_path):
    from experiments import runner
    cfg = cli.config_path("irmas")
    with pytest.raises(ValueError, match="setting"):
        runner.run(cfg, "smoke", {"settings": "s,xl"}, workdir=tmp_path / "a")
    with pytest.raises(runner.ConfigError, match="batches"):
        runner.run(cfg, "smoke", {"batches": "16,x"}, workdir=tmp_path / "b")
    with pytest.raises(UsageError, match=r"IRMAS data folder '.*missing' does not exist.*expected the IRMAS layout"):
        runner.run(cfg, "smoke", {"data_dir": str(tmp_path / "missing")}, workdir=tmp_path / "c")


@pytest.mark.slow
def test_reproduce_irmas_end_to_end(tmp_path, capsys):
    """The command on a tiny generated stand-in: grid (setting s, B = 4), training, test-set F1, files."""
    rc = cli.main(["reproduce", "irmas", "--quick", f"--config.synth_dir={tmp_path / 'synth'}",
                   f"--config.cache_dir={tmp_path / 'cache'}", "--workdir", str(tmp_path / "out"),
                   "--config.clips_per_class=2", "--config.test_clips=2", "--config.settings=s",
                   "--config.batches=4", "--config.repeats=1", "--config.steps=6", "--config.batch_size=8"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "| s | 259 | 38 | 4 |" in out and "| BPPSA |" in out
    assert re.search(r"\[1/1, +\d+ s\] s  T=  259", out), out  # the grid's progress line
    assert f"the results, in {tmp_path / 'out'}: irmas_grid.json, irmas_grid.md (the table) and irmas_grid.png" in out
    grid = json.loads((tmp_path / "out" / "irmas_grid.json").read_text())
    assert [(r["setting"], r["B"]) for r in grid["rows"]] == [("s", 4)]
    assert grid["provenance"]["jax"] == jax.__version__ and grid["data"]["kind"] == "synthetic"
    train = json.loads((tmp_path / "out" / "irmas_train.json").read_text())
    assert train["test"]["clips"] == 2 and 0 <= train["test"]["bppsa"]["micro_f1"] <= 1
    assert "| s | 259 | 38 | 4 |" in (tmp_path / "out" / "irmas_grid.md").read_text()
    assert "| BPPSA |" in (tmp_path / "out" / "irmas_train.md").read_text()
    for name in ("irmas_grid.png", "irmas_train.png"):
        assert (tmp_path / "out" / name).read_bytes()[:4] == b"\x89PNG"
    assert len(list((tmp_path / "synth" / irmas.TRAIN_DIR).rglob("*.wav"))) == 22


def test_padded_test_windows_are_read_at_their_last_real_frame():
    """predict_probs with lengths (a padded batch through bppsa.nn.RNN's seq_lengths) equals the
    model on each window cut to its real frames; without lengths, the padding frames count."""
    from flax import nnx

    from bppsa import cells, nn
    model = nn.SequenceClassifier(cells.GRU(input_size=6, hidden_size=5), irmas.CLASSES.__len__(),
                                  rngs=nnx.Rngs(0), dtype=np.float64)
    x = np.random.default_rng(0).normal(size=(4, 9, 6))
    lengths = np.array([9, 3, 1, 7])
    x[np.arange(9)[None, :] >= lengths[:, None]] = 0.0  # zero padding after the real frames
    padded = ie.predict_probs(model, x, batch_size=3, lengths=lengths)
    for i, n in enumerate(lengths):
        np.testing.assert_allclose(padded[i], ie.predict_probs(model, x[i:i + 1, :n])[0], rtol=1e-12)
    assert not np.allclose(ie.predict_probs(model, x)[1], padded[1])
