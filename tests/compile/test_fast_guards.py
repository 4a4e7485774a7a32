"""Dynamo's recursive dict-tag guards for the frames this backend compiles (torch_fl/bpu/guards.py,
setting `fast_guards`): those frames' guards get the check, every other frame keeps Dynamo's
default, and a compiled model still recompiles on each change its guards exist for."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._dynamo.eval_frame import _debug_get_cache_entry_list

from tests.compile.bpu_helpers import compile_bpu
from torch_fl.bpu import guards
from torch_fl.bpu.backend import bpu_backend
from torch_fl.bpu.errors import SettingsError

OPTION = "use_recursive_dict_tags_for_guards"
pytestmark = pytest.mark.skipif(guards._config() is None, reason="no recursive dict-tag guards")


class Net(nn.Module):
    """A conv net whose forward reads a plain attribute, so a changed attribute must recompile."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 1))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(8 * 8 * 8, 4))
        self.doubled = False
        self.options = {"shift": 0.0}  # containers forward reads, changed in place below
        self.gains = [1.0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.head(self.body(x)) * self.gains[0] + self.options["shift"]
        return y * 2 if self.doubled else y


class Other(Net):
    """The same net with a forward of its own: a frame (code object) of its own for Dynamo."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def _net() -> Net:
    torch.manual_seed(0)
    return Net().eval()


def _tag_safe_roots(module: nn.Module) -> int:
    """How many nodes of the compiled frame's guard trees are recursive dict-tag roots."""
    count = 0
    for entry in _debug_get_cache_entry_list(type(module).forward.__code__):
        stack = [entry.guard_manager.root]
        while stack:
            node = stack.pop()
            count += bool(node.is_tag_safe_root())
            stack.extend(node.get_child_managers())
    return count


@pytest.fixture
def dynamo():
    """A fresh Dynamo, and Dynamo's option as it was afterwards."""
    torch._dynamo.reset()
    before = getattr(torch._dynamo.config, OPTION)
    yield
    setattr(torch._dynamo.config, OPTION, before)
    torch._dynamo.reset()


X = torch.randn(2, 3, 8, 8)


@pytest.mark.board
def test_bpu_frames_get_the_check_and_the_option_is_put_back(dynamo):
    assert getattr(torch._dynamo.config, OPTION) is False
    model = _net()
    with torch.no_grad():
        out = compile_bpu(model, executor="eager")(X)
        torch.testing.assert_close(out, model(X))
    assert _tag_safe_roots(model) >= 1
    assert getattr(torch._dynamo.config, OPTION) is False  # not left on for other backends


def test_fast_guards_off_keeps_dynamos_default(dynamo):
    model = _net()
    with torch.no_grad():
        compile_bpu(model, executor="eager", fast_guards=False)(X)
    assert _tag_safe_roots(model) == 0


def test_other_backends_after_a_bpu_frame_keep_the_default(dynamo):
    with torch.no_grad():
        compile_bpu(_net(), executor="eager")(X)
        torch.manual_seed(0)
        other = Other().eval()
        torch.compile(other, backend="eager")(X)
    assert _tag_safe_roots(other) == 0


def test_a_users_own_choice_is_kept(dynamo):
    setattr(torch._dynamo.config, OPTION, True)
    with torch.no_grad():
        compile_bpu(_net(), executor="eager", fast_guards=False)(X)
        compile_bpu(_net(), executor="eager")(X)
    assert getattr(torch._dynamo.config, OPTION) is True


def test_after_dynamo_reset_the_callback_is_registered_again(dynamo):
    for _ in range(2):
        torch._dynamo.reset()  # clears Dynamo's compile callbacks, ours among them
        model = _net()
        with torch.no_grad():
            compile_bpu(model, executor="eager")(X)
        assert _tag_safe_roots(model) >= 1
        assert getattr(torch._dynamo.config, OPTION) is False


def test_a_graph_handed_to_the_backend_by_hand_leaves_the_option_alone(dynamo):
    gm = torch.fx.symbolic_trace(lambda x: (torch.relu(x) + 1,))
    compiled = bpu_backend(gm, [torch.randn(4)], options={"executor": "eager"})
    torch.testing.assert_close(compiled(torch.ones(4))[0], torch.full((4,), 2.0))
    assert getattr(torch._dynamo.config, OPTION) is False


def test_a_failing_compile_puts_the_option_back(dynamo):
    with pytest.raises(SettingsError):
        compile_bpu(_net(), executor="eager", sim_kernels="avx9")(X)
    assert getattr(torch._dynamo.config, OPTION) is False


def _replace_conv(m: Net) -> None:
    m.body[2] = nn.Conv2d(8, 8, 1)


def _replace_weight(m: Net) -> None:
    m.head[1].weight = nn.Parameter(torch.randn(4, 8 * 8 * 8))


def _drop_bias(m: Net) -> None:
    m.body[0].bias = None


def _flag(m: Net) -> None:
    m.doubled = True


def _dict_in_place(m: Net) -> None:
    m.options["shift"] = 1.5  # the module's own dict is unchanged: the nested dict's tag is not


def _list_in_place(m: Net) -> None:
    m.gains[0] = 3.0  # a list is no dict: its guards always run


def _nested_flag(m: Net) -> None:
    m.body[1].inplace = True  # a module attribute forward reads: a guard on it


def _entries_after(change, fast: bool) -> int:
    """Compile, call, make the change, call again: the result must be the eager model's; how
    many compiled entries the frame has then."""
    torch._dynamo.reset()
    model = _net()
    compiled = compile_bpu(model, executor="eager", fast_guards=fast)
    with torch.no_grad():
        compiled(X)
        compiled(X)  # the guards pass: no recompile
        change(model)
        torch.testing.assert_close(compiled(X), model(X))
    return len(_debug_get_cache_entry_list(type(model).forward.__code__))


@pytest.mark.parametrize(
    "change",
    [
        _replace_conv,
        _replace_weight,
        _drop_bias,
        _flag,
        _nested_flag,
        _dict_in_place,
        _list_in_place,
    ],
)
def test_each_change_gets_the_right_answer_and_the_defaults_recompiles(dynamo, change):
    # a replaced module or parameter of the same shapes is a new graph input, no recompile;
    # a changed flag, container value or a dropped bias changes the graph: both guard kinds
    # see the same
    assert _entries_after(change, fast=True) == _entries_after(change, fast=False)
    if change in (_drop_bias, _flag, _nested_flag, _dict_in_place, _list_in_place):
        assert _entries_after(change, fast=True) == 2


def test_train_mode_recompiles_for_the_host(dynamo):
    model = _net()
    compiled = compile_bpu(model, executor="eager")
    with torch.no_grad():
        compiled(X)
    model.train()
    with pytest.warns(UserWarning, match="nothing offloaded"):
        out = compiled(X)
    torch.testing.assert_close(out, model(X))
    assert out.requires_grad


def test_the_setting_rejects_a_non_boolean(monkeypatch, dynamo):
    monkeypatch.setenv("FLAGOS_BPU_FAST_GUARDS", "maybe")
    with pytest.raises(SettingsError, match="FLAGOS_BPU_FAST_GUARDS"):
        compile_bpu(_net(), executor="eager")(X)
    assert getattr(torch._dynamo.config, OPTION) is False
