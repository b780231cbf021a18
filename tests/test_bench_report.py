"""The README's benchmark block is what ``bench/run.py`` generates from the committed results.

``python3 bench/run.py --readme`` measures and rewrites the block between the bench markers;
``--render bench/results/latest.json --readme`` rewrites it from the results file. A hand edit
of the numbers, or results committed without regenerating the README, fails here.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_run", REPO / "bench" / "run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being built
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


@pytest.fixture(scope="module")
def results():
    return json.loads((REPO / "bench" / "results" / "latest.json").read_text())


def test_readme_block_is_generated_from_the_committed_results(bench, results):
    readme = (REPO / "README.md").read_text()
    start, end = readme.index(bench.README_START), readme.index(bench.README_END)
    assert readme[start:end + len(bench.README_END)] == bench.readme_block(results), \
        "README benchmark block is stale: " \
        "python3 bench/run.py --render bench/results/latest.json --readme"


def test_block_states_machine_date_medians_and_spread(bench, results):
    block = bench.readme_block(results)
    meta = results["meta"]
    assert meta["date"][:10] in block and meta["machine"]["cpu_model"] in block
    assert f"median of {meta['reps']}" in block and "min–max" in block
    raw = [r["recv"]["gb_per_s"] for r in results["records"]
           if r["section"] == "throughput" and r["row"] == "raw-tcp" and r.get("size") == 1048576
           and not r.get("failed") and not r.get("calibration")]
    assert f"({min(raw):.2f}–{max(raw):.2f})" in block  # the spread of a row, from the records


def test_update_readme_rewrites_only_the_block(bench, results, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{bench.README_START}\nold numbers\n{bench.README_END}\nafter\n")
    bench.update_readme(str(readme), results)
    text = readme.read_text()
    assert text.startswith("before\n") and text.endswith("\nafter\n")
    assert "old numbers" not in text and bench.readme_block(results) in text
    readme.write_text("no markers\n")
    with pytest.raises(SystemExit, match="no benchmark markers"):
        bench.update_readme(str(readme), results)
