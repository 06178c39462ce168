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
