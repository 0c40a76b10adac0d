"""Running untrusted, model-written programs (HumanEval / MBPP checks) in a contained child process."""

from mdmkit.sandbox.runner import (
    ENV_VAR,
    ExecutionResult,
    SandboxLimits,
    UnsafeExecutionError,
    check_allowed,
    run_many,
    run_program,
)

__all__ = ["ENV_VAR", "ExecutionResult", "SandboxLimits", "UnsafeExecutionError", "check_allowed", "run_many",
           "run_program"]
