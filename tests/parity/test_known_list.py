"""known_failures.tsv names only cases that exist: a line whose case is gone (the op got
a lowering of its own, so its key changed) would never be checked again and would keep
reporting a failure that no longer happens."""
from __future__ import annotations

import test_compiled
import test_opinfo
import test_parity

import known


def _case_ids() -> dict[str, set[str]]:
    parity = {p.id for p in test_parity.CASES} | {p.id for p in test_compiled._cases()}
    return {"parity": parity, "opinfo": {p.id for p in test_opinfo.CASES}}


def test_every_listed_failure_names_a_case_that_exists():
    ids = _case_ids()
    stale = [f"{src}\t{key}" for (src, key) in known.KNOWN if key not in ids.get(src, ())]
    assert not stale, ("known_failures.tsv lists cases no test collects (delete the lines, or "
                       "re-key them to the case now run):\n" + "\n".join(stale))
