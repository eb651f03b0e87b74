"""DTensor sharding rules for the ops the tpu device routes models through.

``F.scaled_dot_product_attention`` on tpu tensors becomes
``aten::_scaled_dot_product_flash_attention_for_cpu`` (``tpu_kernels.patterns``), for which
torch's DTensor has no sharding rule (CPU tensors hit the same gap). Attention is
independent per batch row and per head, so the rule is the one torch gives the CUDA flash
kernel: everything replicated, or q, k, v, the output and its logsumexp all sharded on
the batch dim (0) or on the heads dim (1). The backward takes the same three layouts.
"""
from __future__ import annotations

import torch
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor._op_schema import OpSchema, OpStrategy, RuntimeSchemaInfo
from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy, register_op_strategy

aten = torch.ops.aten


def _layouts(n_outputs: int, n_inputs: int) -> list[list]:
    return [[p] * (n_outputs + n_inputs) for p in (Replicate(), Shard(0), Shard(1))]


def _tensor_inputs(op_schema: OpSchema) -> int:
    return sum(isinstance(a, OpStrategy) for a in op_schema.args_schema)


@register_op_strategy(aten._scaled_dot_product_flash_attention_for_cpu.default,
                      schema_info=RuntimeSchemaInfo(3))
def sdpa_for_cpu_strategy(op_schema: OpSchema) -> OpStrategy:
    mesh = op_schema.get_mesh_from_args()
    n = _tensor_inputs(op_schema)                 # q, k, v (an attn_mask stays replicated)
    return expand_to_full_mesh_op_strategy(mesh, op_schema, _layouts(2, n), input_index=2)


@register_op_strategy(aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
                      schema_info=RuntimeSchemaInfo(6))
def sdpa_for_cpu_backward_strategy(op_schema: OpSchema) -> OpStrategy:
    mesh = op_schema.get_mesh_from_args(validate=False)
    n = _tensor_inputs(op_schema)                 # grad_out, q, k, v, out, logsumexp
    return expand_to_full_mesh_op_strategy(mesh, op_schema, _layouts(3, n), input_index=3)
