"""The cell contract: init, step and shapes on Cell; the analytic adjoint an optional typed
protocol (bppsa.cells.AnalyticAdjoint) checked where the plan uses it, not stubs that raise."""

import ast
import dataclasses
import inspect

import jax
import jax.numpy as jnp
import pytest

import bppsa
from bppsa import cells
from bppsa.errors import UsageError
from tests.helpers import normal


def test_the_contract_has_no_stub_that_raises():
    """No method of Cell (or of its shared bases) raises NotImplementedError: a capability a cell
    lacks is absent, not a stub."""
    for cls in (cells.Cell, cells.Affine, cells.AffineAdjoint):
        tree = ast.parse(inspect.getsource(cls))
        raised = [node for node in ast.walk(tree) if isinstance(node, ast.Raise) and node.exc is not None
                  and "NotImplementedError" in ast.unparse(node.exc)]
        assert not raised, f"{cls.__name__} raises NotImplementedError: {[ast.unparse(r) for r in raised]}"


def test_cells_with_and_without_the_adjoint():
    for cell in (cells.RNN(2, 3), cells.GRU(2, 3), cells.LSTM(2, 3)):
        assert cell.has_adjoint and isinstance(cell, cells.AnalyticAdjoint)
    for cell in (cells.BlockGRU(2, 4, head_size=2), cells.Generic(lambda p, h, x: h)):
        assert not cell.has_adjoint and not isinstance(cell, cells.AnalyticAdjoint)


def test_a_cell_that_claims_the_adjoint_without_its_methods_gets_a_one_line_error():
    @dataclasses.dataclass(frozen=True, eq=False)
    class Claims(cells.Generic):
        has_adjoint = True

    cell = Claims(lambda p, h, x: jnp.tanh(p["W"] @ h + x), hidden_size=3, input_size=3)
    params, xs, h0 = {"W": normal(0, (3, 3), 0.3)}, normal(1, (5, 2, 3)), jnp.zeros((2, 3))
    with pytest.raises(UsageError, match=r"^Claims sets has_adjoint but lacks step_factors, adjoint_step, "
                                         r"adjoint_grads, adjoint_sum_inputs, adjoint_sum_step, "
                                         r"adjoint_sum_result \(bppsa.cells.AnalyticAdjoint\); define them or "
                                         r"set has_adjoint = False"):
        jax.grad(lambda p: bppsa.rnn(cell, p, xs, h0, backward="bptt").sum())(params)
