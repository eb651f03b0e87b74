"""Known failures (``known_failures.tsv``) and the results file (``.tpu_kernels/parity.json``).

known_failures.tsv: one failure per line, tab-separated ``source``, ``key``, ``reason``
(``#`` starts a comment). ``source`` is ``parity`` (key ``<op overload>|<impl kind>:<impl
name>``; for target ops with no registered impl, the route they take:
``decomp:torch._decomp``, ``twin:<functional op>``, ``runtime:view``, ``none:refused``) or ``opinfo`` (key ``<OpInfo name>[.<variant>]|<dtype>``). A listed case
that fails is an expected failure; a listed case that passes fails its test (delete the
line: the list only shrinks); an unlisted failure fails its test.

Results file (``.tpu_kernels/parity.json`` in the working directory), written at the end
of every run of tests/parity and merged with the previous file (entries of cases not run
this time are kept, each with the date it was last run)::

    {
      "format": 1,
      "updated": "2025-01-31T12:00:00",          # last run (local time, ISO 8601)
      "profile": "ci",                            # Hypothesis profile of the last run
      "torch": "2.13.0",
      "ops": {                                    # per op overload
        "aten.add.Tensor": {
          "tier": 1,                              # from aten_targets.tsv, null if not a target
          "registered": true,                     # has an impl in the registry
          "impls": {                              # per impl: "<kind>:<name>"
            "xla:add": {"kind": "xla", "status": "pass" | "known_failure" | "fail" | "untested",
                        "reason": "...",          # known_failure / fail / untested
                        "examples": 4,            # Hypothesis examples run (CPU-accepted)
                        "grad_examples": 3,       # of which gradients were compared
                        "family": "elementwise",
                        "date": "2025-01-31"}
          },
          "opinfo": {                             # OpInfo cases that called this overload
            "add|float32": {"status": "pass" | "known_failure" | "fail" | "skip", "date": "..."}
          }
        }
      },
      "opinfo": {                                 # per OpInfo case
        "add|float32": {"status": "...", "reason": "...", "samples": 2, "passed": 2,
                        "overloads": ["aten.add.Tensor"], "date": "..."}
      }
    }

``status`` "untested": the op has no strategy (see tests/parity/families.py).
"""
from __future__ import annotations

import datetime
import json
import os
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
KNOWN_FAILURES = os.path.join(HERE, "known_failures.tsv")
RESULTS = os.path.join(".tpu_kernels", "parity.json")


def load_known() -> dict[tuple[str, str], str]:
    out: dict[tuple[str, str], str] = {}
    if not os.path.exists(KNOWN_FAILURES):
        return out
    with open(KNOWN_FAILURES) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            parts = line.split("\t")
            if len(parts) < 3:
                raise ValueError(f"{KNOWN_FAILURES}: bad line (need source<TAB>key<TAB>reason): {line!r}")
            out[(parts[0], parts[1])] = parts[2]
    return out


KNOWN = load_known()

CI_SHARE = 4   # CI runs one sampled case in this many (test_parity, test_opinfo, test_compiled)


def in_ci_sample(source: str, key: str) -> bool:
    """Whether CI runs a case of a sampled kind (the other cases are marked ``thorough``):
    every listed known failure, so the list stays checked, and a fixed share of the rest,
    chosen by a hash of the key (the same on every machine and in every order)."""
    return (source, key) in KNOWN or zlib.crc32(key.encode()) % CI_SHARE == 0


def now() -> str:
    return datetime.datetime.now().isoformat(timespec="seconds")


def merge_pending(profile: str) -> None:
    """Merge every pending ``parity.<pid>.jsonl`` into the results file, then delete it."""
    import fcntl
    import glob

    d = os.path.dirname(RESULTS)
    if not os.path.isdir(d):
        return
    with open(RESULTS + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        files = glob.glob(os.path.join(d, "parity.*.jsonl"))
        records = []
        for path in files:
            with open(path) as f:
                records += [json.loads(line) for line in f if line.strip()]
        if records:
            _merge(records, profile)
        for path in files:
            os.remove(path)


def _merge(records: list[dict], profile: str) -> None:
    import torch
    try:
        with open(RESULTS) as f:
            data = json.load(f)
        if data.get("format") != 1:
            raise ValueError
    except (OSError, ValueError):
        data = {"format": 1, "ops": {}, "opinfo": {}}
    data.update(updated=now(), profile=profile, torch=torch.__version__)
    ops = data.setdefault("ops", {})
    for r in records:
        kind = r.pop("record")
        if kind == "impl":
            op = ops.setdefault(r.pop("op"), {})
            op["tier"] = r.pop("tier", None)
            op["registered"] = r.pop("registered", True)
            op.setdefault("impls", {})[r.pop("impl")] = r
            op.setdefault("opinfo", {})
        elif kind == "opinfo":
            key = r.pop("key")
            data.setdefault("opinfo", {})[key] = r
            for name in r.get("overloads", []):
                op = ops.setdefault(name, {"tier": r.get("tiers", {}).get(name), "impls": {}})
                op.setdefault("opinfo", {})[key] = {"status": r["status"], "date": r["date"]}
            r.pop("tiers", None)
    tmp = RESULTS + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, RESULTS)


def classify(exc: BaseException) -> str:
    """A one-line reason for a failure (the known-failures list's wording)."""
    import re
    text = f"{type(exc).__name__}: {exc}"
    lines = [ln for ln in str(exc).splitlines() if ln.strip() and not ln.startswith("dtypes:")]
    first = lines[0] if lines else type(exc).__name__
    m = re.search(r"(\S+) has no implementation on the tpu device", text)
    if m:
        return f"no lowering yet: {m.group(1)}"
    m = re.search(r"^dtypes: (.*)$", text, re.M)
    dts = f" ({m.group(1)})" if m else ""
    raised = re.search(r"(tpu raised|gradient on tpu raised) (.*)", text)
    if raised:
        return f"{raised.group(1).replace(' on tpu', '')}{dts} {raised.group(2)[:200]}"
    if "Tensor-likes are not close" in text or "Scalars are not close" in text or "not equal" in text:
        grad = " in gradients" if "(gradients" in text else ""
        det = [ln.strip() for ln in str(exc).splitlines() if "Greatest" in ln or "Mismatched" in ln]
        return f"values differ{grad}{dts}: " + "; ".join(det[:2])
    if "gradient" in text and "raised" in text:
        return "gradient: " + first[:200]
    if "aliasing" in text or "view strides" in text:
        return "view/aliasing differs: " + next((ln for ln in str(exc).splitlines() if "alias" in ln or "strides" in ln), first)[:200]
    if "shape" in text.lower() and "AssertionError" in text:
        return f"shape/dtype differs: {first[:200]}"
    return f"tpu raised {type(exc).__name__}: {first[:200]}"


