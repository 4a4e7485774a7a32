"""Which aten nodes the BPU takes, and how they group into partitions."""

from torch_fl.bpu.partitioning.partitioner import PartitionPlan, partition_graph
from torch_fl.bpu.partitioning.support import COMPUTE_KINDS, BpuOperatorSupport, op_kind

__all__ = ["COMPUTE_KINDS", "BpuOperatorSupport", "PartitionPlan", "op_kind", "partition_graph"]
