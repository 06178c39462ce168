"""Task functions for the runner tests (configs name them as "tests.helpers:NAME"), and test data
made with numpy (``jax.random`` compiles once per shape; a few seconds a test on a loaded 2-core
machine, for data whose values do not matter)."""

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


def echo_task(config, workdir) -> dict:
    """Returns ``{"n": config.n}``; writes nothing."""
    return {"n": config.n}


def pub_task(config, workdir) -> dict:
    """Writes ``pub.json`` and ``pub.md`` into ``workdir`` when ``config.write``; returns ``{"wrote": ...}``."""
    if config.write:
        workdir.entry("pub.json").write_text("{}")
        workdir.entry("pub.md").write_text("| a |\n")
    return {"wrote": config.write}


def write_task(config, workdir) -> dict:
    """Writes ``out.json`` and ``state/step.txt`` into ``workdir`` (through its writer, ``workdir.entry``);
    with ``config.die`` the process then kills itself with SIGKILL (a run killed before the runner can
    record anything)."""
    import os
    import signal
    workdir.entry("out.json").write_text('{"n": %d}' % config.n)
    state = workdir.entry("state")
    state.mkdir(exist_ok=True)
    (state / "step.txt").write_text(str(config.n))
    if config.die:
        os.kill(os.getpid(), signal.SIGKILL)
    return {"n": config.n}


def refusing_task(config, workdir) -> dict:
    """Refuses ``config.n == 0`` (or a work directory holding ``REFUSE``) with a UsageError, as a task
    does on a bad data folder, after creating an empty ``partial/``; otherwise returns ``{"n": config.n}``."""
    from bppsa.errors import UsageError
    workdir.entry("partial").mkdir(exist_ok=True)
    if config.n == 0 or (workdir / "REFUSE").exists():
        raise UsageError("config.n: the task found nothing to do with n = 0; expected n >= 1")
    return {"n": config.n}


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


def part_task(config, workdir) -> dict:
    """Writes ``<name>.json``, ``<name>.md`` (and ``<name>_extra.png`` with ``config.extra``); with
    ``config.fail_part`` one of its parts ("replica 2") fails through :func:`experiments.part_failed`."""
    from experiments import part_failed
    failed: list[dict] = []
    if config.fail_part:
        part_failed(config, "replica 2", "killed by SIGKILL (exit -9)", failed)
    workdir.entry(f"{config.name}.json").write_text('{"n": %d}' % config.n)
    workdir.entry(f"{config.name}.md").write_text(f"| n |\n|---|\n| {config.n} |\n")
    if config.extra:
        workdir.entry(f"{config.name}_extra.png").write_bytes(b"png %d" % config.n)
    return {"n": config.n, **({"failed_parts": failed} if failed else {})}


def vanish_task(config, workdir) -> dict:
    """Writes ``data/a.txt``, then removes the whole work directory (as ``rm -rf`` in another shell
    would) and goes on writing, recreating ``data/`` as orbax recreates its folders; returns normally."""
    import shutil
    from pathlib import Path
    data = workdir.entry("data")
    data.mkdir(exist_ok=True)
    (data / "a.txt").write_text("first")
    shutil.rmtree(Path(workdir))
    data.mkdir(parents=True)
    (data / "b.txt").write_text("second")
    return {"n": config.n}


def missing_key_task(config, workdir) -> dict:
    """Reads ``config.learning_rate``, which its config may lack."""
    return {"lr": config.learning_rate}


def one_argument_task(config) -> dict:
    """A task with the wrong signature: no ``workdir``."""
    return {}
