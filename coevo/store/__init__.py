"""The audit store: SQL tables, alembic migrations and the `Store` API (see store.py)."""

from coevo.store.records import (
    AssetRecord,
    CheckpointRecord,
    DecisionRecord,
    EvaluationRecord,
    EvidenceRow,
    ProposalRecord,
    ResultRow,
    ReviewRecord,
    RoundRecord,
    RunRecord,
)
from coevo.store.engine import DEFAULT_URL, resolve_url
from coevo.store.store import Store

__all__ = [
    "DEFAULT_URL", "Store", "resolve_url", "AssetRecord", "CheckpointRecord", "DecisionRecord",
    "EvaluationRecord", "EvidenceRow", "ProposalRecord", "ResultRow", "ReviewRecord", "RoundRecord", "RunRecord",
]
