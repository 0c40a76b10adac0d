"""Results records: one JSON object per evaluation, appended to a JSONL file and never overwritten."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch


def machine() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, {torch.get_num_threads()} threads"


def append_record(path: str | Path, record: dict[str, Any]) -> Path:
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": machine(), **record}
    with path.open("a") as handle:
        handle.write(json.dumps(record) + "\n")
    return path


def read_records(path: str | Path) -> list[dict[str, Any]]:
    with Path(path).expanduser().open() as handle:
        return [json.loads(line) for line in handle if line.strip()]
