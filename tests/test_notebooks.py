"""notebooks/: committed clean, each one checks its claims, each one in the README.

nbval executes them (``python3 -m pytest`` collects ``notebooks/`` with ``--nbval-lax``); these
tests keep what nbval cannot see: a committed notebook carries no outputs (a diff of a re-run
is all noise, and an output could hide a stale result), it asserts what it says, it tidies up
after itself, and the README links it with a line saying what it shows, next to a Binder badge
that opens this repository.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def source(cell: dict) -> str:
    text = cell["source"]
    return text if isinstance(text, str) else "".join(text)


def test_there_are_notebooks():
    names = [path.stem for path in NOTEBOOKS]
    assert len(names) >= 5, names
    assert all(re.fullmatch(r"\d\d-[a-z0-9-]+", name) for name in names), names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.name)
def test_committed_without_outputs(path):
    notebook = json.loads(path.read_text())
    assert notebook["nbformat"] == 4
    assert notebook["metadata"]["kernelspec"]["name"] == "python3"
    dirty = [index for index, cell in enumerate(notebook["cells"]) if cell["cell_type"] == "code"
             and (cell.get("outputs") or cell.get("execution_count") is not None)]
    assert not dirty, f"cells {dirty} have outputs: jupyter nbconvert --clear-output --inplace"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.name)
def test_checks_its_claims_and_cleans_up(path):
    code = [source(cell) for cell in cells(path) if cell["cell_type"] == "code"]
    asserts = sum(len(re.findall(r"^\s*assert\b", text, re.M)) for text in code)
    assert asserts >= 3, f"{path.name}: {asserts} asserts; every claim needs one"
    assert cells(path)[0]["cell_type"] == "markdown", "the first cell says what it shows"
    assert "netq-" in code[-1] or "netq-" in code[-2], \
        f"{path.name}: the last cells must check that no netq- thread is left"


def test_readme_links_every_notebook_and_the_binder_badge():
    readme = (REPO / "README.md").read_text()
    for path in NOTEBOOKS:
        link = f"(notebooks/{path.name})"
        assert link in readme, f"README does not link {path.name}"
        line = next(line for line in readme.splitlines() if link in line)
        assert len(line.split(link, 1)[1].strip(" :-—|")) > 20, \
            f"README: say what {path.name} shows on its line"
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    repository = project["urls"]["Repository"]
    owner_name = repository.removeprefix("https://github.com/").strip("/")
    badge = f"https://mybinder.org/v2/gh/{owner_name}/HEAD?urlpath=lab/tree/notebooks"
    assert badge in readme, f"README: no Binder badge for {repository} ({badge})"
    assert "https://mybinder.org/badge_logo.svg" in readme
