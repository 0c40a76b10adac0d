from mdmkit.models.transformer import MaskedTransformer, TransformerConfig

__all__ = ["MaskedTransformer", "TransformerConfig"]
