"""The docs cannot rot: every ```python block in README.md and docs/, and every script in
examples/, runs."""
from __future__ import annotations

import pathlib
import re
import runpy

import pytest

from tpu_kernels import registry

ROOT = pathlib.Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


# Generated reports (tables written by a command, not pages a user follows): no examples to run.
GENERATED = {"cost_table.md": "written by `python -m tpu_kernels costs`"}


def _pages():
    pages = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
    return [p for p in pages if p.name not in GENERATED]


def _run(path: pathlib.Path) -> None:
    """Run a script as ``__main__``, then drop the kernels it registered and left behind:
    examples/pallas_gelu.py registers a ``my_gelu`` on aten::gelu, and a later page
    registering its own ``my_gelu`` in the same process failed (random order only)."""
    namespace = {}
    try:
        namespace = runpy.run_path(str(path), run_name="__main__")
    finally:
        for value in list(namespace.values()):
            if getattr(value, "tpu_impls", None):
                registry.unregister(value)


@pytest.mark.parametrize("page", _pages(), ids=lambda p: p.name)
def test_doc_blocks_run(page, tmp_path):
    blocks = BLOCK.findall(page.read_text())
    assert blocks, f"{page.name} has no python blocks"
    # one script per page, written to a file: Helion reads kernel source with inspect
    script = tmp_path / f"{page.stem}.py"
    script.write_text("\n".join(f"# --- block {i}\n{code}" for i, code in enumerate(blocks)))
    _run(script)


@pytest.mark.parametrize("script", sorted((ROOT / "examples").glob("*.py")), ids=lambda p: p.name)
def test_example_runs(script):
    _run(script)
