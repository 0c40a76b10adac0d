"""Storage: checkpoints (networks, indicators) and results files. Reads and writes; builds nothing above models."""
