"""Data-parallel evaluation: one model replica per process, the test split sharded by whole batches.

Launched by `torchrun --nproc_per_node=N evaluate.py ...` or as the N tasks of one SLURM job (the submitit launcher
with `tasks_per_node=N`). Batches go to ranks round-robin and each draws from its own seeded stream, so rank 0,
gathering them back in order, writes the same row a single process writes. A rank with fewer batches waits at the
gather (`GATHER_TIMEOUT`); a rank that dies makes torchrun end the others, and a re-run resumes from the rows written.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from mdmkit.core.errors import ConfigError

T = TypeVar("T")
GATHER_TIMEOUT = datetime.timedelta(hours=24)  # a fast rank waits at the gather for its slowest peer


@dataclass(frozen=True)
class Batch:
    """One batch of a split: its position in the single-process order and its rows."""

    index: int
    begin: int
    end: int


@dataclass(frozen=True)
class Ranks:
    """This process's place among the evaluation processes (rank 0 of 1 without a launcher)."""

    rank: int = 0
    world_size: int = 1

    @property
    def main(self) -> bool:
        """The process that gathers, prints and writes rows."""
        return self.rank == 0

    def batches(self, n_items: int, batch_size: int) -> list[Batch]:
        """This rank's batches of `n_items` rows: every `world_size`-th batch, starting at its rank."""
        starts = range(0, n_items, batch_size)
        return [Batch(i, begin, min(begin + batch_size, n_items))
                for i, begin in enumerate(starts) if i % self.world_size == self.rank]

    def gather(self, value: T) -> list[T] | None:
        """Every rank's `value` in rank order on rank 0; None on the other ranks."""
        if self.world_size == 1:
            return [value]
        gathered: list[Any] | None = [None] * self.world_size if self.main else None
        dist.gather_object(value, gathered, dst=0)
        return gathered

    def broadcast(self, value: T) -> T:
        """Rank 0's `value` on every rank (so that all ranks take the same decisions, e.g. what to resume)."""
        if self.world_size == 1:
            return value
        box: list[Any] = [value if self.main else None]  # rank 0's value on every rank, once broadcast
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def leave(self) -> None:
        if self.world_size > 1:
            leave_process_group()


SINGLE_PROCESS = Ranks()  # the default of every evaluation entry point: no launcher


def leave_process_group() -> None:
    """Leave the process group once every rank is done with it. A gloo rank that exits without this can die in
    its own teardown ("terminate called without an active exception", SIGABRT: pytorch/pytorch#190489), and
    torchrun then fails a run whose rows are all written. Only on success: a rank whose peers still wait in a
    collective would hang here."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list (`gpu[07-08,11],cpu3` -> `gpu07`): the rendezvous address."""
    head = nodelist.split(",")[0]
    if "[" not in head:
        return head
    prefix, numbers = nodelist[: nodelist.index("]")].split("[", 1)
    return prefix + numbers.split(",")[0].split("-")[0]


def _launcher_env() -> dict[str, str]:
    """The env:// variables of torchrun, or those the tasks of one SLURM job imply (`srun`, or the submitit
    launcher with `tasks_per_node` > 1): rank, world size, local rank, the first node and a port from the job id."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return dict(os.environ)
    if int(os.environ.get("SLURM_NTASKS", "1")) > 1 and "SLURM_PROCID" in os.environ:
        os.environ.update({
            "RANK": os.environ["SLURM_PROCID"], "WORLD_SIZE": os.environ["SLURM_NTASKS"],
            "LOCAL_RANK": os.environ.get("SLURM_LOCALID", "0"),
            "MASTER_ADDR": os.environ.get("MASTER_ADDR")
            or first_host(os.environ.get("SLURM_JOB_NODELIST", "127.0.0.1")),
            "MASTER_PORT": os.environ.get("MASTER_PORT")
            or str(20000 + int(os.environ.get("SLURM_JOB_ID", "0")) % 40000),
        })
        return dict(os.environ)
    return {}


def init_ranks(device: str) -> Ranks:
    """Join the launcher's process group (once per process) and pin this rank's GPU; rank 0 of 1 without one.

    `device=cuda`/`auto` with GPUs: NCCL, one GPU per local rank. On the CPU: gloo.
    """
    env = _launcher_env()
    world_size = int(env.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return SINGLE_PROCESS
    rank, local_rank = int(env["RANK"]), int(env.get("LOCAL_RANK", env.get("SLURM_LOCALID", "0")))
    use_cuda = device != "cpu" and torch.cuda.is_available()
    if device.startswith("cuda:"):
        raise ConfigError(f"device={device} pins every rank to one GPU: use device=cuda (or auto) with one process "
                          "per GPU")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={device}, but this process sees no CUDA device")
    if use_cuda:
        if local_rank >= torch.cuda.device_count():
            raise ConfigError(f"local rank {local_rank} has no GPU of its own ({torch.cuda.device_count()} visible): "
                              "launch one process per GPU")
        torch.cuda.set_device(local_rank)  # `cuda` now names this rank's GPU
    if not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo", timeout=GATHER_TIMEOUT)
    return Ranks(rank, world_size)

