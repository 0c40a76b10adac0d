"""The machinery every sampler shares: the contract, the forward counter, blocks, budgets,
choice, orderings, KV caches and the masked loop. Nothing here imports a rule."""
