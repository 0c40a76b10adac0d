"""Whether a benchmark on the Hugging Face hub can load here, told before loading it.

Offline, `datasets` retries the hub for about half a minute before it fails (or falls back to its cache): a run
that will read a split from the hub asks first. Offline is `HF_HUB_OFFLINE` / `HF_DATASETS_OFFLINE`, or the hub's
host not answering within seconds; a dataset already in the datasets cache still loads, from the cache, at once.
"""

from __future__ import annotations

import functools
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

PROBE_S = 3.0  # how long the hub's host may take to accept a connection
_ON = ("1", "ON", "YES", "TRUE")
_FLAGS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def hub_unreachable() -> str | None:
    """Why the hub cannot be reached from here (None: it can)."""
    for flag in _FLAGS:
        if os.environ.get(flag, "").strip().upper() in _ON:
            return f"{flag} is set"
    host = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").hostname or "huggingface.co"
    return None if _answers(host) else f"the hub ({host}) does not answer"


@functools.cache
def _answers(host: str) -> bool:
    """Whether `host` accepts a connection within `PROBE_S` (asked once per process)."""
    try:
        socket.create_connection((host, 443), timeout=PROBE_S).close()
    except OSError:
        return False
    return True


def datasets_cache() -> Path:
    """Where `datasets` keeps what it downloaded (its own default, from the environment)."""
    if os.environ.get("HF_DATASETS_CACHE"):
        return Path(os.environ["HF_DATASETS_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface"
    return Path(home).expanduser() / "datasets"


def cached(dataset: str) -> bool:
    """Whether the hub dataset `dataset` ("openai/gsm8k") is in the datasets cache."""
    directory = datasets_cache() / dataset.replace("/", "___")
    return directory.is_dir() and any(directory.iterdir())


def load_from_cache() -> None:
    """Have `datasets` read its cache without asking the hub (set before `datasets` is imported)."""
    os.environ["HF_DATASETS_OFFLINE"] = "1"
