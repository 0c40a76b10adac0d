"""Train a masked diffusion model: `python train.py experiment=sudoku_mdm [key=value ...]`."""

from mdmkit.cli import train

if __name__ == "__main__":
    train()
