"""Every MoE language-model family of the installed transformers, as a tiny causal LM with random weights.

The families are found, not listed: each ``*ForCausalLM`` of transformers' auto mapping whose modeling module defines
an experts class (``*Experts``: transformers 5's fused expert weights) or a sparse-MoE/top-k router class. Each
config is shrunk the same way (a few layers, every layer sparse, small widths, a few experts) through the attribute
names the families use; :data:`OVERRIDES` holds what one family needs besides. A family the shrinker cannot build is
reported by :func:`build` with the reason, never skipped silently.
"""

from __future__ import annotations

import importlib
import inspect
import os
from dataclasses import dataclass
from typing import Any, Callable, Optional

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # noqa: E402

#: Sizes every family is shrunk to.
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, VOCAB, LAYERS = 64, 4, 2, 16, 128, 2
EXPERTS, TOP_K, INTER, MOE_INTER = 8, 2, 64, 32

#: attribute -> value, applied where the config has the attribute.
_SIZES: dict[str, Any] = {
    "vocab_size": VOCAB, "hidden_size": HIDDEN, "d_model": HIDDEN, "intermediate_size": INTER,
    "ffn_hidden_size": INTER, "moe_intermediate_size": MOE_INTER, "expert_intermediate_size": MOE_INTER,
    "shared_expert_intermediate_size": MOE_INTER, "moe_shared_expert_intermediate_size": MOE_INTER,
    "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
    "max_position_embeddings": 256, "sliding_window": 16, "max_window_layers": LAYERS,
    # experts and routing
    "num_experts": EXPERTS, "num_local_experts": EXPERTS, "n_routed_experts": EXPERTS, "moe_num_experts": EXPERTS,
    "num_experts_per_tok": TOP_K, "top_k_experts": TOP_K, "moe_k": TOP_K, "moe_topk": TOP_K,
    "n_group": 2, "topk_group": 1, "n_shared_experts": 1, "num_shared_experts": 1,
    "first_k_dense_replace": 0, "decoder_sparse_step": 1, "moe_layer_freq": 1, "mlp_only_layers": [],
    "moe_layer_start_index": 0, "expert_interval": 1, "expert_layer_period": 1, "expert_layer_offset": 0,
    # the MoE itself where a family's default config turns it off (Gemma4's block beside the MLP, Doge's CDMoE)
    "enable_moe_block": True, "is_moe": True,
    # multi-head latent attention
    "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
    "qk_head_dim": 16,
    # per-layer inputs, linear attention, state spaces
    "hidden_size_per_layer_input": 16, "vocab_size_per_layer_input": VOCAB,
    "linear_num_value_heads": 2, "linear_num_key_heads": 2, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "mamba_d_state": 8, "mamba_n_heads": 4, "mamba_d_head": 16, "mamba_expand": 2, "mamba_n_groups": 1,
    "ssm_state_size": 8, "mamba_head_dim": 16, "n_groups": 1,
    # sparse ("indexed") attention
    "index_n_heads": 2, "index_head_dim": 16, "index_topk": 8,
    # Jamba-style layer periods: every other layer attention, every layer sparse
    "attn_layer_period": 2, "attn_layer_offset": 1, "num_dense_layers": 0,
}


@dataclass
class Family:
    model_type: str
    causal_lm: type
    config: Any


def _modeling(cls: type):
    return importlib.import_module(cls.__module__)


def _is_moe(mod) -> bool:
    names = [n for n, o in vars(mod).items() if inspect.isclass(o) and o.__module__ == mod.__name__]
    return any(n.endswith("Experts") or "SparseMoe" in n or n.endswith("MoE") or n.endswith("Moe") for n in names)


def _get(cfg: Any, name: str) -> Any:
    try:
        return getattr(cfg, name, None)
    except Exception:  # noqa: BLE001 - a per-layer attribute (Dots3) is no global one
        return None


def _shrink(cfg: Any) -> None:
    for name, value in _SIZES.items():
        if name in cfg.to_dict() or hasattr(cfg, name):
            try:
                setattr(cfg, name, value)
            except Exception:  # noqa: BLE001 - a read-only derived property
                pass
    if getattr(cfg, "qk_rope_head_dim", None) is not None and hasattr(cfg, "head_dim"):
        cfg.head_dim = cfg.qk_rope_head_dim  # multi-head latent attention: the rotary part's width
    if _get(cfg, "kv_lora_rank") is not None and hasattr(cfg, "num_key_value_heads"):
        cfg.num_key_value_heads = HEADS  # multi-head latent attention: one latent key/value per head
    if isinstance(getattr(cfg, "pad_token_id", None), int) and cfg.pad_token_id >= VOCAB:
        cfg.pad_token_id = 0
    layers = getattr(cfg, "num_hidden_layers", LAYERS)
    lt = getattr(cfg, "layer_types", None)
    if isinstance(lt, (list, tuple)) and lt and "layer_types" in cfg.to_dict():
        kinds = list(dict.fromkeys(lt))  # keep one layer of each kind, in order of appearance
        try:
            cfg.layer_types = (kinds * layers)[:max(layers, len(kinds))]
            cfg.num_hidden_layers = len(cfg.layer_types)
        except AttributeError:  # derived from other attributes (Jamba's periods)
            pass
    if "mlp_layer_types" in cfg.to_dict():
        cfg.mlp_layer_types = ["sparse"] * cfg.num_hidden_layers
    rope = getattr(cfg, "rope_parameters", None)
    if isinstance(rope, dict) and type(cfg).__name__.startswith(("Glm4vMoe", "Ernie4_5_VLMoe")):
        # multimodal rotary sections (t, h, w) sized for the full head: the tiny head's rotary half-width
        rotary = HIDDEN // HEADS * rope.get("partial_rotary_factor", 1.0) // 2
        a = int(rotary) * 3 // 8  # Ernie takes the first two sections as equal (h, w) halves
        rope["mrope_section"] = [a, a, int(rotary) - 2 * a]


def _causal_families() -> list[str]:
    out = []
    for mt, cls_name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items():
        cls = getattr(transformers, cls_name, None)
        if cls is None:
            continue
        try:
            mod = _modeling(cls)
        except Exception:  # noqa: BLE001
            continue
        # A multimodal model whose text model is a family of its own (gemma4 -> gemma4_text) is that family.
        if f"{mt}_text" in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
            continue
        if _is_moe(mod) and mt not in out:
            out.append(mt)
    return out


def _text_model_class(package: str) -> Optional[type]:
    """The language model of a transformers package whose MoE language model is no causal LM of the auto mapping
    (multimodal models' text models, encoder-decoders): its ``*TextModel``, else ``*ForCausalLM``, else ``*Model``
    (an encoder-decoder, run with the input ids as decoder ids too); None when the package has no MoE."""
    import pkgutil

    pkg = importlib.import_module(f"transformers.models.{package}")
    for sub in pkgutil.iter_modules(pkg.__path__):
        if not sub.name.startswith("modeling_"):
            continue
        try:
            mod = importlib.import_module(f"{pkg.__name__}.{sub.name}")
        except Exception:  # noqa: BLE001 - a modeling file needing a package not installed
            continue
        if not _is_moe(mod):
            continue
        classes = [n for n, o in vars(mod).items() if inspect.isclass(o) and o.__module__ == mod.__name__]
        for pick in (lambda n: n.endswith("TextModel"), lambda n: n.endswith("ForCausalLM"),
                     lambda n: n.endswith("Model") and not n.endswith("PreTrainedModel")):
            found = [n for n in classes if pick(n)]
            if found:
                return getattr(mod, found[0])
    return None


#: Packages with MoE classes that are no language model (vision backbones, document-layout routers).
NOT_LANGUAGE_MODELS = ("vitpose_backbone", "granite_docling")


def _packaged_families(known: list[str]) -> list[str]:
    import pkgutil

    import transformers.models as models

    causal = {MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(mt) for mt in known}
    out = []
    for info in pkgutil.iter_modules(models.__path__):
        name = info.name
        if name in known or f"{name}_text" in known or name in NOT_LANGUAGE_MODELS:
            continue
        cls = _text_model_class(name)
        if cls is not None and cls.__name__ not in causal:
            out.append(name)
    return out


def families() -> list[str]:
    """The causal LMs of the auto mapping that have MoE layers, then the other packages with a MoE language model
    (multimodal models' text models, encoder-decoders)."""
    causal = _causal_families()
    return causal + _packaged_families(causal)


class _Seq2Seq(torch.nn.Module):
    """An encoder-decoder called as a language model: the input ids feed the encoder and the decoder."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.config = model.config

    def forward(self, input_ids: torch.Tensor, **kwargs: Any):
        return self.model(input_ids=input_ids, decoder_input_ids=input_ids, **kwargs)


#: model_type -> fn(config) for what the shared shrinker cannot guess.
def _dbrx(cfg: Any) -> None:
    cfg.d_model, cfg.n_heads, cfg.n_layers, cfg.max_seq_len, cfg.vocab_size = HIDDEN, HEADS, LAYERS, 256, VOCAB
    cfg.attn_config.kv_n_heads = KV_HEADS
    cfg.ffn_config.ffn_hidden_size, cfg.ffn_config.moe_num_experts, cfg.ffn_config.moe_top_k = MOE_INTER, EXPERTS, TOP_K
    cfg.ffn_config.hidden_size = HIDDEN
    cfg.attn_config.rope_theta = 10000.0  # DbrxAttention reads attn_config.rope_theta, which the config lacks
    cfg.attn_config.clip_qkv = 8.0  # and clamps with it unconditionally


def _qwen4_exp(cfg: Any) -> None:
    cfg.indexer_n_heads, cfg.indexer_kv_heads, cfg.indexer_head_dim = 2, 1, 16
    cfg.indexer_budget, cfg.indexer_compress_ratio = 8, 4


def _lfm2_moe(cfg: Any) -> None:
    cfg.layer_types = ["conv", "full_attention"]
    cfg.num_hidden_layers = 2


def _granitemoehybrid(cfg: Any) -> None:
    cfg.layer_types = ["linear_attention", "full_attention"]  # the default has no attention layer
    cfg.mamba_d_head = cfg.mamba_expand * cfg.hidden_size // cfg.mamba_n_heads
    cfg.num_hidden_layers = 2


def _mistral4(cfg: Any) -> None:
    cfg.rope_parameters["partial_rotary_factor"] = 1.0  # the rotary part is qk_rope_head_dim already


def _dots3(cfg: Any) -> None:
    cfg.num_key_value_heads = HEADS  # multi-head latent attention (kv_lora_rank is per layer here)


OVERRIDES: dict[str, Callable[[Any], None]] = {"dots3_note_text": _dots3, "mistral4": _mistral4, "dbrx": _dbrx, "qwen4_exp_text": _qwen4_exp, "lfm2_moe": _lfm2_moe,
                                               "granitemoehybrid": _granitemoehybrid}


def build(model_type: str, seed: int = 0) -> torch.nn.Module:
    """The tiny language model of ``model_type`` (a family of :func:`families`) in float32 eval mode, random weights
    (seeded); it takes ``input_ids [B, T]``."""
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        cls = _text_model_class(model_type)
        cfg = cls.config_class()
        _shrink(cfg)
        if model_type in OVERRIDES:
            OVERRIDES[model_type](cfg)
        torch.manual_seed(seed)
        model = cls(cfg).float().eval()
        return _Seq2Seq(model).eval() if getattr(cfg, "is_encoder_decoder", False) else model
    cls = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    cfg_cls = cls.config_class
    cfg = cfg_cls()
    text = getattr(cfg, "text_config", None)
    target = text if text is not None and cfg_cls.model_type != model_type else cfg
    if cfg.model_type != model_type:
        from transformers import AutoConfig
        target = cfg = AutoConfig.for_model(model_type)
    _shrink(target)
    if model_type in OVERRIDES:
        OVERRIDES[model_type](target)
    torch.manual_seed(seed)
    model = cls(cfg)
    return model.float().eval()
