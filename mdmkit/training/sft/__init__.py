"""Supervised fine-tuning of pretrained diffusion LLMs (LLaDA, Dream) with the masked diffusion loss."""
