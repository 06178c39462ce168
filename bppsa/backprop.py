"""``bppsa.rnn``: forward by ``lax.scan``, backward by BPPSA (a parallel scan) or by BPTT.

BPPSA backward (Wang, Bai, Pekhimenko, MLSys 2020): from the saved forward states, generate
every step's transposed Jacobian at once (parallel over T), solve the gradient recurrence
g_{t-1} = g_t @ M_t + c_{t-1} with a scan from :mod:`bppsa.scan` in Θ(log T) levels, then turn
all g_t into parameter and input gradients with one batched contraction. It is wrapped in
``jax.custom_vjp``, so ``jax.grad``/``value_and_grad``/``jit``/``vmap`` of any loss of the
returned states are exact. ``backward="bptt"`` is the plain ``lax.scan`` differentiated by JAX.
"""

from __future__ import annotations

import functools
import operator

import jax
import jax.numpy as jnp
from jax import lax

from . import cost as cost_lib
from . import scan as scan_lib
from .errors import UsageError

__all__ = ["rnn", "BACKWARDS", "PRECISIONS", "validate_precision", "bppsa_states", "forward_states", "validate_inputs", "validate_options",
           "validate_params", "scan_order", "root_and_offsets",
           "storage_inputs", "stored_jacobians", "stored_scan", "chunked_backward"]

BACKWARDS = ("bppsa", "bptt", "auto")
PRECISIONS = ("highest", "high", "default")  # jax.lax.Precision's members, by name


def forward_states(cell, params, xs, s0, unroll: int | None = None):
    """Flat-state forward: s0 (B, S), xs (T, B, I) -> ss (T, B, S), one ``lax.scan``; BPTT is its
    autodiff. ``unroll``: the scan's unroll factor; None (default) picks it for this shape and
    backend (:func:`bppsa.cost.bptt_unroll`, decided at trace time); 1 is the plain ``lax.scan``."""

    def body(s, x):
        s_new = cell.flatten_state(cell.step(params, cell.unflatten_state(s), x))
        return s_new, s_new

    if unroll is None:
        unroll = cost_lib.bptt_unroll(cell, xs.shape[0], xs.shape[1], xs.dtype, state_size=s0.shape[-1])
    _, ss = lax.scan(body, s0, xs, unroll=unroll)
    return ss


def storage_inputs(spr, xr, sr, ds):
    """The backward's scan-order (n, ...) inputs in the Blelloch scan's storage order: padding
    steps get copies of a real step (finite Jacobians; the scan replaces them by the identity)
    and zero offsets. Returns (spr, xr, sr, ds) with N rows (:func:`bppsa.scan.bottom_layout`)."""
    n = xr.shape[0]
    return (*(scan_lib.to_storage(a, n, pad="edge") for a in (spr, xr, sr)), scan_lib.to_storage(ds, n))


def stored_jacobians(cell, params, spr, xr, sr):
    """The Jacobians of storage-order steps for the Blelloch scan: the cell's diagonal structure
    ``(A, Wt)`` where it has one (:meth:`bppsa.cells.Cell.diagonal_jacobian`), else the
    (N, B, S, S) matrices."""
    if cell.has_diagonal_jacobian:
        return cell.diagonal_jacobian(params, spr, xr, sr)
    return cell.transposed_jacobian(params, spr, xr, sr)


def stored_scan(v, jacobians, ds, n):
    """The storage-order Blelloch scan of :func:`stored_jacobians`' output (ds zero-padded, as
    :func:`storage_inputs` makes it). Returns (prefixes in scan order, total)."""
    if isinstance(jacobians, tuple):
        return scan_lib.blelloch_scan_stored_diag(v, *jacobians, ds, n)
    return scan_lib.blelloch_scan_stored(v, jacobians, ds, n, zero_padded_offsets=True)


def _scan_gradients(cell, scan_method, params, xr, sr, spr, ds, v):
    """Generate the Jacobians of one stretch of steps (scan order) and scan them from root v.

    Returns (gs, total): gs[k] the gradient w.r.t. the state of element k, total the gradient
    the stretch's first step sends to the state before it. For the Blelloch scan the Jacobians
    are generated directly in the scan's storage order (:func:`bppsa.scan.to_storage` of the
    (n, B, S) state vectors, never of the (n, B, S, S) matrices), and for a cell with diagonal
    structure (the RNN) not at all: only its (A, Wt) factors (:func:`stored_jacobians`).
    """
    if scan_method == "blelloch":
        n = xr.shape[0]
        spr_p, xr_p, sr_p, ds_p = storage_inputs(spr, xr, sr, ds)
        return stored_scan(v, stored_jacobians(cell, params, spr_p, xr_p, sr_p), ds_p, n)
    Ms = cell.transposed_jacobian(params, spr, xr, sr)
    return scan_lib.scan(v, Ms, ds, scan_method)


def chunked_backward(cell, scan_method, chunk_size, params, xr, sr, spr, ctr):
    """BPPSA backward over chunks of ``chunk_size`` steps, latest chunk first (scan order).

    Each chunk generates only its own Jacobians (C, B, S, S), scans them with the gradient
    flowing in from the later chunks added to its root vector, and passes the scan's total
    (the gradient its first step sends to the previous state) on as the next chunk's carry.
    Peak memory is O(C·B·S²) instead of O(T·B·S²); the result is exact.

    xr (T, B, I), sr, spr, ctr (T, B, S) are in scan order (:func:`scan_order`). Returns
    (dparams, dxr (T, B, I) in scan order, g0 (B, S) the gradient w.r.t. the initial state).
    """
    T = xr.shape[0]

    def chunk(u, xr_c, sr_c, spr_c, ctr_c):
        v, ds = root_and_offsets(ctr_c)
        gs, total = _scan_gradients(cell, scan_method, params, xr_c, sr_c, spr_c, ds, v + u)
        dp, dx = cell.param_grads(params, spr_c, xr_c, sr_c, gs)
        return total, dp, dx

    n_full, rest = divmod(T, chunk_size)
    u = jnp.zeros_like(ctr[0])
    split = lambda a: a[:n_full * chunk_size].reshape((n_full, chunk_size) + a.shape[1:])

    def body(carry, c):
        u, acc = carry
        u, dp, dx = chunk(u, *c)
        return (u, jax.tree.map(jnp.add, acc, dp)), dx

    acc = jax.tree.map(jnp.zeros_like, params)
    (u, acc), dxr = jax.lax.scan(body, (u, acc), tuple(split(a) for a in (xr, sr, spr, ctr)))
    dxr = dxr.reshape((n_full * chunk_size,) + dxr.shape[2:])
    if rest:  # the earliest steps: one shorter chunk
        tail = slice(n_full * chunk_size, T)
        u, dp, dx = chunk(u, xr[tail], sr[tail], spr[tail], ctr[tail])
        acc = jax.tree.map(jnp.add, acc, dp)
        dxr = jnp.concatenate([dxr, dx], axis=0)
    return acc, dxr, u


def scan_order(xs, ss, s0, ct):
    """Time order -> scan order (latest step first), as every BPPSA backward needs it.

    xs (T, B, I), ss (T, B, S) the states after each step, s0 (B, S) the state before the first,
    ct (T, B, S) the cotangents of ss. Returns (xr, sr, spr, ctr), each reversed along time:
    element k is step T - k, ``spr[k]`` the state before it (``sr[k + 1]``, and s0 last).
    """
    spr = jnp.concatenate([ss[-2::-1], s0[None]], axis=0) if ss.shape[0] > 1 else s0[None]
    return xs[::-1], ss[::-1], spr, ct[::-1].astype(ss.dtype)


def root_and_offsets(ctr):
    """The scan's root vector v = ctr[0] (B, S) and offsets ds (n, B, S): element k adds ctr[k + 1]
    (the last element, the first step, adds nothing: the loss on s0 is not the cell's)."""
    return ctr[0], jnp.concatenate([ctr[1:], jnp.zeros_like(ctr[:1])], axis=0)


def _cast_grads(dparams, dxr, g0, params, xs, s0):
    dparams = jax.tree.map(lambda d, p: d.astype(p.dtype), dparams, params)
    return dparams, dxr[::-1].astype(xs.dtype), g0.astype(s0.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 6))
def bppsa_states(cell, scan_method, chunk_size, params, xs, s0, precision="highest"):
    """Flat-state forward (:func:`forward_states`: xs (T, B, I), s0 (B, S) -> ss (T, B, S)) whose
    VJP is the BPPSA backward with ``scan_method`` over chunks of ``chunk_size`` steps (an int,
    None: one chunk, or "auto": :func:`bppsa.cost.auto_chunk_size`), every matrix product of it
    at ``precision`` (a name from :data:`PRECISIONS`). ``cell``, ``scan_method``, ``chunk_size``
    and ``precision`` are static (hashable); inputs are not validated (see :func:`rnn`)."""
    return forward_states(cell, params, xs, s0)


def _bppsa_fwd(cell, scan_method, chunk_size, params, xs, s0, precision="highest"):
    ss = forward_states(cell, params, xs, s0)
    return ss, (params, xs, s0, ss)


def _bppsa_bwd(cell, scan_method, chunk_size, precision, res, ct):
    # Every dot traced in here (Jacobians, scan, parameter gradients) carries this precision.
    with jax.default_matmul_precision(precision):
        return _bppsa_backward(cell, scan_method, chunk_size, res, ct)


def _bppsa_backward(cell, scan_method, chunk_size, res, ct):
    params, xs, s0, ss = res
    xr, sr, spr, ctr = scan_order(xs, ss, s0, ct)
    T, B, S = ss.shape
    chunk = (cost_lib.auto_chunk_size(T, B, S, ss.dtype.itemsize,
                                      structured=scan_method == "blelloch" and cell.has_diagonal_jacobian)
             if chunk_size == "auto" else chunk_size)
    if chunk is not None and chunk < T:
        dparams, dxr, g0 = chunked_backward(cell, scan_method, chunk, params, xr, sr, spr, ctr)
        return _cast_grads(dparams, dxr, g0, params, xs, s0)
    v, ds = root_and_offsets(ctr)
    gs, g0 = _scan_gradients(cell, scan_method, params, xr, sr, spr, ds, v)  # gs[k] = g_{T-k}
    dparams, dxr = cell.param_grads(params, spr, xr, sr, gs)
    return _cast_grads(dparams, dxr, g0, params, xs, s0)


bppsa_states.defvjp(_bppsa_fwd, _bppsa_bwd)


def rnn(cell, params, xs, h0, *, backward: str = "bppsa", scan: str | None = None,
        chunk_size: int | str | None = "auto", cost_model=None, precision="highest"):
    """Run ``cell`` over a sequence on one device; differentiable w.r.t. ``params``, ``xs``, ``h0``.

    ``bppsa.rnn`` is this function, or with ``mesh=`` :func:`bppsa.parallel.rnn` (the time axis
    split over a device mesh).

    Args:
      cell: a cell from :mod:`bppsa.cells`.
      params: the cell's parameter pytree (``cell.init(key)``).
      xs: (T, B, I) inputs, time-major.
      h0: (B, H) initial state; for an LSTM the pair (h0, c0), each (B, H).
      backward: "bppsa" (parallel-scan backward), "bptt" (autodiff through ``lax.scan``, its
        unroll tuned per shape and backend: :func:`bppsa.cost.bptt_unroll`) or "auto"
        (:func:`bppsa.cost.choose_backward` picks tuned BPTT, BPPSA-blelloch or BPPSA-sequential
        for this cell, T, B, state size, dtype and backend).
      scan: the BPPSA scan: "blelloch", "associative" or "sequential" (see :mod:`bppsa.scan`).
        None (default): "blelloch", or with ``backward="auto"`` the scan the model chose. An
        explicit scan is kept: ``auto`` then decides BPTT or BPPSA, and BPPSA runs that scan.
      chunk_size: BPPSA only (ignored by BPTT): run the backward over chunks of this many steps
        (an int; numpy and JAX integer scalars are taken as ints),
        carrying the boundary gradient, so Jacobian memory is chunk_size·B·S² instead of T·B·S²
        (exact; None: one chunk). "auto" (default): on CPU, chunks whose Jacobians (for the RNN,
        whose Jacobians are never formed: its first-level products) fit in
        :data:`bppsa.cost.CHUNK_BYTES` (cache blocking, see :func:`bppsa.cost.auto_chunk_size`);
        on accelerators, one chunk.
      cost_model: ``backward="auto"`` only: the :class:`bppsa.cost.CostModel` that decides
        (None: the calibration cached for this device if there is one, else the model shipped
        with bppsa for this backend, :func:`bppsa.cost.default_cost_model`).
      precision: BPPSA only: the precision of every matrix product of the backward (Jacobians,
        scan, parameter gradients): "highest" (default: full float32), "high" or "default" (the
        backend's choice: TF32 on recent NVIDIA GPUs), or a ``jax.lax.Precision``. The long
        Jacobian chains of the scan are where reduced precision would show; no effect on CPU.

    Returns:
      The cell's state sequence: hs (T, B, H), hs[t] = h_{t+1}; for an LSTM the pair (hs, cs).
      ``cell.hidden(out)`` is hs (T, B, H) for every cell: use it where only hs is needed.

    Raises:
      bppsa.errors.UsageError (a ValueError), one line naming the argument and what was expected:
      unknown method names, a bad chunk_size, params that are not ``cell.param_spec``'s structure
      (a missing, extra or misshapen leaf), xs or h0 of the wrong shape or a non-float dtype, an h0
      whose dtype one step would change (h0 float32 with float64 params). See :func:`validate_inputs`.
    """
    chunk_size = validate_options(backward, scan, chunk_size)
    precision = validate_precision(precision)
    xs = jnp.asarray(xs)
    s0 = validate_inputs(cell, params, xs, h0)
    if backward == "auto":  # the model's scan only where the caller left scan at its default (None)
        backward, auto_scan = cost_lib.choose_backward(cell, xs.shape[0], xs.shape[1], xs.dtype,
                                                       cost_model=cost_model)
        scan = scan or auto_scan
    scan = scan or "blelloch"
    if backward == "bptt":
        ss = forward_states(cell, params, xs, s0)
    else:
        ss = bppsa_states(cell, scan, chunk_size, params, xs, s0, precision)
    return cell.unflatten_state(ss)


def validate_options(backward, scan, chunk_size):
    """Check :func:`rnn`'s method arguments; return ``chunk_size`` as an int, None or "auto"
    (a numpy or JAX integer scalar becomes an int; bools, floats and traced values are refused)."""
    if not (isinstance(backward, str) and backward in BACKWARDS):
        raise UsageError(f"backward must be one of {list(BACKWARDS)}; got {backward!r}")
    if scan is not None and not (isinstance(scan, str) and scan in scan_lib.SCANS):
        raise UsageError(f"scan must be one of {sorted(scan_lib.SCANS)} or None; got {scan!r}")
    if chunk_size is None or (isinstance(chunk_size, str) and chunk_size == "auto"):
        return chunk_size
    dtype = getattr(chunk_size, "dtype", None)
    if (isinstance(chunk_size, int) and not isinstance(chunk_size, bool)) or (
            dtype is not None and jnp.ndim(chunk_size) == 0 and jnp.issubdtype(dtype, jnp.integer)):
        try:
            n = operator.index(chunk_size)
        except TypeError:  # a traced value: the chunking is decided at trace time
            raise UsageError(f"chunk_size must be a concrete positive int (static under jit); "
                             f"got a traced {dtype} value") from None
        if n >= 1:
            return n
    raise UsageError(f"chunk_size must be a positive int, None or 'auto'; got {chunk_size!r}")


def validate_precision(precision) -> str:
    """Check :func:`rnn`'s ``precision``: a name from :data:`PRECISIONS` (any case) or a
    ``jax.lax.Precision``; return its lower-case name (static, hashable)."""
    if isinstance(precision, lax.Precision):
        return precision.name.lower()
    if isinstance(precision, str) and precision.lower() in PRECISIONS:
        return precision.lower()
    raise UsageError(f"precision must be one of {list(PRECISIONS)} or a jax.lax.Precision; got {precision!r}")


def validate_params(cell, params):
    """Check ``params`` against ``cell.param_spec`` (leaf paths and shapes, at trace time; nothing
    when the spec is None): a UsageError names the first leaf that is missing, extra or of another
    shape. Containers are compared by their leaves' paths only (a dict and a flax State with the
    same keys both pass)."""
    name = type(cell).__name__
    if params is None:
        raise UsageError(f"params must be {name}'s parameter pytree (cell.init(key)); got None")
    leaves = jax.tree_util.tree_leaves_with_path(params)
    dtypes = [jnp.result_type(leaf) for _, leaf in leaves]
    dtype = jnp.result_type(*dtypes) if dtypes and all(_is_float(d) for d in dtypes) else jnp.float32
    spec = cell.param_spec(dtype)
    if spec is None:
        return
    keystr = jax.tree_util.keystr
    want = {keystr(path): tuple(leaf.shape) for path, leaf in jax.tree_util.tree_leaves_with_path(spec)}
    got = {keystr(path): tuple(jnp.shape(leaf)) for path, leaf in leaves}
    if got and not set(got) & set(want):
        raise UsageError(f"params must be like {name}.init's output, a {type(spec).__name__} with "
                         f"{', '.join('params' + k for k in want)}; got a {type(params).__name__} with "
                         f"{', '.join('params' + k for k in got)}")
    for key, shape in want.items():
        if key not in got:
            raise UsageError(f"params{key} is missing: {name} expects a leaf of shape {shape} there "
                             f"(its params: {', '.join('params' + k for k in want)})")
    for key, shape in got.items():
        if key not in want:
            raise UsageError(f"params{key} (shape {shape}) is not a parameter of {name}; expected exactly "
                             f"{', '.join('params' + k for k in want)}")
        if shape != want[key]:
            raise UsageError(f"params{key} has shape {shape}; {name} expects {want[key]}")


def _is_float(x) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.floating)


def validate_inputs(cell, params, xs, h0):
    """Check params (:func:`validate_params`), shapes and dtypes; return the flat initial state
    s0 (B, S). Shape checks only: everything here runs at trace time."""
    name = type(cell).__name__
    validate_params(cell, params)
    if xs.ndim != 3:
        raise UsageError(f"xs must have shape (T, B, I) (rank 3); got rank {xs.ndim} with shape {xs.shape}")
    T, B, I = xs.shape
    if T == 0:
        raise UsageError(f"xs must have at least one time step (T >= 1); got shape {xs.shape}")
    if not _is_float(xs):
        raise UsageError(f"xs must have a floating dtype; got {xs.dtype}")
    if cell.input_size is not None and I != cell.input_size:
        raise UsageError(f"xs must have shape (T, B, I) with I = {name}.input_size = {cell.input_size}; "
                         f"got shape {xs.shape}")
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        if not _is_float(leaf):
            raise UsageError(f"params{jax.tree_util.keystr(path)} must have a floating dtype; "
                             f"got {jnp.result_type(leaf)}")
    H = cell.hidden_size
    expected = (B, H) if H is not None else (B, "H")
    if cell.pair_state and not (isinstance(h0, (tuple, list)) and len(h0) == 2):
        raise UsageError(f"h0 for {name} must be a pair (h0, c0) of (B, H) = {expected} arrays; got {type(h0).__name__}")
    h0 = tuple(h0) if cell.pair_state else h0
    parts = h0 if cell.pair_state else (h0,)
    for label, part in zip(("h0", "c0"), parts):
        if part is None:
            raise UsageError(f"{label} must be the initial state, a (B, H) = {expected} array "
                             f"(e.g. jnp.zeros); got None")
        part = jnp.asarray(part)
        if part.ndim != 2 or part.shape[0] != B or (H is not None and part.shape[1] != H):
            raise UsageError(f"{label} must have shape (B, H) = {expected} to match xs {xs.shape} and "
                             f"{name}.hidden_size; got {part.shape}")
        if not _is_float(part):
            raise UsageError(f"{label} must have a floating dtype; got {part.dtype}")
    h0 = jax.tree.map(jnp.asarray, h0)
    _check_step(cell, params, xs, h0)
    return cell.flatten_state(h0)


def _check_step(cell, params, xs, h0):
    """One step, traced only: it must return the state's shapes and dtypes (lax.scan needs it)."""
    name = type(cell).__name__
    out = jax.eval_shape(cell.step, params, h0, xs[0])
    parts, outs = jax.tree.leaves(jax.eval_shape(lambda h: h, h0)), jax.tree.leaves(out)
    if jax.tree.structure(out) != jax.tree.structure(h0) or any(o.shape != h.shape for o, h in zip(outs, parts)):
        raise UsageError(f"{name}.step must return the state's shape {[h.shape for h in parts]}; "
                         f"it returns {[o.shape for o in outs]} for h0 {[h.shape for h in parts]}")
    for label, o, h in zip(("h0", "c0"), outs, parts):
        if o.dtype != h.dtype and not h.weak_type:  # lax.scan promotes a weakly typed h0
            dtypes = [jnp.result_type(leaf) for leaf in jax.tree.leaves(params)]
            pdtype = jnp.result_type(*dtypes) if dtypes else None
            cause = (f"params' dtype {pdtype}" if pdtype is not None and pdtype != h.dtype
                     else f"xs' dtype {xs.dtype}")
            raise UsageError(f"{label} has dtype {h.dtype} but {name}.step turns it into {o.dtype} "
                             f"(from {cause}); pass {label} as {o.dtype}, or params and xs as {h.dtype}")
