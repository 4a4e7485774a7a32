"""Dynamo's guards for the graphs this backend compiles: the recursive dict-tag check.

Every call of a compiled model first runs Dynamo's guards, and a model's guards grow with its
modules: for each parameter, the chain of module dicts that reaches it and a tensor check, plus
each module's flags. Compiled MobileNetV3-Small carries some 3,000 of them; with a backend that
returns a constant they cost 106 us a call at batch 1 here, and in place, after an int8 session
has emptied the caches, 0.4 to 0.8 ms of a ~2 ms call (docs/compile-models.md).

Dynamo has a faster form of the same check, off by default in open-source PyTorch
(`torch._dynamo.config.use_recursive_dict_tags_for_guards`): for a module subtree whose guards
only read module dicts and tensors, it compares the version tags of those dicts, and runs the
subtree's guards only when one changed (an attribute set, a module or parameter replaced,
train() / eval()). Tensors it treats as unchanged while their dict is, which Dynamo's default
(`skip_tensor_guards_with_matching_dict_tags`) already does; in-place weight writes are the
baked-weight check's job (conversion/freezing.py), not the guards'.

The option is read when Dynamo builds a frame's guards, after the backend has compiled the
frame's graph. `use_dict_tag_guards` turns it on from inside the backend and registers a
compile-end callback that turns it off again, so frames compiled by other backends keep Dynamo's
default. A user who turned it on themselves keeps it on.
"""

from __future__ import annotations

import logging

log = logging.getLogger("torch_fl.bpu")

_OPTION = "use_recursive_dict_tags_for_guards"
_state = {"ours": False}
"""Whether the option is on because this module turned it on (and must turn it off again)."""


def _config():
    """Dynamo's config module, or None where this torch has no recursive dict-tag guards."""
    try:
        import torch._dynamo.config as config
        from torch._dynamo import callback_handler
    except ImportError:
        return None
    if not hasattr(config, _OPTION) or not hasattr(callback_handler, "register_end_callback"):
        return None
    return config


def _compiling() -> bool:
    """Whether Dynamo is compiling a frame now (whose end runs the callbacks): not for a graph
    handed to the backend by hand, where nothing would turn the option off again."""
    from torch._guards import CompileContext

    try:
        return CompileContext.current_compile_id() is not None
    except Exception:  # noqa: BLE001  (no compile context in this torch: not compiling)
        return False


def _restore(_args=None) -> None:
    """Dynamo's compile-end callback: put the option back as the user had it."""
    config = _config()
    if config is not None and _state["ours"]:
        setattr(config, _OPTION, False)
    _state["ours"] = False


def use_dict_tag_guards(enabled: bool) -> bool:
    """Build the guards of the frame Dynamo is compiling now with the recursive dict-tag check
    (when `enabled`, the `fast_guards` setting). Called from the backend, during the frame's
    compilation; returns whether that frame's guards get the check."""
    config = _config()
    if config is None:
        return False
    if getattr(config, _OPTION):
        return True  # on already: the user's choice, or ours for an earlier graph of this frame
    if not enabled or not _compiling():
        return False
    from torch._dynamo import callback_handler

    # torch._dynamo.reset() clears the callbacks: register again whenever ours is gone
    if _restore not in callback_handler.end_callbacks:
        callback_handler.register_end_callback(_restore)
    setattr(config, _OPTION, True)
    _state["ours"] = True
    log.debug("bpu: this frame's guards use Dynamo's recursive dict-tag check")
    return True
