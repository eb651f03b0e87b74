"""The file format of the cost model's shipped tables (``xla_estimates.json``,
``measured.json``): ``{"version": 1, "entries": {key: entry}}``, keys sorted."""
from __future__ import annotations

import json
import os


def read(path: str) -> dict[str, dict]:
    """The table's entries (empty when the file is missing)."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)["entries"]


def merge(path: str, entries: dict[str, dict]) -> None:
    """Write ``entries`` into the table at ``path``, over the ones it holds."""
    merged = {**read(path), **entries}
    with open(path, "w") as f:
        json.dump({"version": 1, "entries": dict(sorted(merged.items()))}, f, indent=1)
        f.write("\n")
