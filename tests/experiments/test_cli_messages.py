"""The command line's messages (issue 55, item 8): the hint for a flag written without ``--config.``,
``bppsa`` and ``bppsa reproduce`` alone (argparse's convention: usage and an error on stderr, exit code
2; ``--help``: usage on stdout, exit code 0), ``CONFIG.py:`` with no preset after the colon, and no
summary reports a comparison with a method that did not run."""

import json
from pathlib import Path

import pytest

from experiments import cli, runner

CONFIGS = cli.config_paths()  # {name: experiments/<paper>/configs/name.py}
RNN_TRAIN = CONFIGS["rnn_train"]


pytestmark = pytest.mark.usefixtures("float32_as_in_bppsa_run")  # float64 off, as `bppsa run` runs


@pytest.mark.parametrize("flag, meant", [("--steps=3", "--config.steps=3"),
                                         ("--learning-rate=1e-5", "--config.learning_rate=1e-5"),
                                         ("--steps", "--config.steps=...")])
def test_a_flag_without_config_gets_the_override_it_meant(one_error_line, tmp_path, capsys, flag, meant):
    assert cli.main(["run", f"{RNN_TRAIN}:smoke", flag, "--workdir", str(tmp_path / "w")]) == 2
    line = one_error_line(no_output=True)
    assert f"(did you mean {meant}?)" in line, line
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("argv", [[], ["reproduce"]], ids=["bppsa", "bppsa reproduce"])
def test_a_missing_command_or_name_is_an_error_on_stderr(capsys, argv):
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "usage: bppsa" in captured.err and "error:" in captured.err, captured.err
    assert cli.main([*argv, "--help"]) == 0  # asked for: the usage on stdout
    captured = capsys.readouterr()
    assert "usage: bppsa" in captured.out and captured.err == ""


@pytest.mark.parametrize("name", ["rnn_train", "irmas_grid", "hetero_dp"])
def test_an_empty_preset_after_the_colon_is_refused_naming_the_presets(one_error_line, tmp_path, capsys, name):
    path = CONFIGS[name]
    assert cli.main(["run", f"{path}:", "--workdir", str(tmp_path / "w")]) == 2
    line = one_error_line(no_output=True)
    assert "no preset after ':'" in line and "smoke" in line and "quick" in line, line
    assert not (tmp_path / "w").exists()


def test_rnn_train_with_one_method_reports_no_comparison(tmp_path):
    w = tmp_path / "w"
    summary = runner.run(RNN_TRAIN, "smoke", {"methods": "bptt", "steps": "2", "timing.lengths": "()"}, workdir=w)
    assert "max_loss_diff" not in summary and "diverge_step" not in summary
    assert "bptt_train_loss" in summary
    record = json.loads((w / "rnn_train.json").read_text())
    assert record["max_loss_diff"] is None and record["diverge_step"] is None
    text = (w / "rnn_train.md").read_text()
    assert "One method (BPTT): nothing to compare" in text and "agree" not in text, text


def test_zipline_without_an_exact_method_reports_no_optimal_range(tmp_path):
    from experiments.paper_sync.zipline import zipline_runtimes
    config = runner.load_config(CONFIGS["zipline"], "smoke")
    runner.apply_overrides(config, {"methods": "grid_scan", "workers": "10", "repeats": "1"})
    zipline_runtimes(config, Path(tmp_path))
    record = json.loads((tmp_path / f"{config.name}.json").read_text())
    assert [r["optimal_range"] for r in record["rows"]] == [None]
    assert (tmp_path / f"{config.name}.md").read_text().rstrip().endswith("| — |")


def test_newton_training_compares_with_the_sequential_forward_only_where_it_ran():
    from experiments.extensions.newton_training import markdown, summaries
    records = [{"loss": 1.0, "accuracy": 0.5, "step_s": 0.1}, {"loss": 0.5, "accuracy": 0.5, "step_s": 0.1}]
    shifted = [dict(r, loss=r["loss"] + 0.25) for r in records]
    runs = summaries({"newton": {"records": shifted}, "sequential": {"records": records}})
    assert runs["newton"]["summary"]["max_abs_loss_diff_vs_sequential"] == 0.25  # sequential ran after it
    alone = summaries({"newton": {"records": shifted}})
    assert "max_abs_loss_diff_vs_sequential" not in alone["newton"]["summary"]
    record = {"title": "t", "name": "n", "config": {"hidden": 4, "steps": 2, "learning_rate": 0.1, "batch": 2},
              "data": {"kind": "synthetic", "setting": "s", "clips": 2, "T": 3, "F": 2}, "runs": {"gru": alone},
              "wall_s": 1.0, "provenance": {"command": "c", "date": "d", "backend": "cpu", "cpu": "x",
                                            "cpu_count": 2, "jax": "0", "git_commit": "0"}}
    row = next(line for line in markdown(record).splitlines() if line.startswith("| gru"))
    assert row.split("|")[5].strip() == "—", row


def test_flax_rnn_with_one_layer_reports_no_loss_difference():
    from experiments.extensions.flax_rnn import loss_gap
    assert loss_gap({"nnx.RNN": [1.0, 0.5]}, "nnx.RNN") is None
    assert loss_gap({"nnx.RNN": [1.0, 0.5], "auto": [1.0, 0.75]}, "nnx.RNN") == 0.25
