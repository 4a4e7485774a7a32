"""The graph a fused sim session opens: ONNX Runtime's own optimized form of the integer graph,
with the extension's ops in it (conversion/lookups.py and lookup_mean.py, conversion/depthwise.py,
conversion/grouped_conv.py, conversion/narrow_op.py, conversion/max_pool.py,
conversion/concat_lookup.py, conversion/gemv.py, conversion/pair_gemm.py; conversion/clamp_fold.py
folds the byte clamps after them into their output step).

The rewrites work on ORT's optimized form rather than on the graph it receives: there the
integer convs already run channels-last with the transposes between them cancelled, and an op
ORT does not know, placed before its optimizer, would get a transpose on each side (32 around
MobileNetV3's lookups: at batch 8 on 2 threads 2.6 ms of 9.2 by ORT's profiler, and the session
timed at 7.44 ms on 2 threads against 7.50 on 1). The session then opens the result with graph
optimizations off (runtime/executors.py). Where no rewrite has anything to replace, no ORT
pass is spent (ResNet-18's first call after calibrating, by hand: 0.28 to 0.37 s with that
pass, 0.21 to 0.26 s with this check, 0.21 to 0.24 s with lookups off)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import onnx

from torch_fl.bpu.conversion.clamp_fold import fold_clamps
from torch_fl.bpu.conversion.concat_lookup import candidates as concat_candidates
from torch_fl.bpu.conversion.concat_lookup import rewrite_concats
from torch_fl.bpu.conversion.depthwise import candidates, rewrite_depthwise
from torch_fl.bpu.conversion.gemv import candidates as gemv_candidates
from torch_fl.bpu.conversion.gemv import gemm_rows, rewrite_gemv
from torch_fl.bpu.conversion.grouped_conv import candidates as grouped_candidates
from torch_fl.bpu.conversion.grouped_conv import rewrite_grouped
from torch_fl.bpu.conversion.inferred_shapes import inferred_shapes
from torch_fl.bpu.conversion.lookup_mean import fuse_means, pairs, reduce_shapes
from torch_fl.bpu.conversion.lookups import fuse_lookups, has_chains, ort_optimized
from torch_fl.bpu.conversion.max_pool import candidates as pool_candidates
from torch_fl.bpu.conversion.max_pool import rewrite_max_pools
from torch_fl.bpu.conversion.narrow_op import MAX_OUTPUTS, rewrite_narrow
from torch_fl.bpu.conversion.narrow_op import candidates as narrow_candidates
from torch_fl.bpu.conversion.pair_gemm import candidates as pair_candidates
from torch_fl.bpu.conversion.pair_gemm import rewrite_pair_gemm
from torch_fl.bpu.conversion.session_shapes import declare_shapes

__all__ = ["SessionGraph", "session_graph"]


@dataclass(frozen=True)
class SessionGraph:
    data: bytes | None
    """The rewritten optimized graph; None where nothing was replaced (the session opens the
    integer graph itself, optimized by ORT as usual)."""
    lookups: int
    """Elementwise chains now table lookups."""
    depthwise: int
    """Depthwise int8 convs now the extension's DepthwiseConv op."""
    narrow: int = 0
    """Int8 convs over few input channels now the extension's NarrowConv op."""
    means: int = 0
    """Float lookups and the ReduceMean over each now one LookupMeanF32 (among `lookups`)."""
    grouped: int = 0
    """Grouped int8 convs of narrow groups now the extension's GroupedConv or GroupedDotConv
    op."""
    pools: int = 0
    """Channels-first 8-bit max pools now the extension's MaxPool op."""
    concats: int = 0
    """8-bit concats now the extension's ConcatLookup op (the byte lookups only they read
    folded in: among `lookups`)."""
    gemv: int = 0
    """One-row 8-bit GEMMs and 1x1 convs over one pixel now the extension's Gemv op."""
    pair_gemms: int = 0
    """1x1 int8 convs and 8-bit GEMMs with uint8 weights now the extension's PairGemm op."""
    clamps: int = 0
    """Byte clamps (among `lookups`) folded into the output step of the op they read."""


def session_graph(
    model: onnx.ModelProto,
    disabled: Sequence[str],
    lookups: bool,
    depthwise: bool,
    narrow: bool = False,
    dot: bool = False,
    pools: bool = False,
    grouped: bool | None = None,
    narrow_outputs: int = MAX_OUTPUTS,
    pair_gemm: bool = False,
) -> SessionGraph:
    """ORT's optimized form of the integer graph `model` (without the optimizers in `disabled`)
    with its elementwise chains as lookups where `lookups` (a float lookup and the mean over it
    as one op: conversion/lookup_mean.py), its depthwise convs as DepthwiseConv and its
    grouped convs of narrow groups as GroupedConv where `grouped` (None: as `depthwise`; the
    executor asks for it only where the float op has its AVX-512 form), as GroupedDotConv where
    `dot` (AVX512-VNNI) and that op takes them, its convs over few input channels (at most
    `narrow_outputs` outputs) as NarrowConv where `narrow`, its channels-first 8-bit max pools
    as MaxPool where `pools`, its 8-bit concats as ConcatLookup where `lookups`, and its one-row
    8-bit GEMMs and 1x1 convs over one pixel as Gemv where `dot`, and its 1x1 convs and GEMMs with uint8 weights (ORT's
    u8u8 kernels) as PairGemm where `pair_gemm`. No ORT pass is spent where no rewrite has anything to
    replace."""
    want_lookups = lookups and has_chains(model)
    want_depthwise = depthwise and candidates(model) > 0
    floats = depthwise if grouped is None else grouped
    want_grouped = (floats or dot) and grouped_candidates(model) > 0
    want_narrow = narrow and narrow_candidates(model) > 0
    want_pools = pools and pool_candidates(model) > 0
    want_concats = lookups and concat_candidates(model) > 0
    # the integer graph's shapes, inferred once, and only for a pass that reads them
    shapes = functools.cache(lambda: inferred_shapes(model))
    has_gemms = any(node.op_type == "Gemm" for node in model.graph.node)
    has_rows = has_gemms or any(node.op_type == "Conv" for node in model.graph.node)
    want_pairs = pair_gemm and pair_candidates(model) > 0
    # A's rows (a 1x1 conv's pixels): the one-row op takes single rows; the pair op leaves short
    # GEMMs of large weights
    rows = gemm_rows(shapes()) if (dot and has_rows) or (want_pairs and has_gemms) else {}
    want_gemv = dot and gemv_candidates(rows) > 0
    wanted = (
        want_lookups, want_depthwise, want_grouped, want_narrow, want_pools, want_concats,
        want_gemv, want_pairs,
    )  # fmt: skip
    if not any(wanted):
        return SessionGraph(None, 0, 0)
    optimized = ort_optimized(model, disabled)
    n_lookups = fuse_lookups(optimized) if want_lookups else 0
    n_means = (
        fuse_means(optimized, reduce_shapes(shapes())) if n_lookups and pairs(optimized) else 0
    )
    n_depthwise = rewrite_depthwise(optimized) if want_depthwise else 0
    n_grouped = rewrite_grouped(optimized, dot=dot, floats=floats) if want_grouped else 0
    n_narrow = rewrite_narrow(optimized, max_outputs=narrow_outputs) if want_narrow else 0
    n_pools = rewrite_max_pools(optimized) if want_pools else 0
    # last: a concat folds in the lookups above that feed it
    n_concats = rewrite_concats(optimized)[0] if want_concats else 0
    n_gemv = rewrite_gemv(optimized, rows) if want_gemv else 0
    # after the narrow and one-row ops, which take their convs and GEMMs first
    n_pairs = rewrite_pair_gemm(optimized, rows=rows) if want_pairs else 0
    # last: the clamps that read the ops above
    folds = n_depthwise or n_grouped or n_pairs or n_gemv
    n_clamps = fold_clamps(optimized) if n_lookups and folds else 0
    changed = (
        n_lookups or n_depthwise or n_grouped or n_narrow or n_pools or n_concats or n_gemv
        or n_pairs
    )  # fmt: skip
    if changed:
        # the shapes ORT cannot infer past the extension's ops, where computable here: its
        # planner then lets byte lookups run in place (conversion/session_shapes.py)
        declare_shapes(optimized)
    data = optimized.SerializeToString() if changed else None
    return SessionGraph(
        data, n_lookups, n_depthwise, n_narrow, n_means, n_grouped, n_pools, n_concats, n_gemv,
        n_pairs, n_clamps,
    )  # fmt: skip
