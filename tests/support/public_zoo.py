"""Public architectures nobody here wrote: torchvision, timm and Hugging Face transformers.

Each is built from its library's own definition (random weights, no downloads), in eval mode,
at a size that keeps the lane within its budget on the 2-core host. `build(name)` returns the
model and one input tuple. torchvision 0.28 is installed beside torch 2.13 without its C ops
(a CUDA build that does not load here): `import_torchvision` skips their fake registrations,
which only the detection ops (nms, roi_align) need.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch


def import_torchvision():
    """torchvision without its `_meta_registrations` (they need the C ops' schemas)."""
    name = "torchvision._meta_registrations"
    if "torchvision" not in sys.modules:
        sys.modules.setdefault(name, types.ModuleType(name))
    import torchvision

    return torchvision


def available(library: str) -> bool:
    return importlib.util.find_spec(library) is not None


@dataclass(frozen=True)
class PublicModel:
    library: str
    make: Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]
    note: str = ""


def _image(batch: int = 1, size: int = 64) -> tuple[torch.Tensor, ...]:
    return (torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(0)),)


def _tv(name: str, size: int = 64, **kwargs) -> Callable:
    def make():
        tv = import_torchvision()
        torch.manual_seed(0)
        model = getattr(tv.models, name)(weights=None, **kwargs)
        return model, _image(1, size)

    return make


def _timm(name: str, size: int = 64, **kwargs) -> Callable:
    def make():
        import_torchvision()  # timm imports torchvision
        import timm

        torch.manual_seed(0)
        return timm.create_model(name, pretrained=False, **kwargs), _image(1, size)

    return make


def _tokens(vocab: int, length: int = 16) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return (torch.randint(0, vocab, (1, length), generator=g),)


def _hf(config_name: str, model_name: str, **config) -> Callable:
    def make():
        import_torchvision()  # transformers imports torchvision when it is installed
        import transformers

        torch.manual_seed(0)
        cfg = getattr(transformers, config_name)(**config)
        model = getattr(transformers, model_name)(cfg)
        model.config.use_cache = False
        return model, _tokens(cfg.vocab_size)

    return make


_SMALL_ENCODER = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=64,
)
_SMALL_DECODER = {**_SMALL_ENCODER, "num_key_value_heads": 2}  # grouped-query attention

MODELS: dict[str, PublicModel] = {
    "tv_resnet18": PublicModel("torchvision", _tv("resnet18")),
    "tv_mobilenet_v2": PublicModel("torchvision", _tv("mobilenet_v2")),
    "tv_mobilenet_v3_large": PublicModel("torchvision", _tv("mobilenet_v3_large")),
    "tv_alexnet": PublicModel("torchvision", _tv("alexnet", 224)),
    "tv_efficientnet_b0": PublicModel("torchvision", _tv("efficientnet_b0")),
    "tv_shufflenet_v2_x0_5": PublicModel("torchvision", _tv("shufflenet_v2_x0_5")),
    "tv_squeezenet1_1": PublicModel("torchvision", _tv("squeezenet1_1")),
    "tv_regnet_y_400mf": PublicModel("torchvision", _tv("regnet_y_400mf")),
    "tv_swin_v2_t": PublicModel("torchvision", _tv("swin_v2_t", 64)),
    "timm_efficientnet_b0": PublicModel("timm", _timm("efficientnet_b0")),
    "timm_mobilevitv2_050": PublicModel("timm", _timm("mobilevitv2_050")),
    "timm_fastvit_t8": PublicModel("timm", _timm("fastvit_t8")),
    "timm_convnextv2_atto": PublicModel("timm", _timm("convnextv2_atto")),
    "hf_gpt2": PublicModel(
        "transformers",
        _hf(
            "GPT2Config",
            "GPT2LMHeadModel",
            vocab_size=256,
            n_embd=64,
            n_layer=2,
            n_head=4,
            n_positions=64,
        ),
    ),
    "hf_llama": PublicModel(
        "transformers", _hf("LlamaConfig", "LlamaForCausalLM", **_SMALL_DECODER)
    ),
    "hf_qwen2": PublicModel(
        "transformers", _hf("Qwen2Config", "Qwen2ForCausalLM", **_SMALL_DECODER)
    ),
    "hf_bert": PublicModel("transformers", _hf("BertConfig", "BertModel", **_SMALL_ENCODER)),
    "hf_roberta": PublicModel(
        "transformers", _hf("RobertaConfig", "RobertaModel", pad_token_id=1, **_SMALL_ENCODER)
    ),
}


def _settle_batchnorm(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
    """Running statistics measured on random inputs, as training would leave them.

    With its initial statistics (mean 0, var 1) a randomly initialised deep CNN in eval mode
    collapses (torchvision MobileNetV3 at 64x64: outputs ~1e-10, where float rounding noise alone
    moves the cosine): no trained model looks like that, and no quantizer could be judged on it.
    """
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms or not all(t.is_floating_point() for t in inputs):
        return
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average over the batches below
    g = torch.Generator().manual_seed(2)
    model.train()
    with torch.no_grad():
        for _ in range(4):
            model(*(torch.randn((4, *t.shape[1:]), generator=g) for t in inputs))


def build(name: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    model, inputs = MODELS[name].make()
    _settle_batchnorm(model, inputs)
    return model.eval(), inputs


def output_tensors(value) -> list[torch.Tensor]:
    """Every tensor in a model's output (tensor, tuple, list, dict or Hugging Face ModelOutput)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in output_tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in output_tensors(v)]
    return []


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.flatten().double(), b.flatten().double()
    return torch.nn.functional.cosine_similarity(a, b, dim=0).item()


def samples(inputs: tuple[torch.Tensor, ...], n: int, seed: int) -> list[tuple[torch.Tensor, ...]]:
    """`n` random input tuples shaped like `inputs` (token ids stay in their range)."""
    g = torch.Generator().manual_seed(seed)
    return [
        tuple(
            torch.randn(t.shape, generator=g)
            if t.is_floating_point()
            else torch.randint(0, int(t.max()) + 1, t.shape, generator=g)
            for t in inputs
        )
        for _ in range(n)
    ]
