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


def test_where_the_time_goes_is_published_when_measured_and_old_runs_still_publish(tmp_path):
    def detailed(T, plain, bppsa, **extra):
        p = _point("s", 16, 2.0, bptt_fused=2.5)
        p.update(sweep="T", cell="RNN", setting=None, T=T, I=1,
                 backward_ms={"bptt_plain": plain, "bptt": plain / 2, "bppsa_blelloch": bppsa, "bptt_fused": 1.0},
                 forward_ms={"bptt_plain": 0.5, "bppsa_blelloch": 0.25, "bppsa_fused": 0.125},
                 launches={"bptt_plain": {"total": 2 * T + 5, "exact": True},
                           "bppsa_blelloch": {"total": 80, "exact": False}}, **extra)
        p.pop("setting")
        return p

    old = {"provenance": {"date": "a", "device_kind": "NVIDIA H200"}, "points": [_point("s", 16, 2.0)], "skipped": []}
    new = {"provenance": {"date": "b"}, "skipped": [],
           "points": [detailed(30000, 216.0, 2.0), detailed(1000, 9.0, 1.5),
                      {**_parallel("blockgru", 1, 64, 2, 3, **{"newton/bppsa fused": 0.5, "pararnn_torch_fused": 0.25}),
                       "head_size": 1}]}
    md_old = gpu_publish.markdown({"provenance": old["provenance"], **gpu_publish.merge([old])})
    for title in ("The backward alone", "The forward alone", "Kernels launched", "bptt fused", "pararnn"):
        assert title not in md_old, title  # a run without them: no such tables or columns
    md = gpu_publish.markdown({"provenance": old["provenance"], **gpu_publish.merge([old, new])})
    bwd = md.split("## The backward alone")[1].split("##")[0]
    row = next(line for line in bwd.splitlines() if line.startswith("| T | RNN | 30000 |"))
    cols = [c.strip() for c in row.strip("|").split("|")]
    # sweep, cell, T, B, plain, tuned, bptt fused, BPPSA, (no BPPSA fused, no cuDNN), plain/BPPSA, tuned/BPPSA, share
    assert cols[4:] == ["216", "108", "1", "2", "108.00", "54.00", "1.00"]  # the paper's 108x backward metric
    assert "BPPSA fused" not in next(line for line in bwd.splitlines() if line.startswith("| sweep"))  # not measured
    fwd = md.split("## The forward alone")[1].split("##")[0]
    assert "| T | RNN | 1000 | 16 | 0.5 | 0.25 | 0.125 |" in fwd
    assert "cuDNN" not in next(line for line in fwd.splitlines() if line.startswith("| sweep"))
    lau = md.split("## Kernels launched per training step")[1].split("##")[0]
    assert "| T | RNN | 30000 | 16 | 60005 | 80+ |" in lau  # + : a loop without a known trip count
    header = next(line for line in md.splitlines() if line.startswith("| setting / cell"))
    assert header.rstrip(" |").endswith("bptt fused")
    par = md.split("## The parallel forward's training step")[1].split("##")[0]
    prow = next(line for line in par.splitlines() if line.startswith("| BlockGRU k=1"))
    pcols = [c.strip() for c in prow.strip("|").split("|")]
    assert pcols[10:13] == ["0.5", "0.25", "18.00"]  # × = tuned BPTT / the fastest bppsa program, not the peer's
    assert "pararnn-torch fused" in par


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
        bppsa = ms["bppsa_blelloch"]
        best = min(ms["bptt_plain"], ms["bptt_unrolled"], ms["bptt"]) / bppsa
        row = next(line for line in md.splitlines()
                   if line.startswith(f"| {p['setting']} | {p['I']} | {p['T']} | {p['B']} |"))
        cols = [c.strip() for c in row.strip("|").split("|")]
        assert cols[7] == f"{bppsa:.3g}" and cols[9] == f"{ms['cudnn']:.3g}"
        assert cols[10:13] == [f"{ms['bptt_plain'] / bppsa:.2f}", f"{best:.2f}", f"{ms['cudnn'] / bppsa:.2f}"]
    for title in ("T sweep", "B sweep", "IRMAS", "Float32 gradient error", "parallel forward", "16 CPU cores",
                  "auto's choices", "roofline"):
        assert title in md, title
    choices = md.split("## auto's choices")[1].split("##")[0]
    assert choices.count("| gpu |") == 18 and choices.count("| parallel |") == 6


def _parallel(kind, head, T, B, predicted, **ms):
    from experiments.extensions import parallel_step
    return {"part": "parallel", "sweep": "T", "cell": parallel_step.cell_label(kind, head), "head_size": head,
            "T": T, "B": B, "I": 1, "H": 20, "newton": {"newton/bppsa": {"predicted": predicted}},
            "ms": {"sequential/bptt": 9.0, "sequential/bppsa": 2.0, "newton/bppsa": 1.0, "quasi/bppsa": 3.0, **ms}}


def test_parallel_skips_match_their_points_by_kind_and_structured_cells_are_rebuilt():
    first = {"points": [], "skipped": [
        {"part": "parallel", "sweep": "T", "cell": "blockgru", "head_size": 16, "T": 64, "B": 2, "reason": "time budget"},
        {"part": "parallel", "sweep": "T", "cell": "rnn", "head_size": 1, "T": 99, "B": 2, "reason": "time budget"}]}
    second = {"points": [_parallel("blockgru", 16, 64, 2, 3)], "skipped": first["skipped"][1:]}
    got = gpu_publish.merge([first, second])
    assert [(s["cell"], s["T"]) for s in got["skipped"]] == [("rnn", 99)]  # measured later; no duplicate
    cell = gpu_publish.cell_of({**got["points"][0], "I": 8, "H": 32})
    assert type(cell).__name__ == "BlockGRU" and cell.head_size == 16


def test_a_foreseen_newton_beyond_its_gate_is_listed_as_the_sequential_forward():
    from bppsa.plan import cost
    from experiments.extensions import parallel_step
    T, B = 100_000, 16
    _, gate = cost.choose_forward(parallel_step.make_cell("rnn", 1, 20, 1), T, B, backend="gpu")
    assert gate is not None and gate > 2  # a long RNN: the model lets Newton run
    for predicted, pick in ((int(gate) + 1, "sequential/bppsa"), (2, "newton/bppsa")):
        row = next(line for line in gpu_publish.choices([_parallel("rnn", 1, T, B, predicted)]).splitlines()
                   if line.startswith("| parallel"))
        cols = [c.strip() for c in row.strip("|").split("|")]
        assert cols[5:7] == [pick, "newton/bppsa"] and cols[7] == f"{2.0 if pick.startswith('seq') else 1.0:.2f}"


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
    p = got["points"][0]
    base = {"bptt_plain", "bptt_unrolled", "bptt", "bppsa_blelloch", "bppsa_sequential", "bppsa_fused"}
    assert base <= set(p["ms"]) <= base | {"bptt_fused"}  # the fused kernels, interpreted on the CPU
    assert "bptt_fused" in p["ms"] or "bptt_fused" in p["errors"]  # a fused variant not there yet: its reason
    assert "backward_ms" not in p  # the dry plan asks IRMAS for no detail
