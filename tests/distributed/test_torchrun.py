"""torchrun on this host with 2 and 4 processes: every check of harness.py, one launch each.

One launch per world size runs all of that size's checks inside the workers (JAX and
torch start once per launch, which is most of the cost on a 2-core machine); the test
fails listing every check that failed, with its traceback. ``make test-thorough`` adds
the thorough checks.
"""
from __future__ import annotations

import json
import pathlib
import sys

import pytest

from tpu_kernels.distributed import launch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _expected(world: int, thorough: bool) -> list[str]:
    import harness
    harness._load_checks()
    return [name for name, _ in harness.selected(world, thorough)]


def _run(world: int, thorough: bool, tmp_path: pathlib.Path) -> None:
    args = [str(tmp_path)] + (["--thorough"] if thorough else [])
    # JAX's default heartbeat (100 s): on a loaded 2-core machine a starved process can miss
    # a shorter one, and the coordination service then stops every rank
    result = launch.torchrun(str(HERE / "harness.py"), world, args, timeout=900 if thorough else 600)
    tail = result.output[-6000:]
    assert not result.timed_out, f"torchrun timed out:\n{tail}"
    per_rank = []
    for r in range(world):
        path = tmp_path / f"rank{r}.json"
        assert path.exists(), f"rank {r} wrote no results (exit {result.returncode}):\n{tail}"
        per_rank.append(json.loads(path.read_text()))
    expected = _expected(world, thorough)
    assert sorted(per_rank[0]) == sorted(expected), "the ranks ran other checks than expected"
    failed = {name: [res[name]["error"] for res in per_rank if not res[name]["ok"]]
              for name in expected if not all(res[name]["ok"] for res in per_rank)}
    report = "\n\n".join(f"{name}:\n{errs[0] if errs else ''}" for name, errs in failed.items())
    assert not failed, f"{len(failed)} of {len(expected)} checks failed:\n{report}"
    assert result.returncode == 0, f"torchrun exited {result.returncode}:\n{tail}"


@pytest.mark.parametrize("world", [2, 4])
def test_torchrun_checks(world, tmp_path, request):
    """Collectives x dtypes, DDP, FSDP2 + DCP, DTensor, tensor parallel, sub-groups,
    compiled collectives and argument errors (see harness.CHECKS)."""
    _run(world, request.config.getoption("--thorough"), tmp_path)
