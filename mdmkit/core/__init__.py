"""The bottom layer: errors, validated configs, seeds, devices and stop conditions.

Everything in mdmkit may import from here; nothing here imports from the rest of mdmkit.
"""
