"""Training runs: the Lightning module (EMA, validation accuracy), step-indexed data, checks that run before
Lightning loads (preflight), resuming a run by its directory (resume), and the NI indicator."""
