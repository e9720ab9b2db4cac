"""The asset-version pages: line blame of a version (blame.py) and the version tree of its
lineage, each node with the proposal that produced it and the gate's verdict."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from coevo.serve.blame import BlameLine, blame_version, pick_proposal
from coevo.store import AssetRecord, Store
from coevo.store.queries import ProposalSummary, invalid_children, proposals_for_versions, version_tree

TREE_LIMIT = 2000  # versions drawn on one lineage page


def blame_view(store: Store, ref: str) -> dict[str, Any]:
    me = store.resolve(None, ref)
    chain, fields = blame_version(store, me.hash)
    by_version = proposals_for_versions(store, chain)
    steps = [(h, pick_proposal(by_version.get(h, [])), len(by_version.get(h, []))) for h in chain]
    main, settings, empty = split_fields(fields)
    return {"me": me, "fields": main, "settings": settings, "empty": empty, "chain": steps,
            "n_lines": sum(len(v) for v in fields.values()), "n_fields": len(fields)}


def split_fields(fields: dict[str, list[BlameLine]]) -> tuple[dict[str, list[BlameLine]],
                                                                 dict[str, BlameLine], list[str]]:
    """(fields shown in full: the system prompt first, then every field with more than one
    line or a line a proposal wrote; one-line settings unchanged since the seed; empty fields)."""
    main, settings, empty = {}, {}, []
    for name in sorted(fields, key=lambda f: (f != "system_prompt", f)):
        lines = fields[name]
        if not lines:
            empty.append(name)
        elif name == "system_prompt" or len(lines) > 1 or not lines[0].origin.seed:
            main[name] = lines
        else:
            settings[name] = lines[0]
    return main, settings, empty


@dataclass
class Node:
    rec: AssetRecord
    proposals: list[ProposalSummary]
    children: list["Node"] = field(default_factory=list)
    invalid: list[ProposalSummary] = field(default_factory=list)
    on_path: bool = False  # an ancestor of (or) the version the page was opened for

    @property
    def status(self) -> str:
        """seed | accepted | rejected | pending | invalid | stored (no proposal)."""
        p = pick_proposal(self.proposals)
        return p.status if p else ("seed" if self.rec.parent is None else "stored")


def lineage_view(store: Store, ref: str) -> dict[str, Any]:
    me = store.resolve(None, ref)
    root, rest = version_tree(store, me.hash, TREE_LIMIT)
    recs = [root, *rest]
    props = proposals_for_versions(store, [r.hash for r in recs])
    invalid = invalid_children(store, [r.hash for r in recs])
    nodes = {r.hash: Node(r, props.get(r.hash, []), invalid=invalid.get(r.hash, [])) for r in recs}
    for r in rest:
        if r.parent in nodes:
            nodes[r.parent].children.append(nodes[r.hash])
    path = {a.hash for a in store.ancestors(me.hash)} | {me.hash}
    for h in path:
        if h in nodes:
            nodes[h].on_path = True
    counts: dict[str, int] = {}
    for n in nodes.values():
        counts[n.status] = counts.get(n.status, 0) + 1
    n_invalid = sum(len(n.invalid) for n in nodes.values())
    return {"me": me, "rows": tree_rows(nodes[root.hash]), "counts": counts,
            "n_invalid": n_invalid, "truncated": len(rest) >= TREE_LIMIT, "limit": TREE_LIMIT}


def _sizes(root: Node) -> dict[int, int]:
    """id(node) -> nodes in its subtree, computed once (children before parents)."""
    order, stack = [], [root]
    while stack:
        n = stack.pop()
        order.append(n)
        stack.extend(n.children)
    size: dict[int, int] = {}
    for n in reversed(order):
        size[id(n)] = 1 + sum(size[id(c)] for c in n.children)
    return size


def tree_rows(root: Node) -> list[tuple[int, str, Any]]:
    """The tree as rows (indent, "version" | "invalid", Node | ProposalSummary), drawn like a
    branch history: the main line (the accepted child, else the largest subtree) continues at
    the same indent, side branches (rejected candidates, what grew from them) and invalid
    proposals are indented under the version they were made against. Iterative, so a lineage
    of any length draws without recursion."""
    size = _sizes(root)
    rows: list[tuple[int, str, Any]] = []
    stack: list[tuple[int, Node]] = [(0, root)]
    while stack:
        indent, node = stack.pop()
        rows.append((indent, "version", node))
        kids = sorted(node.children, key=lambda c: (c.status == "accepted", size[id(c)]), reverse=True)
        main, side = (kids[0], kids[1:]) if kids else (None, [])
        rows.extend((indent + 1, "invalid", p) for p in node.invalid)
        if main is not None:
            stack.append((indent, main))  # popped after the side branches
        stack.extend((indent + 1, c) for c in reversed(side))
    return rows
