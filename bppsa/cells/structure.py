"""The structure of a cell's transposed Jacobians, one typed description: ``cell.jacobian_structure``.

Every cell gives its dense transposed Jacobians M_t (T, B, S, S) by :meth:`bppsa.cells.Cell.transposed_jacobian`
(g_{t-1} = g_t @ M_t, M_t[b, i, j] = ∂s_t[b, i] / ∂s_{t-1}[b, j]). A cell that knows more says so with one
of four small frozen descriptions, each carrying the functions that structure needs (each called as
``fn(params, s_prev, xs, s)``, the arrays of :meth:`~bppsa.cells.Cell.transposed_jacobian`):

- :class:`Dense` (the default): nothing more; the scans multiply S × S matrices.
- :class:`Scaled`: M_t = diag(A_t) Wt, one (S, S) matrix shared by all steps, its rows scaled per
  step (the RNN: diag(σ'(a_t)) W_hᵀ). The Blelloch scan never forms the (T, B, S, S) matrices.
- :class:`Factored`: M_t = Σ_q diag(A_{q,t}) Wt_q, Q scaled shared matrices (the GRU, Q = 4; the
  LSTM, Q = 5); the fused scan forms each M_t inside its kernels.
- :class:`Blocks`: M_t block-diagonal, S/k contiguous (k, k) blocks (the cells of
  :mod:`bppsa.cells.block`; k = 1: diagonal); the scans combine blocks, never S × S matrices.

The consumers (the backward's scans, the parallel forward, the plan, the kernels) read it through
:func:`structure_of` and match on its type; :func:`jacobian_blocks`, :func:`jacobian_diagonal`,
:func:`block_size` and :func:`elementwise` are what they derive from it for any cell.

Examples:
  >>> import jax.numpy as jnp
  >>> from bppsa import cells
  >>> from bppsa.cells import structure
  >>> structure.structure_of(cells.GRU(3, 4))                     # doctest: +ELLIPSIS
  Factored(factors=...)
  >>> structure.block_size(cells.BlockGRU(3, 6, head_size=2)), structure.elementwise(cells.BlockRNN(3, 6))
  (2, True)
  >>> structure.structure_of(cells.Generic(lambda p, h, x: jnp.tanh(h + x)))
  Dense()
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Callable, Union

import jax.numpy as jnp
from jax import Array

from bppsa.errors import UsageError, as_int

# Cells are typed Any here: bppsa.cells.base (the contract) reads this module, not the other way round.
Cell = Any

__all__ = ["Dense", "Scaled", "Factored", "Blocks", "Structure", "structure_of", "legacy_structure", "block_size",
           "elementwise", "jacobian_blocks", "jacobian_diagonal", "on_params", "LEGACY_MEMBERS"]

#: ``fn(params, s_prev (T, B, S), xs (T, B, I), s (T, B, S)) -> arrays``: what each description carries.
JacobianFn = Callable[[Any, Array, Array, Array], Any]


def _check_fn(kind: str, field: str, fn: Any, required: bool = True) -> None:
    if (fn is None and not required) or callable(fn):
        return
    raise UsageError(f"{kind}: {field} must be a function fn(params, s_prev, xs, s)"
                     f"{'' if required else ' or None'}; got {fn!r}")


@dataclasses.dataclass(frozen=True)
class Dense:
    """No structure: M_t (T, B, S, S) by :meth:`bppsa.cells.Cell.transposed_jacobian` (the default)."""


@dataclasses.dataclass(frozen=True)
class Scaled:
    """M_t[b] = diag(A[t, b]) @ Wt: one (S, S) matrix Wt shared by all steps, its rows scaled per step.

    Attributes:
      factors: ``factors(params, s_prev, xs, s) -> (A (T, B, S), Wt (S, S))``.
    """

    factors: JacobianFn

    def __post_init__(self):
        _check_fn("Scaled", "factors", self.factors)


@dataclasses.dataclass(frozen=True)
class Factored:
    """M_t[b] = Σ_q diag(A[q, t, b]) @ Wt[q]: Q per-unit factors per step and Q matrices shared by all
    steps; the fused scan (:func:`bppsa.kernels.chunked_scan_factored`) forms each M_t inside its kernels,
    reading Q·S numbers a step instead of S². The XLA scans use the dense M_t.

    Attributes:
      factors: ``factors(params, s_prev, xs, s) -> (A (Q, T, B, S), Wt (Q, S, S))``.
    """

    factors: JacobianFn

    def __post_init__(self):
        _check_fn("Factored", "factors", self.factors)


@dataclasses.dataclass(frozen=True)
class Blocks:
    """M_t block-diagonal: S/k contiguous (k, k) blocks (k = 1: diagonal); the scans combine blocks.

    Attributes:
      size: k, a positive int dividing S.
      blocks: ``blocks(params, s_prev, xs, s) -> (T, B, S/k, k, k)``, block n holding the rows and
        columns n·k … n·k + k − 1 of M_t[b].
      diagonal: ``diagonal(params, s_prev, xs, s) -> (T, B, S)``, diag(M_t) (the quasi-Newton forward's
        Jacobian), or None: taken from ``blocks``.
    """

    size: int
    blocks: JacobianFn
    diagonal: JacobianFn | None = None

    def __post_init__(self):
        if (k := as_int(self.size)) is None or k < 1:
            raise UsageError(f"Blocks: size must be a positive int (the blocks' k); got {self.size!r}")
        object.__setattr__(self, "size", k)
        _check_fn("Blocks", "blocks", self.blocks)
        _check_fn("Blocks", "diagonal", self.diagonal, required=False)


#: One of the four descriptions.
Structure = Union[Dense, Scaled, Factored, Blocks]
_KINDS = (Dense, Scaled, Factored, Blocks)

#: The members a cell gave before :attr:`bppsa.cells.Cell.jacobian_structure` (read by :func:`legacy_structure`).
LEGACY_MEMBERS = ("jacobian_block_size", "jacobian_blocks", "jacobian_diagonal", "has_diagonal_jacobian",
                  "diagonal_jacobian", "factored_jacobian")


def legacy_structure(cell: Cell) -> Structure:
    """The description a cell written against the old members implies (a ``DeprecationWarning`` where it
    has one): ``jacobian_block_size`` k (with ``jacobian_blocks``, ``jacobian_diagonal``) -> :class:`Blocks`;
    ``has_diagonal_jacobian`` (``diagonal_jacobian``) -> :class:`Scaled`; ``factored_jacobian`` ->
    :class:`Factored`; none of them -> :class:`Dense`.

    Args:
      cell: any cell.

    Returns:
      The :class:`Structure` its old members describe.
    """
    found = [m for m in LEGACY_MEMBERS if hasattr(cell, m)]
    if not found:
        return Dense()
    warnings.warn(f"{cell.display_name} describes its Jacobian by {', '.join(found)}: replaced by one "
                  f"jacobian_structure (bppsa.cells.Dense, Scaled, Factored or Blocks); translated here",
                  DeprecationWarning, stacklevel=3)
    k = getattr(cell, "jacobian_block_size", None)
    if k is not None:
        if not callable(getattr(cell, "jacobian_blocks", None)):
            raise UsageError(f"{cell.display_name} sets jacobian_block_size = {k!r} but has no jacobian_blocks; "
                             f"give jacobian_structure = bppsa.cells.Blocks(size, blocks)")
        return Blocks(k, cell.jacobian_blocks, getattr(cell, "jacobian_diagonal", None))  # pyright: ignore[reportAttributeAccessIssue]
    if getattr(cell, "has_diagonal_jacobian", False):
        return Scaled(cell.diagonal_jacobian)  # pyright: ignore[reportAttributeAccessIssue]
    if callable(getattr(cell, "factored_jacobian", None)):
        return Factored(cell.factored_jacobian)  # pyright: ignore[reportAttributeAccessIssue]
    return Dense()


def structure_of(cell: Cell) -> Structure:
    """``cell.jacobian_structure``, checked: one of :class:`Dense`, :class:`Scaled`, :class:`Factored`,
    :class:`Blocks`.

    Args:
      cell: any cell.

    Returns:
      Its :class:`Structure`.

    Raises:
      bppsa.errors.UsageError: ``jacobian_structure`` is something else (the message names it).
    """
    st = cell.jacobian_structure
    if not isinstance(st, _KINDS):
        raise UsageError(f"{cell.display_name}.jacobian_structure must be one of bppsa.cells.Dense(), "
                         f"Scaled(factors), Factored(factors) or Blocks(size, blocks, diagonal=None); got {st!r}")
    return st


def block_size(cell: Cell) -> int | None:
    """k of a :class:`Blocks` cell, else None (dense: one S × S block).

    Args:
      cell: any cell.

    Returns:
      The blocks' k, or None.
    """
    st = structure_of(cell)
    return st.size if isinstance(st, Blocks) else None


def elementwise(cell: Cell) -> bool:
    """Whether each unit's next value reads only its own previous units (Jacobian blocks 1 x 1, or
    2 x 2 for a pair state (h, c)): a step is then a few elementwise operations.

    Args:
      cell: any cell.

    Returns:
      True for such a cell.
    """
    return block_size(cell) == (2 if cell.pair_state else 1)


def jacobian_blocks(cell: Cell, params: Any, s_prev: Array, xs: Array, s: Array) -> Array:
    """M_t's diagonal blocks (T, B, S/k, k, k): a :class:`Blocks` cell's, else the dense M_t as one block.

    Args:
      cell: any cell.
      params, s_prev, xs, s: as for :meth:`bppsa.cells.Cell.transposed_jacobian`.

    Returns:
      (T, B, S/k, k, k) (k = S, one block, without :class:`Blocks`); block n holds the rows and
      columns n·k … n·k + k − 1 of M_t[b].
    """
    st = structure_of(cell)
    if isinstance(st, Blocks):
        return st.blocks(params, s_prev, xs, s)
    return cell.transposed_jacobian(params, s_prev, xs, s)[..., None, :, :]


def jacobian_diagonal(cell: Cell, params: Any, s_prev: Array, xs: Array, s: Array) -> Array:
    """diag(M_t) (T, B, S), the quasi-Newton forward's Jacobian: a :class:`Blocks` cell's ``diagonal``,
    else from :func:`jacobian_blocks`.

    Args:
      cell: any cell.
      params, s_prev, xs, s: as for :meth:`bppsa.cells.Cell.transposed_jacobian`.

    Returns:
      (T, B, S), the diagonal of each M_t[b].
    """
    st = structure_of(cell)
    if isinstance(st, Blocks) and st.diagonal is not None:
        return st.diagonal(params, s_prev, xs, s)
    d = jnp.diagonal(jacobian_blocks(cell, params, s_prev, xs, s), axis1=-2, axis2=-1)
    return d.reshape(d.shape[:-2] + (-1,))  # (T, B, S/k, k) -> (T, B, S)


def on_params(st: Structure, convert: Callable[[Any], Any]) -> Structure:
    """``st`` with each of its functions reading ``convert(params)``: an adapter's description from the
    cell it adapts (:mod:`bppsa.nn.cells`' flax cells).

    Args:
      st: a description whose functions take another parameter layout.
      convert: this layout's params -> theirs.

    Returns:
      The same kind of description on this layout.
    """
    def wrap(fn):
        return None if fn is None else (lambda params, *args: fn(convert(params), *args))

    if isinstance(st, Blocks):
        return Blocks(st.size, wrap(st.blocks), wrap(st.diagonal))  # pyright: ignore[reportArgumentType]
    if isinstance(st, (Scaled, Factored)):
        return type(st)(wrap(st.factors))  # pyright: ignore[reportArgumentType]
    return st
