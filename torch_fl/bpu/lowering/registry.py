"""Registries of graph passes keyed by the op they handle: the loop looks up, never branches.

In the style of Torch-TensorRT's converter registry (and `runtime/registry.py` here): each
pattern is one small function, registered with a decorator that names the aten op(s) it handles
and, optionally, a validator (a capability check on the node). A pass loop asks
`registry.find(node)` for the pass of `node.target` and runs it; what the pass does, and whether
it still declines after its validator, is the pass's own business.

One op has at most one pass per registry: a second registration for the same op raises
`PassRegistryError` at import time, so two patterns can never silently shadow each other.

Nothing here imports the rest of lowering: `rewrites` and `decompose` import this module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from torch import fx

from torch_fl.bpu.errors import PassRegistryError

Validator = Callable[[fx.Node], bool]
"""A capability check: True when the pass applies to this node (its arguments, its metadata)."""

F = TypeVar("F", bound=Callable)


def op_name(target: object) -> str:
    """The name a pass gets when none is given: the aten op's name without its overload or
    leading underscores (`aten._safe_softmax.default` -> "safe_softmax")."""
    packet = getattr(target, "overloadpacket", None)
    name = getattr(packet, "__name__", None) or getattr(target, "__name__", None) or str(target)
    return str(name).lstrip("_")


@dataclass(frozen=True)
class Pass(Generic[F]):
    """One registered pass: the function, the op it is registered for, the name it reports."""

    name: str
    target: object
    fn: F
    validator: Validator | None = None

    def accepts(self, node: fx.Node) -> bool:
        """Whether the validator (if any) lets this pass run on `node`."""
        return self.validator is None or bool(self.validator(node))


class PassRegistry(Generic[F]):
    """{op: Pass}, filled by the `register` decorator; `find` is what a pass loop calls."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        """What the registry holds ("rewrite", "decomposition"): named in errors."""
        self._passes: dict[object, Pass[F]] = {}

    def register(
        self, *targets: object, name: str | None = None, validator: Validator | None = None
    ) -> Callable[[F], F]:
        """Decorator: `fn` handles each op in `targets`, reported as `name` (default: each
        op's own name, see `op_name`), where `validator` (default: always) accepts the node."""
        if not targets:
            raise PassRegistryError(f"a {self.kind} pass must name at least one op")

        def add(fn: F) -> F:
            for target in targets:
                self._add(Pass(name or op_name(target), target, fn, validator))
            return fn

        return add

    def _add(self, entry: Pass[F]) -> None:
        old = self._passes.get(entry.target)
        if old is not None:
            raise PassRegistryError(
                f"{self.kind} for {entry.target} registered twice ({old.fn.__name__} and "
                f"{entry.fn.__name__}); one op has one {self.kind} pass, merge the two"
            )
        self._passes[entry.target] = entry

    def find(self, node: fx.Node) -> Pass[F] | None:
        """The pass registered for `node.target` when its validator accepts `node`, else None."""
        entry = self._passes.get(node.target)
        if entry is None or not entry.accepts(node):
            return None
        return entry

    def get(self, target: object) -> Pass[F] | None:
        """The pass registered for `target`, whatever its validator says."""
        return self._passes.get(target)

    def names(self) -> frozenset[str]:
        """Every name a pass of this registry can report."""
        return frozenset(entry.name for entry in self._passes.values())

    def __contains__(self, target: object) -> bool:
        return target in self._passes

    def __iter__(self) -> Iterator[Pass[F]]:
        return iter(self._passes.values())

    def __len__(self) -> int:
        return len(self._passes)
