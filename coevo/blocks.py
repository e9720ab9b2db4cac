"""Nested mappings merged block by block: a run config's `extends:` layers and a proposer's
changes to an asset's fields both keep what the newer mapping does not name."""

from __future__ import annotations

from typing import Any


def merge_blocks(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` updated by `over`, recursing where both hold a block (a mapping).

    >>> merge_blocks({"gate": {"alpha": 0.05, "name": "soft"}, "proposers": [1, 2]},
    ...              {"gate": {"alpha": 0.1}, "proposers": [3]})
    {'gate': {'alpha': 0.1, 'name': 'soft'}, 'proposers': [3]}
    """
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_blocks(out[key], value)
        else:
            out[key] = value
    return out
