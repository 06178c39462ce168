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
    param_grads(params, s_prev, xs, s, gs) -> (dparams, dxs)
        gs: (T, B, S) the total gradient ∂L/∂s_t; one contraction over (t, b).

Optional structure (``diagonal_jacobian``, ``jacobian_blocks``) lets the scans avoid S×S
matrices; ``project`` lets the sequential forward hoist the input's product out of its loop.

Each cell's maths is written once, here; conventions in which published cells differ are
fields (activations by name, :data:`ACTIVATIONS`; input/hidden biases: PyTorch both, flax's GRU
input only, its LSTM hidden only; the SimpleCell's residual; :mod:`bppsa.nn.cells` maps
flax's layout). Row convention: a step computes ``x @ W_x + h @ W_h``, W_x: (I, G), W_h: (H, G);
gate orders are PyTorch's, (r, z, n) and (i, f, g, o). The batched methods' arrays may be in
any time order (BPPSA passes them latest step first); they only have to agree."""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp
from jax import Array

from bppsa.errors import UsageError, as_int

__all__ = ["Cell", "Affine", "RNN", "GRU", "LSTM", "Generic", "ACTIVATIONS", "autodiff_jacobian", "flat_outer",
           "autodiff_param_grads"]

#: Activation functions by name: (function, its derivative written in terms of its output y).
ACTIVATIONS: dict[str, tuple[Callable, Callable]] = {"tanh": (jnp.tanh, lambda y: 1.0 - y * y),
                                                     "sigmoid": (jax.nn.sigmoid, lambda y: y * (1.0 - y)),
                                                     "relu": (jax.nn.relu, lambda y: (y > 0).astype(y.dtype))}


def _split(a: Array, n: int) -> list[Array]:
    """``a``'s last axis in ``n`` parts; not slices, whose transposes (pads) XLA's CPU fuses into slow loops."""
    return list(a) if isinstance(a, (list, tuple)) else jnp.split(a, n, axis=-1)


def _uniform(key, shape, bound, dtype):
    return jax.random.uniform(key, shape, dtype, -bound, bound)


class Cell(abc.ABC):
    """The contract every cell meets. Shapes: B batch, I input, H hidden, S = flat state size
    (S = H; LSTM: S = 2H with s = [h, c]), T steps (in any order, as long as the arrays agree).

    Subclasses are frozen dataclasses (hashable: :func:`bppsa.rnn` passes them as a static
    argument of its custom VJP). :meth:`param_spec` is the structure ``params`` must have
    (:func:`bppsa.rnn` names any leaf that is missing, extra or of another shape); its default
    traces :meth:`init`, so a cell that implements ``init`` is checked."""

    input_size: Any  # int, or None where a cell does not fix it (Generic)
    hidden_size: Any  # int (Generic: int or None)

    @abc.abstractmethod
    def init(self, key: Array, dtype: jax.typing.DTypeLike = jnp.float32) -> Any:
        """The parameter pytree for ``key``."""

    def param_spec(self, dtype: jax.typing.DTypeLike = jnp.float32) -> Any:
        """The structure :func:`bppsa.rnn` checks ``params`` against: a pytree of
        ``jax.ShapeDtypeStruct`` (default: :meth:`init` traced, not computed), or None (unchecked)."""
        return jax.eval_shape(lambda key: self.init(key, dtype), jax.random.key(0))

    @abc.abstractmethod
    def step(self, params: Any, h: Any, x: Array, /) -> Any:
        """One step: h (B, H) [LSTM: (h, c)], x (B, I) -> the next state, same structure as h."""

    def project(self, params: Any, xs: Array, /) -> Any:
        """The part of a step that reads only its input, for any number of steps at once: xs
        (..., I) -> u, which :meth:`step_projected` finishes. The sequential forward computes it for
        all T steps before its loop (one large product, not T small ones). Default: xs itself."""
        return xs

    def step_projected(self, params: Any, h: Any, u: Any, /) -> Any:
        """:meth:`step` from ``u = project(params, x)`` (default: ``step(params, h, u)``)."""
        return self.step(params, h, u)

    @abc.abstractmethod
    def transposed_jacobian(self, params: Any, s_prev: Array, xs: Array, s: Array, /) -> Array:
        """s_prev, s: (T, B, S), xs: (T, B, I) -> Ms (T, B, S, S) with g_{t-1} = g_t @ M_t,
        M_t[b, i, j] = ∂s_t[b, i] / ∂s_{t-1}[b, j]."""

    @abc.abstractmethod
    def param_grads(self, params: Any, s_prev: Array, xs: Array, s: Array, gs: Array, /) -> tuple[Any, Array]:
        """gs (T, B, S) = ∂L/∂s_t -> (dparams, dxs (T, B, I)), summed over t and b."""

    def diagonal_jacobian(self, params: Any, s_prev: Array, xs: Array, s: Array, /) -> Any:
        """``(A, Wt)`` with A (T, B, S) and M_t[b] = diag(A[t, b]) @ Wt for one shared (S, S) Wt,
        or None (default). The Blelloch scan then never forms the (T, B, S, S) matrices."""
        return None

    @property
    def has_diagonal_jacobian(self) -> bool:  # whether diagonal_jacobian returns it (default no)
        return False

    @property
    def jacobian_block_size(self) -> int | None:  # k: each M_t block-diagonal, S/k contiguous (k, k)
        return None  # blocks (1: diagonal), the scans then use jacobian_blocks; None: dense

    def jacobian_blocks(self, params: Any, s_prev: Array, xs: Array, s: Array, /) -> Array:
        """M_t's diagonal blocks (T, B, S/k, k, k); default: the dense M_t as one block."""
        return self.transposed_jacobian(params, s_prev, xs, s)[..., None, :, :]

    def jacobian_diagonal(self, params: Any, s_prev: Array, xs: Array, s: Array, /) -> Array:
        """diag(M_t) (T, B, S), the quasi-Newton forward's Jacobian; default: from the blocks."""
        d = jnp.diagonal(self.jacobian_blocks(params, s_prev, xs, s), axis1=-2, axis2=-1)
        return d.reshape(d.shape[:-2] + (-1,))  # (T, B, S/k, k) -> (T, B, S)

    #: Gate count G (pre-activations per step are G·H wide): the per-step work scales with it.
    gates: ClassVar[int] = 1
    #: Whether the state is a pair of (B, H) arrays (LSTM) rather than one array.
    pair_state: ClassVar[bool] = False

    @property
    def state_size(self) -> int:
        """S, the width of the flat state the scan works on."""
        return self.hidden_size

    def flatten_state(self, h: Any, /) -> Array:
        """state -> (..., S)."""
        return h

    def unflatten_state(self, s: Array, /) -> Any:
        """(..., S) -> state."""
        return s

    def hidden(self, states: Any, /) -> Array:
        """The hidden states of what :func:`bppsa.rnn` returns: (T, B, H) for every cell
        (for an LSTM, hs of the pair (hs, cs))."""
        return states[0] if self.pair_state else states


class Affine(Cell):
    """A cell whose input enters only through x W_x + b_x: that product is its :meth:`project`;
    ``_recurrent`` is h's, h W_h + b_h (each bias where the cell has it)."""

    input_bias: bool
    hidden_bias: bool
    _activations: ClassVar[tuple[str, ...]] = ("gate", "activation")  # the fields naming ACTIVATIONS

    def __post_init__(self):
        name = type(self).__name__
        for field in ("input_size", "hidden_size"):  # numpy and JAX integer scalars are stored as ints
            if (n := as_int(value := getattr(self, field))) is None or n < 1:
                raise UsageError(f"{name}: {field} must be a positive int; got {value!r}")
            object.__setattr__(self, field, n)
        for field in self._activations:
            if not (isinstance(value := getattr(self, field), str) and value in ACTIVATIONS):
                raise UsageError(f"{name}: {field} must be one of {list(ACTIVATIONS)}; got {value!r}")
        for field in ("input_bias", "hidden_bias"):
            if not isinstance(value := getattr(self, field), bool):
                raise UsageError(f"{name}: {field} must be True or False; got {value!r}")

    def init(self, key: Array, dtype: jax.typing.DTypeLike = jnp.float32) -> dict[str, Array]:
        """PyTorch's initialisation, U(±1/√H), of W_x (I, G), W_h (H, G) and the biases the cell has."""
        k = jax.random.split(key, 4)
        bound = 1.0 / float(self.hidden_size) ** 0.5
        G = self.gates * self.hidden_size
        params = {"W_x": _uniform(k[0], (self.input_size, G), bound, dtype),
                  "W_h": _uniform(k[1], (self.hidden_size, G), bound, dtype)}
        if self.input_bias:
            params["b_x"] = _uniform(k[2], (G,), bound, dtype)
        if self.hidden_bias:
            params["b_h"] = _uniform(k[3], (G,), bound, dtype)
        return params

    def project(self, params: Any, xs: Array) -> Any:
        """x W_x + b_x: (..., G·H) for one gate, else a tuple of the G gates' (..., H) parts (a
        loop slicing gates out of one step input runs several times slower on XLA's CPU)."""
        gx = xs @ params["W_x"]
        gx = gx + params["b_x"] if self.input_bias else gx
        return gx if self.gates == 1 else tuple(_split(gx, self.gates))

    def _recurrent(self, params, h):
        gh = h @ params["W_h"]
        return gh + params["b_h"] if self.hidden_bias else gh

    def step(self, params: Any, h: Any, x: Array) -> Any:
        return self.step_projected(params, h, self.project(params, x))

    def _contract(self, xs, h_prev, dgx, dgh):
        """Parameter gradients of ``(x W_x + b_x, h W_h + b_h)`` from their cotangents (T, B, G)."""
        grads = {"W_x": flat_outer(xs, dgx), "W_h": flat_outer(h_prev, dgh)}
        if self.input_bias:
            grads["b_x"] = dgx.sum((0, 1))
        if self.hidden_bias:
            grads["b_h"] = dgh.sum((0, 1))
        return grads


def flat_outer(a: Array, b: Array) -> Array:
    """Σ over the leading axes of a[..., :, None] b[..., None, :] -> (m, n): one product of the flattened
    arrays (the einsum "tbi,tbg->ig" runs 1.4-4.4x slower on XLA's CPU: experiments/history/diagonal-newton.md)."""
    return a.reshape(-1, a.shape[-1]).T @ b.reshape(-1, b.shape[-1])


def autodiff_jacobian(step_one: Callable[[Any, Array, Array], Array], params: Any, s_prev: Array, xs: Array) -> Array:
    """Transposed Jacobians by autodiff: ``step_one(params, s (S,), x (I,)) -> (S,)`` is one
    example's step; ``jax.jacrev`` of it, vmapped over T and B -> (T, B, S, S). Batch rows cannot
    mix: the step never sees the batch axis."""
    one = jax.jacrev(step_one, argnums=1)
    return jax.vmap(jax.vmap(one, in_axes=(None, 0, 0)), in_axes=(None, 0, 0))(params, s_prev, xs)


def autodiff_param_grads(step_one: Callable[[Any, Array, Array], Array], params: Any, s_prev: Array, xs: Array,
                         gs: Array) -> tuple[Any, Array]:
    """(dparams, dxs (T, B, I)) by one ``jax.vjp`` of ``step_one`` vmapped over T and B."""
    steps = jax.vmap(jax.vmap(step_one, in_axes=(None, 0, 0)), in_axes=(None, 0, 0))
    _, vjp = jax.vjp(lambda p, x: steps(p, s_prev, x), params, xs)
    return vjp(gs)


@dataclasses.dataclass(frozen=True)
class RNN(Affine):
    """Elman RNN: h' = σ(x W_x + b_x + h W_h + b_h [+ h if residual]), σ = ``nonlinearity``
    ("tanh", "relu" or "sigmoid").

    Transposed Jacobian (row convention): M_t = diag(σ'(a_t)) (W_hᵀ [+ I]), so
    g_{t-1} = (g_t ⊙ σ'(a_t)) @ W_hᵀ; for tanh σ'(a_t) = 1 − h_t². The Blelloch backward uses
    that diagonal structure; ``diagonal=False`` switches it off (the dense path of GRU and LSTM,
    same gradients: the cost-model calibration measures the dense products with it).
    ``input_bias``/``hidden_bias``: whether b_x / b_h exist (flax's SimpleCell: input only)."""

    input_size: int
    hidden_size: int
    nonlinearity: str = "tanh"
    diagonal: bool = True  # False: ignore the structure and form the matrices (as for GRU/LSTM)
    input_bias: bool = True
    hidden_bias: bool = True
    residual: bool = False

    _activations: ClassVar[tuple[str, ...]] = ("nonlinearity",)

    def __post_init__(self):
        for name in ("diagonal", "residual"):
            if not isinstance(getattr(self, name), bool):
                raise UsageError(f"RNN: {name} must be True or False; got {getattr(self, name)!r}")
        super().__post_init__()

    def step_projected(self, params: Any, h: Array, gx: Array) -> Array:
        a = gx + self._recurrent(params, h)
        return ACTIVATIONS[self.nonlinearity][0](a + h if self.residual else a)

    def _dact(self, s):
        return ACTIVATIONS[self.nonlinearity][1](s)

    def _wt(self, params):
        W = params["W_h"].T
        return W + jnp.eye(self.hidden_size, dtype=W.dtype) if self.residual else W

    def transposed_jacobian(self, params: Any, s_prev: Array, xs: Array, s: Array) -> Array:
        return self._dact(s)[..., :, None] * self._wt(params)

    @property
    def has_diagonal_jacobian(self) -> bool:
        return self.diagonal

    def diagonal_jacobian(self, params: Any, s_prev: Array, xs: Array, s: Array) -> tuple[Array, Array] | None:
        return (self._dact(s), self._wt(params)) if self.diagonal else None

    def param_grads(self, params: Any, s_prev: Array, xs: Array, s: Array, gs: Array) -> tuple[Any, Array]:
        da = gs * self._dact(s)
        return self._contract(xs, s_prev, da, da), da @ params["W_x"].T


@dataclasses.dataclass(frozen=True)
class GRU(Affine):
    """GRU with PyTorch's gate convention (r, z, n), gate σ and activation φ (default sigmoid, tanh):

        r = σ(x W_xr + b_xr + h W_hr + b_hr),  z = σ(x W_xz + b_xz + h W_hz + b_hz),
        m = h W_hn + b_hn,  n = φ(x W_xn + b_xn + r ⊙ m),  h' = (1 − z) ⊙ n + z ⊙ h.

    Transposed Jacobian (the paper's fused formula, row convention):
        M = diag(u_r) W_hrᵀ + diag(u_z) W_hzᵀ + diag(u_n r) W_hnᵀ + diag(z),
        u_n = (1 − z) φ'(n),  u_r = u_n m σ'(r),  u_z = (h − n) σ'(z).
    ``input_bias``/``hidden_bias``: whether b_x / b_h exist (flax's GRUCell: input only)."""

    input_size: int
    hidden_size: int
    gate: str = "sigmoid"
    activation: str = "tanh"
    input_bias: bool = True
    hidden_bias: bool = True

    gates: ClassVar[int] = 3

    def _gates(self, params, h, gx):  # gx: the projected input, the gates' parts (r, z, n)
        sigma, phi = ACTIVATIONS[self.gate][0], ACTIVATIONS[self.activation][0]
        (x_r, x_z, x_n), (h_r, h_z, m) = gx, _split(self._recurrent(params, h), 3)
        return (r := sigma(x_r + h_r)), sigma(x_z + h_z), m, phi(x_n + r * m)

    def step_projected(self, params: Any, h: Array, gx: Any) -> Array:
        r, z, m, n = self._gates(params, h, gx)
        return (1.0 - z) * n + z * h

    def gate_terms(self, params: Any, s_prev: Array, xs: Array) -> tuple[Array, ...]:  # (r, z, u_r, u_z, u_n), per unit
        r, z, m, n = self._gates(params, s_prev, self.project(params, xs))
        dsigma = ACTIVATIONS[self.gate][1]
        u_n = (1.0 - z) * ACTIVATIONS[self.activation][1](n)  # ∂h'/∂(pre-activation of n)
        return r, z, u_n * m * dsigma(r), (s_prev - n) * dsigma(z), u_n

    def transposed_jacobian(self, params: Any, s_prev: Array, xs: Array, s: Array) -> Array:
        H = self.hidden_size
        r, z, u_r, u_z, u_n = self.gate_terms(params, s_prev, xs)
        W = params["W_h"].reshape(H, 3, H)  # (in j, gate, out i)
        M = jnp.einsum("...gi,jgi->...ij", jnp.stack([u_r, u_z, u_n * r], axis=-2), W)
        return M + z[..., :, None] * jnp.eye(H, dtype=M.dtype)

    def param_grads(self, params: Any, s_prev: Array, xs: Array, s: Array, gs: Array) -> tuple[Any, Array]:
        r, z, u_r, u_z, u_n = self.gate_terms(params, s_prev, xs)
        da_r, da_z, da_n = gs * u_r, gs * u_z, gs * u_n
        dgx = jnp.concatenate([da_r, da_z, da_n], axis=-1)
        dgh = jnp.concatenate([da_r, da_z, da_n * r], axis=-1)
        return self._contract(xs, s_prev, dgx, dgh), dgx @ params["W_x"].T


@dataclasses.dataclass(frozen=True)
class LSTM(Affine):
    """LSTM with PyTorch's gate order (i, f, g, o), gate σ and activation φ (default sigmoid,
    tanh); the state is (h, c), flat s = [h, c] (2H).

        i, f, o = σ(a_i), σ(a_f), σ(a_o),  g = φ(a_g),  a = x W_x + b_x + h W_h + b_h,
        c' = f ⊙ c + i ⊙ g,  h' = o ⊙ φ(c').

    With k = o φ'(c'), P = Σ_{q∈i,f,g} diag(p_q) W_hqᵀ (p_i = g σ'(i), p_f = c σ'(f),
    p_g = i φ'(g)) and Q = diag(φ(c') σ'(o)) W_hoᵀ, the 2H × 2H transposed Jacobian is

        M = [[diag(k) P + Q, diag(k f)],     rows: ∂L/∂h', ∂L/∂c'
             [P,             diag(f)  ]]     columns: ∂L/∂h, ∂L/∂c
    ``input_bias``/``hidden_bias``: whether b_x / b_h exist (flax's LSTM cells: hidden only)."""

    input_size: int
    hidden_size: int
    gate: str = "sigmoid"
    activation: str = "tanh"
    input_bias: bool = True
    hidden_bias: bool = True

    gates: ClassVar[int] = 4
    pair_state: ClassVar[bool] = True

    @property
    def state_size(self) -> int:
        return 2 * self.hidden_size

    def flatten_state(self, h: tuple[Array, Array]) -> Array:
        return jnp.concatenate(h, axis=-1)

    def unflatten_state(self, s: Array) -> tuple[Array, Array]:
        return tuple(_split(s, 2))  # pyright: ignore[reportReturnType]

    def _gates(self, params, h, gx):  # gx: the projected input, the gates' parts (i, f, g, o)
        sigma, phi = ACTIVATIONS[self.gate][0], ACTIVATIONS[self.activation][0]
        i, f, g, o = (x + r for x, r in zip(gx, _split(self._recurrent(params, h), 4), strict=True))
        return sigma(i), sigma(f), phi(g), sigma(o)

    def step_projected(self, params: Any, state: tuple[Array, Array], gx: Any) -> tuple[Array, Array]:
        h, c = state
        i, f, g, o = self._gates(params, h, gx)
        c_new = f * c + i * g
        return o * ACTIVATIONS[self.activation][0](c_new), c_new

    def _terms(self, params, s_prev, xs, s):
        H = self.hidden_size
        h, c = s_prev[..., :H], s_prev[..., H:]
        i, f, g, o = self._gates(params, h, self.project(params, xs))
        phi, dphi = ACTIVATIONS[self.activation]
        dsigma = ACTIVATIONS[self.gate][1]
        tc = phi(s[..., H:])
        k = o * dphi(tc)  # ∂h'/∂c'
        p = (g * dsigma(i), c * dsigma(f), i * dphi(g))  # ∂c'/∂a_i, ∂c'/∂a_f, ∂c'/∂a_g
        return f, k, p, tc * dsigma(o)  # the last: ∂h'/∂a_o

    def transposed_jacobian(self, params: Any, s_prev: Array, xs: Array, s: Array) -> Array:
        H = self.hidden_size
        f, k, p, q = self._terms(params, s_prev, xs, s)
        W = params["W_h"].reshape(H, 4, H)  # (in j, gate, out m)
        Uc = jnp.stack(p + (jnp.zeros_like(q),), axis=-2)  # dc'_tot -> dh
        Uh = jnp.stack(tuple(k * pq for pq in p) + (q,), axis=-2)  # g_h' -> dh
        eye = jnp.eye(H, dtype=q.dtype)
        top = jnp.concatenate([jnp.einsum("...gm,jgm->...mj", Uh, W), (k * f)[..., :, None] * eye], axis=-1)
        bottom = jnp.concatenate([jnp.einsum("...gm,jgm->...mj", Uc, W), f[..., :, None] * eye], axis=-1)
        return jnp.concatenate([top, bottom], axis=-2)

    def param_grads(self, params: Any, s_prev: Array, xs: Array, s: Array, gs: Array) -> tuple[Any, Array]:
        H = self.hidden_size
        f, k, p, q = self._terms(params, s_prev, xs, s)
        g_h, g_c = gs[..., :H], gs[..., H:]
        dc = g_c + g_h * k
        da = jnp.concatenate([dc * p[0], dc * p[1], dc * p[2], g_h * q], axis=-1)
        return self._contract(xs, s_prev[..., :H], da, da), da @ params["W_x"].T


@dataclasses.dataclass(frozen=True, eq=False)
class Generic(Cell):
    """Any per-example step ``step_fn(params, h, x) -> h'`` with h, h': (S,) and x: (I,).

    bppsa vmaps ``step_fn`` over the batch (``step`` takes h (B, S), x (B, I)) and, in the
    backward, over time too, so a step cannot couple batch rows (it never sees the batch axis);
    something like ``h.mean(0)`` inside it is a mean over the state's S entries. Optional:

    - ``jacobian_fn(params, h, x) -> (S, S)``: M[i, j] = ∂h'[i]/∂h[j] for one example and step;
      without it, ``jax.jacrev`` of ``step_fn`` (:func:`autodiff_jacobian`).
    - ``hidden_size``/``input_size``: checked against h0 and xs when given.
    - ``init_fn(key, dtype) -> params``: supplies ``init``, and ``param_spec`` (so
      :func:`bppsa.rnn` checks ``params`` against its structure); without it params are not checked.

    Parameter gradients come from one ``jax.vjp`` of ``step_fn`` vmapped over T and B
    (:func:`autodiff_param_grads`)."""

    step_fn: Callable[[Any, jax.Array, jax.Array], jax.Array]
    jacobian_fn: Callable[[Any, jax.Array, jax.Array], jax.Array] | None = None
    hidden_size: int | None = None  # type: ignore[assignment]
    input_size: int | None = None
    init_fn: Callable | None = None

    def init(self, key: Array, dtype: jax.typing.DTypeLike = jnp.float32) -> Any:
        if self.init_fn is None:
            raise UsageError("Generic.init needs init_fn(key, dtype); none was given")
        return self.init_fn(key, dtype)

    def param_spec(self, dtype: jax.typing.DTypeLike = jnp.float32) -> Any:
        return None if self.init_fn is None else super().param_spec(dtype)

    def step(self, params: Any, h: Array, x: Array) -> Array:
        return jax.vmap(self.step_fn, in_axes=(None, 0, 0))(params, h, x)

    def transposed_jacobian(self, params: Any, s_prev: Array, xs: Array, s: Array) -> Array:
        if self.jacobian_fn is None:
            return autodiff_jacobian(self.step_fn, params, s_prev, xs)
        over_b = jax.vmap(self.jacobian_fn, in_axes=(None, 0, 0))
        return jax.vmap(over_b, in_axes=(None, 0, 0))(params, s_prev, xs)

    def param_grads(self, params: Any, s_prev: Array, xs: Array, s: Array, gs: Array) -> tuple[Any, Array]:
        return autodiff_param_grads(self.step_fn, params, s_prev, xs, gs)
