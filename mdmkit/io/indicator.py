"""Indicator checkpoints: the MLP's config and weights, tied to the base network it was trained on."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mdmkit.core.errors import CheckpointError
from mdmkit.models.denoiser import HiddenStateDenoiser
from mdmkit.models.indicator import Indicator, IndicatorConfig, network_fingerprint

FORMAT = "mdmkit-indicator-v1"


def save_indicator(
    indicator: Indicator, base: HiddenStateDenoiser, path: Path, extra: dict[str, Any] | None = None
) -> None:
    """Write the indicator with the fingerprint of `base`, so it is never used with another network."""
    payload = {
        "format": FORMAT,
        "indicator": indicator.config.to_dict(),
        "d_model": indicator.d_model,
        "vocab_size": base.embed.num_embeddings,
        "weights": {name: value.detach().cpu() for name, value in indicator.state_dict().items()},
        "base_fingerprint": network_fingerprint(base),
        **(extra or {}),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, path)


@dataclass
class TrainedIndicator:
    path: Path
    indicator: Indicator
    base_fingerprint: str
    extra: dict[str, Any] = field(default_factory=dict)  # what training stored: base checkpoint, summary

    def check(self, network: HiddenStateDenoiser) -> None:
        """Refuse a base network other than the one the indicator was trained on."""
        if network_fingerprint(network) != self.base_fingerprint:
            base = self.extra.get("base_checkpoint", "another network")
            raise CheckpointError(f"indicator {self.path} was trained on {base}; this base network differs")


def load_indicator(path: str | Path) -> TrainedIndicator:
    path = Path(path).expanduser()
    if not path.is_file():
        raise CheckpointError(f"indicator checkpoint not found: {path}")
    try:
        raw = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:  # noqa: BLE001 (a truncated or foreign file: one line, not a traceback)
        raise CheckpointError(f"{path}: not a readable checkpoint ({type(error).__name__}: {error})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not an mdmkit indicator checkpoint")
    indicator = IndicatorConfig(**raw["indicator"]).build(raw["d_model"], raw["vocab_size"])
    indicator.load_state_dict(raw["weights"])
    known = {"format", "indicator", "d_model", "vocab_size", "weights", "base_fingerprint"}
    extra = {key: value for key, value in raw.items() if key not in known}
    return TrainedIndicator(path, indicator.eval(), raw["base_fingerprint"], extra)
