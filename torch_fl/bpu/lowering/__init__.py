"""Graph rewrites applied to the aten graph before partitioning."""

from torch_fl.bpu.lowering.rewrites import apply_rewrites

__all__ = ["apply_rewrites"]
