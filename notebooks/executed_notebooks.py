"""A pytest plugin that keeps each notebook nbval executed, with its outputs, for the docs site.

The notebooks are committed without outputs and executed by nbval in the test run; the docs
site (docs/conf.py) renders these executed copies with execution off, so a notebook is run once
per CI run, by the tests, never again by the docs build.

A notebook is written (to ``docs/_executed/notebooks/<name>.ipynb``, gitignored) only when
every one of its code cells ran and passed in this session; its previous copy is deleted when
its first cell starts, so a failed or partial run leaves no stale outputs for the docs to show.
Wired from notebooks/conftest.py; nothing here changes how the cells are run or checked.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import nbformat
import pytest
from nbval.plugin import IPyNbCell, IPyNbFile

EXECUTED_FOLDER = Path(__file__).resolve().parents[1] / "docs" / "_executed" / "notebooks"


class ExecutedNotebookWriter:
    """Collects nbval's outputs cell by cell and writes each fully passed notebook."""

    def __init__(self, folder: Path = EXECUTED_FOLDER) -> None:
        self.folder = folder
        # per notebook: {code cell number: outputs} of the cells that passed or were skipped,
        # and the notebooks with a cell that failed
        self._outputs: dict[IPyNbFile, dict[int, list]] = {}
        self._failed: set[IPyNbFile] = set()

    def _target(self, notebook: IPyNbFile) -> Path:
        return self.folder / Path(str(notebook.path)).name

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if isinstance(item, IPyNbCell) and item.parent not in self._outputs:
            self._outputs[item.parent] = {}
            self._target(item.parent).unlink(missing_ok=True)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        report = yield
        if isinstance(item, IPyNbCell):
            if report.failed:
                self._failed.add(item.parent)
            elif report.skipped:  # an NBVAL_SKIP cell: no outputs, and nothing failed
                self._outputs[item.parent][item.cell_num] = []
            elif report.when == "call":
                self._outputs[item.parent][item.cell_num] = item.test_outputs or []
        return report

    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> None:
        if not isinstance(item, IPyNbCell):
            return
        notebook = item.parent
        if nextitem is not None and nextitem.parent is notebook:
            return  # not the notebook's last cell
        outputs = self._outputs.pop(notebook, {})
        if notebook in self._failed:
            self._failed.discard(notebook)
            return
        self._write(notebook, outputs)

    def _write(self, notebook: IPyNbFile, outputs: dict[int, list]) -> None:
        executed = copy.deepcopy(notebook.nb)
        code_cells = [cell for cell in executed.cells if cell.cell_type == "code"]
        if any(number not in outputs for number in range(len(code_cells))):
            return  # only some cells ran (pytest -k, --lf): not a whole execution
        for number, cell in enumerate(code_cells, start=1):
            cell.execution_count = number
            cell.outputs = copy.deepcopy(outputs.get(number - 1, []))
            for output in cell.outputs:
                if output.output_type == "execute_result":
                    output.execution_count = number
        nbformat.validate(executed)
        self.folder.mkdir(parents=True, exist_ok=True)
        target = self._target(notebook)
        partial = target.with_suffix(".ipynb.partial")
        nbformat.write(executed, str(partial))
        os.replace(partial, target)

