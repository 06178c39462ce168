"""The one timed gradient: what every timing table of bppsa measures, for every method.

A training step's gradient, here of one fixed loss: a random readout of every step's hidden state, ::

    L(θ) = Σ_t Σ_b ⟨h_t[b], R_t[b]⟩ = jnp.vdot(cell.hidden(out), R),     R (T, B, H) ~ N(0, 1),

drawn once from a seed (:func:`readout`): a loss on every step, the general case of the paper's
recurrence g_{t-1} = J_tᵀ g_t + ∂ℓ_{t-1}/∂h_{t-1}. :func:`loss` is the one definition;
:func:`gradient_fn` is its gradient w.r.t. the parameters, forward included (what a training
loop runs); :func:`backward_functions` time the backward alone (the VJP of the forward at the
cotangent ∂L/∂out, what the cost model predicts). Methods, named the same in every table::

    bptt_unroll{u}  autodiff through ``lax.scan(..., unroll=u)`` over ``cell.step`` (u = 1: the
                    plain ``lax.scan``)
    bptt            ``bppsa.rnn(..., backward="bptt")``: the unroll :func:`bppsa.plan.rules.bptt_unroll` picks
    bppsa_{scan}    ``bppsa.rnn(..., backward="bppsa", scan=scan)``, scan in :data:`bppsa.scan.SCANS`
    auto            ``bppsa.rnn(..., backward="auto")``
    cudnn           PyTorch's cuDNN ``nn.RNN`` / ``nn.GRU`` / ``nn.LSTM`` on the same xs and R
                    (:func:`cudnn_function`; only where torch imports and has a CUDA device)

Shapes: xs (T, B, I), h0 (B, H) [LSTM: (h0, c0)], R (T, B, H). :func:`gradient_errors` is the one
float32-against-float64 gradient-error measurement, on the same loss.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from bppsa import backprop
from bppsa.cells import Cell
from bppsa.scan import SCANS

__all__ = ["loss", "readout", "problem", "out_cotangent", "forward_fn", "gradient_fn", "gradient_functions",
           "backward_functions", "forward_functions", "cudnn_function", "cudnn_parts", "gradient_errors",
           "method_names"]


def loss(cell: Cell, out: Any, R: jax.Array) -> jax.Array:
    """The one timed loss: out = what :func:`bppsa.rnn` returns (hs (T, B, H) [LSTM: (hs, cs)]),
    R (T, B, H) -> Σ ⟨cell.hidden(out), R⟩, a scalar."""
    return jnp.vdot(cell.hidden(out), R)


def readout(cell: Cell, T: int, B: int, dtype: Any = jnp.float32, seed: int = 0) -> jax.Array:
    """The fixed readout R (T, B, H) of :func:`loss`: standard normal from ``seed``."""
    return jax.random.normal(jax.random.fold_in(jax.random.key(seed), 1), (T, B, cell.hidden_size), dtype)


def problem(cell: Cell, T: int, B: int, *, dtype: Any = jnp.float32, seed: int = 0) -> tuple:
    """(params, xs (T, B, I), h0, R (T, B, H)) of one timed point: the cell's initialisation,
    bitstreams (p = 0.5) for input size 1 (the paper's RNN task) else standard normal inputs, a
    zero initial state and :func:`readout`'s R, all from ``seed``."""
    if cell.input_size is None:
        raise ValueError(f"problem needs the cell's input_size to draw xs; {type(cell).__name__} has none")
    kp, kx = jax.random.split(jax.random.key(seed))
    params = cell.init(kp, dtype)
    shape = (T, B, cell.input_size)
    xs = (jax.random.bernoulli(kx, 0.5, shape).astype(dtype) if cell.input_size == 1
          else jax.random.normal(kx, shape, dtype))
    h0 = cell.unflatten_state(jnp.zeros((B, cell.state_size), dtype))
    return params, xs, h0, readout(cell, T, B, dtype, seed)


def out_cotangent(cell: Cell, R: jax.Array) -> Any:
    """∂L/∂out of :func:`loss` (L is linear in out): R in the hidden slot, zeros elsewhere, in the
    structure of :func:`bppsa.rnn`'s output."""
    zeros = cell.unflatten_state(jnp.zeros(R.shape[:2] + (cell.state_size,), R.dtype))
    return jax.grad(lambda o: loss(cell, o, R))(zeros)


def method_names(*, unrolls: Iterable[int] = (), tuned: bool = True, scans: Iterable[str] = ("blelloch",)) -> tuple:
    """The method names of the module docstring for these unrolls, tuned BPTT and BPPSA scans."""
    return tuple(f"bptt_unroll{u}" for u in unrolls) + (("bptt",) if tuned else ()) + \
        tuple(f"bppsa_{s}" for s in scans)


def _plain_scan(cell, params, xs, h0, unroll):
    def body(h, x):
        h = cell.step(params, h, x)
        return h, h
    return lax.scan(body, h0, xs, unroll=unroll)[1]


def forward_fn(cell: Cell, method: str, **opts: Any) -> Callable:
    """``f(params, xs, h0) -> out`` of ``method`` (a name of the module docstring but cudnn);
    ``opts`` go to :func:`bppsa.rnn` (chunk_size, precision, cost_model) for bptt, bppsa_*, auto."""
    if method.startswith("bptt_unroll"):
        u = method[len("bptt_unroll"):]
        if not u.isdigit() or int(u) < 1:
            raise ValueError(f"method {method!r}: the unroll after 'bptt_unroll' must be a positive int")
        return functools.partial(_plain_scan, cell, unroll=int(u))
    if method in ("bptt", "auto"):
        kw = {"backward": method}
    elif method.startswith("bppsa_") and method[len("bppsa_"):] in SCANS:
        kw = {"backward": "bppsa", "scan": method[len("bppsa_"):]}
    else:
        raise ValueError(f"method must be 'bptt', 'auto', 'bptt_unroll<u>' or one of "
                         f"{['bppsa_' + s for s in SCANS]}; got {method!r}")
    return lambda p, x, h: backprop.rnn(cell, p, x, h, **kw, **opts)


def gradient_fn(cell: Cell, method: str, **opts: Any) -> Callable:
    """The timed gradient: jitted ``g(params, xs, h0, R) -> ∂L/∂params`` of :func:`loss`, forward included."""
    fwd = forward_fn(cell, method, **opts)
    return jax.jit(jax.grad(lambda p, x, h, R: loss(cell, fwd(p, x, h), R)))


def gradient_functions(cell: Cell, params: Any, xs: jax.Array, h0: Any, R: jax.Array, methods: Iterable[str],
                       **opts: Any) -> dict[str, Callable]:
    """``{method: zero-argument function}`` running :func:`gradient_fn` on these arrays."""
    return {m: functools.partial(gradient_fn(cell, m, **opts), params, xs, h0, R) for m in methods}


_apply = jax.jit(lambda f, c: f(c))


def backward_functions(cell: Cell, params: Any, xs: jax.Array, h0: Any, R: jax.Array, methods: Iterable[str],
                       **opts: Any) -> dict[str, Callable]:
    """``{method: zero-argument function}``: the backward alone, i.e. the VJP of the method's
    forward at ∂L/∂out (:func:`out_cotangent`), w.r.t. (params, xs, h0); the forward runs once here."""
    ct = out_cotangent(cell, R)
    fns = {}
    for m in methods:
        _, vjp = jax.vjp(forward_fn(cell, m, **opts), params, xs, h0)
        fns[m] = functools.partial(_apply, vjp, ct)
    return fns


def forward_functions(cell: Cell, params: Any, xs: jax.Array, h0: Any, methods: Iterable[str],
                      **opts: Any) -> dict[str, Callable]:
    """``{method: zero-argument function}``: the forward alone, jitted, of each method's program.

    Args:
      cell: the cell.
      params, xs, h0: the arrays of :func:`problem`.
      methods: names of the module docstring but cudnn (bptt_unroll{u} runs ``lax.scan``; bptt,
        bppsa_* and auto run :func:`bppsa.rnn`'s primal forward: its sequential forward, or the
        fused kernel with ``kernels=``).
      **opts: options of :func:`bppsa.rnn` (e.g. ``kernels``), as :func:`forward_fn` takes them.

    Returns:
      ``{method: f}`` with ``f()`` running ``jax.jit(forward_fn(cell, method, **opts))(params, xs, h0)``.
    """
    return {m: functools.partial(jax.jit(forward_fn(cell, m, **opts)), params, xs, h0) for m in methods}


def cudnn_parts(cell: Cell, xs: jax.Array, R: jax.Array) -> dict[str, Callable] | None:
    """PyTorch's cuDNN training step split: ``{"step", "forward", "backward"}`` zero-argument functions.

    ``step`` is :func:`cudnn_function`'s forward + backward; ``forward`` the forward with autograd
    recording (as a training step runs it, cuDNN's training kernels); ``backward`` only
    ``loss.backward(retain_graph=True)`` of one forward run here, the graph kept between calls.
    Each synchronises CUDA before it returns.

    Args:
      cell: an RNN, GRU or LSTM cell (others: None).
      xs: inputs (T, B, I).
      R: the readout (T, B, H).

    Returns:
      The dict, or None where :func:`cudnn_function` is None (no torch, no CUDA, no counterpart).
    """
    step = cudnn_function(cell, xs, R)
    if step is None:
        return None
    import torch  # pyright: ignore[reportMissingImports] -- present: cudnn_function found it

    kind = type(cell).__name__
    kw = {"nonlinearity": getattr(cell, "nonlinearity")} if kind == "RNN" and hasattr(cell, "nonlinearity") else {}
    x = torch.from_numpy(np.array(xs)).to("cuda")
    r = torch.from_numpy(np.array(R)).to("cuda")
    mod = getattr(torch.nn, kind)(cell.input_size, cell.hidden_size, **kw).to("cuda", x.dtype)

    def forward():
        out, _ = mod(x)
        loss = (out * r).sum()
        torch.cuda.synchronize()
        return loss

    graph = [forward()]  # the one forward whose graph the backward replays

    def backward():
        mod.zero_grad(set_to_none=True)
        graph[0].backward(retain_graph=True)
        torch.cuda.synchronize()
        return ()

    return {"step": step, "forward": lambda: (forward(), ())[1], "backward": backward}


def cudnn_function(cell: Cell, xs: jax.Array, R: jax.Array) -> Callable | None:
    """A zero-argument function running PyTorch's cuDNN forward and backward of :func:`loss` on
    the same xs (T, B, I) and R (T, B, H) (``nn.RNN`` / ``nn.GRU`` / ``nn.LSTM`` of the cell's
    sizes, its own weights), or None when torch does not import, has no CUDA device, or the cell
    has no cuDNN counterpart."""
    kind = {"RNN": "RNN", "GRU": "GRU", "LSTM": "LSTM"}.get(type(cell).__name__)
    if kind is None:
        return None
    try:
        import torch  # pyright: ignore[reportMissingImports] -- optional dependency, absent in the lint env
        if not torch.cuda.is_available():
            return None
    except Exception:  # noqa: BLE001 -- optional: any import failure means no cuDNN baseline
        return None
    kw = {"nonlinearity": getattr(cell, "nonlinearity")} if kind == "RNN" and hasattr(cell, "nonlinearity") else {}
    x = torch.from_numpy(np.array(xs)).to("cuda")
    r = torch.from_numpy(np.array(R)).to("cuda")
    mod = getattr(torch.nn, kind)(cell.input_size, cell.hidden_size, **kw).to("cuda", x.dtype)

    def run():
        mod.zero_grad(set_to_none=True)
        out, _ = mod(x)
        (out * r).sum().backward()
        torch.cuda.synchronize()
        return ()

    return run


def _flat(tree):
    return np.concatenate([np.ravel(np.asarray(a, np.float64)) for a in jax.tree.leaves(tree)])


def _max_rel(a, ref) -> float:
    return float(np.max(np.abs(a - ref)) / np.max(np.abs(ref)))


def gradient_errors(cell: Cell, T: int, B: int, variants: dict, *, pairs: Iterable[tuple[str, str]] = (),
                    seed: int = 0) -> dict[str, float]:
    """Float32 parameter-gradient errors of :func:`loss` against float64 autodiff through the
    plain ``lax.scan`` (``bptt_unroll1``), on :func:`problem`'s float64 data cast to float32.

    ``variants``: ``{label: (method, opts)}`` with opts for :func:`forward_fn`, plus an optional
    ``"matmul_precision"`` run under ``jax.default_matmul_precision``. ``pairs``: (label, label)
    whose float32 gradients are also compared with each other. Error = ``max |g − g_ref| / max |g_ref|``
    over all parameters. Returns ``{label: error, "a vs b": error}``. Needs ``jax_enable_x64``.
    """
    if not jax.config.jax_enable_x64:  # pyright: ignore[reportAttributeAccessIssue] -- JAX sets options dynamically
        raise ValueError("gradient_errors needs float64: set jax_enable_x64 first")
    p64, xs64, h64, R64 = problem(cell, T, B, dtype=jnp.float64, seed=seed)
    ref = _flat(gradient_fn(cell, "bptt_unroll1")(p64, xs64, h64, R64))
    p32, xs32, h32, R32 = jax.tree.map(lambda a: a.astype(jnp.float32), (p64, xs64, h64, R64))
    grads, out = {}, {}
    for label, (method, opts) in variants.items():
        opts = dict(opts)
        prec = opts.pop("matmul_precision", None)
        with jax.default_matmul_precision(prec) if prec else contextlib.nullcontext():
            grads[label] = _flat(gradient_fn(cell, method, **opts)(p32, xs32, h32, R32))
        out[label] = _max_rel(grads[label], ref)
    for a, b in pairs:
        out[f"{a} vs {b}"] = _max_rel(grads[a], grads[b])
    return out

