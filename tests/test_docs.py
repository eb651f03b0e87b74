"""The docs cannot rot: every ```python block in README.md and docs/, and every script in
examples/, runs."""
from __future__ import annotations

import pathlib
import re
import runpy

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def _pages():
    return [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


@pytest.mark.parametrize("page", _pages(), ids=lambda p: p.name)
def test_doc_blocks_run(page, tmp_path):
    blocks = BLOCK.findall(page.read_text())
    assert blocks, f"{page.name} has no python blocks"
    # one script per page, written to a file: Helion reads kernel source with inspect
    script = tmp_path / f"{page.stem}.py"
    script.write_text("\n".join(f"# --- block {i}\n{code}" for i, code in enumerate(blocks)))
    runpy.run_path(str(script), run_name="__main__")


@pytest.mark.parametrize("script", sorted((ROOT / "examples").glob("*.py")), ids=lambda p: p.name)
def test_example_runs(script):
    runpy.run_path(str(script), run_name="__main__")
