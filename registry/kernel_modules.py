"""Kernel modules named when the registry loads, imported when first used.

Importing Helion costs seconds and every Pallas kernel module pulls in Pallas; most
programs run a handful of kernels, and off TPU none (``Registry.enabled`` refuses kernel
kinds before asking their ``supports``). A binding therefore names its kernel module
(``kernel = kernel_module("tpu_kernels.pallas.matmul")``) and uses it as the module:
the first attribute read (a ``supports`` check or a launch) imports it.
``tests/test_layers.py`` counts each ``kernel_module("...")`` as a module-level import.
"""
from __future__ import annotations

import importlib
import types
from typing import Any


class KernelModule:
    """Stands for the module ``name``; imports it on the first attribute read."""
    __slots__ = ("name", "_module")

    def __init__(self, name: str) -> None:
        self.name = name
        self._module: types.ModuleType | None = None

    @property
    def loaded(self) -> bool:
        return self._module is not None

    def module(self) -> types.ModuleType:
        """The real module (imported now if it is not yet)."""
        if self._module is None:
            self._module = importlib.import_module(self.name)
        return self._module

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.module(), attr)

    def __repr__(self) -> str:
        return f"<kernel module {self.name!r} ({'loaded' if self.loaded else 'not loaded yet'})>"


def kernel_module(name: str) -> KernelModule:
    """The kernel module ``name`` (``tpu_kernels.pallas.*`` or ``tpu_kernels.helion_kernels.*``),
    imported on first use."""
    if not name.startswith(("tpu_kernels.pallas.", "tpu_kernels.helion_kernels.")):
        raise ValueError(f"kernel_module({name!r}): only Pallas and Helion kernel modules load lazily")
    return KernelModule(name)
