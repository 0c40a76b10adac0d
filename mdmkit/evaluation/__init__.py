"""Sampling a split and scoring it: results rows, grid sweeps, text generation and the lm-eval model."""
