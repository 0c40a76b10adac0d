"""lm-eval task configs for mdmkit's GSM8K / HumanEval / MBPP (prompts, stops and scoring as `evaluate.py`)."""
