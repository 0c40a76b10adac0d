"""Offline trajectories of a base sampler over a task split: a sharded, resumable `datasets` Arrow dataset.

One record per example: its final tokens, the step that revealed each position (the ordered partition:
position i belongs to step reveal_step[i]; -1 for given positions), its step count, its index in the split
and whether the task scores it correct. Shard i holds examples [i * shard_size, (i + 1) * shard_size) of the
split and is written atomically (saved to a temporary directory, then renamed), so a killed run resumes at
its first missing shard and a later run that asks for more examples reuses every shard already there. The
directory name is a hash of what determines the records (checkpoint content, task data, sampler, seed,
batching), so different settings never mix.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import numpy as np
import torch

from mdmkit.core.config import Validated, require
from mdmkit.core.devices import resolve_device
from mdmkit.core.errors import DataFormatError
from mdmkit.core.progress import progress_bar
from mdmkit.core.seeding import seeded_generator, stream_seed
from mdmkit.io.checkpoint import TrainedModel
from mdmkit.io.results import file_fingerprint, row_key
from mdmkit.samplers.core.counting import ForwardCounter
from mdmkit.samplers.core.masked import MaskedSampler
from mdmkit.samplers.core.protocol import Sampled
from mdmkit.samplers.rules.topk import TopKSampler
from mdmkit.tasks.base import SPLITS, PuzzleTask, Split, default_cache_dir

_COLUMNS = ("tokens", "reveal_step", "steps", "index", "correct")


@dataclass
class TrajectoryConfig(Validated):
    """Which base sampler runs on which examples (config group `trajectories`)."""

    checkpoint: str  # the base MDM
    sampler: MaskedSampler = field(default_factory=TopKSampler)  # full-step top-1 confidence by default
    split: str = "train"
    n_examples: int = 20_000  # rounded up to whole shards (capped at the split's size)
    shard_size: int = 1_000
    batch_size: int = 256
    seed: int = 0
    root: str = field(default_factory=lambda: f"{default_cache_dir()}/trajectories")
    device: str = "auto"
    progress: bool = True

    def validate(self) -> None:
        require(Path(self.checkpoint).expanduser().is_file(), f"checkpoint={self.checkpoint}: no such file")
        require(self.split in SPLITS, f"split='{self.split}' is not one of {', '.join(SPLITS)}")
        require(self.split != "test", "split='test': NI is scored on the test split, so its indicator must not "
                                      "learn from it (train or val)")
        for name in ("n_examples", "shard_size", "batch_size"):
            require(getattr(self, name) >= 1, f"{name}={getattr(self, name)} must be >= 1")

    def settings(self, task: PuzzleTask) -> dict:
        """Everything that determines the records (n_examples does not: shards are reused as it grows)."""
        sampler = {"class": type(self.sampler).__name__, **self.sampler.to_dict()}
        checkpoint = file_fingerprint(str(Path(self.checkpoint).expanduser()))
        return {"checkpoint": checkpoint, "task": task.fingerprint(), "split": self.split, "sampler": sampler,
                "shard_size": self.shard_size, "batch_size": self.batch_size, "seed": self.seed}

    def directory(self, task: PuzzleTask) -> Path:
        return Path(self.root).expanduser() / f"{task.name}-{row_key(**self.settings(task))}"


@dataclass
class Trajectories:
    """Recorded trajectories as tensors."""

    tokens: torch.Tensor  # [N, L] final tokens
    reveal_step: torch.Tensor  # [N, L] step that revealed each position, -1: given
    steps: torch.Tensor  # [N]
    index: torch.Tensor  # [N] example index in the split
    correct: torch.Tensor  # [N] bool

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def take(self, rows: torch.Tensor | slice) -> Trajectories:
        return Trajectories(*(getattr(self, name)[rows] for name in _COLUMNS))

    def prompts(self, mask_id: int) -> torch.Tensor:
        """The sampler's inputs: every position the base revealed masked again."""
        return self.tokens.masked_fill(self.reveal_step >= 0, mask_id)

    def sampled(self) -> Sampled:
        return Sampled(self.tokens, self.reveal_step, self.steps)


@contextmanager
def _quiet_datasets() -> Iterator[None]:
    """No `datasets` progress bar per shard save: the run has its own."""
    was_disabled = datasets.utils.are_progress_bars_disabled()
    datasets.utils.disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            datasets.utils.enable_progress_bars()


def _record(config: TrajectoryConfig, network: torch.nn.Module, task: PuzzleTask, split: Split, shard: int,
            total: int) -> dict[str, np.ndarray]:
    """The columns of shard `shard`: the base sampler run on its examples of `split` (the first `total`)."""
    device = next(network.parameters()).device
    generator = seeded_generator(stream_seed(config.seed, shard), device)
    first, last = shard * config.shard_size, min((shard + 1) * config.shard_size, total)
    parts: dict[str, list[torch.Tensor]] = {name: [] for name in _COLUMNS}
    parts["index"].append(torch.arange(first, last))
    for begin in range(first, last, config.batch_size):
        end = min(begin + config.batch_size, last)
        target = split.tokens[begin:end].to(device)
        answer = split.answer_mask[begin:end].to(device)
        counter = ForwardCounter(network, target.shape[0])
        prompt = target.masked_fill(answer, task.mask_id)
        sampled = config.sampler.sample(counter, prompt, task.mask_id, generator)
        for name in ("tokens", "reveal_step", "steps"):
            parts[name].append(getattr(sampled, name).int().cpu())
        parts["correct"].append(task.score(sampled.tokens, target, answer).cpu())
    return {name: torch.cat(values).numpy() for name, values in parts.items()}


def build_trajectories(config: TrajectoryConfig, task: PuzzleTask) -> Path:
    """Record the trajectories `config` asks for (the shards not on disk yet); returns their directory."""
    directory = config.directory(task)
    split = task.load_splits()[config.split]
    total = min(math.ceil(config.n_examples / config.shard_size) * config.shard_size, len(split))
    shards = range(math.ceil(total / config.shard_size))
    missing = [i for i in shards if not (directory / f"shard-{i:05d}").is_dir()]
    if not missing:
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    meta = {"settings": config.settings(task), "mask_id": task.mask_id, "seq_len": task.seq_len}
    (directory / "meta.json").write_text(json.dumps(meta, indent=2, default=str))
    network = TrainedModel(config.checkpoint).network(task).to(resolve_device(config.device))
    done = total - sum(min(config.shard_size, total - i * config.shard_size) for i in missing)
    bar = progress_bar(total=total, initial=done, desc=f"trajectories ({config.split})", unit="ex",
               disable=not config.progress)
    for shard in missing:
        columns = _record(config, network, task, split, shard, total)
        temporary = directory / f".shard-{shard:05d}.partial"
        shutil.rmtree(temporary, ignore_errors=True)  # left by a killed run
        with _quiet_datasets():
            datasets.Dataset.from_dict(columns).save_to_disk(str(temporary))
        temporary.rename(directory / f"shard-{shard:05d}")
        bar.update(len(columns["index"]))
    bar.close()
    return directory


def load_trajectories(directory: Path, n_examples: int | None = None) -> Trajectories:
    """The first `n_examples` records (all for None) of a trajectory directory, shard by shard in order."""
    shards = sorted(directory.glob("shard-*"))
    if not shards:
        raise DataFormatError(f"{directory}: no trajectory shards")
    parts, have = [], 0
    for shard in shards:
        if n_examples is not None and have >= n_examples:
            break
        parts.append(datasets.load_from_disk(str(shard)))
        have += len(parts[-1])
    table = datasets.concatenate_datasets(parts).with_format("numpy")[: n_examples if n_examples else have]
    tensors = {name: torch.from_numpy(np.asarray(table[name])) for name in _COLUMNS}
    tensors = {name: t.long() if name != "correct" else t.bool() for name, t in tensors.items()}
    return Trajectories(**tensors)
