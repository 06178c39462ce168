"""The one Markdown table writer of every result file. ::

    markdown_table(["T", "B", "BPPSA ms"], [[10, 16, "0.12"], [100, 16, "0.95"]])

gives a GitHub-flavoured table (header, separator, one line per row). Cells are written with
``str`` (format numbers before passing them); a ``|`` inside a cell is escaped so the table
keeps its columns.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["markdown_table"]


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(header: Sequence[object], rows: Iterable[Sequence[object]],
                   align: Sequence[str] | None = None) -> str:
    """A Markdown table: ``header`` (k column titles), ``rows`` (each k cells), ``align`` one of
    "l", "r", "c" per column (default: no alignment marks). Raises ValueError on a row whose
    length is not k, naming the row."""
    k = len(header)
    if align is not None and (len(align) != k or any(a not in ("l", "r", "c") for a in align)):
        raise ValueError(f"align must give one of 'l', 'r', 'c' for each of the {k} columns; got {align!r}")
    marks = {"l": ":---", "r": "---:", "c": ":---:"}
    sep = [marks[a] for a in align] if align is not None else ["---"] * k
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |", "|" + "|".join(sep) + "|"]
    for i, row in enumerate(rows):
        row = list(row)
        if len(row) != k:
            raise ValueError(f"row {i} has {len(row)} cells; the header has {k}: {row!r}")
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return "\n".join(lines)
