"""pytest runs these notebooks under nbval (``python3 -m pytest`` collects this folder).

Lax: the checks are the asserts in the cells, not a comparison with stored outputs (the
notebooks are committed without any). Current env: the kernel is this interpreter, with netq.
Set here rather than in addopts so that the options exist only where notebooks are run:
``pytest tests`` works without nbval or Jupyter installed.

Each notebook that passes whole is also written with its outputs for the docs site
(executed_notebooks.py), which renders them without executing them again.
"""

import pytest


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.hasplugin("nbval"):
        raise pytest.UsageError("notebooks/ run under nbval: pip install -e '.[notebooks]' "
                                "(or run only the suite: pytest tests)")
    if not config.option.nbval:  # an explicit --nbval (compare outputs) wins
        config.option.nbval_lax = True
    config.option.nbval_current_env = True
    from executed_notebooks import ExecutedNotebookWriter  # needs nbval, checked above

    config.pluginmanager.register(ExecutedNotebookWriter(), "netq-executed-notebooks")
