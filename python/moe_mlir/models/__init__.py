"""One complete SMoE transformer block per seed router, in plain PyTorch (attention, router, experts).

=====================  ==========================================  ==============================================
module                 model                                       router ops
=====================  ==========================================  ==============================================
similarity_inform      :class:`SimilarityInformBlock`              similarity_inform, topk_renorm (probs)
attention_inform       :class:`AttentionInformBlock`               attention_posterior, topk_renorm (probs)
hyper_router           :class:`HyperRouterBlock`                   hyper_router, topk_renorm (logits)
acmoe                  :class:`ACMoEStack` (two layers)            topk_renorm, mad_dispersion
symphony               :class:`SymphonyBlock`                      topk_renorm (probs, raw), adjacency_update
=====================  ==========================================  ==============================================

Each module has ``example(batch, seq, **kw) -> (model, example_args)``.
"""

from . import acmoe, attention_inform, hyper_router, similarity_inform, symphony
from .acmoe import ACMoEBlock, ACMoEStack, StandardSMoEBlock
from .attention_inform import AttentionInformBlock
from .common import Experts, MultiHeadAttention, SMoEBlock
from .hyper_router import HyperRouterBlock
from .similarity_inform import SimilarityInformBlock
from .symphony import SymphonyBlock

__all__ = [
    "acmoe", "attention_inform", "hyper_router", "similarity_inform", "symphony",
    "ACMoEBlock", "ACMoEStack", "StandardSMoEBlock", "AttentionInformBlock", "Experts", "MultiHeadAttention",
    "SMoEBlock", "HyperRouterBlock", "SimilarityInformBlock", "SymphonyBlock",
]
