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

import jax
import jax.numpy as jnp
from jax import lax

from . import cells as cells_lib
from . import scan as scan_lib

__all__ = ["rnn", "BACKWARDS", "choose_backward", "auto_chunk_size", "has_diagonal_jacobian",
           "CHUNK_BYTES"]

# chunk_size="auto" on CPU: chunks whose Jacobians take at most this many bytes, so that each
# chunk's scan works in cache. Measured (RNN H = 20, 2-core CPU, BPPSA backward, min of 7):
# T = 30 000, B = 1: one chunk 48.8 ms, chunks of 2048 / 4096 / 8192 steps 15.3 / 14.9 / 16.7 ms
# (BPTT 20.5 ms); T = 3000, B = 16: 70.2 ms -> 22.8 ms with chunks of 256
# (experiments/results/cpu/scan-optimisation.md). 8 MiB is 5120 steps at B = 1, 320 at B = 16.
# The RNN (diagonal structure, no Jacobians formed) is far less sensitive: T = 30 000, B = 1, median
# of 11: one chunk 13.1 ms, chunks of 4096 / 8192 / 16384 steps 12.8 / 13.4 / 13.0 ms; its chunks are
# sized by its largest array, the first level's products (half the Jacobians' bytes).
CHUNK_BYTES = 8 << 20

BACKWARDS = ("bppsa", "bptt", "auto")


def choose_backward(cell, T: int, B: int, dtype=None) -> str:
    """The method ``backward="auto"`` uses for this problem: "bppsa" or "bptt".

    By default: the calibrated cost model of :mod:`bppsa.bench` when one is cached for this
    device (``bppsa bench`` or ``bppsa.bench.load_cost_model()`` probes and caches it), else BPTT.
    :func:`set_auto_policy` installs any other policy.
    """
    return _AUTO_POLICY(cell, T, B, dtype)


_CACHED_MODEL = []  # [model or None], looked up once per process


def _default_policy(cell, T, B, dtype):
    if not _CACHED_MODEL:
        from .bench import cached_cost_model
        _CACHED_MODEL.append(cached_cost_model())
    model = _CACHED_MODEL[0]
    return "bptt" if model is None else model.choose(cell, T, B, dtype)


_AUTO_POLICY = _default_policy


def set_auto_policy(policy):
    """Install ``policy(cell, T, B, dtype) -> "bppsa" | "bptt"`` for ``backward="auto"``.

    Returns the previous policy, so callers can restore it.
    """
    global _AUTO_POLICY
    previous, _AUTO_POLICY = _AUTO_POLICY, policy
    return previous


def _forward(cell, params, xs, s0):
    """Flat-state forward: s0 (B, S), xs (T, B, I) -> ss (T, B, S)."""

    def body(s, x):
        s_new = cell.flatten_state(cell.step(params, cell.unflatten_state(s), x))
        return s_new, s_new

    _, ss = lax.scan(body, s0, xs)
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
    diag = cell.diagonal_jacobian(params, spr, xr, sr) if has_diagonal_jacobian(cell) else None
    return diag if diag is not None else cell.transposed_jacobian(params, spr, xr, sr)


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


def _chunked_bwd(cell, scan_method, chunk_size, params, xr, sr, spr, ctr):
    """BPPSA backward over chunks of ``chunk_size`` steps, latest chunk first (scan order).

    Each chunk generates only its own Jacobians (C, B, S, S), scans them with the gradient
    flowing in from the later chunks added to its root vector, and passes the scan's total
    (the gradient its first step sends to the previous state) on as the next chunk's carry.
    Peak memory is O(C·B·S²) instead of O(T·B·S²); the result is exact.
    """
    T = xr.shape[0]

    def chunk(u, xr_c, sr_c, spr_c, ctr_c):
        ds = jnp.concatenate([ctr_c[1:], jnp.zeros_like(ctr_c[:1])], axis=0)
        gs, total = _scan_gradients(cell, scan_method, params, xr_c, sr_c, spr_c, ds, ctr_c[0] + u)
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


def auto_chunk_size(T: int, B: int, S: int, itemsize: int, backend: str | None = None,
                    structured: bool = False) -> int | None:
    """The chunk length ``chunk_size="auto"`` uses: None (one chunk) off CPU or when everything
    fits in :data:`CHUNK_BYTES`; else the largest length of the form m·2^k (32 <= m < 64, so the
    Blelloch scan pads nothing) whose largest array fits in it, at least 64: the (B, S, S)
    Jacobians per step, or for a cell with diagonal structure (``structured``, see
    :func:`has_diagonal_jacobian`) half of that, the first level's products (its Jacobians are
    never formed).

    Decided when the backward is traced, from ``jax.default_backend()`` (not the placement of the
    arrays) and the shapes the backward sees (per example under ``vmap``).
    """
    if (backend or jax.default_backend()) != "cpu":
        return None
    per_step = B * S * S * itemsize
    if structured:
        per_step = max(1, per_step // 2)
    if T * per_step <= CHUNK_BYTES:
        return None
    c = max(64, CHUNK_BYTES // per_step)
    k, m, _ = scan_lib.bottom_layout(c)
    c = max(64, (c >> k) << k)  # m·2^k steps: the Blelloch scan needs no padding in a full chunk
    return None if c >= T else int(c)


def has_diagonal_jacobian(cell) -> bool:
    """Whether ``cell`` provides :meth:`bppsa.cells.Cell.diagonal_jacobian` (M_t = diag(A_t) @ Wt),
    which the Blelloch backward then uses instead of forming the matrices."""
    return getattr(type(cell), "diagonal_jacobian", None) not in (None, cells_lib.Cell.diagonal_jacobian)


@functools.lru_cache(maxsize=None)
def _bppsa_fn(cell, scan_method, chunk_size="auto"):
    """The custom-VJP flat-state RNN for one (cell, scan, chunk_size) (cached: cells are hashable)."""

    @jax.custom_vjp
    def run(params, xs, s0):
        return _forward(cell, params, xs, s0)

    def fwd(params, xs, s0):
        ss = _forward(cell, params, xs, s0)
        return ss, (params, xs, s0, ss)

    def bwd(res, ct):
        params, xs, s0, ss = res
        # Everything in scan order (latest step first): element k is step T - k.
        xr = xs[::-1]
        sr = ss[::-1]
        spr = jnp.concatenate([ss[-2::-1], s0[None]], axis=0) if ss.shape[0] > 1 else s0[None]
        ctr = ct[::-1].astype(ss.dtype)
        T, B, S = ss.shape
        chunk = (auto_chunk_size(T, B, S, ss.dtype.itemsize,
                                 structured=scan_method == "blelloch" and has_diagonal_jacobian(cell))
                 if chunk_size == "auto" else chunk_size)
        if chunk is not None and chunk < T:
            dparams, dxr, g0 = _chunked_bwd(cell, scan_method, chunk, params, xr, sr, spr, ctr)
            dparams = jax.tree.map(lambda d, p: d.astype(p.dtype), dparams, params)
            return dparams, dxr[::-1].astype(xs.dtype), g0.astype(s0.dtype)
        ds = jnp.concatenate([ctr[1:], jnp.zeros_like(ctr[:1])], axis=0)
        gs, g0 = _scan_gradients(cell, scan_method, params, xr, sr, spr, ds, ctr[0])  # gs[k] = g_{T-k}
        dparams, dxr = cell.param_grads(params, spr, xr, sr, gs)
        dparams = jax.tree.map(lambda d, p: d.astype(p.dtype), dparams, params)
        return dparams, dxr[::-1].astype(xs.dtype), g0.astype(s0.dtype)

    run.defvjp(fwd, bwd)
    return run


def rnn(cell, params, xs, h0, *, backward: str = "bppsa", scan: str = "blelloch",
        mesh=None, seq_axis: str = "seq", batch_axis: str | None = None,
        chunk_size: int | str | None = "auto"):
    """Run ``cell`` over a sequence; differentiable w.r.t. ``params``, ``xs`` and ``h0``.

    Args:
      cell: a cell from :mod:`bppsa.cells`.
      params: the cell's parameter pytree (``cell.init(key)``).
      xs: (T, B, I) inputs, time-major.
      h0: (B, H) initial state; for an LSTM the pair (h0, c0), each (B, H).
      backward: "bppsa" (parallel-scan backward), "bptt" (autodiff through ``lax.scan``) or
        "auto" (:func:`choose_backward` picks one for this cell, T and B).
      scan: the BPPSA scan: "blelloch", "associative" or "sequential" (see :mod:`bppsa.scan`).
      mesh: a ``jax.sharding.Mesh``: split the time axis over ``mesh[seq_axis]`` (and the batch
        over ``mesh[batch_axis]``), see :mod:`bppsa.parallel`; None runs on one device.
      chunk_size: BPPSA only (ignored by BPTT): run the backward over chunks of this many steps,
        carrying the boundary gradient, so Jacobian memory is chunk_size·B·S² instead of T·B·S²
        (exact; None: one chunk). "auto" (default): on CPU, chunks whose Jacobians (for the RNN,
        whose Jacobians are never formed: its first-level products) fit in :data:`CHUNK_BYTES`
        (cache blocking, see :func:`auto_chunk_size`); on accelerators, one
        chunk. An int cannot be combined with ``mesh``; with ``mesh`` each device scans its
        stretch in one piece with the reference up/down-sweep of :mod:`bppsa.parallel`.

    Returns:
      hs: (T, B, H), hs[t] = h_{t+1}; for an LSTM the pair (hs, cs).
    """
    if backward not in BACKWARDS:
        raise ValueError(f"backward must be one of {list(BACKWARDS)}; got {backward!r}")
    if scan not in scan_lib.SCANS:
        raise ValueError(f"scan must be one of {sorted(scan_lib.SCANS)}; got {scan!r}")
    if chunk_size is not None and not (isinstance(chunk_size, str) and chunk_size == "auto") and (
            not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1):
        raise ValueError(f"chunk_size must be a positive int, None or 'auto'; got {chunk_size!r}")
    xs = jnp.asarray(xs)
    s0 = _validate(cell, params, xs, h0)
    if backward == "auto":
        backward = choose_backward(cell, xs.shape[0], xs.shape[1], xs.dtype)
    if mesh is not None and chunk_size not in (None, "auto"):
        raise ValueError(f"chunk_size={chunk_size!r} cannot be combined with mesh (the sharded scan "
                         "already splits the sequence); pass one of them")
    if mesh is not None:
        from .parallel.sequence import sequence_parallel_states
        ss = sequence_parallel_states(cell, params, xs, s0, mesh, seq_axis=seq_axis, batch_axis=batch_axis,
                                      backward=backward, scan=scan)
    elif backward == "bptt":
        ss = _forward(cell, params, xs, s0)
    else:
        ss = _bppsa_fn(cell, scan, chunk_size)(params, xs, s0)
    return cell.unflatten_state(ss)


def _is_float(x) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.floating)


def _validate(cell, params, xs, h0):
    """Check shapes and dtypes; return the flat initial state s0 (B, S)."""
    name = type(cell).__name__
    if xs.ndim != 3:
        raise ValueError(f"xs must have shape (T, B, I) (rank 3); got rank {xs.ndim} with shape {xs.shape}")
    T, B, I = xs.shape
    if T == 0:
        raise ValueError(f"xs must have at least one time step (T >= 1); got shape {xs.shape}")
    if not _is_float(xs):
        raise ValueError(f"xs must have a floating dtype; got {xs.dtype}")
    if cell.input_size is not None and I != cell.input_size:
        raise ValueError(f"xs must have shape (T, B, I) with I = {name}.input_size = {cell.input_size}; "
                         f"got shape {xs.shape}")
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        if not _is_float(leaf):
            raise ValueError(f"params{jax.tree_util.keystr(path)} must have a floating dtype; "
                             f"got {jnp.result_type(leaf)}")
    H = cell.hidden_size
    parts = h0 if isinstance(cell_state_template(cell), tuple) else (h0,)
    if isinstance(cell_state_template(cell), tuple) and not (isinstance(h0, (tuple, list)) and len(h0) == 2):
        raise ValueError(f"h0 for {name} must be a pair (h0, c0) of (B, H) = {(B, H)} arrays; got {type(h0).__name__}")
    for label, part in zip(("h0", "c0"), parts):
        part = jnp.asarray(part)
        expected = (B, H) if H is not None else (B, "H")
        if part.ndim != 2 or part.shape[0] != B or (H is not None and part.shape[1] != H):
            raise ValueError(f"{label} must have shape (B, H) = {expected} to match xs {xs.shape} and "
                             f"{name}.hidden_size; got {part.shape}")
        if not _is_float(part):
            raise ValueError(f"{label} must have a floating dtype; got {part.dtype}")
    return cell.flatten_state(jax.tree.map(jnp.asarray, tuple(h0) if isinstance(h0, list) else h0))


def cell_state_template(cell):
    """() for cells whose state is one array, a tuple for cells with a pair state (LSTM)."""
    from .cells import LSTM
    return (None, None) if isinstance(cell, LSTM) else None
