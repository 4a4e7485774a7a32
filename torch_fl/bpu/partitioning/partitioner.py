"""Group supported nodes into partitions with torch.fx's capability-based partitioner."""

from __future__ import annotations

import operator
from collections.abc import Collection
from dataclasses import dataclass, field

from torch import fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

from torch_fl.bpu.partitioning.support import BpuOperatorSupport, is_compute, weight_derived

PREFIX = "bpu_partition_"


@dataclass
class Rejected:
    """A compute node left on the CPU, and why."""

    node: str
    target: str
    reason: str


@dataclass
class PartitionPlan:
    """The fused graph plus what the report needs to know about it."""

    graph_module: fx.GraphModule
    partition_names: list[str]  # submodule names in execution order
    compute_counts: dict[str, int]
    rejected: list[Rejected] = field(default_factory=list)
    total_compute: int = 0
    # the rejected nodes that are ops, not getitem reads of a CPU tuple (strict mode refuses these)
    blockers: list[Rejected] = field(default_factory=list)


def partition_graph(
    gm: fx.GraphModule, min_partition_ops: int = 1, frozen_inputs: Collection[fx.Node] = ()
) -> PartitionPlan:
    """Partition `gm` (already rewritten) and fuse each partition into a submodule.

    `frozen_inputs` are the placeholders that hold parameters/buffers: ops computed from them
    alone (a causal-mask buffer compared with 0) are weight-derived and may be non-float.
    """
    support = BpuOperatorSupport(weight_derived(gm, frozen_inputs))
    partitioner = CapabilityBasedPartitioner(gm, support, allows_single_node_partition=True)
    proposed = partitioner.propose_partitions()
    total_compute = sum(1 for n in gm.graph.nodes if is_compute(n))

    keep = []
    small_reasons: dict[fx.Node, str] = {}
    for partition in proposed:
        count = sum(1 for n in partition.nodes if is_compute(n))
        if count < max(min_partition_ops, 1):
            reason = (
                f"below minimum size: partition of {count} compute op(s) < "
                f"min_partition_ops={max(min_partition_ops, 1)}"
            )
            for n in partition.nodes:
                small_reasons[n] = reason
        else:
            keep.append(partition)

    rejected = []
    blockers = []
    for node in gm.graph.nodes:
        if not is_compute(node):
            continue
        reason = support.reasons.get(node) or small_reasons.get(node)
        if reason is not None:
            rejected.append(Rejected(node.name, str(node.target), reason))
            blockers.append(rejected[-1])
    # getitems are not compute but their reasons explain the tuple boundary; keep them too.
    for node, reason in support.reasons.items():
        if not is_compute(node) and node.op == "call_function" and node.graph is gm.graph:
            rejected.append(Rejected(node.name, str(node.target), reason))
            if node.target is not operator.getitem:
                blockers.append(rejected[-1])

    if keep:
        fused = fuse_by_partitions(
            gm, [p.nodes for p in keep], prefix=PREFIX, always_return_tuple=True
        )
    else:
        fused = gm
    names = [n.target for n in fused.graph.nodes if n.op == "call_module"]
    counts = {
        name: sum(1 for n in fused.get_submodule(name).graph.nodes if is_compute(n))
        for name in names
    }
    return PartitionPlan(fused, names, counts, rejected, total_compute, blockers)
