"""Dynamic shapes in, static BPU artifacts out: one static compilation per input signature.

hbdk4 compiles static shapes only. Dynamo hands the backend symbolic dimensions after a second
input shape (automatic dynamic shapes), under `dynamic=True` and for `mark_dynamic` dims; a
backend that rejected those nodes would silently leave the BPU on the first new batch size.
Instead `StaticShapes` stands in for the symbolic graph: each call's concrete signature (tensor
shapes, strides and dtypes, integer arguments) gets its own static compilation of the same Dynamo
graph, cached, up to `max_shapes` per graph. Beyond the limit a signature runs the graph on the
host, with one warning. Calibration carries over between the shapes of one graph (see
conversion/calibration_store.py).
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from torch_fl.bpu.errors import StrictModeError
from torch_fl.bpu.report import GraphReport, noting
from torch_fl.bpu.report import register as register_report
from torch_fl.bpu.settings import BpuSettings

log = logging.getLogger("torch_fl.bpu")
_told: set[object] = set()


def _is_symbolic(value: Any) -> bool:
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(value, torch.Tensor):
        return any(
            not isinstance(d, int) for d in (*value.shape, *value.stride(), value.storage_offset())
        )
    return False


def symbolic(example_inputs: Sequence[Any]) -> bool:
    """Whether Dynamo gave this graph symbolic sizes (dynamic shapes)."""
    return any(_is_symbolic(x) for x in example_inputs)


def signature(args: Sequence[Any], scalars: frozenset[int] = frozenset()) -> tuple:
    """What a static compilation depends on, for a call's concrete inputs (with the values of
    the inputs at `scalars`, which it takes as constants)."""
    sig: list[Any] = []
    for i, a in enumerate(args):
        if i in scalars and isinstance(a, torch.Tensor):
            sig.append(("scalar", a.item()))
        elif isinstance(a, torch.Tensor):
            sig.append((tuple(a.shape), a.stride(), a.dtype, a.device.type, a.requires_grad))
        elif isinstance(a, (int, float, bool)):
            sig.append((type(a).__name__, a))
        else:
            sig.append(type(a).__name__)
    return tuple(sig)


def _example_values(gm: fx.GraphModule) -> list[Any]:
    """Each input's example value from Dynamo's metadata (for finding scalar inputs)."""
    return [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]


def _describe(sig: tuple) -> str:
    shapes = ["x".join(map(str, s[0])) for s in sig if isinstance(s, tuple) and len(s) == 5]
    return ", ".join(shapes[-3:]) if shapes else "?"


class StaticShapes:
    """The compiled form of a symbolic Dynamo graph: a static compilation per signature."""

    def __init__(
        self,
        gm: fx.GraphModule,
        settings: BpuSettings,
        grad: Any,
        compile_static: Callable[..., Callable],
    ) -> None:
        self.gm = gm
        self.settings = settings
        self.grad = grad
        self.compile_static = compile_static
        self.compiled: dict[tuple, Callable] = {}
        self._scalars = frozenset(_scalar_inputs(gm, _example_values(gm)))
        self._lock = threading.Lock()
        self._over_limit_warned = False
        key = grad.key if grad.key is not None else ("graph", gm.code)
        if key not in _told:
            _told.add(key)
            log.warning(
                "torch_fl.bpu: Dynamo asked for dynamic shapes (a new input shape, dynamic=True "
                "or mark_dynamic); the BPU runs static shapes, so each input shape gets its own "
                "static artifact (at most max_shapes=%d per graph)",
                settings.max_shapes,
            )

    def __call__(self, *args: Any):
        sig = signature(args, self._scalars)
        run = self.compiled.get(sig)
        if run is None:
            run = self._compile(sig, args)
        return run(*args)

    def _compile(self, sig: tuple, args: Sequence[Any]) -> Callable:
        with self._lock:
            run = self.compiled.get(sig)
            if run is not None:
                return run
            if len(self.compiled) >= self.settings.max_shapes:
                return self._over_limit(sig)
            run = _static_compile(self.gm, args, self.settings, self.grad, self.compile_static)
            self.compiled[sig] = run
            log.info("bpu: static compilation %d for inputs %s", len(self.compiled), _describe(sig))
            return run

    def _over_limit(self, sig: tuple) -> Callable:
        message = (
            f"torch_fl.bpu: a graph already has {self.settings.max_shapes} static input "
            f"shapes compiled (max_shapes); inputs {_describe(sig)} run on the host CPU. Fix: "
            "pad or bucket inputs to fewer shapes, or raise options={'max_shapes': N}"
        )
        if self.settings.strict:
            raise StrictModeError("strict: " + message)
        if not self._over_limit_warned:
            self._over_limit_warned = True
            warnings.warn(message, stacklevel=4)
        return _host_run(self.gm, message)


def _static_compile(
    gm: fx.GraphModule,
    args: Sequence[Any],
    settings: BpuSettings,
    grad: Any,
    compile_static: Callable[..., Callable],
) -> Callable:
    """Compile `gm` for exactly these inputs: static fake tensors, a fresh tracing context (so
    aot_autograd records which inputs are parameters, as it does under Dynamo)."""
    from torch._guards import TracingContext, tracing
    from torch._subclasses.fake_tensor import FakeTensorMode

    gm = _fold_scalar_items(gm, args)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [
        fake_mode.from_tensor(a, static_shapes=True) if isinstance(a, torch.Tensor) else a
        for a in args
    ]
    with tracing(TracingContext(fake_mode)):
        return compile_static(gm, fakes, settings, grad)


def _scalar_inputs(gm: fx.GraphModule, values: Sequence[Any]) -> list[int]:
    """Inputs that are 0-d tensors read only through `.item()`: under dynamic=True Dynamo
    passes Python float attributes (BatchNorm's momentum) that way, and a static compile takes
    their values as constants (they are part of the signature)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return [
        i
        for i, (node, value) in enumerate(zip(placeholders, values, strict=False))
        if isinstance(value, torch.Tensor)
        and value.dim() == 0
        and node.users
        and all(u.op == "call_method" and u.target == "item" for u in node.users)
    ]


def _scalar_items(gm: fx.GraphModule, args: Sequence[Any]) -> dict[int, Any]:
    return {i: args[i].item() for i in _scalar_inputs(gm, args)}


def _fold_scalar_items(gm: fx.GraphModule, args: Sequence[Any]) -> fx.GraphModule:
    """A copy of `gm` with each `_scalar_items` input's `.item()` replaced by its value."""
    items = _scalar_items(gm, args)
    if not items:
        return gm
    graph = fx.Graph()
    mapping: dict[fx.Node, fx.Node] = {}
    graph.graph_copy(gm.graph, mapping)
    output = next(n for n in gm.graph.nodes if n.op == "output")
    graph.output(torch.fx.map_arg(output.args[0], lambda n: mapping[n]))
    old_inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, value in items.items():
        for user in list(mapping[old_inputs[i]].users):
            user.replace_all_uses_with(value)
            graph.erase_node(user)
    folded = fx.GraphModule(gm, graph)
    folded.meta = dict(gm.meta)
    if hasattr(gm, "_param_name_to_source"):
        folded._param_name_to_source = gm._param_name_to_source
    for old in old_inputs:
        if hasattr(old, "_dynamo_source"):
            mapping[old]._dynamo_source = old._dynamo_source
    return folded


def _host_run(gm: fx.GraphModule, reason: str) -> Callable:
    """The Dynamo graph run as it is, on the host; the report says why."""
    nodes = [
        {"node": n.name, "target": str(n.target), "reason": reason}
        for n in gm.graph.nodes
        if n.op in ("call_function", "call_method", "call_module")
    ]
    greport = GraphReport(-1, cpu_nodes=nodes, compute_total=len(nodes))
    greport.runtimes = []
    register_report(greport)
    return noting(greport, gm.forward)
