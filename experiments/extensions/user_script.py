"""What a library user gets, measured in a process of its own (the task of
experiments/extensions/configs/user_script.py).

The measurement is experiments/scripts/user_script.py, a plain user script: ``import bppsa`` and the
public API, no ``bppsa.host`` call and no harness set-up in its process, so the process is in the
state a user's script is in (the first ``bppsa.rnn`` call applies bppsa's CPU defaults, as it would
for them). This task runs that script as a subprocess (``sys.executable``, this process's
environment) with the config's flags (``steps``, ``repeats``, ``shapes``, ``note``) and its output
path inside the work directory, then reads back the JSON it wrote: ``<name>``.json (the script's
rows and provenance, the command recorded being this run's ``bppsa run ...``) and ``<name>``.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from os import PathLike
from pathlib import Path

from bppsa.errors import UsageError, checked_by, require_int
from experiments import entry
from experiments.provenance import current_command

__all__ = ["SCRIPT", "check", "script_argv", "run"]

#: The user script this task runs.
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "user_script.py"


def check(config) -> None:
    """The ranges of :func:`run`'s config (UsageError naming the key)."""
    require_int(config, "steps")
    require_int(config, "repeats")
    shapes = config.shapes
    if not isinstance(shapes, (list, tuple)) or not shapes or any(
            not isinstance(s, (list, tuple)) or len(s) != 2
            or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in s) for s in shapes):
        raise UsageError(f"config.shapes must be a non-empty list of (T, B) pairs of positive ints; got {shapes!r}")
    if not isinstance(config.note, str):
        raise UsageError(f"config.note must be a string; got {config.note!r}")
    name = config.name
    if not isinstance(name, str) or not name or any(c in name for c in "./\\"):
        raise UsageError(f"config.name must be a file stem (no '.', '/'); got {name!r}")


def script_argv(config, out: Path, command: str | None = None) -> list[str]:
    """The script's command line: ``sys.executable SCRIPT --out OUT --steps … --repeats … --shapes TxB,…``
    (``--note``, ``--command`` when given)."""
    argv = [sys.executable, str(SCRIPT), "--out", str(out), "--steps", str(config.steps),
            "--repeats", str(config.repeats), "--shapes", ",".join(f"{T}x{B}" for T, B in config.shapes)]
    if config.note:
        argv += ["--note", config.note]
    if command:
        argv += ["--command", command]
    return argv


@checked_by(check)
def run(config, workdir: PathLike) -> dict:
    """Task of ``experiments/extensions/configs/user_script.py``: the script in a subprocess, its JSON read back."""
    check(config)
    json_path = entry(workdir, f"{config.name}.json")
    md_path = entry(workdir, f"{config.name}.md")
    stem = json_path.with_name(config.name)  # the script writes stem.json and stem.md
    argv = script_argv(config, stem, current_command())
    print("running", " ".join(argv[1:3]), "...", flush=True)
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.stdout:
        print(proc.stdout, end="", flush=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{SCRIPT.name} exited with status {proc.returncode}:\n{proc.stderr[-3000:]}")
    if not md_path.is_file():
        raise RuntimeError(f"{SCRIPT.name} wrote no {md_path}")
    record = json.loads(json_path.read_text())
    return {"rows": [{"T": r["T"], "B": r["B"], "ms_per_step": r["ms_per_step"], "fastest": r["fastest"],
                      "auto_choice": r["auto_choice"], "auto_vs_fastest": r["auto_vs_fastest"],
                      "allocator_tuned": r["allocator_tuned"]} for r in record["rows"]],
            "auto_vs_fastest_max": max(r["auto_vs_fastest"] for r in record["rows"]),
            "command": record["provenance"]["command"],
            "files": [json_path.name, md_path.name]}
