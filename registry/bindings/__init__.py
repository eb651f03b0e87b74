"""Bindings of Pallas and Helion kernels to ops: one module per kernel family.

Each module binds with ``@tpu_kernel(..., kind="pallas"|"helion", supports=...)``.
Every module here is imported when the registry loads.
"""
import importlib
import pkgutil

for _m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if not _m.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_m.name}")
