"""Line blame for asset versions: which proposal wrote each line of each field.

The algorithm is `git blame` over the version lineage (asset_versions.parent_hash), oldest
first. Every field of the root version is one text (`coevo.assets.base.field_texts`: strings
as written, lists and numbers as indented JSON); each of its lines is attributed to the root.
For each child, every field is line-diffed against the same field of its parent
(difflib.SequenceMatcher, no junk heuristic): lines in matching blocks keep their parent's
attribution, inserted or replaced lines are attributed to the child. A field that is new in a
child is all the child's. The attribution of a version is the proposal that produced it
(`pick_proposal`), with its round, proposer, gate decision and measured delta; the root, or any version no proposal produced (a seed file, an imported edit), is
marked as such.

Departure from git blame: lineage is a chain of whole versions, so a line moved from one field
to another counts as new in its new field (fields are diffed separately, as the gate's diff
shows them).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from coevo.assets.base import field_texts
from coevo.store import Store
from coevo.store.queries import ProposalSummary, asset_contents, proposals_for_versions


@dataclass(frozen=True)
class Origin:
    """Who wrote a line: version `version`, made by `proposal` (None: not by a proposal;
    `seed` says it is the root of the lineage)."""

    version: str
    proposal: ProposalSummary | None = None
    seed: bool = False

    @property
    def delta(self) -> float | None:
        """The gate's measured effect of the proposal: mean paired difference (a rubric:
        AUC difference); None when not measured."""
        if self.proposal is None:
            return None
        st = self.proposal.statistic
        for key in ("mean_diff", "auc_diff"):
            v = st.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                return float(v)
        return None


@dataclass(frozen=True)
class BlameLine:
    number: int  # 1-based
    text: str
    origin: Origin


def blame_texts(versions: Sequence[tuple[Origin, Mapping[str, str]]]) -> dict[str, list[BlameLine]]:
    """Blame of the last version's fields, given every version from the root down as
    (origin, {field: text}) (module docstring). Pure: no store access.

    >>> a, b = Origin("a", seed=True), Origin("b")
    >>> out = blame_texts([(a, {"p": "one\\ntwo\\n"}), (b, {"p": "one\\n2\\n"})])
    >>> [(x.text, x.origin.version) for x in out["p"]]
    [('one', 'a'), ('2', 'b')]
    """
    if not versions:
        return {}
    origin, texts = versions[0]
    current = {f: [(ln, origin) for ln in t.splitlines()] for f, t in texts.items()}
    for origin, texts in versions[1:]:
        nxt: dict[str, list[tuple[str, Origin]]] = {}
        for field, text in texts.items():
            new = text.splitlines()
            old = current.get(field, [])
            lines: list[tuple[str, Origin]] = [(ln, origin) for ln in new]
            sm = difflib.SequenceMatcher(None, [ln for ln, _ in old], new, autojunk=False)
            for i, j, n in sm.get_matching_blocks():
                for k in range(n):
                    lines[j + k] = old[i + k]
            nxt[field] = lines
        current = nxt
    return {f: [BlameLine(i + 1, ln, o) for i, (ln, o) in enumerate(lines)]
            for f, lines in sorted(current.items())}


def pick_proposal(proposals: Sequence[ProposalSummary]) -> ProposalSummary | None:
    """The proposal a version is credited to, from those (oldest first) whose candidate it is:
    the first accepted one (content is addressed by hash, so a later run proposing the same
    text makes the same version; the first to get it accepted wrote it), else the first."""
    accepted = [p for p in proposals if p.status == "accepted"]
    return (accepted or list(proposals) or [None])[0]


def blame_version(store: Store, ref: str) -> tuple[list[str], dict[str, list[BlameLine]]]:
    """(the lineage root first, down to `ref`'s hash; the blame of `ref`'s fields)."""
    me = store.resolve(None, ref)
    chain = [a.hash for a in reversed(store.ancestors(me.hash))] + [me.hash]
    contents = asset_contents(store, chain)
    by_version = proposals_for_versions(store, chain)
    versions = []
    for i, h in enumerate(chain):
        prop = pick_proposal(by_version.get(h, []))
        origin = Origin(h, prop, seed=i == 0 and prop is None)
        versions.append((origin, field_texts(contents[h])))
    return chain, blame_texts(versions)
