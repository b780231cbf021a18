"""How netq.widgets is packaged: the top-level widgets/ folder mapped into netq."""

from __future__ import annotations

import tomllib
from pathlib import Path

import netq.widgets

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
