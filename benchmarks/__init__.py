"""Benchmarks of mdmkit: each a runner (`python -m benchmarks.bench_<name>`) and the modules that make its page in
docs/results/. Outside the package: they use mdmkit's public API and are not installed with it."""
