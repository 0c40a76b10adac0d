"""What token editing would read on a trained MDM: its prediction at decided (unmasked) answer positions.

    python scripts/editing_probe.py checkpoints/sudoku_mdm.pt --limit 200 --out docs/results/editing_sudoku_probe.json

Token editing (`sampler=editing`) rewrites a decided token where the network, run on the canvas, prefers another
token above the editing threshold. Such an edit helps where the decided token is wrong and the network's choice
there is right; it hurts where the decided token is right. This probe builds canvases from the test split's
answers: each answer position is masked with probability `rate`, and a `wrong` share of the decided ones get a
random other token of the answer vocabulary. One forward per canvas, then per rate and editing threshold:

- right kept: on a decided position holding its right token, the network's choice (the mask token excluded) is
  that token;
- damaged: a decided right token would be edited away (another token above the threshold);
- repaired: a decided wrong token would be edited to the right one (the right token above the threshold);
- masked right: for comparison, the choice at masked positions is the right token (what the network was trained on).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from mdmkit.analysis.pages import run_script
from mdmkit.io.checkpoint import TrainedModel


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ckpt", help="a trained mdmkit checkpoint on a puzzle task")
    parser.add_argument("--limit", type=int, default=200, help="first N test examples")
    parser.add_argument("--rates", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75],
                        help="masking rates of the answer positions")
    parser.add_argument("--wrong", type=float, default=0.1, help="share of decided positions given a wrong token")
    parser.add_argument("--thresholds", type=float, nargs="+", default=[0.5, 0.9, 0.99], help="editing thresholds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write the table as JSON here")
    return parser.parse_args(argv)


def probe(ckpt: str, limit: int, rates: list[float], wrong: float, thresholds: list[float],
          seed: int) -> list[dict]:
    trained = TrainedModel(ckpt)
    task = trained.task
    network = trained.network(task).eval()
    test = task.load_test().head(limit)
    tokens, answer, mask_id = test.tokens, test.answer_mask.bool(), task.mask_id
    vocabulary = torch.unique(tokens[answer])  # the tokens an answer position holds
    generator = torch.Generator().manual_seed(seed)
    out = []
    for rate in rates:
        masked = (torch.rand(tokens.shape, generator=generator) < rate) & answer
        decided = answer & ~masked
        corrupt = decided & (torch.rand(tokens.shape, generator=generator) < wrong)
        # a random other token of the answer vocabulary: shift the true token's index by 1..n-1
        index = torch.searchsorted(vocabulary, tokens)
        shift = torch.randint(1, len(vocabulary), tokens.shape, generator=generator)
        other = vocabulary[(index.clamp(max=len(vocabulary) - 1) + shift) % len(vocabulary)]
        canvas = torch.where(masked, mask_id, torch.where(corrupt, other, tokens))
        with torch.no_grad():
            logits = network(canvas).float()
        logits[..., mask_id] = float("-inf")
        probs = logits.softmax(-1)
        chosen_prob, choice = probs.max(-1)
        right_decided = decided & ~corrupt
        row = {"rate": rate, "decided_right": int(right_decided.sum()), "decided_wrong": int(corrupt.sum()),
               "masked": int(masked.sum()),
               "right_kept": float((choice == tokens)[right_decided].float().mean()) if right_decided.any() else None,
               "masked_right": float((choice == tokens)[masked].float().mean()) if masked.any() else None}
        for threshold in thresholds:
            edit = (choice != canvas) & (chosen_prob > threshold)
            row[f"damaged@{threshold}"] = float(edit[right_decided].float().mean()) if right_decided.any() else None
            row[f"repaired@{threshold}"] = (float((edit & (choice == tokens))[corrupt].float().mean())
                                            if corrupt.any() else None)
        out.append(row)
    return out


def table(rows: list[dict], thresholds: list[float]) -> str:
    def cell(value: float | None) -> str:
        return "—" if value is None else f"{100 * value:.1f}%"

    head = ["mask rate", "right kept", "masked right"] + [
        f"{kind} > {t}" for t in thresholds for kind in ("damaged", "repaired")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for row in rows:
        cells = [f"{row['rate']:g}", cell(row["right_kept"]), cell(row["masked_right"])] + [
            cell(row[f"{kind}@{t}"]) for t in thresholds for kind in ("damaged", "repaired")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    rows = probe(args.ckpt, args.limit, args.rates, args.wrong, args.thresholds, args.seed)
    print(table(rows, args.thresholds))
    if args.out:
        args.out.write_text(json.dumps({"ckpt": args.ckpt, "limit": args.limit, "wrong": args.wrong,
                                        "seed": args.seed, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    run_script(main, "editing_probe.py")
