from mdmkit.tasks.base import PuzzleTask, Split

__all__ = ["PuzzleTask", "Split"]
