"""The docs site's notebook pipeline: nbval executes, the writer keeps the outputs, the site
renders them without executing again (docs/conf.py refuses to build without them).

The writer (notebooks/executed_notebooks.py) runs here on two small notebooks in a pytest of
their own, with a real kernel: the one that passes is written with its outputs, the one with a
failing cell is not, and a stale copy of it is removed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbval")

REPO = Path(__file__).resolve().parents[1]

CONFTEST = f"""
import sys
from pathlib import Path
sys.path.insert(0, {str(REPO / "notebooks")!r})
from executed_notebooks import ExecutedNotebookWriter

def pytest_configure(config):
    config.option.nbval_lax = True
    config.option.nbval_current_env = True
    config.pluginmanager.register(ExecutedNotebookWriter(Path(__file__).parents[1] / "out"))
"""


def notebook(*sources: str):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# a notebook")]
    nb.cells += [nbformat.v4.new_code_cell(source) for source in sources]
    return nb


def run_nbval(folder: Path) -> subprocess.CompletedProcess:
    """pytest under nbval on the notebooks in ``folder``, in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
         str(folder)],
        cwd=folder, capture_output=True, text=True, timeout=100,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})


@pytest.mark.timeout(120)
def test_nbval_run_writes_passed_notebooks_with_outputs(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "conftest.py").write_text(CONFTEST)
    nbformat.write(notebook("print('hello')", "x = 6 * 7\nx", "assert x == 42"),
                   str(run / "good.ipynb"))
    nbformat.write(notebook("print('before')", "assert False, 'this cell fails'"),
                   str(run / "bad.ipynb"))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "bad.ipynb").write_text("stale")
    result = run_nbval(run)
    assert "1 failed, 4 passed" in result.stdout, result.stdout + result.stderr

    assert not (tmp_path / "out" / "bad.ipynb").exists()  # failed: no stale outputs either
    executed = nbformat.read(str(tmp_path / "out" / "good.ipynb"), as_version=4)
    nbformat.validate(executed)
    code = [cell for cell in executed.cells if cell.cell_type == "code"]
    assert [cell.execution_count for cell in code] == [1, 2, 3]
    assert code[0].outputs[0].output_type == "stream"
    assert code[0].outputs[0].text == "hello\n"
    assert code[1].outputs[0].output_type == "execute_result"
    assert code[1].outputs[0].data["text/plain"] == "42"
    assert code[1].outputs[0].execution_count == 2
    assert code[2].outputs == []
    # the committed notebook is untouched: still without outputs
    source = nbformat.read(str(run / "good.ipynb"), as_version=4)
    assert all(cell.get("outputs", []) == [] for cell in source.cells)



@pytest.mark.timeout(120)
def test_written_copy_applies_display_updates_and_keeps_no_widget_views(tmp_path):
    # A live view displayed with a display id and replaced by a later cell (as a monitor that
    # stops is): the copy shows the replacement, without the widget view whose model is not
    # stored, and the notebook's widget metadata is not carried over.
    run = tmp_path / "run"
    run.mkdir()
    (run / "conftest.py").write_text(CONFTEST)
    widget = "application/vnd.jupyter.widget-view+json"
    view = {widget: {"version_major": 2, "version_minor": 1, "model_id": "0123abcd"}}
    nb = notebook(
        "from IPython.display import display, update_display\n"
        f"handle = display({{**{view!r}, 'text/html': '<b>live</b>', 'text/plain': 'live'}}, "
        "raw=True, display_id='view')",
        "update_display({'text/html': '<b>stopped</b>', 'text/plain': 'stopped'}, raw=True, "
        "display_id='view')\n"
        f"display({view!r}, raw=True)",
        "print('done')")
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    nbformat.write(nb, str(run / "views.ipynb"))
    (tmp_path / "out").mkdir()
    result = run_nbval(run)
    assert "3 passed" in result.stdout, result.stdout + result.stderr

    executed = nbformat.read(str(tmp_path / "out" / "views.ipynb"), as_version=4)
    nbformat.validate(executed)
    assert "widgets" not in executed.metadata
    first, second, third = (cell for cell in executed.cells if cell.cell_type == "code")
    assert [output.data for output in first.outputs] == [
        {"text/html": "<b>stopped</b>", "text/plain": "stopped"}]
    assert second.outputs == []  # a widget view and nothing else: nothing left to show
    assert third.outputs[0].text == "done\n"

def test_docs_build_refuses_to_run_without_the_executed_notebooks(tmp_path):
    sphinx = pytest.importorskip("sphinx")
    del sphinx
    docs = tmp_path / "docs"
    docs.mkdir()
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "01-x.ipynb").write_text("{}")
    conf = (REPO / "docs" / "conf.py").read_text()
    (docs / "conf.py").write_text(conf)
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-q", str(docs), str(tmp_path / "html")],
        capture_output=True, text=True, timeout=100)
    assert result.returncode != 0
    assert "01-x.ipynb is missing from docs/_executed/notebooks/" in result.stderr
    assert "python3 -m pytest notebooks" in result.stderr
