"""Process groups as the tpu collectives see them: global ranks, this rank, timeout."""
from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup

DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)
_TPU = torch.device("tpu")


@dataclasses.dataclass(frozen=True)
class Group:
    name: str
    ranks: tuple[int, ...]     # global ranks, in group-rank order
    rank: int                  # this process's rank in the group
    timeout: float             # seconds

    @property
    def size(self) -> int:
        return len(self.ranks)


_CREATED: dict[str, datetime.timedelta] = {}   # groups whose tpu backend is ours -> timeout
_GROUPS: dict[str, Group] = {}


def created(name: str, timeout: datetime.timedelta) -> None:
    """Record that the tpu backend of group ``name`` was made here."""
    _CREATED[name] = timeout
    _GROUPS.pop(name, None)


def of(pg: Any, collective: str) -> Group:
    """The group of a c10d op's process-group argument (a ScriptObject or a ProcessGroup)."""
    if isinstance(pg, torch.ScriptObject):
        pg = ProcessGroup.unbox(pg)
    name = pg.group_name
    group = _GROUPS.get(name)
    if group is None:
        group = _GROUPS[name] = _make(pg, name, collective)
    return group


def named(name: str, collective: str) -> Group:
    """The group a functional collective names (by its group name)."""
    group = _GROUPS.get(name)
    if group is None:
        pg = torch._C._distributed_c10d._resolve_process_group(name)
        group = _GROUPS[name] = _make(pg, name, collective)
    return group


def _make(pg: ProcessGroup, name: str, collective: str) -> Group:
    if name not in _CREATED:
        devices = [d.type for d in pg._device_types]
        raise RuntimeError(
            f"{collective}: process group {name!r} has no tpu backend (it serves {devices}). "
            f"Create it with backend='tpu' (dist.init_process_group('tpu'), or "
            f"'cpu:gloo,tpu:tpu' for both devices), or move the tensors to a device it serves")
    ranks = tuple(dist.get_process_group_ranks(pg))
    return Group(name, ranks, pg.rank(), _CREATED[name].total_seconds())
