"""The runtime is built in layers: every import of a ``tpu_kernels`` module points to the
same or a lower layer, the import graph (function-level imports included) has no circle,
and the runtime and tools import nothing inside functions (no import exists to break a
circle). The layers, low to high, as docs/design.md draws them."""
from __future__ import annotations

import ast
import os

import tpu_kernels
from tpu_kernels import bench, helion_kernels, pallas, registry

LAYERS = [
    # helpers over torch alone (untraced: functions Dynamo never traces, without importing it)
    ("torch", ("tpu_kernels.untraced",)),
    ("kernels", ("tpu_kernels.pallas", "tpu_kernels.helion_kernels")),
    # spmd_kernels: the bindings' kernels partitioned per shard (custom_partitioning)
    # spmd_moe: the MoE experts op, expert-parallel per shard (all_to_all)
    ("registry", ("tpu_kernels.registry", "tpu_kernels.spmd_kernels", "tpu_kernels.spmd_moe")),
    ("base", ("tpu_kernels.platform", "tpu_kernels.lru", "tpu_kernels.cache_files", "tpu_kernels.jax_cache", "tpu_kernels.code_memory", "tpu_kernels.inflight", "tpu_kernels.errors", "tpu_kernels.random_state", "tpu_kernels.devices",
              "tpu_kernels.memory", "tpu_kernels.streams", "tpu_kernels.trace_ranges", "tpu_kernels.device")),
    ("storage", ("tpu_kernels.lazy", "tpu_kernels.lazy_programs", "tpu_kernels.strided", "tpu_kernels.storage")),
    ("tensor", ("tpu_kernels.fast_tokens", "tpu_kernels.shadow", "tpu_kernels.printing", "tpu_kernels.tensor",
                "tpu_kernels.tensor_values", "tpu_kernels.module_moves")),
    ("dispatch", ("tpu_kernels.dispatch",)),
    ("runtime ops", ("tpu_kernels.runtime_ops", "tpu_kernels.flex_attention", "tpu_kernels.autocast", "tpu_kernels.amp_names",
                     "tpu_kernels.serialization", "tpu_kernels.interchange", "tpu_kernels.host_memory", "tpu_kernels.data_parallel", "tpu_kernels.accelerator",
                     "tpu_kernels.optim_defaults")),
    ("modes", ("tpu_kernels.deferred_mode", "tpu_kernels.graphs", "tpu_kernels.graph_packing", "tpu_kernels.program_packs", "tpu_kernels.graphed_callables", "tpu_kernels.compile_options", "tpu_kernels.graph_patterns", "tpu_kernels.host_writes",
               "tpu_kernels.graph_inputs", "tpu_kernels.graph_outputs", "tpu_kernels.graph_host_ops", "tpu_kernels.graph_program", "tpu_kernels.compile_fast_path", "tpu_kernels.compile_joint", "tpu_kernels.compile_train_fast_path",
               "tpu_kernels.compile_output_bases",
               "tpu_kernels.compile_step", "tpu_kernels.step_counters", "tpu_kernels.fused_step_programs",
               "tpu_kernels.compile_backend",
               "tpu_kernels.spmd")),
    # collectives on tpu tensors: runtime handlers, and a program hook of graph_program
    ("distributed", ("tpu_kernels.distributed",)),
    ("tools", ("tpu_kernels.testing", "tpu_kernels.models", "tpu_kernels.bench", "tpu_kernels.coverage",
               "tpu_kernels.demo", "tpu_kernels.__main__", "tpu_kernels.serving", "tpu_kernels.aot",
               "tpu_kernels.transformers_flex", "tpu_kernels.transformers_moe")),
    ("package", ("tpu_kernels",)),   # __init__: the public API, assembled last
]
# Others' areas may import lazily inside functions (still without circles).
LAZY_IMPORTS_ALLOWED = ("tpu_kernels.pallas", "tpu_kernels.helion_kernels", "tpu_kernels.registry.xla")


def _modules() -> dict[str, str]:
    """Module name -> source file, for every module of the installed package."""
    roots = {"tpu_kernels": tpu_kernels, "tpu_kernels.registry": registry, "tpu_kernels.pallas": pallas,
             "tpu_kernels.helion_kernels": helion_kernels, "tpu_kernels.bench": bench}
    out = {}
    for pkg, mod in roots.items():
        root = os.path.dirname(mod.__file__)
        for d, dirs, files in os.walk(root):
            dirs[:] = [x for x in dirs if x != "__pycache__" and not (pkg == "tpu_kernels" and d == root
                                                                         and f"tpu_kernels.{x}" in roots)]
            for f in files:
                if f.endswith(".py"):
                    parts = os.path.relpath(os.path.join(d, f[:-3]), root).split(os.sep)
                    parts = parts[:-1] if parts[-1] == "__init__" else parts
                    out[".".join([pkg, *parts]) if parts else pkg] = os.path.join(d, f)
    return out


MODULES = _modules()


def _owner(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _names_kernel_module(node: ast.AST) -> bool:
    """``kernel_module("tpu_kernels....")``: the registry's import-on-first-use of a kernel module."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "kernel_module"
            and len(node.args) == 1 and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str))


def _imports(module: str, path: str) -> list[tuple[str, bool]]:
    """(imported tpu_kernels module, inside a function) for each import in ``path``."""
    tree = ast.parse(open(path).read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package
                    for _ in range(child.level - 1):
                        up = up.rpartition(".")[0]
                    base = f"{up}.{base}" if base else up
                # a submodule is imported itself; a name comes from its module
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in child.names]
            elif _names_kernel_module(child):
                names = [child.args[0].value]   # a lazily loaded kernel module (registry/kernel_modules.py)
            else:
                names = []
            for n in names:
                target = _owner(n) if n.startswith("tpu_kernels") else None
                if target is not None and target != module:
                    found.append((target, in_function))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
    visit(tree, False)
    return found


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def layer(module: str) -> int:
    best = None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            inside = module == p or (module.startswith(p + ".") and p != "tpu_kernels")
            if inside and (best is None or len(p) > best[1]):
                best = (i, len(p))
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best[0]


def test_every_module_has_a_layer():
    for m in MODULES:
        layer(m)


def test_imports_point_down():
    wrong = [f"{m} ({LAYERS[layer(m)][0]}) imports {t} ({LAYERS[layer(t)][0]})"
             for m, edges in GRAPH.items() for t, _ in edges if layer(t) > layer(m)]
    assert not wrong, "\n".join(wrong)


def test_no_import_circles():
    state: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def walk(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t, _ in GRAPH[m]:
            if state.get(t) == 1:
                circles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                walk(t)
        stack.pop()
        state[m] = 2

    for m in sorted(GRAPH):
        if m not in state:
            walk(m)
    assert not circles, "\n".join(" -> ".join(c) for c in circles)


def test_runtime_imports_at_module_level():
    lazy = [f"{m} imports {t} inside a function" for m, edges in GRAPH.items() for t, inside in edges
            if inside and not m.startswith(LAZY_IMPORTS_ALLOWED)]
    assert not lazy, "\n".join(lazy)
