"""The lowering pass registries: lookup by op, validators, duplicates, and today's pass names."""

from __future__ import annotations

import pytest
import torch
from torch import fx

from torch_fl.bpu.errors import BpuError, PassRegistryError
from torch_fl.bpu.lowering.decompose import DECOMPOSITIONS, decompose
from torch_fl.bpu.lowering.registry import PassRegistry, op_name
from torch_fl.bpu.lowering.rewrites import REWRITES, _rewrite

aten = torch.ops.aten

# Every name the rewrite chain could return before it became a registry, by the op it fired on.
REWRITE_NAMES = {
    aten._native_batch_norm_legit_no_training.default: "batch_norm",
    aten.native_layer_norm.default: "layer_norm",
    aten.native_group_norm.default: "group_norm",
    aten._prelu_kernel.default: "prelu",
    aten._adaptive_avg_pool2d.default: "adaptive_avg_pool",
    aten.adaptive_avg_pool2d.default: "adaptive_avg_pool",
    aten.addcmul.default: "addcmul",
    aten.max_pool2d_with_indices.default: "max_pool2d",
    aten._softmax.default: "softmax",
    aten._log_softmax.default: "log_softmax",
    aten._unsafe_view.default: "reshape",
    aten.view.default: "reshape",
    aten.as_strided.default: "as_strided_permute",
    aten.slice_scatter.default: "slice_scatter",
    aten.copy.default: "copy",
    aten._to_copy.default: "cast",
    aten.unbind.int: "unbind",
    torch.ops.torch_fl_bpu.resize.default: "resize",
    aten.split.Tensor: "split",
    aten.split_with_sizes.default: "split",
    aten.add.Tensor: "scalar_overload",
    aten.sub.Tensor: "scalar_overload",
    aten.mul.Tensor: "scalar_overload",
    aten.div.Tensor: "scalar_overload",
    aten.t.default: "permute",
}

# The decompositions' names: `decompose` counted each op under its own name, underscores dropped.
DECOMPOSITION_NAMES = {
    aten._safe_softmax.default: "safe_softmax",
    aten.mkldnn_rnn_layer.default: "mkldnn_rnn_layer",
    aten.scaled_dot_product_attention.default: "scaled_dot_product_attention",
    aten._scaled_dot_product_flash_attention_for_cpu.default: (
        "scaled_dot_product_flash_attention_for_cpu"
    ),
    aten._scaled_dot_product_flash_attention.default: "scaled_dot_product_flash_attention",
    aten._scaled_dot_product_efficient_attention.default: (
        "scaled_dot_product_efficient_attention"
    ),
    aten._scaled_dot_product_attention_math.default: "scaled_dot_product_attention_math",
    aten._native_multi_head_attention.default: "native_multi_head_attention",
    aten._transformer_encoder_layer_fwd.default: "transformer_encoder_layer_fwd",
}


def _graph_with(target, *args, shape=(2, 3)):
    """A graph `x -> target(x, *args)`; x carries a real tensor as its meta value."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.randn(*shape)
    node = graph.call_function(target, (x, *args))
    node.meta["val"] = torch.randn(*shape)
    graph.output(node)
    return graph, x, node


def test_a_registered_pass_is_found_for_its_op_only():
    registry: PassRegistry = PassRegistry("test pass")

    @registry.register(aten.relu.default, aten.sigmoid.default)
    def handle(node):
        return node

    _, _, relu = _graph_with(aten.relu.default)
    entry = registry.find(relu)
    assert entry is not None and entry.fn is handle
    assert entry.name == "relu" and entry.target is aten.relu.default
    assert registry.get(aten.sigmoid.default).name == "sigmoid"
    _, _, tanh = _graph_with(aten.tanh.default)
    assert registry.find(tanh) is None
    assert len(registry) == 2 and aten.relu.default in registry


def test_a_validator_that_refuses_the_node_means_no_pass():
    registry: PassRegistry = PassRegistry("test pass")
    seen = []

    def only_positive_dim(node):
        seen.append(node)
        return node.args[1] >= 0

    @registry.register(aten.squeeze.dim, name="squeeze", validator=only_positive_dim)
    def handle(node):
        return node

    _, _, ok = _graph_with(aten.squeeze.dim, 1)
    _, _, refused = _graph_with(aten.squeeze.dim, -1)
    assert registry.find(ok).name == "squeeze"
    assert registry.find(refused) is None
    assert seen == [ok, refused]  # the validator really ran on each node
    assert registry.get(aten.squeeze.dim).accepts(refused) is False


def test_registering_an_op_twice_is_an_error_and_keeps_the_first():
    registry: PassRegistry = PassRegistry("test pass")

    @registry.register(aten.relu.default, name="first")
    def first(node):
        return node

    with pytest.raises(PassRegistryError, match="registered twice") as info:

        @registry.register(aten.relu.default, name="second")
        def second(node):
            return node

    assert isinstance(info.value, BpuError) and isinstance(info.value, ValueError)
    assert "first" in str(info.value) and "second" in str(info.value)
    assert registry.get(aten.relu.default).fn is first
    with pytest.raises(PassRegistryError, match="at least one op"):
        registry.register(name="nothing")


def test_every_rewrite_name_is_registered_for_its_op():
    assert {entry.target: entry.name for entry in REWRITES} == REWRITE_NAMES
    assert REWRITES.names() == set(REWRITE_NAMES.values())


def test_every_decomposition_name_is_registered_for_its_op():
    assert {entry.target: entry.name for entry in DECOMPOSITIONS} == DECOMPOSITION_NAMES
    for target, name in DECOMPOSITION_NAMES.items():
        # the name `decompose` reported before the registry existed
        assert name == str(target.overloadpacket.__name__).lstrip("_") == op_name(target)


@pytest.mark.parametrize(
    ("target", "name", "new_target"),
    [
        (aten._softmax.default, "softmax", aten.softmax.int),
        (aten._log_softmax.default, "log_softmax", aten.log_softmax.int),
    ],
)
def test_softmax_rewrite_follows_its_validator(target, name, new_target):
    graph, x, node = _graph_with(target, -1, True)
    assert _rewrite(graph, node) is None  # half_to_float: refused, left alone
    assert node.target is target and node.args == (x, -1, True)
    graph, x, node = _graph_with(target, -1, False)
    assert _rewrite(graph, node) == name
    assert node.target is new_target and node.args == (x, -1)


def test_scalar_overload_only_for_a_python_number():
    graph, x, node = _graph_with(aten.add.Tensor, 2.0)
    assert _rewrite(graph, node) == "scalar_overload" and node.target is aten.add.Scalar
    graph = fx.Graph()
    a, b = graph.placeholder("a"), graph.placeholder("b")
    node = graph.call_function(aten.add.Tensor, (a, b))
    assert _rewrite(graph, node) is None and node.target is aten.add.Tensor


def test_cast_rewrite_refuses_more_than_a_cast():
    graph, _, node = _graph_with(aten._to_copy.default)
    node.kwargs = {"dtype": torch.float16, "memory_format": torch.channels_last}
    assert _rewrite(graph, node) is None and node.target is aten._to_copy.default
    node.kwargs = {"dtype": torch.float16}
    assert _rewrite(graph, node) == "cast" and node.target is aten.to.dtype


def test_transpose_rewrite_only_for_a_matrix():
    graph, x, node = _graph_with(aten.t.default, shape=(4,))
    assert _rewrite(graph, node) is None and node.target is aten.t.default
    graph, x, node = _graph_with(aten.t.default)
    assert _rewrite(graph, node) == "permute" and node.args == (x, [1, 0])


def test_sdpa_with_dropout_has_no_decomposition():
    _, _, node = _graph_with(aten.scaled_dot_product_attention.default)
    node.args = (node.args[0], node.args[0], node.args[0], None, 0.5)
    assert DECOMPOSITIONS.find(node) is None
    node.args = (node.args[0], node.args[0], node.args[0], None, 0.0)
    assert DECOMPOSITIONS.find(node).name == "scaled_dot_product_attention"


def test_decompose_counts_a_registered_decomposition_by_its_name():
    graph, x, node = _graph_with(aten._safe_softmax.default, -1)
    gm = fx.GraphModule(torch.nn.Module(), graph)
    assert decompose(gm) == {"safe_softmax": 1}
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert aten._safe_softmax.default not in targets and aten._softmax.default in targets
    inp = torch.randn(2, 3)
    torch.testing.assert_close(gm(inp), torch.softmax(inp, -1))
