"""First-call latency (issue 22): torch's Python meta functions run without importing
``torch._dynamo`` (``dispatch/dynamo_free.py``), and dynamo works as before once imported."""
from __future__ import annotations

import subprocess
import sys

_CODE = """
import sys, torch, tpu_kernels
import torch.nn.functional as F
x = torch.randn(4, 8)
w, b = torch.randn(8), torch.randn(8)
got = F.layer_norm(x.to('tpu'), (8,), w.to('tpu'), b.to('tpu')).cpu()
assert torch.allclose(got, F.layer_norm(x, (8,), w, b), atol=1e-5)
print('dynamo after a meta function:', 'torch._dynamo' in sys.modules)
from tpu_kernels.dispatch import dynamo_free
given, left = dynamo_free.standing()
assert given > 50 and left == given, (given, left)
import torch._dynamo
f = torch.compile(lambda t: F.layer_norm(t, (8,)) * 2, backend='eager')
assert torch.allclose(f(x), F.layer_norm(x, (8,)) * 2, atol=1e-5)
got = F.layer_norm(x.to('tpu') + 1, (8,), w.to('tpu'), b.to('tpu')).cpu()
assert torch.allclose(got, F.layer_norm(x + 1, (8,), w, b), atol=1e-5)
given, left = dynamo_free.standing()
assert 0 < given - left < given, (given, left)   # the ones run since: the real disable
print('ok')
"""


def test_meta_functions_leave_dynamo_unimported():
    out = subprocess.run([sys.executable, "-c", _CODE], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "dynamo after a meta function: False" in out.stdout, out.stdout
    assert out.stdout.strip().endswith("ok"), out.stdout
