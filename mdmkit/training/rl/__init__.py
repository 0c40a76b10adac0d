"""Reinforcement learning for masked diffusion models: rollouts from any mdmkit sampler, rewards from the tasks'
own verifiers, policy updates through mdmkit.objectives.rl (docs/rl.md). Importing this package loads no Lightning:
its settings (`config`, `rewards`) are read before a run starts."""
