"""Test data made with numpy (``jax.random`` compiles once per shape; a few seconds a test on a
loaded 2-core machine, for data whose values do not matter) and the cells and problems the tests share.
The runner's task functions are in :mod:`tests.runner_tasks`; the shared fixtures in tests/conftest.py."""

import numpy as np


def normal(seed, shape, scale=1.0, dtype=np.float64):
    """A (shape) array of N(0, scale²) draws from numpy's generator ``seed``, as a jax array."""
    import jax.numpy as jnp
    return jnp.asarray((scale * np.random.default_rng(seed).normal(size=shape)).astype(dtype))


def random_params(cell, seed=0, dtype=np.float64):
    """Parameters with ``cell.init``'s structure, shapes and dtype (from ``cell.param_spec``, traced
    without computing), drawn U(-1/√H, 1/√H) as the built-in cells draw theirs."""
    import jax
    import jax.numpy as jnp
    rng = np.random.default_rng(seed)
    bound = 1 / np.sqrt(cell.hidden_size)
    return jax.tree.map(lambda s: jnp.asarray(rng.uniform(-bound, bound, s.shape).astype(s.dtype)),
                        cell.param_spec(dtype))


def generic_cell(I, H):
    """A cells.Generic whose step mixes tanh and sin (the autodiff-Jacobian cell of the tests)."""
    import jax
    import jax.numpy as jnp

    from bppsa import cells

    def step(p, h, x):  # one example: h (H,), x (I,) -> (H,)
        return jnp.tanh(x @ p["A"] + jnp.sin(h) @ p["W"] + p["b"])

    def init(key, dtype=jnp.float32):
        k = jax.random.split(key, 3)
        return {"A": jax.random.normal(k[0], (I, H), dtype), "W": jax.random.normal(k[1], (H, H), dtype) / H,
                "b": jax.random.normal(k[2], (H,), dtype)}

    return cells.Generic(step, hidden_size=H, input_size=I, init_fn=init)


def random_like(tree, seed=100):
    """A pytree of ``tree``'s structure and shapes, float64 N(0, 1) draws, leaf k from numpy's generator
    ``seed + k`` (tangents, cotangents, directions)."""
    import jax
    leaves, treedef = jax.tree.flatten(tree)
    return jax.tree.unflatten(treedef, [normal(seed + k, np.shape(a)) for k, a in enumerate(leaves)])


class Problem(tuple):
    """(cell, params, xs, h0), unpackable as a tuple: ``cell, params, xs, h0 = problem(...)``."""

    __slots__ = ()

    def __new__(cls, cell, params, xs, h0):
        return super().__new__(cls, (cell, params, xs, h0))

    cell = property(lambda self: self[0])
    params = property(lambda self: self[1])
    xs = property(lambda self: self[2])
    h0 = property(lambda self: self[3])


def make_problem(cell, T=7, B=2, *, seed=0, dtype=np.float64, h0_scale=0.5, param_scale=1.0):
    """One problem for ``cell``: :func:`random_params` (seed) times ``param_scale``, xs (T, B, I) ~ N(0, 1)
    (seed + 1) and the state h0 (B, S) ~ N(0, h0_scale²) (seed + 2; 0: zeros) in the cell's state
    structure, all of ``dtype``."""
    import jax
    import jax.numpy as jnp
    xs = normal(seed + 1, (T, B, cell.input_size), dtype=dtype)
    s0 = normal(seed + 2, (B, cell.state_size), h0_scale, dtype) if h0_scale else jnp.zeros((B, cell.state_size), dtype)
    params = random_params(cell, seed, dtype)
    if param_scale != 1.0:
        params = jax.tree.map(lambda p: p * param_scale, params)
    return Problem(cell, params, xs, cell.unflatten_state(s0))


def jax_problem(cell, T, B, dtype=np.float64, seed=0, *, extra=()):
    """One problem drawn by ``jax.random`` (the kernels' and the adjoint's tests): from the keys of
    ``jax.random.split(jax.random.key(seed), 3 + len(extra))`` in turn, ``cell.init`` in ``dtype``, xs
    (T, B, I) ~ N(0, 1), the flat state s0 (B, S) ~ N(0, 0.25), then one array ~ N(0, 1) of each shape
    in ``extra`` (cotangents, weights). Returns (params, xs, s0, *extras)."""
    import jax
    k = jax.random.split(jax.random.key(seed), 3 + len(extra))
    params = cell.init(k[0], dtype)
    xs = jax.random.normal(k[1], (T, B, cell.input_size), dtype)
    s0 = 0.5 * jax.random.normal(k[2], (B, cell.state_size), dtype)
    return (params, xs, s0, *(jax.random.normal(key, shape, dtype) for key, shape in zip(k[3:], extra)))


def states_loss(out, every_step=True):
    """A nonlinear scalar of the states ``out`` (T, B, ...) (every leaf: an LSTM's cell state too), weighted
    per unit so that no two units' gradients coincide and with a non-zero Hessian: of every step, or of the
    last step only (``every_step=False``)."""
    import jax
    import jax.numpy as jnp
    total = 0.0
    for a in jax.tree.leaves(out):
        w = jnp.cos(jnp.arange(a.shape[-1], dtype=a.dtype))
        if every_step:
            total = total + jnp.sum(jnp.sin(a) * (1 + a) * w) + jnp.sum(a[-1] ** 2)
        else:
            total = total + jnp.sum(a[-1] * w + a[-1] ** 2)
    return total


def one_line_usage_error(match, fn, *args, says_expected=False, **kwargs):
    """The message of the :class:`bppsa.errors.UsageError` that ``fn(*args, **kwargs)`` raises, matching
    ``match`` and on one line (saying what was expected, with ``says_expected``)."""
    import pytest

    from bppsa.errors import UsageError
    with pytest.raises(UsageError, match=match) as info:
        fn(*args, **kwargs)
    msg = str(info.value)
    assert "\n" not in msg and ("expected" in msg or not says_expected), msg
    return msg


def file_tree(d, *, text=False, mtime=False, skip=(), recursive=True):
    """Every file under the folder ``d`` (only its own with ``recursive=False``) by its relative path:
    its bytes (its text with ``text``; with ``mtime``, (bytes, st_mtime_ns)), leaving out file names in
    ``skip``; {} when ``d`` does not exist."""
    from pathlib import Path
    d = Path(d)
    if not d.exists():
        return {}

    def read(p):
        data = p.read_text() if text else p.read_bytes()
        return (data, p.stat().st_mtime_ns) if mtime else data
    files = d.rglob("*") if recursive else d.iterdir()
    return {str(p.relative_to(d)): read(p) for p in sorted(files) if p.is_file() and p.name not in skip}


def toy_classifier():
    """A small float32 training model: ``SequenceClassifier`` over ``cells.RNN(1, 8)``, 10 classes, BPTT."""
    from flax import nnx

    from bppsa import cells
    from bppsa.nn import SequenceClassifier
    return SequenceClassifier(cells.RNN(1, 8), 10, backward="bptt", rngs=nnx.Rngs(0))


def toy_data():
    """(x, y): 32 Bernoulli bitstreams of 8 steps and their labels, for :func:`toy_classifier`."""
    from bppsa.tasks.bitstream import make_bitstream
    return make_bitstream(32, 8)
