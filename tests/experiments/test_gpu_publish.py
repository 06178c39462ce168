"""Publishing device-machine runs (experiments.paper_bppsa.gpu_publish): runs merged point by point (the
later run wins, a point skipped in one run and measured in another is not listed as skipped), the
committed H200 record rendered into its tables, a file that is not a run's summary refused; and
``gpu_run --part gpu/<sweep>`` runs that sweep alone."""

import json
from pathlib import Path

import pytest

from experiments.paper_bppsa import gpu_publish, gpu_run

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "experiments" / "results" / "gpu" / "h200.json"


def _point(setting, B, bppsa, **ms):
    return {"part": "gpu", "sweep": "irmas", "setting": setting, "cell": "GRU", "T": 259, "B": B, "H": 20, "I": 38,
            "best_unroll": 4, "ms": {"bptt_plain": 8.0, "bptt_unrolled": 4.0, "bptt": 3.0, "bppsa_blelloch": bppsa,
                                     "bppsa_sequential": 5.0, **ms}}


def test_later_runs_win_and_measured_points_are_not_skipped():
    first = {"provenance": {"date": "a"}, "points": [_point("s", 16, 2.0)],
             "skipped": [{"part": "gpu", "sweep": "irmas", "setting": "s", "B": 32, "reason": "time budget"},
                         {"part": "gpu", "sweep": "irmas", "setting": "m", "B": 16, "reason": "time budget"}]}
    second = {"provenance": {"date": "b"}, "points": [_point("s", 16, 1.5), _point("s", 32, 1.0)], "skipped": []}
    got = gpu_publish.merge([first, second])
    assert [(p["setting"], p["B"], p["ms"]["bppsa_blelloch"]) for p in got["points"]] == [("s", 16, 1.5), ("s", 32, 1.0)]
    assert [(s["setting"], s["B"]) for s in got["skipped"]] == [("m", 16)]
    assert [r["date"] for r in got["runs"]] == ["a", "b"]
    assert gpu_publish.merge([second, first])["points"][0]["ms"]["bppsa_blelloch"] == 2.0  # the later run's


def test_the_committed_h200_record_renders_its_tables():
    record = json.loads(H200.read_text())
    assert record["provenance"]["device_kind"] == "NVIDIA H200" and len(record["runs"]) == 2
    md = gpu_publish.markdown(record)
    irmas = [p for p in record["points"] if p["part"] == "gpu" and p.get("sweep") == "irmas"]
    assert len(irmas) == 9
    for p in irmas:  # each IRMAS row: its times and best BPTT / BPPSA, as the table prints them
        ms = p["ms"]
        best = min(ms[k] for k in gpu_publish.BASELINES) / ms["bppsa_blelloch"]
        row = next(line for line in md.splitlines()
                   if line.startswith(f"| {p['setting']} | {p['I']} | {p['T']} | {p['B']} |"))
        assert f"| {best:.2f} |" in row and f"| {ms['bppsa_blelloch']:.3g} |" in row
    for title in ("T sweep", "B sweep", "IRMAS", "Float32 gradient error", "parallel forward", "16 CPU cores",
                  "auto's choices", "roofline"):
        assert title in md, title
    choices = md.split("## auto's choices")[1].split("##")[0]
    assert choices.count("| gpu |") == 18 and choices.count("| parallel |") == 6


def test_a_file_that_is_not_a_summary_is_refused(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps([1, 2]))
    with pytest.raises(SystemExit):
        gpu_publish.main([str(bad), "--name", "x", "--results", str(tmp_path)])
    assert "is not a GPU run's summary.json" in capsys.readouterr().err


def test_one_gpu_sweep_alone(tmp_path):
    pl = gpu_run.plan(True)
    s = gpu_run.Summary(tmp_path / "out")
    gpu_run.run_gpu(s, {**pl, "budgets": {**pl["budgets"], "gpu/irmas": 600}}, gpu_run.time.monotonic() + 600,
                    only="gpu/irmas")
    got = s.write()
    assert [(p["sweep"], p["setting"]) for p in got["points"]] == [("irmas", "s")] and got["skipped"] == []
    assert set(got["points"][0]["ms"]) == {"bptt_plain", "bptt_unrolled", "bptt", "bppsa_blelloch", "bppsa_sequential"}
