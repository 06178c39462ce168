"""Task functions for the runner tests (configs name them as "tests.runner_tasks:NAME"),
and ``python tests/runner_tasks.py K ARGV...``: run ``bppsa ARGV...`` and SIGKILL the process after
the K-th training step of :func:`experiments.train.fit` it completes, as kill -9 does. :func:`steps_task`
kills itself so after its K-th step when the environment has ``BPPSA_TEST_KILL_AFTER=K``."""

import json
import os
import signal
import sys
import time


_done = [0]


def after_step(step: int) -> None:
    """Called by :func:`steps_task` after each step: SIGKILL after the ``BPPSA_TEST_KILL_AFTER``-th one."""
    _done[0] += 1
    if os.environ.get("BPPSA_TEST_KILL_AFTER") == str(_done[0]):
        os.kill(os.getpid(), signal.SIGKILL)


def steps_task(config, workdir) -> dict:
    """A resumable toy training run: ``config.steps`` steps of x <- (3x + step) mod 1009, each logged to
    ``train/metrics.jsonl`` and checkpointed to ``train/state.json`` (atomic), then ``<name>.json``.

    Faults, from the environment: ``BPPSA_TEST_FAULT=part`` -- after the steps, a part of the task fails
    (:func:`experiments.part_failed`); ``=rmdir`` -- the work directory is removed (as by ``rm -rf`` in
    another shell) before the steps, which go on, recreating ``train/``."""
    import shutil
    from pathlib import Path

    from experiments import part_failed
    train = workdir.entry("train")
    train.mkdir(exist_ok=True)
    fault = os.environ.get("BPPSA_TEST_FAULT")
    if fault == "rmdir":
        shutil.rmtree(Path(workdir))
        train.mkdir(parents=True)
    state = train / "state.json"
    start, x = (json.loads(state.read_text())["step"], json.loads(state.read_text())["x"]) if state.exists() else (0, 1)
    if start > config.steps:
        raise ValueError(f"state at step {start} past steps = {config.steps}")
    lines = (train / "metrics.jsonl").read_text().splitlines()[:start] if start else []
    (train / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))
    for step in range(start + 1, config.steps + 1):
        x = (3 * x + step) % 1009
        with (train / "metrics.jsonl").open("a") as f:
            f.write(json.dumps({"step": step, "x": x}) + "\n")
        (train / "state.tmp").write_text(json.dumps({"step": step, "x": x}))
        os.replace(train / "state.tmp", state)
        after_step(step)
    if fault == "part":
        part_failed(config, "the toy's evaluation", "its process was killed", [])
    workdir.entry(f"{config.name}.json").write_text(json.dumps({"x": x, "steps": config.steps}))
    return {"x": x}


def wait_task(config, workdir) -> dict:
    """Writes ``started``, then waits (at most 120 s) until the file ``config.release`` exists."""
    workdir.entry("started").write_text(str(os.getpid()))
    deadline = time.monotonic() + 120
    while not os.path.exists(config.release) and time.monotonic() < deadline:
        time.sleep(0.05)
    return {"released": os.path.exists(config.release)}


def entry_then_die(config, workdir) -> dict:
    """Obtains ``config.entry`` from the run's writer and SIGKILLs the process before creating it."""
    workdir.entry(config.entry)
    os.kill(os.getpid(), signal.SIGKILL)
    return {}


def bypass_task(config, workdir) -> dict:
    """Writes ``raw.txt`` without the writer (as a task that forgets it would), and ``out.txt`` through it."""
    from pathlib import Path
    (Path(workdir) / "raw.txt").write_text("not through entry()")
    workdir.entry("out.txt").write_text("through entry()")
    return {}


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


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import experiments.train
    from experiments import cli
    count, k = [0], int(sys.argv[1])

    def kill_after_k(step):
        count[0] += 1
        if count[0] == k:
            os.kill(os.getpid(), signal.SIGKILL)
    experiments.train.after_step = kill_after_k
    sys.exit(cli.main(sys.argv[2:]))
