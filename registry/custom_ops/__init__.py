"""New ops: declared here (schema, CPU reference, autograd), implemented like any op.

``define.py`` holds the mechanism (``declare_op``); ``library.py`` declares this
library's own ops (``torch.ops.tpu_kernels.*``), whose impls live with the other impls:
the XLA lowerings in ``registry/xla/library_ops.py``, the kernels in
``registry/bindings/``.
"""
from tpu_kernels.registry.custom_ops.define import DECLARED, CustomOp, declare_op

__all__ = ["DECLARED", "CustomOp", "declare_op"]
