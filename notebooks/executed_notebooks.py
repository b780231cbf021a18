"""A pytest plugin that keeps each notebook nbval executed, with its outputs, for the docs site.

The notebooks are committed without outputs and executed by nbval in the test run; the docs
site (docs/conf.py) renders these executed copies with execution off, so a notebook is run once
per CI run, by the tests, never again by the docs build.

A notebook is written (to ``docs/_executed/notebooks/<name>.ipynb``, gitignored) only when
every one of its code cells ran and passed in this session; its previous copy is deleted when
its first cell starts, so a failed or partial run leaves no stale outputs for the docs to show.
Wired from notebooks/conftest.py; nothing here changes how the cells are run or checked.

A display that a later cell updates in place (``update_display_data`` for its display id: a
monitor or dashboard that stops shows its static form where the live one was) is written as
updated, as Jupyter shows it. nbval itself does not apply such updates (it reports them as
unhandled), so the writer reads them from the kernel messages nbval receives; an update sent
while no cell runs reaches nobody, and the output keeps what it showed before.

The copy stores no widget state: nbval records a cell's outputs, never the widgets' models, so
a widget view in an output would refer to a model nobody can load (an empty box in nbconvert's
HTML). Such an output keeps only its static forms (the monitor's and the dashboard's HTML and
text, which every display of theirs carries beside the widget), and any ``widgets`` metadata
is dropped.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import nbformat
import pytest
from nbval.plugin import IPyNbCell, IPyNbFile

EXECUTED_FOLDER = Path(__file__).resolve().parents[1] / "docs" / "_executed" / "notebooks"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def without_widget_views(outputs: list) -> list:
    """``outputs`` (changed in place) minus the widget views, whose models are not stored: a
    display keeps its other forms; one that had nothing else is left out."""
    kept = []
    for output in outputs:
        data = output.get("data")
        if data is not None:
            data.pop(WIDGET_VIEW, None)
            if not data:
                continue
        kept.append(output)
    return kept


class ExecutedNotebookWriter:
    """Collects nbval's outputs cell by cell and writes each fully passed notebook."""

    def __init__(self, folder: Path = EXECUTED_FOLDER) -> None:
        self.folder = folder
        # per notebook: {code cell number: outputs} of the cells that passed or were skipped,
        # and the notebooks with a cell that failed
        self._outputs: dict[IPyNbFile, dict[int, list]] = {}
        self._failed: set[IPyNbFile] = set()
        # per notebook: the ``data`` of each output shown with a display id (nbval keeps a
        # copy of it, found again by equality), and the last update of each display id
        self._displays: dict[IPyNbFile, tuple[list[tuple[dict, str]], dict[str, dict]]] = {}

    def _target(self, notebook: IPyNbFile) -> Path:
        return self.folder / Path(str(notebook.path)).name

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if isinstance(item, IPyNbCell) and item.parent not in self._outputs:
            self._outputs[item.parent] = {}
            self._target(item.parent).unlink(missing_ok=True)
            self._follow_display_updates(item.parent)

    def _follow_display_updates(self, notebook: IPyNbFile) -> None:
        """See every kernel message nbval reads for ``notebook``, to apply display updates."""
        shown, latest = self._displays[notebook] = ([], {})
        receive = notebook.get_kernel_message

        def get_kernel_message(*args, **kwargs):
            message = receive(*args, **kwargs)
            content = message.get("content") or {}
            display_id = (content.get("transient") or {}).get("display_id")
            if display_id is not None and "data" in content:
                if message["msg_type"] in ("display_data", "execute_result"):
                    shown.append((copy.deepcopy(content["data"]), display_id))
                elif message["msg_type"] == "update_display_data":
                    latest[display_id] = copy.deepcopy(content["data"])
            return message

        notebook.get_kernel_message = get_kernel_message  # type: ignore[method-assign]

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
        displays = self._displays.pop(notebook, ([], {}))
        if notebook in self._failed:
            self._failed.discard(notebook)
            return
        self._write(notebook, outputs, *displays)

    def _write(self, notebook: IPyNbFile, outputs: dict[int, list],
               shown: list[tuple[dict, str]], latest: dict[str, dict]) -> None:
        executed = copy.deepcopy(notebook.nb)
        executed.metadata.pop("widgets", None)  # no model is stored: see the module docstring
        code_cells = [cell for cell in executed.cells if cell.cell_type == "code"]
        if any(number not in outputs for number in range(len(code_cells))):
            return  # only some cells ran (pytest -k, --lf): not a whole execution
        for number, cell in enumerate(code_cells, start=1):
            cell.execution_count = number
            cell.outputs = copy.deepcopy(outputs.get(number - 1, []))
            for output in cell.outputs:  # as updated later, where a later cell updated it
                display_id = next((display_id for data, display_id in shown
                                   if output.get("data") == data), None)
                if display_id in latest:
                    output.data = copy.deepcopy(latest[display_id])
            cell.outputs = without_widget_views(cell.outputs)
            for output in cell.outputs:
                if output.output_type == "execute_result":
                    output.execution_count = number
        nbformat.validate(executed)
        self.folder.mkdir(parents=True, exist_ok=True)
        target = self._target(notebook)
        partial = target.with_suffix(".ipynb.partial")
        nbformat.write(executed, str(partial))
        os.replace(partial, target)

