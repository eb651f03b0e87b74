"""XLA lowerings: one module per op family, a short pure-JAX function per op.

Every module in this package is imported (and so registers its lowerings) when the
registry loads; adding a family is adding a file.
"""
import importlib
import pkgutil

for _m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if not _m.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_m.name}")
