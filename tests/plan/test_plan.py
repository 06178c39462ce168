"""Decisions made once: every entry point makes one Plan, with every choice concrete, before
anything runs; the layers below it (bppsa.forward, bppsa.backward, parallel.sequence) never consult the cost
model; the option fields are defined once."""

import ast
import dataclasses
import functools
from pathlib import Path
from typing import get_args

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import bppsa
import bppsa.nn
from bppsa import cells, parallel
from bppsa.plan import calibration, cost, options, rules
from bppsa.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
# the layers that run a plan: every module of the forward and the backward, and the mesh's
EXECUTORS = sorted(str(p.relative_to(ROOT)) for d in ("forward", "backward") for p in (ROOT / "bppsa" / d).glob("*.py")) \
    + ["bppsa/parallel/sequence.py"]


def _assert_concrete(plan, devices=None):
    assert type(plan) is options.Plan and plan.devices == devices
    assert plan.backward in ("bppsa", "bptt") and plan.forward in ("sequential", "newton", "quasi")
    assert plan.scan in get_args(options.Scan) and plan.combine in ("logstep", "allgather", "chain")
    assert plan.chunk_size is None or type(plan.chunk_size) is int
    assert plan.solve_chunk is None or type(plan.solve_chunk) is int
    assert type(plan.unroll) is int and type(plan.tol) is float and plan.precision in options.PRECISIONS


@pytest.fixture
def plans(monkeypatch):
    made = []
    planner = options.Options.plan

    def recording(self, *args, **kwargs):
        made.append(planner(self, *args, **kwargs))
        return made[-1]

    monkeypatch.setattr(options.Options, "plan", recording)
    return made


@pytest.mark.parametrize("fields", [{}, {"backward": "auto", "forward": "auto"}, {"forward": "quasi"},
                                    {"backward": "bptt", "unroll": True}])
def test_one_device_makes_one_concrete_plan(problem, plans, fields):
    cell, params, xs, h0 = problem(cells.GRU(2, 3), T=8, h0_scale=0)
    jax.grad(lambda p: jnp.sum(bppsa.rnn(cell, p, xs, h0, **fields)))(params)
    assert len(plans) == 1
    _assert_concrete(plans[0])


def test_a_mesh_makes_one_concrete_plan(problem, plans):
    cell, params, xs, h0 = problem(cells.GRU(2, 3), T=8, h0_scale=0)
    mesh = parallel.make_mesh(2, batch_axis=None)
    jax.jit(jax.grad(lambda p: jnp.sum(bppsa.rnn(cell, p, xs, h0, mesh=mesh, forward="newton"))))(params)  # one compile
    parallel.pmap_rnn(cell, params, xs.reshape((2, 4) + xs.shape[1:]), h0)
    assert len(plans) == 2
    for plan in plans:
        _assert_concrete(plan, devices=2)
        assert (plan.chunk_size, plan.solve_chunk, plan.unroll, plan.combine) == (None, None, 1, "allgather")
    with pytest.raises(UsageError, match="chunk_size=3 cannot be combined with mesh"):
        bppsa.rnn(cell, params, xs, h0, mesh=mesh, chunk_size=3)


def test_nn_rnn_makes_one_concrete_plan(plans):
    layer = bppsa.nn.RNN(nnx.GRUCell(2, 3, rngs=nnx.Rngs(0), param_dtype=jnp.float64), backward="auto")
    layer(jnp.ones((2, 5, 2), jnp.float64))
    assert len(plans) == 1
    _assert_concrete(plans[0])
    assert layer.options == bppsa.Options(backward="auto")  # the layer keeps what was asked


def test_a_plan_is_kept_and_refuses_open_choices(problem):
    cell, _, xs, h0 = problem(cells.GRU(2, 3), T=8, h0_scale=0)
    plan = bppsa.Options(backward="auto").plan(cell, xs, h0)
    assert plan.plan(cell, xs, h0) is plan and not isinstance(plan, bppsa.Options)  # its own type
    with pytest.raises(UsageError, match="open: backward='auto'"):
        plan.replace(backward="auto")
    with pytest.raises(UsageError, match="made for devices=None"):
        plan.plan(cell, xs, h0, devices=2)


# (cell, fields, devices) -> the backward the plan names; a GRU has an analytic adjoint, a BlockGRU has not
STAGES = [
    ("gru", {"backward": "bppsa"}, None, "scan", "blelloch"),
    ("gru", {"backward": "bppsa", "scan": "associative"}, None, "scan", "associative"),
    ("gru", {"backward": "bptt"}, None, "analytic", "sequential"),
    ("block", {"backward": "bptt"}, None, "autodiff", "sequential"),
    ("gru", {"backward": "bptt", "forward": "newton"}, None, "scan", "sequential"),
    ("gru", {"backward": "bptt", "kernels": "interpret"}, None, "fused", "sequential"),
    ("gru", {"backward": "bptt"}, 2, "autodiff", "sequential"),
    # the mesh's Newton and quasi-Newton plans (their one-device plans above): make test-all
    pytest.param("gru", {"backward": "bptt", "forward": "newton"}, 2, "scan", "sequential", marks=pytest.mark.slow),
    pytest.param("block", {"backward": "bppsa", "forward": "quasi"}, 2, "scan", "blelloch", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("kind, fields, devices, adjoint, adjoint_scan", STAGES)
def test_a_plan_names_every_stage(problem, loss, close, monkeypatch, kind, fields, devices, adjoint, adjoint_scan):
    """The plan names how the backward runs (``adjoint``, ``adjoint_scan``, ``differentiation``)
    and the layers below run what it names: the rule's functions are called exactly where the
    plan says (a spy on each), and the gradient is autodiff's through a plain ``lax.scan``."""
    from bppsa.backward import adjoint as adjoint_lib
    from bppsa.backward import rule
    from tests.reference import grads_of, scan_grads
    cell = cells.GRU(2, 3) if kind == "gru" else cells.BlockGRU(2, 4, 2)
    cell, params, xs, h0 = problem(cell, T=7, B=2)
    plan = bppsa.Options(**fields).plan(cell, xs, h0, devices=devices)
    assert (plan.adjoint, plan.adjoint_scan) == (adjoint, adjoint_scan)
    assert plan.differentiation == ("autodiff" if adjoint == "autodiff" else "rule")
    assert set(plan.stages) == {"forward", "differentiation", "backward", "devices"}
    assert plan.replace(backward="bppsa").adjoint == "scan"  # a replaced plan names its stages anew
    called = []
    for module, name in ((rule, "adjoint"), (rule, "sequential_adjoint"), (rule, "fused_sequential_adjoint"),
                         (adjoint_lib, "factor_states")):
        fn = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _fn=fn, _name=name, **k: (called.append(_name), _fn(*a, **k))[1])
    entry = bppsa.rnn if devices is None else functools.partial(
        bppsa.parallel.rnn, mesh=parallel.make_mesh(devices, batch_axis=None))
    got = grads_of(lambda p, x, h: entry(cell, p, x, h, **fields), params, xs, h0, loss)
    close(got, scan_grads(cell, params, xs, h0, loss), what=f"{kind} {fields} devices={devices}")
    expected = {"scan": ["adjoint"] if devices is None else [], "analytic": ["sequential_adjoint"],
                "fused": ["fused_sequential_adjoint"], "autodiff": []}[adjoint]
    assert [c for c in called if c != "factor_states"] == expected, called


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the elementwise plan is the CPU's")
@pytest.mark.parametrize("H, T, B", [(20, 1034, 32), (64, 1034, 32), (256, 1034, 32), (20, 2048, 8), (64, 2048, 8),
                                     (256, 2048, 8)])
def test_auto_plans_the_diagonal_bppsa_for_the_diagonal_gru(H, T, B):
    """BlockGRU(head_size=1) at the diagonal points of the pararnn-torch comparison: backward="auto"
    makes the plan of backward="bppsa" (the sequential scan over cache-sized chunks of the diagonals),
    measured 1.2-1.8x faster than BPTT there (experiments/history/diagonal-auto.md); the Newton
    forward's plan too. With a scan given, the model decides (BPTT here)."""
    cell = cells.BlockGRU(12, H, 1, hidden_bias=False)
    xs, s0 = jax.ShapeDtypeStruct((T, B, 12), jnp.float32), jax.ShapeDtypeStruct((B, H), jnp.float32)
    for fields in ({}, {"forward": "newton"}):
        auto = bppsa.Options(backward="auto", **fields).plan(cell, xs, s0)
        assert auto == bppsa.Options(backward="bppsa", **fields).plan(cell, xs, s0)
        assert (auto.backward, auto.scan) == ("bppsa", "sequential")
    assert bppsa.Options(backward="auto", scan="blelloch").plan(cell, xs, s0).backward == "bptt"


def test_the_cost_model_is_consulted_only_by_the_plan(problem, monkeypatch):
    callers = []
    for module, name in ((calibration, "choose_backward"), (cost, "choose_forward"), (rules, "auto_chunk_size"),
                         (rules, "bptt_unroll"), (rules, "choose_combine")):
        fn = getattr(module, name)

        def spy(*args, _fn=fn, **kwargs):
            import inspect
            callers.append(Path(inspect.stack()[1].filename).name)
            return _fn(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)
    cell, params, xs, h0 = problem(cells.GRU(2, 3), T=8, h0_scale=0)
    for fields in ({"backward": "auto", "forward": "newton"}, {"forward": "auto"}, {"backward": "bptt"}):
        jax.grad(lambda p: jnp.sum(bppsa.rnn(cell, p, xs, h0, **fields)))(params)
    assert "options.py" in callers and set(callers) <= {"options.py", "rules.py", "cost.py", "calibration.py"}  # their own helpers


@pytest.mark.parametrize("path", EXECUTORS)
def test_the_executing_layers_do_not_import_the_cost_model(path):
    tree = ast.parse((ROOT / path).read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names |= {f"{node.module or ''}.{a.name}".lstrip(".") for a in node.names} | {node.module or ""}
    concepts = ("cost", "rules", "calibration")  # the rules, the cost model and its calibration: the plan's alone
    assert not [n for n in names if any(n == c or n.endswith("." + c) or n.startswith(c) for c in concepts)], names


def test_the_option_fields_are_defined_once():
    fields = [f.name for f in dataclasses.fields(bppsa.Options)]
    assert [f.name for f in dataclasses.fields(options.Plan)] == fields + ["solve_chunk", "devices", "hoist", "gate", "weights_in_loop",
                                                                          "cell_adjoint", "newton_kernel"]
    assert options.BACKWARDS == get_args(options.Backward) and options.FORWARDS == ("sequential", "newton", "quasi", "auto")
    assert bppsa.forward.newton.Plan is options.Plan  # the solver runs the plan's type
    assert not set(bppsa.forward.newton.__all__) & set(options.__all__)  # and does not re-export the plan's names
    # the solver defines no settings of its own: it reads the Plan's fields
    tree = ast.parse((ROOT / "bppsa/forward/newton.py").read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.decorator_list]
    read = {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "plan"}
    assert read and read <= set(fields) | {"solve_chunk", "devices", "hoist", "gate", "fused"}, read


def test_the_newton_kernel_is_decided_while_planning(problem, monkeypatch):
    """Whether a parallel forward's Newton step runs whole in the kernels (a diagonal cell), with its
    convergence test from them (states the kernels compute in), is the plan's ``newton_kernel``:
    the forward runs what it names, and a plan replaced to "none" runs the fused scan instead, to
    the same states."""
    from bppsa.kernels import newton as newton_kernels
    diagonal, dense = cells.BlockGRU(2, 4, 1), cells.GRU(2, 3)
    cell, params, xs, h0 = problem(diagonal, T=9, B=2)
    plan = bppsa.Options(forward="newton", kernels="interpret").plan(cell, xs, h0)
    assert plan.newton_kernel == "measured" and "whole step fused and measured" in plan.stages["forward"]
    assert bppsa.Options(forward="newton").plan(cell, xs, h0).newton_kernel == "none"  # XLA's
    _, _, xs3, h3 = problem(dense, T=9, B=2)
    assert bppsa.Options(kernels="interpret").plan(dense, xs3, h3).newton_kernel == "none"  # the sequential forward
    assert bppsa.Options(forward="newton", kernels="interpret").plan(dense, xs3, h3).newton_kernel == "none"
    called = []
    fn = newton_kernels.fused_newton_apply
    monkeypatch.setattr(newton_kernels, "fused_newton_apply",
                        lambda *a, **k: (called.append(1), fn(*a, **k))[1])
    whole = bppsa.rnn(cell, params, xs, h0, plan)
    assert called
    called.clear()
    scanned = bppsa.rnn(cell, params, xs, h0, plan.replace(newton_kernel="none"))
    assert not called
    np.testing.assert_allclose(whole, scanned, rtol=1e-10, atol=1e-12)
