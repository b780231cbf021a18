"""How netq.widgets is packaged: the top-level widgets/ folder mapped into netq."""

from __future__ import annotations

import tomllib
from pathlib import Path

import netq.widgets
import pytest

REPO = Path(__file__).resolve().parents[2]


def test_every_netq_subpackage_is_listed_and_widgets_is_mapped():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    setuptools = config["tool"]["setuptools"]
    on_disk = {"netq." + ".".join(p.parent.relative_to(REPO / "netq").parts)
               for p in (REPO / "netq").rglob("__init__.py")}
    on_disk = {name.rstrip(".") for name in on_disk} | {"netq.widgets"}
    assert set(setuptools["packages"]) == on_disk
    assert setuptools["package-dir"] == {"netq.widgets": "widgets"}
    extras = config["project"]["optional-dependencies"]
    # The dev extra (what CI installs) pulls in the widgets through a self-reference.
    requested = set()
    for dependency in extras["dev"]:
        if dependency.startswith("netq["):
            requested |= {name.strip() for name in dependency[5:dependency.index("]")].split(",")}
    assert "widgets" in requested, extras["dev"]


def test_the_imported_widgets_are_this_checkout():
    assert Path(netq.widgets.__file__).resolve() == REPO / "widgets" / "__init__.py"
    assert Path(netq.__file__).resolve() == REPO / "netq" / "__init__.py"


@pytest.mark.timeout(300)
def test_the_views_frontend_files_are_package_data_and_the_wheel_ships_them(tmp_path):
    """The anywidget ES modules and CSS are files in widgets/frontend/, declared as package
    data; a built wheel carries them under netq/widgets/frontend/ (no CDN, no lab extension)."""
    import shutil
    import subprocess
    import sys
    import zipfile

    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    data = config["tool"]["setuptools"]["package-data"]["netq.widgets"]
    assert set(data) >= {"frontend/*.js", "frontend/*.css"}
    assert (REPO / "widgets" / "frontend" / "monitor.js").is_file()
    assert (REPO / "widgets" / "frontend" / "monitor.css").is_file()
    extras = config["project"]["optional-dependencies"]
    assert "anywidget==0.11.0" in extras["widgets"]
    assert not [d for d in extras["widgets"] if "bokeh" in d]
    pytest.importorskip("build", reason="python -m build needs the build package")
    source = tmp_path / "source"  # a copy: the build leaves nothing in the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, source / name)
    for folder in ("netq", "widgets"):
        shutil.copytree(REPO / folder, source / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    # isolated, as .ci/run builds: the backend (setuptools >= 77) comes from the index
    result = subprocess.run([sys.executable, "-m", "build", "--wheel",
                             "--outdir", str(tmp_path / "dist")], cwd=source,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("netq-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"netq/widgets/frontend/monitor.js", "netq/widgets/frontend/monitor.css"} <= names
