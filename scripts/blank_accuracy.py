"""The share of answer cells a checkpoint's sampler gets right (beside whole puzzles solved): how close a model that
solves none comes, as on docs/results/uniform_vs_masked_sudoku.md.

    python scripts/blank_accuracy.py CKPT --sampler eb --set gamma=0.1 --limit 50
"""

from __future__ import annotations

import argparse
import json

from mdmkit import api
from mdmkit.evaluation.runner import sample_split
from mdmkit.io.checkpoint import TrainedModel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ckpt")
    parser.add_argument("--sampler", default="eb", help="a conf/sampler/ preset")
    parser.add_argument("--set", nargs="*", default=[], help="field=value (JSON values) set on the preset")
    parser.add_argument("--limit", type=int, default=50, help="the first N test puzzles")
    args = parser.parse_args()
    fields = {key: json.loads(value) for key, value in (item.split("=", 1) for item in args.set)}
    trained = TrainedModel(args.ckpt)
    network, task = trained.network(), trained.task
    test = task.load_splits()["test"]
    test = type(test)(test.tokens[: args.limit], test.answer_mask[: args.limit], test.keys[: args.limit])
    result = sample_split(network, task, test, api.sampler(args.sampler, **fields), batch_size=args.limit)
    assert result is not None and not isinstance(result.predictions, list)
    right = (result.predictions == test.tokens) & test.answer_mask
    print(json.dumps({"ckpt": args.ckpt, "sampler": args.sampler, "fields": fields, "n": args.limit,
                      "solved": result.accuracy, "answer_cells_right": float(right.sum() / test.answer_mask.sum()),
                      "nfe_mean": float(result.nfe.mean())}))


if __name__ == "__main__":
    main()
