"""Pretrained diffusion LLMs: mdmkit's own network, the hub checkpoint readers of each model kind, LoRA and export."""
