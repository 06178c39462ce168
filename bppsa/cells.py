"""Recurrent cells with analytic transposed Jacobians (BPPSA, Wang et al., MLSys 2020, §3–4).

A cell is a small frozen dataclass (hashable, so it can key compiled functions) with

    init(key, dtype=float32) -> params                  a pytree of arrays
    param_spec(dtype=float32) -> spec                   its shapes (jax.ShapeDtypeStruct), or None
    step(params, h, x) -> h'                            h: (B, H) [LSTM: (h, c)], x: (B, I)

and the two batched pieces BPPSA needs, both over all T steps at once, on the *flat* state
s (B, S) (S = H; LSTM: S = 2H with s = [h, c]):

    transposed_jacobian(params, s_prev, xs, s) -> Ms    s_prev, s: (T, B, S), xs: (T, B, I)
        Ms: (T, B, S, S), the matrix M_t with g_{t-1} = g_t @ M_t (row vectors): the paper's
        Jᵀ acting on column vectors, i.e. M_t[b, i, j] = ∂s_t[b, i] / ∂s_{t-1}[b, j].
    diagonal_jacobian(params, s_prev, xs, s) -> (A, Wt) or None
        optional structure M_t = diag(A_t) @ Wt with one shared Wt (the RNN has it), which the
        Blelloch scan uses to avoid forming the matrices; None where there is none.
    param_grads(params, s_prev, xs, s, gs) -> (dparams, dxs)
        gs: (T, B, S) the total gradient ∂L/∂s_t; the contraction of the per-step gradients of
        the pre-activations with x_t and s_{t-1}, one einsum over (t, b).

:class:`Cell` writes the contract down (abstract methods) and answers the questions callers
used to ask with type checks: ``gates`` (G, the per-step width), ``pair_state`` (the LSTM's
(h, c)), ``has_diagonal_jacobian``, and ``hidden(states)``, the (T, B, H) hidden states of what
:func:`bppsa.rnn` returns.

Row convention throughout: a step computes ``x @ W_x + h @ W_h``, W_x: (I, G), W_h: (H, G). GRU
and LSTM use PyTorch's gate order (r, z, n) and (i, f, g, o). The arrays passed to the batched
methods may be in any time order (BPPSA passes them latest step first); they only have to agree.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp

from .errors import UsageError

__all__ = ["Cell", "RNN", "GRU", "LSTM", "Generic"]


def _uniform(key, shape, bound, dtype):
    return jax.random.uniform(key, shape, dtype, -bound, bound)


class Cell(abc.ABC):
    """The contract every cell meets. Shapes: B batch, I input, H hidden, S = flat state size
    (S = H; LSTM: S = 2H with s = [h, c]), T steps (in any order, as long as the arrays agree).

    Subclasses are frozen dataclasses (hashable: :func:`bppsa.backprop.rnn` passes them as a
    static argument of its custom VJP). :meth:`param_spec` is the structure ``params`` must have
    (:func:`bppsa.backprop.validate_inputs` names any leaf that is missing, extra or of another
    shape); its default traces :meth:`init`, so a cell that implements ``init`` is checked.
    """

    input_size: int | None
    hidden_size: int

    @abc.abstractmethod
    def init(self, key, dtype=jnp.float32):
        """The parameter pytree for ``key``."""

    def param_spec(self, dtype=jnp.float32):
        """The parameter structure :func:`bppsa.rnn` checks ``params`` against (shapes and keys,
        at trace time): a pytree of ``jax.ShapeDtypeStruct`` like :meth:`init`'s output, or None
        (not checked). The default traces :meth:`init` without computing it, so a subclass that
        implements ``init`` gets the check for free; override it where ``init`` cannot be traced."""
        return jax.eval_shape(lambda key: self.init(key, dtype), jax.random.key(0))

    @abc.abstractmethod
    def step(self, params, h, x):
        """One step: h (B, H) [LSTM: (h, c)], x (B, I) -> the next state, same structure as h."""

    @abc.abstractmethod
    def transposed_jacobian(self, params, s_prev, xs, s):
        """s_prev, s: (T, B, S), xs: (T, B, I) -> Ms (T, B, S, S) with g_{t-1} = g_t @ M_t,
        M_t[b, i, j] = ∂s_t[b, i] / ∂s_{t-1}[b, j]."""

    @abc.abstractmethod
    def param_grads(self, params, s_prev, xs, s, gs):
        """gs (T, B, S) = ∂L/∂s_t -> (dparams, dxs (T, B, I)), summed over t and b."""

    def diagonal_jacobian(self, params, s_prev, xs, s):
        """Optional structure of the transposed Jacobian: ``(A, Wt)`` with A (T, B, S) and
        M_t[b] = diag(A[t, b]) @ Wt for one shared (S, S) matrix Wt, or None (the default: no
        such structure). The Blelloch scan uses it to skip forming the (T, B, S, S) matrices
        (:func:`bppsa.scan.blelloch_scan_stored_diag`); see :attr:`has_diagonal_jacobian`."""
        return None

    @property
    def has_diagonal_jacobian(self) -> bool:
        """Whether :meth:`diagonal_jacobian` returns the structure (False by default)."""
        return False

    #: Gate count G (pre-activations per step are G·H wide): the per-step work scales with it.
    gates: ClassVar[int] = 1
    #: Whether the state is a pair (h, c) of (B, H) arrays (LSTM) rather than one array.
    pair_state: ClassVar[bool] = False

    @property
    def state_size(self) -> int:
        """S, the width of the flat state the scan works on."""
        return self.hidden_size

    def flatten_state(self, h):
        """state -> (..., S)."""
        return h

    def unflatten_state(self, s):
        """(..., S) -> state."""
        return s

    def hidden(self, states):
        """The hidden states of what :func:`bppsa.rnn` returns: (T, B, H) for every cell
        (for an LSTM, hs of the pair (hs, cs))."""
        return states[0] if self.pair_state else states


def _rnn_params(key, input_size, hidden_size, gates, dtype):
    k = jax.random.split(key, 4)
    bound = 1.0 / float(hidden_size) ** 0.5  # PyTorch's default initialisation
    G = gates * hidden_size
    return {
        "W_x": _uniform(k[0], (input_size, G), bound, dtype),
        "W_h": _uniform(k[1], (hidden_size, G), bound, dtype),
        "b_x": _uniform(k[2], (G,), bound, dtype),
        "b_h": _uniform(k[3], (G,), bound, dtype),
    }


def _contract(xs, s_prev, da):
    """Parameter gradients of ``a = x @ W_x + b_x + h @ W_h + b_h`` from ∂L/∂a (T, B, G)."""
    return {
        "W_x": jnp.einsum("tbi,tbg->ig", xs, da),
        "W_h": jnp.einsum("tbh,tbg->hg", s_prev, da),
        "b_x": da.sum((0, 1)),
        "b_h": da.sum((0, 1)),
    }


# --------------------------------------------------------------------------------------------
# Vanilla RNN
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class RNN(Cell):
    """Elman RNN: h' = σ(x W_x + b_x + h W_h + b_h), σ = tanh or relu.

    Transposed Jacobian (row convention): M_t = diag(σ'(a_t)) W_hᵀ, so
    g_{t-1} = (g_t ⊙ σ'(a_t)) @ W_hᵀ; for tanh σ'(a_t) = 1 − h_t². The Blelloch backward uses
    that diagonal structure; ``diagonal=False`` switches it off (the dense path of GRU and LSTM,
    same gradients: the cost-model calibration measures the dense products with it).
    """

    input_size: int
    hidden_size: int
    nonlinearity: str = "tanh"
    diagonal: bool = True  # False: ignore the structure and form the matrices (as for GRU/LSTM)

    def __post_init__(self):
        if self.nonlinearity not in ("tanh", "relu"):
            raise UsageError(f"nonlinearity must be 'tanh' or 'relu'; got {self.nonlinearity!r}")
        if not isinstance(self.diagonal, bool):
            raise UsageError(f"diagonal must be True or False; got {self.diagonal!r}")
        _check_sizes(self)

    def init(self, key, dtype=jnp.float32):
        return _rnn_params(key, self.input_size, self.hidden_size, 1, dtype)

    def _act(self, a):
        return jnp.tanh(a) if self.nonlinearity == "tanh" else jax.nn.relu(a)

    def _dact(self, h):
        """σ'(a) from σ(a) = h."""
        return 1.0 - h * h if self.nonlinearity == "tanh" else (h > 0).astype(h.dtype)

    def step(self, params, h, x):
        return self._act(x @ params["W_x"] + params["b_x"] + h @ params["W_h"] + params["b_h"])

    def transposed_jacobian(self, params, s_prev, xs, s):
        return self._dact(s)[..., :, None] * params["W_h"].T

    @property
    def has_diagonal_jacobian(self) -> bool:
        return self.diagonal

    def diagonal_jacobian(self, params, s_prev, xs, s):
        return (self._dact(s), params["W_h"].T) if self.diagonal else None

    def param_grads(self, params, s_prev, xs, s, gs):
        da = gs * self._dact(s)
        return _contract(xs, s_prev, da), da @ params["W_x"].T


# --------------------------------------------------------------------------------------------
# GRU
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class GRU(Cell):
    """GRU with PyTorch's gate convention (r, z, n):

        r = σ(x W_xr + b_xr + h W_hr + b_hr),  z = σ(x W_xz + b_xz + h W_hz + b_hz),
        m = h W_hn + b_hn,  n = tanh(x W_xn + b_xn + r ⊙ m),  h' = (1 − z) ⊙ n + z ⊙ h.

    Transposed Jacobian (the paper's fused formula, row convention):
        M = diag(u_r) W_hrᵀ + diag(u_z) W_hzᵀ + diag(u_n) W_hnᵀ + diag(z),
        u_n = (1 − z)(1 − n²) r,  u_r = (1 − z)(1 − n²) m r(1 − r),  u_z = (h − n) z(1 − z).
    """

    input_size: int
    hidden_size: int

    def __post_init__(self):
        _check_sizes(self)

    gates: ClassVar[int] = 3

    def init(self, key, dtype=jnp.float32):
        return _rnn_params(key, self.input_size, self.hidden_size, 3, dtype)

    def _gates(self, params, h, x):
        H = self.hidden_size
        gx = x @ params["W_x"] + params["b_x"]
        gh = h @ params["W_h"] + params["b_h"]
        r = jax.nn.sigmoid(gx[..., :H] + gh[..., :H])
        z = jax.nn.sigmoid(gx[..., H:2 * H] + gh[..., H:2 * H])
        m = gh[..., 2 * H:]
        n = jnp.tanh(gx[..., 2 * H:] + r * m)
        return r, z, m, n

    def step(self, params, h, x):
        r, z, m, n = self._gates(params, h, x)
        return (1.0 - z) * n + z * h

    def _u(self, params, s_prev, xs):
        r, z, m, n = self._gates(params, s_prev, xs)
        dn = (1.0 - z) * (1.0 - n * n)  # ∂h'/∂(pre-activation of n)
        return r, z, m, n, dn

    def transposed_jacobian(self, params, s_prev, xs, s):
        H = self.hidden_size
        r, z, m, n, dn = self._u(params, s_prev, xs)
        U = jnp.stack([dn * m * r * (1.0 - r), (s_prev - n) * z * (1.0 - z), dn * r], axis=-2)
        W = params["W_h"].reshape(H, 3, H)  # (in j, gate, out i)
        M = jnp.einsum("...gi,jgi->...ij", U, W)
        return M + z[..., :, None] * jnp.eye(H, dtype=M.dtype)

    def param_grads(self, params, s_prev, xs, s, gs):
        r, z, m, n, dn = self._u(params, s_prev, xs)
        da_n = gs * dn
        da_r = da_n * m * r * (1.0 - r)
        da_z = gs * (s_prev - n) * z * (1.0 - z)
        dgx = jnp.concatenate([da_r, da_z, da_n], axis=-1)
        dgh = jnp.concatenate([da_r, da_z, da_n * r], axis=-1)
        grads = {
            "W_x": jnp.einsum("tbi,tbg->ig", xs, dgx),
            "W_h": jnp.einsum("tbh,tbg->hg", s_prev, dgh),
            "b_x": dgx.sum((0, 1)),
            "b_h": dgh.sum((0, 1)),
        }
        return grads, dgx @ params["W_x"].T


# --------------------------------------------------------------------------------------------
# LSTM
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class LSTM(Cell):
    """LSTM with PyTorch's gate order (i, f, g, o); the state is (h, c), flat s = [h, c] (2H).

        i, f, o = σ(a_i), σ(a_f), σ(a_o),  g = tanh(a_g),  a = x W_x + b_x + h W_h + b_h,
        c' = f ⊙ c + i ⊙ g,  h' = o ⊙ tanh(c').

    With k = o(1 − tanh²c'), P = Σ_{q∈i,f,g} diag(p_q) W_hqᵀ (p_i = g·i(1−i), p_f = c·f(1−f),
    p_g = i(1−g²)) and Q = diag(tanh(c')·o(1−o)) W_hoᵀ, the 2H × 2H transposed Jacobian is

        M = [[diag(k) P + Q, diag(k f)],     rows: ∂L/∂h', ∂L/∂c'
             [P,             diag(f)  ]]     columns: ∂L/∂h, ∂L/∂c
    """

    input_size: int
    hidden_size: int

    def __post_init__(self):
        _check_sizes(self)

    gates: ClassVar[int] = 4
    pair_state: ClassVar[bool] = True

    @property
    def state_size(self) -> int:
        return 2 * self.hidden_size

    def flatten_state(self, h):
        return jnp.concatenate(h, axis=-1)

    def unflatten_state(self, s):
        H = self.hidden_size
        return s[..., :H], s[..., H:]

    def init(self, key, dtype=jnp.float32):
        return _rnn_params(key, self.input_size, self.hidden_size, 4, dtype)

    def _gates(self, params, h, x):
        H = self.hidden_size
        a = x @ params["W_x"] + params["b_x"] + h @ params["W_h"] + params["b_h"]
        i = jax.nn.sigmoid(a[..., :H])
        f = jax.nn.sigmoid(a[..., H:2 * H])
        g = jnp.tanh(a[..., 2 * H:3 * H])
        o = jax.nn.sigmoid(a[..., 3 * H:])
        return i, f, g, o

    def step(self, params, state, x):
        h, c = state
        i, f, g, o = self._gates(params, h, x)
        c_new = f * c + i * g
        return o * jnp.tanh(c_new), c_new

    def _terms(self, params, s_prev, xs, s):
        H = self.hidden_size
        h, c = s_prev[..., :H], s_prev[..., H:]
        i, f, g, o = self._gates(params, h, xs)
        tc = jnp.tanh(s[..., H:])
        k = o * (1.0 - tc * tc)
        p = (g * i * (1.0 - i), c * f * (1.0 - f), i * (1.0 - g * g))
        q = tc * o * (1.0 - o)
        return f, k, p, q

    def transposed_jacobian(self, params, s_prev, xs, s):
        H = self.hidden_size
        f, k, p, q = self._terms(params, s_prev, xs, s)
        zero = jnp.zeros_like(q)
        W = params["W_h"].reshape(H, 4, H)  # (in j, gate, out m)
        Uc = jnp.stack(p + (zero,), axis=-2)               # dc'_tot -> dh
        Uh = jnp.stack(tuple(k * pq for pq in p) + (q,), axis=-2)  # g_h' -> dh
        eye = jnp.eye(H, dtype=q.dtype)
        M_hh = jnp.einsum("...gm,jgm->...mj", Uh, W)
        M_ch = jnp.einsum("...gm,jgm->...mj", Uc, W)
        M_hc = (k * f)[..., :, None] * eye
        M_cc = f[..., :, None] * eye
        top = jnp.concatenate([M_hh, M_hc], axis=-1)
        bottom = jnp.concatenate([M_ch, M_cc], axis=-1)
        return jnp.concatenate([top, bottom], axis=-2)

    def param_grads(self, params, s_prev, xs, s, gs):
        H = self.hidden_size
        f, k, p, q = self._terms(params, s_prev, xs, s)
        g_h, g_c = gs[..., :H], gs[..., H:]
        dc = g_c + g_h * k
        da = jnp.concatenate([dc * p[0], dc * p[1], dc * p[2], g_h * q], axis=-1)
        return _contract(xs, s_prev[..., :H], da), da @ params["W_x"].T


# --------------------------------------------------------------------------------------------
# Any cell
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, eq=False)
class Generic(Cell):
    """Any per-example step ``step_fn(params, h, x) -> h'`` with h, h': (S,) and x: (I,).

    bppsa vmaps ``step_fn`` over the batch (``step`` takes h (B, S), x (B, I)) and, in the
    backward, over time too, so a step cannot couple batch rows (it never sees the batch axis);
    something like ``h.mean(0)`` inside it is a mean over the state's S entries. Optional:

    - ``jacobian_fn(params, h, x) -> (S, S)``: M[i, j] = ∂h'[i]/∂h[j] for one example and step;
      without it, ``jax.jacrev`` of ``step_fn``.
    - ``hidden_size``/``input_size``: checked against h0 and xs when given.
    - ``init_fn(key, dtype) -> params``: supplies ``init``, and ``param_spec`` (so
      :func:`bppsa.rnn` checks ``params`` against its structure); without it params are not checked.

    Parameter gradients come from one ``jax.vjp`` of ``step_fn`` vmapped over T and B.
    """

    step_fn: Callable[[Any, jax.Array, jax.Array], jax.Array]
    jacobian_fn: Callable[[Any, jax.Array, jax.Array], jax.Array] | None = None
    hidden_size: int | None = None
    input_size: int | None = None
    init_fn: Callable | None = None

    def init(self, key, dtype=jnp.float32):
        if self.init_fn is None:
            raise UsageError("Generic.init needs init_fn(key, dtype); none was given")
        return self.init_fn(key, dtype)

    def param_spec(self, dtype=jnp.float32):
        return None if self.init_fn is None else super().param_spec(dtype)

    def step(self, params, h, x):
        return jax.vmap(self.step_fn, in_axes=(None, 0, 0))(params, h, x)

    def transposed_jacobian(self, params, s_prev, xs, s):
        one = self.jacobian_fn or (lambda p, h, x: jax.jacrev(self.step_fn, argnums=1)(p, h, x))
        over_b = jax.vmap(one, in_axes=(None, 0, 0))
        return jax.vmap(over_b, in_axes=(None, 0, 0))(params, s_prev, xs)

    def param_grads(self, params, s_prev, xs, s, gs):
        steps = jax.vmap(self.step, in_axes=(None, 0, 0))  # over T, each over B
        _, vjp = jax.vjp(lambda p, x: steps(p, s_prev, x), params, xs)
        return vjp(gs)


def _check_sizes(cell):
    for name in ("input_size", "hidden_size"):
        value = getattr(cell, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UsageError(f"{type(cell).__name__}: {name} must be a positive int; got {value!r}")
