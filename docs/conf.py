"""Sphinx configuration of the netq docs site (``python -m sphinx -W -n docs docs/_build/html``).

Why Sphinx with MyST-NB rather than mkdocs-material with mkdocstrings: the docstrings are
written in reStructuredText roles (``:class:``, ``:func:``, ``:mod:``), which Sphinx's autodoc
resolves and checks natively (``-n``: every reference must resolve); MyST keeps the existing
Markdown pages as they are; and MyST-NB renders the notebooks from their stored outputs with
execution off (mkdocs-jupyter would need its own kernel setup to do the same).

The notebooks are not executed here: the test run executes them under nbval and
notebooks/executed_notebooks.py writes each one that passed, with its outputs, to
docs/_executed/notebooks/. The build stops with a clear message when they are missing.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sphinx.errors import ConfigError

import netq

DOCS = Path(__file__).resolve().parent
EXECUTED = DOCS / "_executed" / "notebooks"
NOTEBOOKS = sorted(p.name for p in (DOCS.parent / "notebooks").glob("*.ipynb"))
missing = [name for name in NOTEBOOKS if not (EXECUTED / name).is_file()]
if missing:
    raise ConfigError(
        f"the docs render the notebooks executed by the test run, and "
        f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing from "
        f"{EXECUTED.relative_to(DOCS.parent)}/: run `python3 -m pytest notebooks` first (nbval "
        f"executes them and notebooks/executed_notebooks.py writes each one that passed)")

project = "netq"
author = "The netq contributors"
copyright = "2026, The netq contributors"
release = version = netq.__version__

sys.path.insert(0, str(DOCS / "_ext"))
extensions = [
    "myst_nb",  # Markdown pages (MyST) and notebooks
    "sphinx.ext.autodoc",
    "netq_docs",  # links to the repository, field tables, short references (_ext/netq_docs.py)
]
exclude_patterns = ["_build", "**.ipynb_checkpoints", "gen_protocol_examples.py"]
# The BokehJS loader outputs have no static form, and their MIME types are taken out below.
suppress_warnings = ["mystnb.mime_priority", "mystnb.unknown_mime_type"]

# --- notebooks: render the stored outputs, never execute
nb_execution_mode = "off"
# BokehJS is loaded inline in the notebooks that plot with bokeh (03, 04, 06); a widget's live
# view needs a kernel. The site shows each output's static form (the views' HTML, text) instead.
nb_mime_priority_overrides = [
    ("html", "application/vnd.jupyter.widget-view+json", None),
    ("html", "application/vnd.bokehjs_load.v0+json", None),
    ("html", "application/javascript", None),
]

# --- Markdown
myst_heading_anchors = 3  # [text](page.md#a-heading) links are checked like any reference
myst_enable_extensions = ["colon_fence"]

# --- API reference from the docstrings
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_preserve_defaults = True  # signatures show defaults as written, not their repr()
autodoc_default_options = {"members": True, "undoc-members": True, "show-inheritance": True}
# Every reference must resolve (-n), except to modules outside netq: the site is built without
# network access, so there is no intersphinx inventory of the standard library to check them.
nitpicky = True
# Nor to netq's inner layers (the engine, the protocol core, the transport bases), which the
# docstrings name for readers of the source but the reference does not document, nor to private
# names (a leading underscore).
nitpick_ignore_regex = [
    (r"py:.*", r"_?(builtins|typing|collections|uuid|ssl|socket|asyncio|concurrent|queue|enum|"
               r"threading|pathlib|os|io|logging|types|dataclasses|weakref|pickle|"
               r"multiprocessing|subprocess|secrets|abc|bokeh|anywidget|traitlets|ipywidgets|grpc|paho)(\..*)?"),
    (r"py:.*", r"netq\.(protocol|engine|loop|link_driver|contract|peers|credit|diagnostics|"
               r"handshake|inbox|session|flow|lab\.(relay|shaping|netem)|_\w+|"
               r"transports\.(base|packets|sockets|mqtt\.\w+|grpc\.\w+)|"
               r"widgets\.replaceable)(\..*)?"),
    (r"py:.*", r"(.*\.)?_\w+"),
]
nitpick_ignore = [
    # instance attributes set in __init__, which autodoc cannot list
    ("py:attr", "Recorder.relay"), ("py:attr", "relay"),
    # inner layers named by a short path (netq.transports.mqtt.link, netq.transports.packets)
    ("py:mod", "link"),
    # the engine's loop factory (netq.contract, an inner layer) in Communicator's signature, and
    # MQTT's channel type in its carrier's base class
    ("py:class", "LoopFactory"), ("py:class", "Channel"),
    # the queues a put's future waits in (netq.futures, an inner layer) in its signature
    ("py:class", "SendQueue"),
    # the carrier's channel type variable (a TypeVar autodoc does not document)
    ("py:class", "netq.carrier.ChannelT"), ("py:obj", "netq.carrier.ChannelT"),
]

html_theme = "furo"
html_title = f"netq {release}"
# Three executed notebooks carry BokehJS (a few MB each): the site does not copy page sources.
html_copy_source = False
