"""Evaluate a checkpoint: `python evaluate.py ckpt=path/to/model.pt sampler=topk sampler.k=2`."""

from mdmkit.cli import evaluate

if __name__ == "__main__":
    evaluate()
