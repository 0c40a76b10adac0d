"""The built-in model kinds, one module each; the registry imports every module here (those named `_*` are shared
parts, not kinds)."""
