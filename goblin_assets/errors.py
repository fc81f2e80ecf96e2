"""Goblin's own exception types: each names the file and the problem."""
from __future__ import annotations


class GoblinError(Exception):
    """Base class: a clear, user-facing error (no deep traceback needed)."""


class WorkloadError(GoblinError):
    """A workload folder or its workload.yaml is missing or invalid."""


class WorkloadSpecError(WorkloadError):
    """One key of a ``workload.yaml`` is unknown or holds a value of the wrong kind.

    ``file`` is the ``workload.yaml``, ``key`` the offending key, ``problem``
    what is wrong with it; ``suggestion`` the closest known key for an unknown
    one (None when nothing is close).  The message is one line:
    ``FILE: unknown key 'units' (did you mean 'unit'?)``.
    """

    def __init__(self, file: str, key: str, problem: str, suggestion: str | None = None):
        self.file, self.key, self.problem, self.suggestion = file, key, problem, suggestion
        super().__init__(f"{file}: {problem}")


class ConfigParseError(GoblinError):
    """A training config file cannot be read or parsed."""

    def __init__(self, file: str, problem: str):
        self.file = file
        self.problem = problem
        super().__init__(f"{file}: {problem}")


class RunFailed(GoblinError):
    """The user's script failed, hung or was killed; carries the RunMetrics."""

    def __init__(self, message: str, metrics=None):
        self.metrics = metrics
        super().__init__(message)


class KBError(GoblinError):
    """The knowledge base file is invalid (names the rule and the field)."""


class WarehouseError(GoblinError):
    """A frame failed validation or could not be written to the warehouse."""


class PatchError(GoblinError):
    """A rule's transform cannot be applied to the user's file."""
