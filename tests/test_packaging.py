"""What ``pip install .`` gives (issue 61): the version from one source, the license, the citation and
the changelog, ``py.typed``; and, built for real (slow), a wheel holding the library and the command's
entry module only: no top-level ``experiments`` package."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
import yaml

import bppsa

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_version_has_one_source():
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "bppsa.__version__"}
    init = (ROOT / "bppsa" / "__init__.py").read_text()
    assert re.findall(r'^__version__ = "([^"]+)"', init, re.M) == [bppsa.__version__]
    literal = re.compile(r"""(version|release)\s*=\s*["']\d""")
    for path in ("docs/conf.py", "experiments/cli.py", "bppsa_cli.py", "pyproject.toml"):
        assert not literal.search((ROOT / path).read_text()), f"{path} writes a version of its own"
    assert "version" not in yaml.safe_load((ROOT / "CITATION.cff").read_text())


def test_the_changelog_names_the_current_version_first():
    headings = re.findall(r"^## (\d+\.\d+\.\d+\S*)", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert headings and headings[0] == bppsa.__version__, headings


def test_the_license_is_the_declared_one():
    assert PYPROJECT["project"]["license"] == "Apache-2.0" and PYPROJECT["project"]["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text[:200] and "Version 2.0, January 2004" in text[:200]
    assert "END OF TERMS AND CONDITIONS" in text and len(text.splitlines()) > 150  # the full text


def test_the_citation_is_the_software_with_the_bppsa_paper_among_its_references():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["type"] == "software" and cff["license"] == "Apache-2.0"
    assert cff["authors"] and cff["title"].startswith("bppsa")
    paper = next(r for r in cff["references"] if r["title"].startswith("BPPSA"))
    assert [a["family-names"] for a in paper["authors"]] == ["Wang", "Bai", "Pekhimenko"]
    assert paper["year"] == 2020 and "MLSys" in paper["collection-title"]


def test_the_package_is_typed():
    assert (ROOT / "bppsa" / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["bppsa"]
    assert "Typing :: Typed" in PYPROJECT["project"]["classifiers"]


def test_the_command_is_the_light_entry_and_the_harness_is_not_packaged():
    assert PYPROJECT["project"]["scripts"] == {"bppsa": "bppsa_cli:main"}
    assert PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"] == ["bppsa*"]
    assert PYPROJECT["tool"]["setuptools"]["py-modules"] == ["bppsa_cli"]


@pytest.mark.slow  # builds the wheel in an isolated environment (setuptools from the registry): 15-40 s
def test_the_wheel_holds_the_library_only(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    (wheel,) = tmp_path.glob("bppsa-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    dist = f"bppsa-{bppsa.__version__}.dist-info"
    assert {n.split("/")[0] for n in names} == {"bppsa", "bppsa_cli.py", dist}, sorted({n.split("/")[0] for n in names})
    assert not [n for n in names if n.startswith(("experiments", "tests", "docs", "notebooks"))]
    expected = {"bppsa/py.typed", "bppsa/plan/cost_models/cpu.json", "bppsa/plan/cost_models/gpu.json",
                f"{dist}/licenses/LICENSE"}
    assert expected <= set(names), expected - set(names)
    sources = {str(p.relative_to(ROOT)) for p in (ROOT / "bppsa").rglob("*.py")}
    assert sources <= set(names), sorted(sources - set(names))[:5]
    with zipfile.ZipFile(wheel) as z:
        meta = Parser().parsestr(z.read(f"{dist}/METADATA").decode())
        entry_points = z.read(f"{dist}/entry_points.txt").decode()
    assert meta["Version"] == bppsa.__version__ and meta["License-Expression"] == "Apache-2.0"
    assert set(meta.get_all("Classifier") or []) == set(PYPROJECT["project"]["classifiers"])
    assert set(meta.get_all("Provides-Extra") or []) >= {"experiments", "distributed", "tasks", "dev"}
    assert re.search(r"^bppsa = bppsa_cli:main$", entry_points, re.M), entry_points


def _readme_paragraph(start: str) -> str:
    text = (ROOT / "README.md").read_text()
    i = text.index(start)
    return text[i:text.index("\n\n", i)]


def test_the_readme_lists_every_config_and_says_where_make_reproduce_writes():
    from experiments import cli, runner
    listed = _readme_paragraph("Every result is a config under `experiments/*/configs/`")
    listed = listed[:listed.index("A run that fails")]
    names = set(re.findall(r"`([a-z_0-9]+)`", listed))
    paths = cli.config_paths()
    folders = {p.parent.parent.name for p in paths.values()}
    assert names == set(paths) | folders, (names ^ (set(paths) | folders))
    reproduce = _readme_paragraph("Each command creates its own virtual environment")
    assert "`.venv/bin/bppsa`" in reproduce and "`bppsa reproduce irmas --quick`" in reproduce
    assert "$(BIN)/bppsa reproduce irmas --quick" in (ROOT / "Makefile").read_text()
    workdir = runner.default_workdir(paths["irmas"], "quick")
    assert f"`{workdir}/`" in reproduce, workdir
    for name in ("irmas_grid", "irmas_train"):
        assert f"`{name}.{{json,md,png}}`" in reproduce
