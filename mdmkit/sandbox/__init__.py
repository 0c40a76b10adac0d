"""Running untrusted, model-written programs (HumanEval / MBPP checks): isolated, with unforgeable verdicts.

Modules, one job each: `limits` (settings, results, the opt-in gate), `isolation` (bwrap or the process
fallback), `cgroups` and `procs` (limits on the whole sandbox, and killing all of it), `channel` (one running
sandbox seen from the caller), `codec` and `child` (plain data across the pipe; the candidate's side),
`verdict` (the trusted checks), `runner` (entry points). docs/sandbox.md says what is contained in each mode.
"""

from mdmkit.sandbox.isolation import describe as describe_isolation
from mdmkit.sandbox.limits import (
    ENV_VAR,
    ISOLATION_ENV,
    ExecutionResult,
    SandboxLimits,
    UnsafeExecutionError,
    check_allowed,
)
from mdmkit.sandbox.runner import backend_for, run_many, run_program
from mdmkit.sandbox.verdict import Check

__all__ = ["ENV_VAR", "ISOLATION_ENV", "Check", "ExecutionResult", "SandboxLimits", "UnsafeExecutionError",
           "backend_for", "check_allowed", "describe_isolation", "run_many", "run_program"]
