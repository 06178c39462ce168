"""A multi-process self-check: the sequence-parallel gradients of a small RNN, saved by process 0. ::

    bppsa launch -n 2 --devices-per-process 2 -- python -m bppsa.parallel.selfcheck --out grads.npz

Each process builds the same float64 problem (:func:`problem`), joins the job
(:func:`bppsa.parallel.initialize`; a plain single process works too), splits the time axis over
every device of every process and computes ``jax.grad`` of a loss at every step w.r.t. params,
xs and h0. The tests compare the saved arrays with autodiff through ``lax.scan`` in one process.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["problem", "loss_of_states", "main"]

CELLS = ("rnn", "gru", "lstm")


def problem(cell_name: str = "gru", T: int = 7, B: int = 2, I: int = 3, H: int = 4, seed: int = 0) -> tuple:
    """(cell, params, xs (T, B, I), h0) as float64 NumPy arrays, the same in every process.

    Args:
      cell_name: "rnn", "gru" (default) or "lstm".
      T: steps.
      B: batch size.
      I: input size.
      H: hidden size.
      seed: the NumPy random seed.

    Returns:
      The tuple (cell, params, xs, h0): the :mod:`bppsa.cells` cell, its params (W_x (I, G·H), W_h (H, G·H),
      b_x and b_h (G·H,)), xs (T, B, I) and h0 (B, H) (the LSTM: the pair (h0, c0), each (B, H)).

    Raises:
      ValueError: ``cell_name`` is not one of the three.
    """
    from bppsa import cells
    if cell_name not in CELLS:
        raise ValueError(f"cell must be one of {CELLS}; got {cell_name!r}")
    cell = cells.BUILTIN[cell_name](I, H)
    rng = np.random.default_rng(seed)
    G = cell.gates * H
    params = {"W_x": rng.normal(0, 0.5, (I, G)), "W_h": rng.normal(0, 0.5, (H, G)),
              "b_x": rng.normal(0, 0.1, (G,)), "b_h": rng.normal(0, 0.1, (G,))}
    xs = rng.normal(0, 1, (T, B, I))
    h0 = rng.normal(0, 0.5, (B, H))
    if cell_name == "lstm":
        h0 = (h0, rng.normal(0, 0.5, (B, H)))
    return cell, params, xs, h0


def loss_of_states(cell: Any, states: Any) -> Any:
    """A loss at every step of the hidden states h = ``cell.hidden(states)``: Σ_t Σ_b Σ_i w_i sin(h_t[b, i]).

    Args:
      cell: the cell that computed ``states``.
      states: what :func:`bppsa.rnn` returns for it, hs (T, B, H) [LSTM: the pair (hs, cs)].

    Returns:
      The scalar loss, with weights w_i = i (i = 1 … H).
    """
    import jax.numpy as jnp
    h = cell.hidden(states)
    return jnp.sum(jnp.sin(h) * jnp.arange(1, h.shape[-1] + 1, dtype=h.dtype))


def main(argv: Sequence[str] | None = None) -> int:
    """The self-check: join the job, compute the gradients of :func:`loss_of_states` over the mesh of
    every process's devices, and save them (process 0) with the loss.

    Args:
      argv: the command line (default ``sys.argv[1:]``): ``--out`` the .npz file process 0 writes,
        ``--cell``, ``--T``, ``--B``, ``--combine`` and ``--init-timeout`` (seconds to wait for the peers).

    Returns:
      0 (a failure raises).
    """
    ap = argparse.ArgumentParser(prog="python -m bppsa.parallel.selfcheck", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--out", required=True, help="where process 0 writes the gradients (.npz)")
    ap.add_argument("--cell", default="gru", choices=CELLS)
    ap.add_argument("--T", type=int, default=7)
    ap.add_argument("--B", type=int, default=2)
    ap.add_argument("--combine", default="auto")
    ap.add_argument("--init-timeout", type=int, default=None, help="seconds to wait for the peers")
    args = ap.parse_args(argv)

    import jax
    jax.config.update("jax_enable_x64", True)
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding, PartitionSpec

    from bppsa.parallel import initialize, make_mesh, rnn

    joined = initialize(timeout=args.init_timeout)
    mesh = make_mesh(batch_axis=None)
    cell, params, xs, h0 = problem(args.cell, args.T, args.B)
    rep = NamedSharding(mesh, PartitionSpec())
    put = lambda a: jax.make_array_from_callback(a.shape, rep, lambda idx: a[idx])  # noqa: E731
    params, xs, h0 = jax.tree.map(put, (params, xs, h0))

    def loss(p, x, h):
        return loss_of_states(cell, rnn(cell, p, x, h, mesh=mesh, combine=args.combine))

    value, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(params, xs, h0)
    flat = jax.tree_util.tree_flatten_with_path(grads)[0]
    arrays: dict[str, Any] = {jax.tree_util.keystr(k): np.asarray(multihost_utils.process_allgather(v, tiled=True))
              for k, v in flat}
    value = float(np.asarray(multihost_utils.process_allgather(value, tiled=True)).reshape(-1)[0])
    print(f"process {jax.process_index()}/{jax.process_count()} (joined: {joined}): "
          f"{jax.device_count()} devices, {jax.local_device_count()} local, loss {value:.12g}", flush=True)
    if jax.process_index() == 0:
        np.savez(args.out, loss=np.array(value), **arrays)
    return 0


if __name__ == "__main__":
    sys.exit(main())
