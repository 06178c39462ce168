"""The one training loop, :func:`fit` (optax Adam by default; JSONL metrics, orbax checkpoints, resume),
for sequence classifiers, and what is built on it: :func:`evaluate`, :func:`compare_backward_training`."""

from __future__ import annotations

import functools
import hashlib
import os
import time
import warnings
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from bppsa.errors import UsageError

__all__ = ["cross_entropy", "make_train_step", "evaluate", "compare_backward_training", "batch_indices", "fit",
           "after_step"]


def cross_entropy(logits, labels):
    """Mean softmax cross-entropy: logits (B, C), labels (B,) int."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def make_train_step(loss_fn: Callable = cross_entropy):
    """The one training step: a jitted ``step(model, optimizer, x, y) -> (loss, accuracy)``.

    Contract:

    - ``model``: an ``nnx.Module`` mapping x (B, ...) to logits (B, C) (e.g.
      :class:`bppsa.nn.SequenceClassifier`: x (B, T, I)); its ``nnx.Param`` state is what is trained.
    - ``optimizer``: ``nnx.Optimizer(model, tx, wrt=nnx.Param)`` for an optax transformation ``tx``.
    - ``x``: the batch's inputs (B, ...); ``y``: its integer labels (B,).
    - ``loss_fn``: ``loss_fn(logits (B, C), y (B,)) -> scalar``, by default the mean softmax
      cross-entropy (:func:`cross_entropy`).

    It computes the loss and its gradient w.r.t. the model's parameters (by whatever backward
    the model's layers use), applies one optimizer update to ``model`` and ``optimizer`` **in
    place**, and returns the loss and the batch accuracy (fraction of argmax(logits) == y) as
    scalar device arrays (before the update's parameters). It compiles once per model graph,
    optimizer and input shapes; :func:`fit` runs its loop on one shared instance.
    """

    @nnx.jit
    def step(model, optimizer, x, y):
        def loss_of(m):
            logits = m(x)
            return loss_fn(logits, y), logits

        (loss, logits), grads = nnx.value_and_grad(loss_of, has_aux=True)(model)
        optimizer.update(model, grads)
        return loss, (logits.argmax(-1) == y).mean()

    return step


@nnx.jit
def _eval_batch(model, x, y):
    logits = model(x)
    return cross_entropy(logits, y) * x.shape[0], (logits.argmax(-1) == y).sum()


def evaluate(model, x, y, batch_size: int = 256) -> dict:
    """Loss and accuracy of ``model`` on (x (N, T, I), y (N,))."""
    if len(x) == 0:
        raise ValueError("evaluate needs at least one sample; got an empty x")
    loss = correct = 0.0
    for i in range(0, len(x), batch_size):
        l, c = _eval_batch(model, jnp.asarray(x[i:i + batch_size]), jnp.asarray(y[i:i + batch_size]))
        loss += float(l)
        correct += float(c)
    return {"loss": loss / len(x), "accuracy": correct / len(x)}


def compare_backward_training(make_model: Callable[[str], nnx.Module], x, y, *, steps: int,
                              batch_size: int, learning_rate: float, seed: int = 0,
                              eval_data=None, eval_every: int = 0,
                              methods=("bptt", "bppsa")) -> dict[str, list[dict]]:
    """Train one model per backward method with :func:`fit`, from the *same* initial parameters and batches.

    ``make_model(backward)`` must build the model deterministically (same rngs for every method);
    x (N, T, I), y (N,). No work directory (nothing saved) and no progress bar. Returns {method: history}.
    """
    return {m: fit(make_model(m), x, y, steps=steps, batch_size=batch_size, learning_rate=learning_rate,
                   seed=seed, eval_data=eval_data, eval_every=eval_every, progress=False)
            for m in methods}


# --------------------------------------------------------------------------------------------
# The loop: JSONL metrics, tqdm progress, orbax checkpoints, bit-identical resume.
# --------------------------------------------------------------------------------------------

def batch_indices(num_samples: int, batch_size: int, seed: int, step: int) -> np.ndarray:
    """Sample indices (batch_size,) of 0-based ``step``: epoch-wise shuffles, stateless.

    Epoch e = step // (num_samples // batch_size) is a permutation drawn from (seed, e), so the
    batch of any step is a pure function of its arguments and a resumed run sees the same data.
    """
    per_epoch = num_samples // batch_size
    if per_epoch < 1:
        raise ValueError(f"batch_size must be in 1..{num_samples} (the dataset size); got {batch_size}")
    epoch, pos = divmod(step, per_epoch)
    perm = np.random.default_rng([seed, epoch]).permutation(num_samples)
    return perm[pos * batch_size:(pos + 1) * batch_size]


@functools.lru_cache(maxsize=1)
def _shared_train_step():
    """One jitted step for all :func:`fit` calls, so equal models and optimizers compile once."""
    return make_train_step()


@functools.lru_cache(maxsize=16)
def _adam(learning_rate: float) -> optax.GradientTransformation:
    """optax.adam, one object per rate: the optimizer is part of the jit key, so reuse avoids recompiles."""
    return optax.adam(learning_rate)


def after_step(step: int) -> None:
    """Called with the global step after every completed step of :func:`fit` (after its checkpoint):
    a hook for fault-injection tests and progress monitors (replace it with monkeypatch or by assignment)."""


def _state_leaves(model, opt):
    return jax.tree.leaves({"model": nnx.state(model), "opt": nnx.state(opt)})


def _to_saveable(leaf):
    if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        return np.asarray(jax.random.key_data(leaf))
    return np.asarray(leaf)


def _restore_state(model, opt, saved: dict) -> None:
    tree = {"model": nnx.state(model), "opt": nnx.state(opt)}
    leaves, treedef = jax.tree.flatten(tree)
    if len(saved) != len(leaves):
        raise ValueError(f"the checkpoint holds {len(saved)} arrays but the model and optimizer have "
                         f"{len(leaves)}; was it written by a different model?")
    new = []
    for i, leaf in enumerate(leaves):
        arr = saved[str(i)]
        if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            new.append(jax.random.wrap_key_data(jnp.asarray(arr), impl=jax.random.key_impl(leaf)))
        else:
            if arr.shape != leaf.shape or arr.dtype != leaf.dtype:
                raise ValueError(f"checkpoint array {i} has shape {arr.shape} {arr.dtype}; the model "
                                 f"expects {leaf.shape} {leaf.dtype}")
            new.append(jnp.asarray(arr))
    restored = jax.tree.unflatten(treedef, new)
    nnx.update(model, restored["model"])
    nnx.update(opt, restored["opt"])


def _digest(tree: dict) -> str:
    """SHA-256 over the arrays {"0": a0, "1": a1, ...} (shapes, dtypes and bytes): a checkpoint's fingerprint."""
    h = hashlib.sha256()
    for i in range(len(tree)):
        a = np.ascontiguousarray(tree[str(i)])
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _open_manager(directory: Path, keep: int):
    import orbax.checkpoint as ocp
    return ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(
        max_to_keep=keep, enable_async_checkpointing=False))


def _read_back(step_dir: Path) -> None:
    """Read every array of a checkpoint synchronously with tensorstore; raises when one does not read.

    Done before orbax's restore: a read that fails inside orbax's own event loop leaves tensorstore
    callbacks behind that fire on the closed loop later ("Event loop is closed" from another thread).
    A layout this function does not know (another orbax version) is left to orbax's restore.
    """
    import json

    import tensorstore as ts
    state = step_dir / "state"
    try:
        meta = json.loads((state / "_METADATA").read_text())
        keys = ["/".join(k["key"] for k in e["key_metadata"]) for e in meta["tree_metadata"].values()]
    except (OSError, ValueError, KeyError, TypeError):
        return  # orbax reads (and judges) its own metadata
    if not meta.get("use_ocdbt", True):
        return
    kvstore = {"driver": "ocdbt", "base": {"driver": "file", "path": f"{state}/"}}  # a spec, not a URL: no escaping
    listed = {k.decode() for k in ts.KvStore.open(kvstore).result().list().result()}
    driver, suffix = ("zarr3", "zarr.json") if meta.get("use_zarr3") else ("zarr", ".zarray")
    for key in keys:
        if f"{key}/{suffix}" not in listed:
            return  # not the layout this reader knows
        ts.open({"driver": driver, "kvstore": {**kvstore, "path": f"{key}/"}}, open=True).result().read().result()


def _restore_intact(directory: Path, keep: int, template: dict, aside: Path):
    """(manager of ``directory``, the newest checkpoint that reads back and matches its SHA-256 or None).

    Bad ones newer than it are moved to ``aside/<step>`` (``<directory>-corrupt``) with a warning, before
    the manager is reopened. With checkpoints but none intact, raises UsageError and moves nothing.
    """
    import orbax.checkpoint as ocp
    manager = _open_manager(directory, keep)
    bad, restored = [], None
    for step in sorted(manager.all_steps(), reverse=True):
        try:
            _read_back(directory / str(step))
            r = manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(template), meta=ocp.args.JsonRestore()))
            digest = r["meta"].get("sha256")  # r: an orbax Composite, a Mapping of the two items
            arrays = {k: np.asarray(v) for k, v in r["state"].items()}
            if digest is not None and digest != _digest(arrays):
                raise ValueError("its arrays do not match the SHA-256 saved with them")
            int(r["meta"]["step"])  # raise here, not later, if step or time is missing or malformed
            float(r["meta"]["time"])
        except Exception as e:  # orbax/tensorstore raise many types for unreadable files
            reason = " ".join(f"{type(e).__name__}: {e}".split())[:200]
            bad.append((step, reason))
            continue
        restored = r
        break
    if bad and restored is None:
        manager.close()
        raise UsageError(f"no intact checkpoint in {str(directory)!r} ({'; '.join(f'step {s}: {w}' for s, w in bad)}); "
                         f"move that folder away (or bppsa run --restart) to start over")
    if bad:
        assert restored is not None  # with none intact, raised just above
        manager.close()
        aside.mkdir(exist_ok=True)
        for step, reason in bad:
            dest = aside / str(step)
            n = 1
            while dest.exists():
                dest, n = aside / f"{step}.{n}", n + 1
            os.replace(directory / str(step), dest)
            warnings.warn(f"checkpoint {str(directory / str(step))!r} is corrupt ({reason}); moved it to "
                          f"{str(dest)!r}; resuming from step {int(restored['meta']['step'])}", stacklevel=3)
        manager = _open_manager(directory, keep)
    return manager, restored


def _read_metrics(path: Path, upto: int) -> tuple[list[dict], int]:
    """(the records with step <= ``upto`` of a JSONL file, the byte offset where the lines past them begin).

    A line that is not a JSON record with an int ``"step"`` is skipped with a warning naming its
    line number; the records after it are kept. The lines from the offset on are all past the
    checkpoint ``upto`` (or unreadable): a resumed run redoes those steps.
    """
    import json
    if not path.exists():
        return [], 0
    records, keep, bad, offset = [], 0, [], 0
    for number, line in enumerate(path.read_bytes().splitlines(keepends=True), 1):
        offset += len(line)
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        step = rec.get("step") if isinstance(rec, dict) else None
        if isinstance(step, int) and not isinstance(step, bool):
            if step <= upto:
                records.append(rec)
                keep = offset
        elif line.strip():
            bad.append((number, offset))
    for number, _ in [(n, o) for n, o in bad if o <= keep]:
        warnings.warn(f"{str(path)!r} line {number} is not a JSON metrics record; skipped (the records after it "
                      f"are kept)", stacklevel=3)
    return records, keep


def _logged_steps(upto: int, steps: int, log_every: int, eval_every: int | bool) -> bool:
    """Whether the loop logs a record at some step in 1..``upto`` (see the condition in :func:`fit`)."""
    return any((log_every and s % log_every == 0) or s == steps or (eval_every and s % eval_every == 0)
               for s in range(1, upto + 1))


def _append_only(path: Path, keep: int, superseded: Path):
    """``path`` opened for appending after its first ``keep`` bytes; the lines after them (the steps a resumed
    run redoes) are first appended to ``superseded`` (``<stem>.superseded.jsonl``), so nothing on disk is lost."""
    if path.exists() and path.stat().st_size > keep:
        with path.open("rb") as f:
            f.seek(keep)
            tail = f.read()
        with superseded.open("ab") as f:
            f.write(tail if tail.endswith(b"\n") else tail + b"\n")
        os.truncate(path, keep)
    f = path.open("a")
    if keep and path.read_bytes()[keep - 1:keep] != b"\n":
        f.write("\n")  # the last kept record was written without its newline
    return f


_ENTRIES = ("metrics.jsonl", "metrics.superseded.jsonl", "checkpoints", "checkpoints-corrupt")


def _entries(workdir) -> list[Path]:
    """The paths of :data:`_ENTRIES` in ``workdir``, obtained from ``workdir.entry(name)`` first when it has
    that writer (:class:`experiments.workdir.RunDir`, the work directory of ``bppsa run``: it lists each as bppsa's
    before it exists, and refuses one bppsa did not create)."""
    writer = getattr(workdir, "entry", None)
    if callable(writer):
        for name in _ENTRIES:
            writer(name)
    root = Path(workdir).resolve()
    return [root / name for name in _ENTRIES]


def fit(model, x, y, *, steps: int, batch_size: int, learning_rate: float = 1e-3, seed: int = 0,
        workdir=None, checkpoint_every: int = 0, keep_checkpoints: int = 2, eval_data=None,
        eval_every: int = 0, log_every: int = 1, optimizer: optax.GradientTransformation | None = None,
        progress: bool = True, desc: str | None = None,
        callback: Callable[[dict], None] | None = None) -> list[dict]:
    """The training loop: resumable, with JSONL metrics, tqdm and orbax checkpoints.

    Trains ``model`` on (x (N, T, I), y (N,)); the batch of step s is :func:`batch_indices`
    (N, batch_size, seed, s). With a ``workdir`` it appends one JSON record per logged step to
    ``workdir/metrics.jsonl`` and saves model + optimizer state to ``workdir/checkpoints`` every
    ``checkpoint_every`` steps and at the end. Calling ``fit`` again with the same arguments on the
    same workdir restores the latest checkpoint, sets the metrics logged after it aside (to
    ``metrics.superseded.jsonl``; a line that does not parse is skipped with a warning) and continues:
    a run killed at any point and resumed ends with the same parameters (bit-identical on CPU) as
    an uninterrupted one, because the state, the step count and the data order are all restored.

    Records hold ``step``, ``loss``, ``accuracy`` (of the training batch), ``step_time`` (s, that
    step incl. the host sync), ``time`` (cumulative training seconds, kept across resumes, without
    the first step of each (re)start, which compiles and is marked ``warmup``) and,
    every ``eval_every`` steps, ``eval_loss``/``eval_accuracy``. Returns the full history.

    Each checkpoint stores a SHA-256 of its arrays and is verified on restore. A checkpoint that
    does not read back or does not match is moved aside to ``workdir/checkpoints-corrupt/`` (never
    deleted) with a warning naming it, and the newest intact one is used. When none is intact,
    nothing is moved and :class:`bppsa.errors.UsageError` names the folder (move it away, or
    ``bppsa run --restart``, to start over).
    """
    import json

    from tqdm.auto import tqdm

    if steps < 0:
        raise ValueError(f"steps must be >= 0; got {steps}")
    if len(x) != len(y):
        raise ValueError(f"x and y must have the same length; got {len(x)} and {len(y)}")
    if not 1 <= batch_size <= len(x):
        raise ValueError(f"batch_size must be in 1..{len(x)} (the dataset size); got {batch_size}")
    if checkpoint_every < 0:
        raise ValueError(f"checkpoint_every must be >= 0; got {checkpoint_every}")
    tx = optimizer if optimizer is not None else _adam(float(learning_rate))
    opt = nnx.Optimizer(model, tx, wrt=nnx.Param)
    step_fn = _shared_train_step()

    start, elapsed, history, manager, metrics_file = 0, 0.0, [], None, None
    if workdir is not None:
        # its four entries: through the run's writer when workdir is the one `bppsa run` hands a task
        metrics_path, superseded, checkpoints, corrupt = _entries(workdir)
        Path(workdir).mkdir(parents=True, exist_ok=True)
        template = {str(i): _to_saveable(l) for i, l in enumerate(_state_leaves(model, opt))}
        manager, restored = _restore_intact(checkpoints, keep_checkpoints, template, corrupt)
        if restored is not None:
            _restore_state(model, opt, restored["state"])
            start, elapsed = int(restored["meta"]["step"]), float(restored["meta"]["time"])
            if start > steps:
                manager.close()
                raise ValueError(f"{workdir} holds a checkpoint at step {start}, past steps = {steps}; "
                                 f"use a new workdir or a larger steps")
        history, keep = _read_metrics(metrics_path, start)
        if start and not history and _logged_steps(start, steps, log_every, eval_data is not None and eval_every):
            manager.close()
            where = str(metrics_path)
            raise UsageError(f"{where!r} {'is gone' if not metrics_path.exists() else 'holds no records'}, but "
                             f"the checkpoint at step {start} follows the steps it logged (it was removed or "
                             f"emptied after bppsa wrote it); the run cannot be resumed: --restart (bppsa run) or "
                             f"a new work directory starts over")
        metrics_file = _append_only(metrics_path, keep, superseded)  # records on disk are never rewritten

    def save(step):
        import orbax.checkpoint as ocp
        assert manager is not None  # save is only called with a workdir, which opened the manager
        tree = {str(i): _to_saveable(l) for i, l in enumerate(_state_leaves(model, opt))}
        meta = {"step": step, "time": elapsed, "sha256": _digest(tree)}
        manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(tree), meta=ocp.args.JsonSave(meta)),
                     force=True)
        manager.wait_until_finished()

    bar = tqdm(total=steps, initial=start, desc=desc, disable=not progress, leave=False)
    try:
        for step in range(start + 1, steps + 1):
            idx = batch_indices(len(x), batch_size, seed, step - 1)
            t0 = time.perf_counter()
            loss, acc = step_fn(model, opt, jnp.asarray(x[idx]), jnp.asarray(y[idx]))
            loss, acc = float(loss), float(acc)
            dt = time.perf_counter() - t0
            warmup = step == start + 1  # compiles: kept out of the cumulative time
            elapsed += 0.0 if warmup else dt
            record = None
            if (log_every and step % log_every == 0) or step == steps or \
                    (eval_data is not None and eval_every and step % eval_every == 0):
                record = {"step": step, "loss": loss, "accuracy": acc, "step_time": dt, "time": elapsed}
                if warmup:
                    record["warmup"] = True
                if eval_data is not None and eval_every and (step % eval_every == 0 or step == steps):
                    ev = evaluate(model, *eval_data)
                    record.update(eval_loss=ev["loss"], eval_accuracy=ev["accuracy"])
                history.append(record)
                if metrics_file is not None:
                    metrics_file.write(json.dumps(record) + "\n")
                    metrics_file.flush()
                if callback is not None:
                    callback(record)
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.4f}")
            if manager is not None and ((checkpoint_every and step % checkpoint_every == 0) or step == steps):
                save(step)
            after_step(step)
    finally:
        bar.close()
        if metrics_file is not None:
            metrics_file.close()
        if manager is not None:
            manager.close()
    return history
