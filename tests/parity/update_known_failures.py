"""Regenerate known_failures.tsv from the last run's results (.tpu_kernels/parity.json).

    python tests/parity/update_known_failures.py            # print the new list
    python tests/parity/update_known_failures.py --write    # replace known_failures.tsv

Keeps listed entries whose case still fails (or was not run), drops listed entries that
passed, and adds this run's new failures with the reason the test classified (review
the wording: "no lowering yet: ...", "values differ (dtypes): ...", "tpu raised ...").
Run the whole parity suite first (``pytest tests/parity``), in the profile CI uses.
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import known  # noqa: E402

HEADER = """# Known parity failures: source<TAB>key<TAB>reason (see tests/parity/known.py).
# The list only shrinks: a listed case that passes fails its test; delete its line then.
# Regenerate after a full run with tests/parity/update_known_failures.py --write.
"""


def categorize(reason: str, key: str = "") -> str:
    """Prefix a classified failure with its category (the wording reviewers scan)."""
    import re
    r = " ".join(reason.split())
    if r.startswith(("no lowering yet", "XLA differs", "low-precision", "special values", "runtime error")):
        return r
    if r.startswith("tpu raised") or r.startswith("gradient raised"):
        return "runtime error (lowering or runtime raised): " + r
    m = re.match(r"values differ( in gradients)? \(([^)]*)\)", r)
    dts = m.group(2) if m else ""
    if "difference: nan" in r or "difference: inf" in r:
        return "special values (nan/inf) differ: " + r
    if m and dts and "float32" not in dts and ("bfloat16" in dts or "float16" in dts):
        return ("low-precision (" + dts + ") values differ beyond the dtype tolerance "
                "(rounding/accumulation order; review): " + r)
    if r.startswith("values differ") and key.endswith("|bfloat16"):
        return "low-precision (bfloat16) values differ beyond the dtype tolerance: " + r
    return "XLA differs: " + r


def main() -> None:
    with open(known.RESULTS) as f:
        data = json.load(f)
    status: dict[tuple[str, str], tuple[str, str]] = {}
    for op, entry in data.get("ops", {}).items():
        for impl, r in entry.get("impls", {}).items():
            status[("parity", f"{op}|{impl}")] = (r["status"], r.get("reason", ""))
    for key, r in data.get("opinfo", {}).items():
        status[("opinfo", key)] = (r["status"], r.get("reason", ""))
    out = {}
    for k, reason in known.KNOWN.items():
        st = status.get(k, ("not run", ""))[0]
        if st in ("known_failure", "fail", "not run"):
            out[k] = categorize(reason, k[1])[:300] if "--recategorize" in sys.argv else reason
    for k, (st, reason) in status.items():
        if st == "fail" and k not in out:
            out[k] = categorize(reason, k[1])[:300] or "fails"
    lines = [HEADER] + [f"{s}\t{k}\t{r}\n" for (s, k), r in sorted(out.items())]
    if "--write" in sys.argv:
        with open(known.KNOWN_FAILURES, "w") as f:
            f.writelines(lines)
        print(f"wrote {len(out)} entries to {known.KNOWN_FAILURES}")
    else:
        sys.stdout.writelines(lines)


if __name__ == "__main__":
    main()
