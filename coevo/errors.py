"""Errors a user can act on. Each names the file and field at fault, so the CLI prints one line."""

from __future__ import annotations


class CoevoError(Exception):
    """Base class: the CLI prints str(error) on one line and exits non-zero."""


class AssetError(CoevoError):
    """An asset file or payload is invalid: `path: field: reason`."""

    def __init__(self, source: str, field: str | None, reason: str):
        self.source, self.field, self.reason = source, field, reason
        where = f"{source}: {field}" if field else source
        super().__init__(f"{where}: {reason}")


class NotFound(CoevoError):
    """A version, run or proposal reference matched nothing (or, for prefixes, too much)."""


class Ambiguous(NotFound):
    def __init__(self, ref: str, candidates: list[str]):
        self.candidates = candidates
        super().__init__(f"{ref!r} is ambiguous; it matches: {', '.join(candidates)}")


class InfraError(CoevoError):
    """A backend or tool-infrastructure failure: missing data, never a zero score."""
