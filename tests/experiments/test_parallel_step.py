"""The parallel-step experiment's ``on_fail="raise"`` probe: run in a subprocess as a user would, it
must reach bppsa's error (it once failed on an import and the result said only "raised None")."""

import json
from pathlib import Path

import ml_collections

from experiments.extensions import parallel_step

RESULTS = Path(__file__).resolve().parents[2] / "experiments" / "results" / "cpu"


def test_the_raise_probe_reports_newtons_error_and_the_markdown_names_it():
    c = ml_collections.ConfigDict()
    c.iter_I, c.iter_H, c.iter_B, c.seed, c.iter_scan, c.chaotic_rho = 3, 4, 1, 0, "sequential", 3.0
    got = parallel_step.raise_probe(c, 30, max_iter=2)
    assert "error" not in got, got.get("error")
    assert got["T"] == 30 and got["raised"] and got["names_NewtonDidNotConverge"], got
    record = json.loads((RESULTS / "parallel-step-predictability.json").read_text())
    record["chaotic"]["on_fail_raise"] = got
    md = parallel_step.markdown(record)
    assert f'`on_fail="raise"` at T = 30: raised {got["raised"]} — ' in md
    assert "NewtonDidNotConverge" in got["message"], got["message"]
