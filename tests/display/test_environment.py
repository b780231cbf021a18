"""netq/display/environment.py: the versions and the machine a measurement ran on."""

from __future__ import annotations

import importlib.metadata
import platform

import netq
from netq.display import environment as environment_module
from netq.display.environment import environment, environment_line, installed_version


def test_the_environment_names_versions_machine_and_load():
    env = environment()
    assert set(env) == {"netq", "python", "system", "cpu", "cores", "load (1 min)"}
    assert env["python"] == platform.python_version() and int(env["cores"]) >= 1
    line = environment_line()
    assert line.startswith(f"netq {env['netq']}, Python {env['python']} on ")
    assert line.endswith(" over 1 min")


def test_the_version_is_the_installed_distributions_which_is_netq_version():
    """Read from the metadata (no import of the netq package above the display), which
    pyproject.toml writes from netq.__version__ at install."""
    assert installed_version() == importlib.metadata.version("netq") == netq.__version__


def test_without_an_installed_distribution_the_version_says_so(monkeypatch):
    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(environment_module.importlib.metadata, "version", not_installed)
    assert environment()["netq"] == "unknown (not installed)"
