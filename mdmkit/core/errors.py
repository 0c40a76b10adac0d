"""Errors that end a run with one clear line instead of a stack trace."""


class MdmkitError(Exception):
    """Base class: the CLI prints these as `error: <message>` and exits with status 2."""


class ConfigError(MdmkitError):
    """A config key, group option or value that cannot work."""


class CheckpointError(MdmkitError):
    """A checkpoint that is missing, unreadable or does not fit the requested model/task."""


class DataFormatError(MdmkitError):
    """A data file that does not parse; the message names the file and line."""


class CapabilityError(ConfigError, ValueError):
    """A sampler asked a network for something it does not provide (a KV cache, a causal head, ...)."""
