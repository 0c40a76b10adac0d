"""Resume a run by its directory: the run's saved config, the overrides given now on top, the same directory.

A run directory is what `train.py` writes: `.hydra/` (Hydra's saved config, overrides and hydra node) and
`checkpoints/`. `ckpt_path=` names the directory (its `checkpoints/last.ckpt`) or any checkpoint under its
`checkpoints/`. Before Hydra starts, `plan_resume` turns the command line into the run's own overrides plus
today's (today's win, key by key) and `hydra.run.dir=<the run>`; Hydra then composes it as usual. Inside the
job `ResumePlan.config` takes the saved config and applies what today's overrides changed (so a conf/ file
edited since the run changes nothing that was not asked for); once the checks have passed, `record` prints
the differences and records the new config in `.hydra/` (the previous files go to `.hydra/history/<n>/`).

Light on purpose (no torch, no Lightning): it runs before any heavy import.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException
from omegaconf import DictConfig, OmegaConf

from mdmkit.core.errors import CheckpointError, ConfigError

if TYPE_CHECKING:
    from hydra.conf import HydraConf

HYDRA_DIR = ".hydra"
LAST = Path("checkpoints") / "last.ckpt"
# the hydra overrides of the original command that do not carry over: where and how that job ran
_PER_JOB = ("hydra.run.", "hydra.sweep.", "hydra.job.name", "hydra.output_subdir", "hydra.mode")
# changes that are the resume itself, not news to print
_QUIET = ("ckpt_path",)
_MULTIRUN = ("-m", "--multirun")
_ABSENT = object()
_PLAIN = re.compile(r"[\w./~+:@%-]+")


def _override(key: str, path: Path) -> str:
    """`key=path` as a Hydra override, quoted where the path holds characters the grammar reads otherwise."""
    value = str(path)
    return f"{key}={value}" if _PLAIN.fullmatch(value) else f"{key}='{value.replace(chr(39), chr(92) + chr(39))}'"


def _key(override: Any) -> str:
    return override.key_or_group + (f"@{override.package}" if override.package else "")


def parse_overrides(overrides: list[str]) -> list[Any]:
    """Hydra's parse of `overrides`; none where one is malformed (Hydra itself reports it, in its own words)."""
    try:
        return OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException:
        return []


def run_directory(path: str | Path) -> tuple[Path, Path] | None:
    """`(run directory, checkpoint)` when `path` is a run directory or a checkpoint inside one; else None."""
    path = Path(path).expanduser().absolute()
    if path.is_dir():
        if not (path / HYDRA_DIR / "config.yaml").is_file():
            raise CheckpointError(f"ckpt_path={path}: not a run directory (no {HYDRA_DIR}/config.yaml)")
        if not (path / LAST).is_file():
            raise CheckpointError(f"ckpt_path={path}: this run directory has no {LAST}")
        return path, path / LAST
    run = path.parent.parent
    if path.parent.name == "checkpoints" and (run / HYDRA_DIR / "config.yaml").is_file():
        return run, path
    return None


@dataclass
class ResumePlan:
    run_dir: Path
    checkpoint: Path
    saved: dict[str, str]  # .hydra/*.yaml of the run before this resume: file name -> text
    original: list[str]  # the run's own task overrides, as its saved config was composed from them
    hydra: list[str]  # the run's hydra overrides that carry over (a search path, a launcher)
    given: list[str]  # the task overrides given now
    argv: list[str]  # the command line Hydra composes
    changes: list[str] = field(default_factory=list)  # saved config -> resumed config
    kept: list[str] = field(default_factory=list)  # saved values that conf/ no longer gives

    def config(self, composed: DictConfig, compose: Callable[[list[str]], DictConfig]) -> DictConfig:
        """The run's saved config with what today's overrides change: `composed` is Hydra's composition of the
        run's overrides plus today's, `compose(overrides)` composes the run's overrides alone."""
        saved = _flat(OmegaConf.to_container(OmegaConf.create(self.saved["config.yaml"]), resolve=False))
        before = _flat(OmegaConf.to_container(compose(self.original + self.hydra), resolve=False))
        after = _flat(OmegaConf.to_container(composed, resolve=False))
        merged = _apply(saved, before, after)
        self.changes = _differences(saved, merged)
        drift = [k for k in saved.keys() | before.keys() if saved.get(k, _ABSENT) != before.get(k, _ABSENT)]
        self.kept = [f"{k}={_show(saved.get(k, _ABSENT))} (conf/ now gives {_show(before.get(k, _ABSENT))})"
                     for k in sorted(drift) if merged.get(k, _ABSENT) == saved.get(k, _ABSENT)]
        return OmegaConf.create(_nest(merged))

    def record(self, config: DictConfig, hydra: HydraConf) -> None:
        """Once the resume has passed its checks: print what changed, and record the run's new config, overrides
        and hydra node in `.hydra/` of the output directory (in the run's own directory the files before go to
        `.hydra/history/<n>/`). Rank 0 only."""
        changes = [c for c in self.changes if c.split(":")[0].split("=")[0].lstrip("+-") not in _QUIET]
        print(f"resuming {self.run_dir} from {self.checkpoint.relative_to(self.run_dir)} with its saved config"
              + ("; changed: " + ", ".join(changes) if changes else " (no changes)"))
        if self.kept:
            print("kept from the run's saved config (conf/ has changed since): " + ", ".join(self.kept))
        node = OmegaConf.to_container(hydra, resolve=False)
        assert isinstance(node, dict), "a config node"
        hydra_dir = Path(node["runtime"]["output_dir"]) / HYDRA_DIR
        if hydra_dir.resolve() == (self.run_dir / HYDRA_DIR).resolve():
            history = hydra_dir / "history"
            previous = history / str(1 + max((int(p.name) for p in history.glob("*") if p.name.isdigit()), default=0))
            previous.mkdir(parents=True, exist_ok=True)
            for name, text in self.saved.items():
                (previous / name).write_text(text)
        hydra_dir.mkdir(parents=True, exist_ok=True)
        node["output_subdir"] = HYDRA_DIR  # as for any run: only this resume left it to `record`
        node["overrides"]["hydra"] = [o for o in node["overrides"]["hydra"] if o != "hydra.output_subdir=null"]
        (hydra_dir / "config.yaml").write_text(OmegaConf.to_yaml(config))
        (hydra_dir / "overrides.yaml").write_text(OmegaConf.to_yaml(node["overrides"]["task"]))
        (hydra_dir / "hydra.yaml").write_text(OmegaConf.to_yaml({"hydra": node}))


def is_rank_zero() -> bool:
    return all(os.environ.get(name, "0") == "0" for name in ("RANK", "LOCAL_RANK", "SLURM_PROCID"))


def plan_resume(argv: list[str]) -> ResumePlan | None:
    """The resumed command line for `argv` (the arguments after the program) when `ckpt_path=` names a run."""
    flags = [a for a in argv if "=" not in a or a.startswith("-")]
    given = [a for a in argv if "=" in a and not a.startswith("-")]
    parsed = parse_overrides(given)
    ckpt = [o for o in parsed if _key(o) == "ckpt_path" and not o.is_delete()]
    if not ckpt or not isinstance(ckpt[-1].value(), str) or any(f in _MULTIRUN for f in flags):
        return None
    if any(_key(o) == "hydra.mode" and o.value() == "MULTIRUN" for o in parsed):
        return None
    found = run_directory(ckpt[-1].value())
    if found is None:
        return None  # a checkpoint outside a run directory: today's config, checked against the checkpoint
    run_dir, checkpoint = found
    saved = {p.name: p.read_text() for p in sorted((run_dir / HYDRA_DIR).glob("*.yaml"))}
    original = list(OmegaConf.load(run_dir / HYDRA_DIR / "overrides.yaml")) if "overrides.yaml" in saved else []
    hydra_saved = OmegaConf.create(saved.get("hydra.yaml", "{}"))
    hydra = [o for o in OmegaConf.select(hydra_saved, "hydra.overrides.hydra", default=[]) or []
             if not o.startswith(_PER_JOB)]
    given = [o.input_line for o in parsed if _key(o) != "ckpt_path"] + [_override("ckpt_path", checkpoint)]
    now = {_key(o) for o in parse_overrides(given)}
    kept = [o.input_line for o in parse_overrides(original + hydra) if _key(o) not in now]  # today's win, key by key
    # Hydra leaves .hydra/ alone (a resume that fails its checks must not change the run): `record` writes it
    run = [] if "hydra.run.dir" in now else [_override("hydra.run.dir", run_dir)]
    run.append("hydra.output_subdir=null")
    return ResumePlan(run_dir, checkpoint, saved, original, hydra, given, argv=[*flags, *kept, *given, *run])


def wandb_run_id(run_dir: Path) -> str | None:
    """The id of the run's latest wandb run (`wandb/offline-run-<time>-<id>` or `wandb/run-<time>-<id>`)."""
    runs = [p.name for p in (run_dir / "wandb").glob("*run-*-*") if p.is_dir()]
    runs.sort(key=lambda name: name.split("run-", 1)[1])
    return runs[-1].rsplit("-", 1)[1] if runs else None


# -- flat views of nested configs: "a.b.c" -> leaf ----------------------------------------------------------------
def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict) and node:
        flat: dict[str, Any] = {}
        for key, value in node.items():
            flat.update(_flat(value, f"{prefix}{key}."))
        return flat
    return {prefix[:-1]: node}


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = nested
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        if not (isinstance(node.get(leaf), dict) and value == {}):
            node[leaf] = value
    return nested


def _apply(saved: dict[str, Any], before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """`saved` with what changed from `before` to `after` (in `after`'s order); a node whose `_target_` changed
    is replaced whole."""
    merged = dict(saved)
    replaced = [k[: -len("._target_")] for k in after if k.endswith("._target_") and before.get(k) != after[k]]
    for prefix in replaced:
        for key in [k for k in merged if k.startswith(prefix + ".")]:
            del merged[key]
        merged.update({k: v for k, v in after.items() if k.startswith(prefix + ".")})
    for key in before.keys() - after.keys():
        merged.pop(key, None)
    for key, value in after.items():
        if key not in before or before[key] != value:
            for other in [k for k in merged if k.startswith(key + ".") or key.startswith(k + ".")]:
                del merged[other]
            merged[key] = value
    order: dict[str, int] = {}
    for key in [*after, *saved]:
        order.setdefault(key, len(order))
    return {key: merged[key] for key in sorted(merged, key=order.__getitem__)}


def _show(value: Any) -> str:
    """A value as it is written on the command line (`true`, `null`)."""
    if value is _ABSENT:
        return "(absent)"
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    lines = []
    for key in sorted(old.keys() | new.keys()):
        if key not in new:
            lines.append(f"-{key}")
        elif key not in old:
            lines.append(f"+{key}={_show(new[key])}")
        elif old[key] != new[key]:
            lines.append(f"{key}: {_show(old[key])} -> {_show(new[key])}")
    return lines


def require_resumable(step: int, max_steps: int, checkpoint: str | Path) -> None:
    """A resume that would train nothing is a mistake, not a no-op."""
    if step >= max_steps:
        raise ConfigError(f"ckpt_path={checkpoint} is at step {step} and trainer.max_steps={max_steps}: "
                          f"raise trainer.max_steps (e.g. trainer.max_steps={2 * step}) to train further")
