"""The machinery every sampler shares: the contract, the forward counter, the batch driver (a fill's row
bookkeeping), blocks, budgets, choice, orderings, KV caches, the masked loop and block diffusion's block walk.
Nothing here imports a rule."""
