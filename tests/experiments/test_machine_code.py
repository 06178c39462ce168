"""The machine-code check (experiments/gpu/machine_code*.py): its parsers of ptxas's, cuobjdump's
and the SASS's text, the table and its verdict, and the dump side's enumeration of the kernels. The
compile side itself needs the triton environment (``make machine-code``), not these tests."""

from __future__ import annotations

import pytest

from experiments.gpu import machine_code as mc
from experiments.gpu import machine_code_compile as cc

pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated:DeprecationWarning")

# captured from triton 3.6.0's ptxas 12.8 (-arch=sm_90a -v) and cuobjdump on bppsa's kernels
PTXAS_CLEAN = """ptxas info    : 11 bytes gmem
ptxas info    : Compiling entry function '_kernel' for 'sm_90a'
ptxas info    : Function properties for _kernel
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 126 registers, used 1 barriers
ptxas info    : Compile time = 118.829 ms
"""
PTXAS_SPILL = """ptxas info    : Compiling entry function '_kernel' for 'sm_90a'
ptxas info    : Function properties for _kernel
    12168 bytes stack frame, 12168 bytes spill stores, 15316 bytes spill loads
ptxas info    : Used 32 registers, used 1 barriers, 12168 bytes cumulative stack size
"""
RESOURCE_USAGE = """
Resource usage:
 Common:
  GLOBAL:11 CONSTANT[4]:8
 Function _kernel:
  REG:126 STACK:0 SHARED:1024 LOCAL:0 CONSTANT[0]:584 TEXTURE:0 SURFACE:0 SAMPLER:0
"""
SASS = """
        Function : _kernel
        /*0000*/                   LDC R1, c[0x0][0x28] ;                      /* 0x00000a00ff017b82 */
        /*0010*/                   S2R R0, SR_TID.X ;                          /* 0x0000000000007919 */
        /*0020*/                   FFMA.FTZ R2, R0, R0, R2 ;                   /* 0x0000000000027223 */
        /*0030*/                   LDG.E R3, desc[UR4][R4.64] ;                /* 0x0000000404037981 */
        /*0040*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;               /* 0x0000000000007b1d */
        /*0050*/               @P0 BRA 0x20 ;                                  /* 0xfffffff000280947 */
        /*0060*/                   EXIT ;                                      /* 0x000000000000794d */
        /*0070*/                   BRA 0x70;                                   /* 0xfffffffc00fc7947 */
"""


def test_ptxas_and_cuobjdump_are_read():
    assert cc.parse_ptxas(PTXAS_CLEAN) == {"regs": 126, "spill_store": 0, "spill_load": 0, "stack": 0}
    assert cc.parse_ptxas(PTXAS_SPILL) == {"regs": 32, "spill_store": 12168, "spill_load": 15316, "stack": 12168}
    usage = cc.parse_resource_usage(RESOURCE_USAGE)
    assert (usage["REG"], usage["SHARED"], usage["LOCAL"], usage["CONSTANT[0]"]) == (126, 1024, 0, 584)
    with pytest.raises(ValueError):
        cc.parse_ptxas("ptxas fatal: nothing")
    with pytest.raises(ValueError):
        cc.parse_resource_usage("Resource usage:\n Common:\n  GLOBAL:0\n")


def test_a_loop_is_a_backward_branch_counted_by_kind():
    ins = cc.sass_instructions(SASS)
    assert [op for _, op, _ in ins][:3] == ["LDC", "S2R", "FFMA.FTZ"] and ins[5][1] == "BRA"  # predicate skipped
    (loop,) = cc.sass_loops(SASS)  # the self-branch at the end is no loop
    assert (loop["start"], loop["end"], loop["instructions"]) == (0x20, 0x50, 4)
    assert loop["kinds"] == {"fp32": 1, "ldg": 1, "bar": 1, "ctrl": 1}
    assert cc.opcode_kind("LDL.LU") == "local" and cc.opcode_kind("IMAD.MOV.U32") == "int/other"


def test_occupancy_by_registers_shared_memory_and_warps():
    assert cc.occupancy(126, 4, 7168, 1024) == 4       # 128 regs x 128 threads: 4 blocks of 64K registers
    assert cc.occupancy(255, 4, 0) == 2
    assert cc.occupancy(32, 4, 130 * 1024, 1024) == 1  # shared memory: one 130 KiB block in 228 KiB
    assert cc.occupancy(16, 1, 0) == 32                # the blocks-per-SM limit
    assert cc.occupancy(16, 32, 0) == 2                # the warps-per-SM limit


def _row(**over):
    row = {"arch": "sm_90a", "regs": 64, "spill_store": 0, "spill_load": 0, "stack": 0, "smem_static": 1024,
           "smem_dynamic": 4096, "smem": 5120, "blocks_per_sm": 4, "sass_instructions": 100, "ieee_dot": True,
           "loops": [{"start": 0, "end": 16, "instructions": 10, "kinds": {"fp32": 6, "ldg": 1}, "opcodes": {}}]}
    return {**row, **over}


def test_the_table_fails_on_a_spill_too_much_shared_memory_a_compile_error_and_a_lowering_error():
    kernels = {k: {"file": f"{k}.ttir", "label": f"scan.{k}", "name": k, "num_warps": 4, "num_stages": 1}
               for k in ("ok", "spill", "smem", "broken")}
    manifest = {"kernels": kernels, "errors": [{"point": "p2", "pair": "newton/bppsa", "error": "lowering: X"}],
                "launches": [{"point": "p", "pair": "sequential/bppsa", "index": i, "kernel": k, "grid": [33, 16]}
                             for i, k in enumerate(kernels)]}
    compiled = {"versions": {"triton": "3.6.0"}, "kernels": {
        "ok": _row(), "spill": _row(spill_store=8, spill_load=4), "smem": _row(smem=300 * 1024),
        "broken": {"error": "CompilationError: x"}}}
    record, md = mc.render(manifest, compiled, {"date": "d", "git_commit": "c", "triton": "3.6.0"}, dict(cc.H100))
    assert "fail" not in record["kernels"]["ok"]
    assert record["kernels"]["spill"]["fail"] == "spills 8/4 B"
    assert record["kernels"]["smem"]["fail"].startswith("shared memory 307200 B")
    assert record["kernels"]["broken"]["fail"] == "does not compile"
    assert len(record["failures"]) == 4 and record["failures"][0].startswith("p2 newton/bppsa")
    ok = next(x for x in record["launches"] if x["kernel"] == "ok")
    assert ok["programs"] == 528 and ok["waves"] == round(528 / (4 * 132), 3)
    assert next(x for x in record["launches"] if x["kernel"] == "broken")["waves"] is None
    assert "**Fails**" in md and "| scan.spill | 4 | 64 | 8/4 | 5120 | 4 | 10 | 6 | 0 | 1 |" in md
    assert "scan.ok 33×16 (1.0 w, " in md  # the step's launches, each with its waves and predicted time
    clean = {"kernels": {"ok": kernels["ok"]}, "errors": [], "launches": manifest["launches"][:1]}
    record, md = mc.render(clean, compiled, {}, dict(cc.H100))
    assert record["failures"] == [] and "**Passes**" in md


def test_the_points_are_the_gpu_scripts_and_the_kernels_limits():
    from bppsa.kernels import newton, recurrence, scan
    from experiments.paper_bppsa import gpu_run

    names = [p.name for p in mc.points()]
    assert len(names) == len(set(names))
    full = gpu_run.plan(False)
    assert {f"gpu/T rnn T={T}" for T in full["T_sweep"]} <= set(names)
    assert {f"gpu/B rnn B={B}" for B in full["B_sweep"]} <= set(names)
    assert len([n for n in names if n.startswith("gpu/irmas")]) == len(full["irmas"])
    from bppsa import cells
    assert {f"limit {k} H={recurrence.HIDDEN_LIMITS[cells.BUILTIN[k]]}" for k in ("rnn", "gru", "lstm")} <= set(names)
    assert {f"limit blockgru head={k}" for k in (scan.LANE_BLOCK, scan.MAX_BLOCK)} <= set(names)
    assert f"limit blockgru head=1 H={newton.MAX_UNITS}" in names


def test_the_dump_writes_every_kernel_a_training_step_launches(tmp_path):
    import json

    point = mc.Point("tiny rnn", "rnn", 1, 20, 10, 16, mc.SEQUENTIAL)
    manifest = mc.dump(tmp_path, selected=[point])
    assert manifest["errors"] == []
    assert json.loads((tmp_path / "manifest.json").read_text()) == json.loads(json.dumps(manifest))
    pairs = {x["pair"] for x in manifest["launches"]}
    assert pairs == {"sequential/bppsa", "sequential/bptt"}
    labels = {k["label"] for k in manifest["kernels"].values()}
    assert {label.split(".")[0] for label in labels} == {"recurrence", "scan", "adjoint"}  # modules of bppsa.kernels
    for kid, k in manifest["kernels"].items():
        assert "tt.func" in (tmp_path / k["file"]).read_text() and k["num_warps"] >= 1 and k["num_stages"] >= 1, kid
    # the forward kernel is one and the same in both steps: written once, launched twice
    forward = [x["kernel"] for x in manifest["launches"] if x["index"] == 0]
    assert len(forward) == 2 and forward[0] == forward[1]
    assert all(len(x["grid"]) >= 1 for x in manifest["launches"])


def test_a_kernels_label_is_its_module_and_function():
    assert mc.kernel_label("_dense_reduce at /x/bppsa/kernels/scan.py:205", "_dense_reduce") == "scan._dense_reduce"
    assert mc.kernel_label("", "_kernel") == "_kernel"


TTIR = """module {
  tt.func public @_kernel(%arg0: !tt.ptr<f32>) {
    %c0_i32 = arith.constant 0 : i32
    %c1000_i32 = arith.constant 1000 : i32
    %c1_i32 = arith.constant 1 : i32
    %c4_i32 = arith.constant 4 : i32
    %0 = arith.addi %c0_i32, %c1000_i32 : i32
    %1 = scf.for %arg1 = %c0_i32 to %0 step %c1_i32 iter_args(%arg2 = %cst) -> (tensor<32xf32>)  : i32 {
      %2 = scf.for %arg3 = %c0_i32 to %c4_i32 step %c1_i32 iter_args(%arg4 = %arg2) -> (tensor<32xf32>)  : i32 {
        scf.yield %arg4 : tensor<32xf32>
      }
      scf.yield %2 : tensor<32xf32>
    }
    %3 = scf.for %arg5 = %c0_i32 to %arg0 step %c1_i32 iter_args(%arg6 = %1) -> (tensor<32xf32>)  : i32 {
      scf.yield %arg6 : tensor<32xf32>
    }
    tt.return
  }
}
"""


def test_the_outer_loops_trip_counts_are_read_from_the_ttir():
    assert cc.loop_trips(TTIR) == [1000, None]  # the inner loop is not outermost; a runtime bound is unknown
    assert cc.loop_trips("module {}") == []
    assert [cc.access_bytes(op) for op in ("LDG.E.128", "STG.E.64", "LDG.E", "LDG.E.U8")] == [16, 8, 4, 1]


def test_the_predicted_time_is_the_stated_model():
    m = mc.MODEL
    loop = {"instructions": 300, "kinds": {"ldg": 1, "bar": 2, "lds": 40, "fp32": 200}, "ldg_bytes": 128,
            "stg_bytes": 128}
    row = {**_row(loops=[loop], trips=[1000], blocks_per_sm=4), "num_warps": 4}
    cycles = 300 + m["global_latency"] + 2 * m["barrier_latency"] + m["smem_latency"]  # one warp a scheduler
    p = mc.predict(row, 1, dict(cc.H100))
    assert p is not None and p["cycles_per_iteration"] == cycles and p["iterations"] == 1000
    assert p["us"] == round((1000 * cycles / m["clock_hz"] + m["launch_s"]) * 1e6, 2)
    # 4 blocks an SM (528 programs): their issue, 4 warps a scheduler, outweighs one block's waits
    many = mc.predict(row, 528, dict(cc.H100))
    assert many is not None and many["cycles_per_iteration"] == max(cycles, 4 * 300)
    assert mc.predict({"error": "x"}, 1, dict(cc.H100)) is None


def test_a_loop_free_kernel_is_its_whole_program_up_to_exit():
    prog = cc.sass_program(SASS)  # the branch-to-self after EXIT is padding
    assert prog["instructions"] == 7 and prog["kinds"] == {"int/other": 2, "fp32": 1, "ldg": 1, "bar": 1, "ctrl": 2}
    assert prog["ldg_bytes"] == 4 * 32 and prog["stg_bytes"] == 0


def test_the_peer_record_prices_pararnns_launches_by_the_same_model():
    """experiments/results/gpu/pararnn_machine_code.json: each pararnn launch's time is
    machine_code.predict of its kernel (the whole program as one iteration), ours the committed
    machine_code.json's Newton launches; a forward is init + 3 iterations."""
    import json

    from experiments.gpu import peer_machine_code as peer

    record = json.loads((mc.RESULTS / "pararnn_machine_code.json").read_text())
    assert record["peer"] == peer.PEER and record["provenance"]["triton"] == "3.6.0"
    for p in record["points"]:
        for x in p["pararnn"]["launches"]:
            if x["kernel"] is None:  # the torch copy_: a launch plus its bytes
                continue
            row = dict(record["pararnn_kernels"][x["kernel"]])
            row["loops"], row["trips"] = [row["program"]], [1]
            assert x["predicted"] == mc.predict(row, x["programs"], record["limits"], record["model"])
        its = [x for x in p["pararnn"]["launches"] if x["per"] == "iteration"]
        assert p["pararnn"]["us_per_iteration"] == pytest.approx(sum(x["predicted"]["us"] for x in its), abs=0.02)
        assert {x["label"] for x in p["ours"]["launches"] if x["per"] == "iteration"} == set(peer.ITERATION_KERNELS)
        f = p["forward"]
        assert f["pararnn_us"] == pytest.approx(p["pararnn"]["us_per_forward_once"] + 3 * p["pararnn"]["us_per_iteration"],
                                                abs=0.02)
    for it in record["iterations"]:  # Newton's errors fall to float32's floor; bppsa's tolerance is met
        for errs in it["errors"].values():
            assert errs[-1] < 1e-5 < errs[0]
        assert it["bppsa"]["converged"] and it["bppsa"]["error"] < 1e-5


def test_a_global_loads_lead_is_the_instructions_before_its_value_is_read():
    body = [("LDG.E.128", "LDG.E.128 R48, desc[UR6][R16.64]"), ("FADD", "FADD R1, R2, R3"),
            ("FADD", "FADD R4, R50, R3"), ("BRA", "BRA 0x20")]
    assert cc.load_lead(body) == 2  # R50 is the load's third word
    ahead = [body[0], body[1], ("BRA", "BRA 0x20"), ("STG.E.128", "STG.E.128 desc[UR6][R8.64], R48")]
    assert cc.load_lead(ahead) == 3 and cc.load_lead(body[1:]) is None
    m, loop = mc.MODEL, {"instructions": 300, "kinds": {"ldg": 1}, "ldg_bytes": 0, "stg_bytes": 0}
    near = mc.predict({**_row(loops=[{**loop, "ldg_lead": 60}], trips=[1], blocks_per_sm=1), "num_warps": 4}, 1,
                      dict(cc.H100))
    far = mc.predict({**_row(loops=[{**loop, "ldg_lead": 290}], trips=[1], blocks_per_sm=1), "num_warps": 4}, 1,
                     dict(cc.H100))
    assert near is not None and near["cycles_per_iteration"] == 300 + m["global_latency"] - 60
    assert far is not None and far["cycles_per_iteration"] == 300  # issued a step ahead: no wait


def test_the_table_fails_on_a_newton_step_under_four_waves():
    """The Newton step's reduce and apply must make 4 waves (programs / (blocks per SM x 132)); the
    carry, a kernel of B x unit-tile programs, is not held to it."""
    kernels = {k: {"file": f"{k}.ttir", "label": f"newton.{k}", "name": k, "num_warps": 1, "num_stages": 1}
               for k in ("_reduce", "_carry", "_apply")}
    compiled = {"versions": {}, "kernels": {k: _row() for k in kernels}}  # 4 blocks an SM: a wave is 528
    launch = lambda k, grid, point="p": {"point": point, "pair": "newton/bppsa", "index": 0, "kernel": k,  # noqa: E731
                                         "grid": grid}
    manifest = {"kernels": kernels, "errors": [], "launches": [
        launch("_reduce", [66, 32]), launch("_carry", [32]), launch("_apply", [66, 32]),  # 2112: 4 waves
        launch("_reduce", [64, 32], "q"), launch("_apply", [8, 16], "q")]}
    record, md = mc.render(manifest, compiled, {}, dict(cc.H100))
    assert record["failures"] == ["q newton/bppsa: newton._reduce 64x32 makes 3.879 waves (< 4)",
                                  "q newton/bppsa: newton._apply 8x16 makes 0.242 waves (< 4)"]
    assert "**Fails**" in md and "2 Newton launch(es) under 4 waves" in md
    manifest["launches"] = manifest["launches"][:3]
    record, md = mc.render(manifest, compiled, {}, dict(cc.H100))
    assert record["failures"] == []
    assert "0 Newton launch(es) under 4 waves (`newton_waves`) of 2, each at 4.0 waves" in md
