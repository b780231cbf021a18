"""Sphinx glue for the netq site: links, field tables and short references (docs/conf.py).

* Links out of the site's pages to files elsewhere in the repository (``../bench/...`` in
  docs/*.md, ``../docs/protocol.md`` in a notebook) are rewritten where they point: a page of
  the site when the file is one, else the file in the repository on the web. A link to a file
  that does not exist is left alone, so the build fails on it as on any broken link.
* netq's docstrings document fields as aligned ``name  meaning`` rows and show code as an
  indented block after a blank line (both read well in ``help()``); reStructuredText would read
  them as broken definition lists and block quotes, so they are shown verbatim.
* A reference to a public name by a longer or shorter path (``netq.exceptions.ConnectionLost``,
  ``ConnectionLost``) resolves to where the reference documents it (``netq.ConnectionLost``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from sphinx.application import Sphinx

REPOSITORY_FILES = "https://github.com/netq/netq/blob/main/"  # pyproject.toml [project.urls]
LINK = re.compile(r"\]\((?!https?:|mailto:|#)([^)\s#]+)(#[^)\s]*)?\)")
FIELD_ROW = re.compile(r"^[a-z_]+(?: ?/ ?[a-z_]+)?(?:\s{2,}\S|$)")


def _rewrite_links(app: Sphinx, docname: str, source: list[str]) -> None:
    docs = Path(app.srcdir)
    repository = docs.parent
    here = (docs / docname).parent
    if docname.startswith("_executed/notebooks/"):
        here = repository / "notebooks"  # the links were written for the notebook's own place

    def target(match: re.Match[str]) -> str:
        path = (here / match[1]).resolve()
        anchor = match[2] or ""
        if not path.exists():
            return match[0]  # a broken link: Sphinx reports it
        executed = docs / "_executed" / "notebooks" / path.name
        if path.parent == repository / "notebooks" and executed.exists():
            path = executed
        page = (docs / docname).parent
        if path.is_relative_to(docs):
            return f"]({_relative(path, page)}{anchor})"
        if path.is_relative_to(repository):
            return f"]({REPOSITORY_FILES}{path.relative_to(repository).as_posix()}{anchor})"
        return match[0]

    source[0] = LINK.sub(target, source[0])


def _relative(path: Path, start: Path) -> str:
    return Path(os.path.relpath(path, start)).as_posix()


def _field_tables_verbatim(app: Sphinx, what: str, name: str, obj: object, options: object,
                           lines: list[str]) -> None:
    result: list[str] = []
    index = 0
    while index < len(lines):
        start = index
        if (index == 0 or not lines[index - 1].strip()) and FIELD_ROW.match(lines[index]):
            while index < len(lines) and lines[index].strip():
                index += 1
            block = lines[start:index]
            if any(re.match(r"^\S.*?\s{2,}\S", row) for row in block):
                result += ["::", "", *("    " + row for row in block)]
                continue
            index = start
        if (index > 0 and not lines[index - 1].strip() and lines[index].startswith(" ")
                and not _opens_indented_block(lines[:index])):
            while index < len(lines) and (not lines[index].strip()
                                          or lines[index].startswith(" ")):
                index += 1
            while not lines[index - 1].strip():
                index -= 1
            result += ["::", "", *lines[start:index]]
            continue
        result.append(lines[index])
        index += 1
    lines[:] = result


def _opens_indented_block(before: list[str]) -> bool:
    """The paragraph before ends with ``::`` or is a directive: its indented block is its own."""
    paragraph = [line for line in before if line.strip()]
    if not paragraph:
        return False
    last = paragraph[-1]
    return last.rstrip().endswith("::") or last.lstrip().startswith(".. ") or last[0] == " "


def _public_name(app: Sphinx, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"]
    domain = env.get_domain("py")
    candidate = "netq." + target.rsplit(".", 1)[-1]
    if candidate == target or candidate not in domain.objects:
        return None
    return domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], candidate,
                               node, contnode)


def setup(app: Sphinx) -> dict[str, object]:
    app.connect("source-read", _rewrite_links)
    app.connect("autodoc-process-docstring", _field_tables_verbatim)
    app.connect("missing-reference", _public_name)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

