"""Task functions for the runner tests (configs name them as "tests.helpers:NAME")."""


def echo_task(config, workdir) -> dict:
    """Returns ``{"n": config.n}``; writes nothing."""
    return {"n": config.n}


def pub_task(config, workdir) -> dict:
    """Writes ``pub.json`` and ``pub.md`` into ``workdir`` when ``config.write``; returns ``{"wrote": ...}``."""
    if config.write:
        (workdir / "pub.json").write_text("{}")
        (workdir / "pub.md").write_text("| a |\n")
    return {"wrote": config.write}


def write_task(config, workdir) -> dict:
    """Writes ``out.json`` and ``state/step.txt`` into ``workdir``; with ``config.die`` the process
    then kills itself with SIGKILL (a run killed before the runner can record anything)."""
    import os
    import signal
    (workdir / "out.json").write_text('{"n": %d}' % config.n)
    (workdir / "state").mkdir(exist_ok=True)
    (workdir / "state" / "step.txt").write_text(str(config.n))
    if config.die:
        os.kill(os.getpid(), signal.SIGKILL)
    return {"n": config.n}


def refusing_task(config, workdir) -> dict:
    """Refuses ``config.n == 0`` (or a work directory holding ``REFUSE``) with a UsageError, as a task
    does on a bad data folder, after creating an empty ``partial/``; otherwise returns ``{"n": config.n}``."""
    from bppsa.errors import UsageError
    (workdir / "partial").mkdir(exist_ok=True)
    if config.n == 0 or (workdir / "REFUSE").exists():
        raise UsageError("config.n: the task found nothing to do with n = 0; expected n >= 1")
    return {"n": config.n}
