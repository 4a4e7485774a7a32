"""The identity half of the baked-weight check (`_C._TensorIdentity`, csrc/python/module.cpp;
conversion/freezing.py): the same tensor objects with the data pointers, version counters,
strides and storage sizes they had, each change seen alone."""

from __future__ import annotations

import pytest
import torch

from torch_fl import _C


def _weights() -> list[torch.Tensor]:
    return [torch.randn(4, 6), torch.randn(7), torch.nn.Parameter(torch.randn(3, 3))]


def test_the_same_objects_unchanged_are_the_same_as_a_list_or_a_tuple():
    w = _weights()
    identity = _C._TensorIdentity(w)
    assert identity.same(w) and identity.same(tuple(w))
    w[0].mul(2)  # out of place: nothing of w[0] changes
    assert identity.same(w)


@pytest.mark.parametrize(
    "change",
    [
        "another object",
        "one fewer",
        "one more",
        "written in place",
        "data replaced",
        "strides",
        "storage grown",
    ],
)
def test_each_change_is_seen(change):
    w = _weights()
    identity = _C._TensorIdentity(w)
    if change == "another object":
        w[1] = w[1].clone()  # equal values, another tensor
    elif change == "one fewer":
        w.pop()
    elif change == "one more":
        w.append(torch.zeros(1))
    elif change == "written in place":
        w[1].add_(0.0)  # the same values, a new version
    elif change == "data replaced":
        with torch.no_grad():
            w[2].data = torch.randn(3, 3)  # the same object, other memory
    elif change == "strides":
        w[0].set_(w[0].untyped_storage(), 0, (4, 6), (1, 4))
    elif change == "storage grown":
        w[1].resize_(4096)
    assert not identity.same(w)


def test_the_identity_refuses_what_is_not_a_sequence_of_tensors():
    with pytest.raises(RuntimeError, match="expected tensors"):
        _C._TensorIdentity([torch.zeros(1), 3])
    identity = _C._TensorIdentity(_weights())
    with pytest.raises(TypeError, match="expected a sequence"):
        identity.same(5)
