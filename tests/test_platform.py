"""JAX starts without its TPU backend on a host with no TPU chips (libtpu installed for
the compile-only compiler would otherwise probe for minutes), and the user's
JAX_PLATFORMS always wins."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tpu_kernels import platform


@pytest.fixture
def no_platforms(monkeypatch):
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.setattr(platform.importlib.util, "find_spec",
                        lambda name: object() if name == "libtpu" else None)


def test_no_tpu_chips_means_cpu(no_platforms, monkeypatch):
    monkeypatch.setattr(platform, "tpu_attached", lambda: False)
    monkeypatch.delitem(sys.modules, "jax")          # as if JAX were not imported yet
    assert platform.choose_platforms() == "cpu"
    assert os.environ["JAX_PLATFORMS"] == "cpu"


def test_tpu_chips_leave_jax_alone(no_platforms, monkeypatch):
    monkeypatch.setattr(platform, "tpu_attached", lambda: True)
    assert platform.choose_platforms() is None
    assert "JAX_PLATFORMS" not in os.environ


def test_the_users_choice_wins(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu,tpu")
    assert platform.choose_platforms() is None
    assert os.environ["JAX_PLATFORMS"] == "cpu,tpu"


def test_a_fresh_process_runs_on_cpu_and_still_compiles_for_tpu():
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    code = ("import tpu_kernels, jax, os, torch\n"
            "assert jax.default_backend() == 'cpu', jax.default_backend()\n"
            "print(os.environ.get('JAX_PLATFORMS'))\n"
            "from tpu_kernels import aot\n"
            "if aot.unavailable_reason() is None:\n"
            "    aot.compile(lambda x: x * 2, jax.ShapeDtypeStruct((8, 128), 'float32'), chip='v5e')\n"
            "print((torch.ones(2, device='tpu') * 3).sum().item())\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    libtpu = platform.importlib.util.find_spec("libtpu") is not None
    expect = "cpu" if libtpu and not platform.tpu_attached() else "None"
    assert out.stdout.split() == [expect, "6.0"], out.stdout
