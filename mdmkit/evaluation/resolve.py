"""Samplers from configs: evaluation, not the sampler, turns checkpoint paths into loaded networks.

A sampler config may name checkpoints (`sampler.planner=` for P2's planner, `sampler.indicator=` for NI's
indicator). The path stays in the config, and so in the results row's key; the sampler object receives the
loaded network. Building also checks that the network offers every capability the sampler needs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig
from torch import nn

from mdmkit.core.config import build
from mdmkit.core.errors import CheckpointError
from mdmkit.io.checkpoint import TrainedModel
from mdmkit.io.indicator import load_indicator
from mdmkit.models.denoiser import HiddenStateDenoiser, require_capabilities
from mdmkit.models.indicator import IndicatorScorer


def _device(network: nn.Module) -> Any:
    return next(network.parameters()).device


def _size(network: nn.Module) -> tuple[int | None, int | None]:
    """(vocabulary, positions) of an mdmkit network; (None, None) for others."""
    config = getattr(network, "config", None)
    return getattr(config, "vocab_size", None), getattr(config, "max_len", None)


def _planner(path: Path, network: nn.Module) -> nn.Module:
    planner = TrainedModel(path).network()
    (vocab, length), (base_vocab, base_length) = _size(planner), _size(network)
    if (vocab is not None and length is not None and base_vocab is not None and base_length is not None
            and (vocab != base_vocab or length < base_length)):
        raise CheckpointError(f"sampler.planner={path}: a model of another task ({vocab} tokens, {length} "
                              f"positions) than the one evaluated ({base_vocab} tokens, {base_length} positions)")
    return planner.to(_device(network))


def _indicator(path: Path, network: nn.Module) -> IndicatorScorer:
    base = cast(HiddenStateDenoiser, network)  # build_sampler checked it declares hidden_states
    trained = load_indicator(path)
    trained.check(base)  # an indicator fits only the network it was trained on
    return IndicatorScorer(trained.indicator.to(_device(network)), base.embed)


# sampler field -> how its checkpoint becomes what the sampler takes, given the base network
LOADERS: dict[str, Callable[[Path, nn.Module], Any]] = {"planner": _planner, "indicator": _indicator}


def checkpoint_fields(config: Mapping[str, Any]) -> dict[str, Path]:
    """The checkpoint paths a sampler config names, each checked to exist."""
    paths = {name: Path(value).expanduser() for name, value in config.items()
             if name in LOADERS and isinstance(value, str)}
    for name, path in paths.items():
        if not path.is_file():
            raise CheckpointError(f"sampler.{name}: checkpoint not found: {path}")
    return paths


def build_sampler(config: DictConfig | dict[str, Any], network: nn.Module | None = None) -> Any:
    """The sampler of `config`, with its checkpoints loaded for `network` and its needs checked against it.

    Without `network` (validating a sweep before the model is loaded) the checkpoints are only checked to
    exist and the sampler is built without them.
    """
    paths = checkpoint_fields(config)
    unloaded = build(config, "sampler", **{name: None for name in paths})
    if network is None:
        return unloaded
    require_capabilities(unloaded, network)  # first: a loader may rely on them (NI's indicator on hidden states)
    return build(config, "sampler", **{name: LOADERS[name](path, network) for name, path in paths.items()})
