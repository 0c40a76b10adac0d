"""Studies made with mdmkit: each a package of its code, configs, pages and tests (see its README)."""
