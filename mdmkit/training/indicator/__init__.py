"""NI sampling's offline side: base-sampler trajectories, the indicator's Lightning module and its training run.

The online sampler is `mdmkit.samplers.NISampler`; the indicator network is `mdmkit.models.indicator`.
"""
