from mdmkit.models.self_conditioned import SelfConditionedConfig, SelfConditionedTransformer
from mdmkit.models.transformer import MaskedTransformer, TransformerConfig

__all__ = ["MaskedTransformer", "SelfConditionedConfig", "SelfConditionedTransformer", "TransformerConfig"]
