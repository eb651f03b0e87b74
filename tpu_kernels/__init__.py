"""tpu_kernels: PyTorch on TPUs through JAX, Pallas and Helion.

    import torch, tpu_kernels
    x = torch.randn(4, 8, device="tpu")
    model = torch.nn.Linear(8, 2).to("tpu")
    print(model(x).sum().item())

Every ATen op on a tpu tensor is looked up in one registry (``tpu_kernels.registry``)
and runs as a Pallas kernel, a Helion kernel, or an XLA lowering.

The runtime is built in layers, each importing only those before it (docs/design.md):
storage (``lazy``, ``strided``, ``storage``) -> tensor (``tensor``, ``shadow``,
``printing``) -> ``dispatch`` (route, build, cache, run) -> ``runtime_ops`` (the
runtime's own handlers) -> modes (``deferred_mode``, ``compile_backend``,
``graph_program``) -> tools (``coverage``, ``testing``, ``bench``, the CLI).
"""
from __future__ import annotations

from tpu_kernels import platform as _platform

_platform.choose_platforms()  # before JAX starts a backend (no TPU chips: no TPU backend)

from tpu_kernels import device as _device  # noqa: E402

_device.setup()  # before anything names torch.device("tpu")

from tpu_kernels import registry  # noqa: E402
from tpu_kernels import dispatch as _dispatch  # noqa: E402,F401  (installs the dispatch hook)
from tpu_kernels import module_moves as _module_moves  # noqa: E402,F401  (Module._apply for tpu tensors)
from tpu_kernels import runtime_ops as _runtime_ops  # noqa: E402,F401  (registers the runtime's handlers)
from tpu_kernels import flex_attention as _flex_attention  # noqa: E402,F401  (flex_attention HOPs on tpu)
from tpu_kernels import accelerator as _accelerator  # noqa: E402
from tpu_kernels import autocast as _autocast  # noqa: E402
from tpu_kernels import amp_names as _amp_names  # noqa: E402
from tpu_kernels import host_memory as _host_memory  # noqa: E402
from tpu_kernels import data_parallel as _data_parallel  # noqa: E402
from tpu_kernels import optim_defaults as _optim_defaults  # noqa: E402
from tpu_kernels import serialization as _serialization  # noqa: E402
from tpu_kernels import interchange as _interchange  # noqa: E402,F401  (DLPack export refused clearly)
from tpu_kernels import deferred_mode as _deferred_mode  # noqa: E402
from tpu_kernels.deferred_mode import deferred, flush  # noqa: E402
from tpu_kernels import graphs as _graphs  # noqa: E402
from tpu_kernels import graphed_callables as _graphed_callables  # noqa: E402
from tpu_kernels import shadow as _shadow  # noqa: E402
from tpu_kernels import fused_step_programs as _fused_step_programs  # noqa: E402,F401  (eager fused optimizer steps)
from tpu_kernels.registry import tpu_kernel  # noqa: E402
from tpu_kernels.tensor import TpuTensor  # noqa: E402

_autocast.install()        # torch.autocast("tpu"): CUDA's op lists, bfloat16 by default
_amp_names.install()       # torch.tpu.amp: torch.cuda.amp's names (autocast, GradScaler, custom_fwd/bwd)
_serialization.install()   # torch.save / torch.load of tpu tensors, map_location="tpu"
_host_memory.install()     # t.pin_memory(), DataLoader(pin_memory=True)
_data_parallel.install()   # nn.DataParallel on one tpu device
_accelerator.install()     # torch.accelerator.* for the tpu device
_optim_defaults.install()  # optimizers and clip_grad_norm_ take their foreach paths, as on CUDA
_deferred_mode.install()   # a backward and an optimizer step run deferred mode's recording so far
_graphs.install()          # torch.tpu.graph / TPUGraph: capture a step, replay it as one executable
_graphed_callables.install()   # torch.tpu.make_graphed_callables
_shadow.trace_device_copies()  # Dynamo traces a constant's move to tpu (any backend)
from tpu_kernels import distributed as _distributed  # noqa: E402

_distributed.install()     # c10d backend "tpu" (names only; loads when a group is made)

# torch.compile(backend="tpu") finds the backend through the package's entry point
# (pyproject.toml), so Dynamo loads with the first compile, not here. An install made
# before the entry point existed (the editable install is not redone) registers it now.
if not _platform.dynamo_backend_installed():
    from tpu_kernels import compile_backend as _compile_backend  # noqa: E402

    _compile_backend.register()

__all__ = ["tpu_kernel", "registry", "TpuTensor", "deferred", "flush"]
