"""Training runs: the Lightning module (EMA, validation accuracy), step-indexed data, and the NI indicator."""
