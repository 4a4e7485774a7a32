"""Keep `F.interpolate` (bilinear / nearest) whole so it exports as one ONNX Resize.

aot_autograd decomposes `upsample_bilinear2d` into `arange`, int64 index arithmetic and four
`_unsafe_index` gathers: a dozen CPU-only nodes per upsampling that cut the partition around it.
Before aot_autograd runs, the backend swaps such calls in Dynamo's graph for the opaque op
`torch_fl_bpu::resize` (same math: it calls F.interpolate), which aot_autograd keeps as one node;
`to_aten` then turns it into `aten.upsample_*2d.vec`, which runs eagerly as the real kernel and
exports as Resize. Only inference graphs get the swap (the op has no autograd formula).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import fx

MODES = ("bilinear", "nearest")


@torch.library.custom_op("torch_fl_bpu::resize", mutates_args=())
def resize(x: torch.Tensor, size: list[int], mode: str, align_corners: bool) -> torch.Tensor:
    if mode == "nearest":
        return F.interpolate(x, size=size, mode=mode)
    return F.interpolate(x, size=size, mode=mode, align_corners=align_corners)


@resize.register_fake
def _(x: torch.Tensor, size: list[int], mode: str, align_corners: bool) -> torch.Tensor:
    return x.new_empty((*x.shape[:2], *size))


def _output_size(x: torch.Tensor, size, scale_factor) -> list[int] | None:
    spatial = list(x.shape[2:])
    if len(spatial) != 2 or not all(isinstance(d, int) for d in spatial):
        return None
    if size is not None:
        sizes = [size, size] if isinstance(size, int) else list(size)
        return [int(s) for s in sizes] if all(isinstance(s, int) for s in sizes) else None
    if scale_factor is None:
        return None
    scales = [scale_factor] * 2 if isinstance(scale_factor, (int, float)) else list(scale_factor)
    out = [d * float(s) for d, s in zip(spatial, scales, strict=True)]
    # With a scale factor the kernel maps coordinates by 1/scale, not in/out: the same op as a
    # size only when the output size is exact.
    if any(o != math.floor(o) for o in out):
        return None
    return [int(o) for o in out]


def keep_interpolate_whole(gm: fx.GraphModule) -> int:
    """Swap static-shape 2-D bilinear/nearest F.interpolate calls for the opaque resize op."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not F.interpolate:
            continue
        names = ("input", "size", "scale_factor", "mode", "align_corners")
        values = dict(zip(names, node.args, strict=False))
        values.update(node.kwargs)
        mode = values.get("mode", "nearest")
        extra = {k: v for k, v in node.kwargs.items() if k not in names}
        if mode not in MODES or any(v not in (None, False) for v in extra.values()):
            continue
        x = values.get("input")
        val = x.meta.get("example_value") if isinstance(x, fx.Node) else None
        if not isinstance(val, torch.Tensor) or val.dim() != 4:
            continue
        size = _output_size(val, values.get("size"), values.get("scale_factor"))
        if size is None:
            continue
        align = bool(values.get("align_corners") or False)
        with gm.graph.inserting_before(node):
            new = gm.graph.call_function(
                torch.ops.torch_fl_bpu.resize.default, (x, size, mode, align)
            )
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count


def to_aten(node: fx.Node) -> bool:
    """Rewrite a resize node (after aot_autograd) into the aten upsample op it stands for."""
    x, size, mode, align = node.args
    if mode == "nearest":
        node.target = torch.ops.aten.upsample_nearest2d.vec
        node.args = (x, list(size), None)
    else:
        node.target = torch.ops.aten.upsample_bilinear2d.vec
        node.args = (x, list(size), bool(align), None)
    return True
