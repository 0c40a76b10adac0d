"""Data-parallel evaluation (issue 17): `torchrun --nproc_per_node=2 evaluate.py ...` on this CPU (gloo) writes
the same rows as one process: same keys, accuracy, NFE distributions and generations files, whatever the shard
sizes (the splits below do not divide evenly between the two ranks), for a grid sweep with the oracle floor and a
stochastic sampler, a text task on a tiny model, and a sweep resumed after one rank was killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import BENCHMARK_DATA, ROOT, WAIT_S, run_cli

SUDOKU = ROOT / "checkpoints" / "sudoku_mdm.pt"
# what may differ between runs of the same measurement: clocks, the machine line, the command, the process count
VOLATILE = {"time", "wall_time_s", "tokens_per_s", "machine", "config", "world_size", "git_commit"}


def torchrun(*overrides: str, cwd: Path, timeout: float = WAIT_S) -> subprocess.CompletedProcess:
    return subprocess.run(launch(*overrides), cwd=cwd, env=_env(), capture_output=True, text=True, check=False,
                          timeout=timeout)


def launch(*overrides: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            str(ROOT / "evaluate.py"), *overrides]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "0", "OMP_NUM_THREADS": "1"}


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def measured(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in VOLATILE}


def write_sweep(directory: Path, name: str, entries: str) -> str:
    """A sweep config of the test's own, found through `hydra.searchpath` as a user's would be."""
    (directory / "sweep").mkdir(parents=True, exist_ok=True)
    (directory / "sweep" / f"{name}.yaml").write_text(f"name: {name}\nentries:\n{entries}")
    return f"hydra.searchpath=[file://{directory}]"


def assert_same_rows(one: list[dict], two: list[dict]) -> None:
    assert [r["key"] for r in one] == [r["key"] for r in two]
    assert [measured(r) for r in one] == [measured(r) for r in two]
    assert {r.get("world_size") for r in one} == {1} and {r["world_size"] for r in two} == {2}


@pytest.mark.slow
@pytest.mark.skipif(not SUDOKU.is_file(), reason=f"{SUDOKU} not found")
def test_two_processes_write_the_single_process_rows_of_a_grid_sweep(tmp_path):
    search = write_sweep(tmp_path / "conf", "dp", (
        "  - sampler: topk\n    grid: {k: [2]}\n    oracle: true\n"
        "  - sampler: eb\n    grid: {gamma: [0.1], ordering: [confidence, random]}\n"))
    # 26 puzzles in batches of 4: seven batches, four on rank 0 and three on rank 1
    common = [f"ckpt={SUDOKU}", "sweep=dp", search, "limit=26", "batch_size=4", "device=cpu", "wandb.mode=disabled"]
    single = run_cli("evaluate.py", *common, f"results_file={tmp_path}/one.jsonl", cwd=tmp_path)
    assert single.returncode == 0, single.stderr
    double = torchrun(*common, f"results_file={tmp_path}/two.jsonl", cwd=tmp_path)
    assert double.returncode == 0, double.stderr
    one, two = rows(tmp_path / "one.jsonl"), rows(tmp_path / "two.jsonl")
    assert [r["kind"] for r in one] == ["evaluate", "oracle", "evaluate", "evaluate"]
    assert_same_rows(one, two)
    assert one[3]["nfe"] != one[2]["nfe"]  # the random ordering's draws shape the row, and match across ranks
    assert double.stdout.count("eb-confidence gamma=0.1: accuracy") == 1  # rank 0 alone reports


@pytest.mark.skipif(not (BENCHMARK_DATA / "gsm8k_test.jsonl").is_file(),
                    reason=f"benchmark data not found: {BENCHMARK_DATA}")
def test_two_processes_write_the_single_process_row_and_generations_of_a_text_task(masked_dir, tmp_path):
    common = ["task=gsm8k", f"task.data_dir={BENCHMARK_DATA}", "task.shots=0", "task.max_gen_len=8",
              f"ckpt={masked_dir}", "limit=3", "batch_size=1", "sampler=eb", "sampler.temperature=1.0",
              "device=cpu", "wandb.mode=disabled"]
    single = run_cli("evaluate.py", *common, f"results_file={tmp_path}/one/rows.jsonl", cwd=tmp_path)
    assert single.returncode == 0, single.stderr
    double = torchrun(*common, f"results_file={tmp_path}/two/rows.jsonl", cwd=tmp_path)
    assert double.returncode == 0, double.stderr
    one, two = rows(tmp_path / "one" / "rows.jsonl"), rows(tmp_path / "two" / "rows.jsonl")
    assert_same_rows(one, two)
    name = f"gsm8k-{one[0]['key']}.jsonl"
    generations = (tmp_path / "one" / "generations" / name).read_text()
    assert len(generations.splitlines()) == 3
    assert (tmp_path / "two" / "generations" / name).read_text() == generations


def _rank_pid(launcher: int, rank: int) -> int | None:
    """The pid of the worker of `launcher` (torchrun) whose RANK is `rank`, from /proc."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if parent == launcher and f"RANK={rank}".encode() in environ:
            return int(entry.name)
    return None


@pytest.mark.slow
@pytest.mark.skipif(not SUDOKU.is_file(), reason=f"{SUDOKU} not found")
@pytest.mark.skipif(not Path("/proc/self/environ").is_file(), reason="needs /proc to find the rank to kill")
def test_a_sweep_killed_with_one_rank_resumes_to_the_single_process_rows(tmp_path):
    search = write_sweep(tmp_path / "conf", "four", "  - sampler: topk\n    grid: {k: [1, 2, 3, 4]}\n")
    common = [f"ckpt={SUDOKU}", "sweep=four", search, "limit=48", "batch_size=8", "device=cpu",
              "wandb.mode=disabled"]
    results = tmp_path / "two.jsonl"
    log = tmp_path / "two.stderr"  # a file, not a pipe: nobody reads while it runs, so a pipe could fill and stall
    with log.open("w") as stderr, subprocess.Popen(launch(*common, f"results_file={results}"), cwd=tmp_path,
                                                   env=_env(), stdout=subprocess.DEVNULL, stderr=stderr) as run:
        try:
            deadline = time.monotonic() + 240
            while not (results.is_file() and results.read_text().strip()) and time.monotonic() < deadline:
                assert run.poll() is None, log.read_text()
                time.sleep(0.05)
            victim = _rank_pid(run.pid, 1)
            assert victim is not None, "rank 1 not found"
            os.kill(victim, signal.SIGKILL)
            assert run.wait(timeout=WAIT_S) != 0  # torchrun ends the other rank and fails
        finally:
            run.kill()
    written = len(rows(results))
    assert 1 <= written < 4, f"the kill came after {written} of 4 rows"

    resumed = torchrun(*common, f"results_file={results}", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.count("already in") == written
    single = run_cli("evaluate.py", *common, f"results_file={tmp_path}/one.jsonl", cwd=tmp_path)
    assert single.returncode == 0, single.stderr
    assert_same_rows(rows(tmp_path / "one.jsonl"), rows(results))


def test_a_slurm_job_of_several_tasks_becomes_a_process_group_of_as_many_ranks(monkeypatch):
    """`srun` (or the submitit launcher's `tasks_per_node=N`): each task finds its rank, the world size and the
    first node as the rendezvous address from SLURM's variables (torchrun's, where set, take precedence)."""
    from mdmkit.evaluation.distributed import _launcher_env, first_host

    assert [first_host(n) for n in ("gpu[07-08,11],cpu3", "node5", "a1,b[2-3]", "x[010]")] == [
        "gpu07", "node5", "a1", "x010"]
    exported = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_NTASKS": "4", "SLURM_PROCID": "3", "SLURM_LOCALID": "1",
             "SLURM_JOB_NODELIST": "gpu[07-08]", "PATH": "/usr/bin"}
    monkeypatch.setattr(os, "environ", dict(slurm))  # what the task sees; nothing leaks into this process
    env = _launcher_env()
    assert [env[name] for name in exported] == ["3", "4", "1", "gpu07", str(20000 + 4242)]
    monkeypatch.setattr(os, "environ", {**slurm, "SLURM_NTASKS": "1"})  # one task: no process group
    assert _launcher_env() == {}
