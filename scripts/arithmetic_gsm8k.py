"""Two-step arithmetic word problems in GSM8K's file format: the data of docs/finetuning.md's CPU example.

    python scripts/arithmetic_gsm8k.py --out examples/arithmetic

Writes gsm8k_train.jsonl and gsm8k_test.jsonl ({"question", "answer"}, the answer's steps then "#### N", as
GSM8K's), so `task=gsm8k task.data_dir=<out>` fine-tunes on the training problems and evaluates on the test ones
with no network. Each problem is two single-digit operations read left to right ("What is 7 + 5 - 3?"); the
splits share no problem. The same seed writes the same files.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

OPERATIONS = {"+": int.__add__, "-": int.__sub__}


def problem(a: int, first: str, b: int, second: str, c: int) -> dict[str, str]:
    middle = OPERATIONS[first](a, b)
    result = OPERATIONS[second](middle, c)
    return {"question": f"What is {a} {first} {b} {second} {c}?",
            "answer": f"{a} {first} {b} = {middle}. {middle} {second} {c} = {result}.\n#### {result}"}


def problems(seed: int) -> list[dict[str, str]]:
    """Every problem once, in a seeded order."""
    every = [problem(a, first, b, second, c) for a in range(10) for first in OPERATIONS for b in range(10)
             for second in OPERATIONS for c in range(10)]
    random.Random(seed).shuffle(every)
    return every


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="the directory for the two files")
    parser.add_argument("--train", type=int, default=1000, help="training problems")
    parser.add_argument("--test", type=int, default=100, help="test problems")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    every = problems(args.seed)
    if args.train + args.test > len(every):
        parser.error(f"--train + --test must be at most {len(every)} (the distinct problems)")
    args.out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("gsm8k_train.jsonl", every[: args.train]),
                       ("gsm8k_test.jsonl", every[args.train: args.train + args.test])):
        (args.out / name).write_text("".join(json.dumps(row) + "\n" for row in rows))
        print(f"wrote {args.out / name}: {len(rows)} problems")


if __name__ == "__main__":
    main()
