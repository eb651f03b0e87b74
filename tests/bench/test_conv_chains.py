"""bench/conv_chains.py: on the CPU both forms of every kind agree with XLA:CPU's own (the
sweep is for a chip, where they did not)."""
from __future__ import annotations

import pytest

from tpu_kernels.bench import conv_chains


@pytest.mark.parametrize("dims", [1, 2])
def test_conv_chains_each_kind_and_form_match_the_cpu(capsys, dims):
    rows = conv_chains.main(["--chains", "1", "--seed", "3", "--dims", str(dims)])
    assert {r["chain"]["dims"] for r in rows} == {dims}
    assert [r["chain"]["kind"] for r in rows] == list(conv_chains.KINDS)
    for row in rows:
        for form in conv_chains.FORMS:
            assert max(row[form].values()) < 1e-5, row
    out = capsys.readouterr().out
    assert all(f"{kind}: wrong chains xla 0, lowered 0" in out for kind in conv_chains.KINDS)
