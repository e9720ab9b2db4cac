"""Asset versions in the store: content-addressed, immutable, with lineage by recursive CTE."""

from __future__ import annotations

import importlib
from typing import Any

import sqlalchemy as sa

from coevo.assets.base import ASSET_TYPES, Asset
from coevo.errors import Ambiguous, CoevoError, NotFound
from coevo.store import tables as T
from coevo.store.base import MIN_PREFIX, StoreBase, is_hex
from coevo.store.records import AssetRecord, asset_record


def _asset_class(kind: str) -> type[Asset]:
    if kind not in ASSET_TYPES:
        # The asset classes register themselves on import; the store may be used before
        # anything imported them (e.g. `coevo harness show`).
        try:
            importlib.import_module("coevo.assets")
        except ImportError:
            pass
    try:
        return ASSET_TYPES[kind]
    except KeyError:
        known = ", ".join(sorted(ASSET_TYPES)) or "(none)"
        raise NotFound(f"no asset class for stored kind {kind!r}; known: {known}") from None



class AssetStore(StoreBase):

    def put_asset(self, asset: Asset) -> str:
        """Store a version; returns its hash. Idempotent: existing content returns the existing
        version (its recorded parent is kept). The parent must already be stored. A skill
        library's member skills (Asset objects in `.skills`) are stored first and recorded."""
        with self.transaction() as s:
            members = self._library_members(asset)
            h = asset.hash
            av = T.AssetVersion.__table__
            if s.execute(sa.select(av.c.seq).where(av.c.hash == h)).first():
                return h
            if asset.parent is not None and not s.execute(
                    sa.select(av.c.seq).where(av.c.hash == asset.parent)).first():
                raise NotFound(f"{asset.kind} {asset.name!r}: parent {asset.parent[:12]} is not "
                               "in the store; put the parent version first")
            # Insert-or-ignore: another process may store the same content between the check
            # above and this insert (PostgreSQL's READ COMMITTED lets both pass the check); the
            # loser's insert waits for the winner's commit and then does nothing, and the
            # winner's transaction has written the members too.
            # RETURNING, not rowcount: psycopg's pipeline mode reports rowcount -1 (truthy).
            inserted = s.execute(self._insert_ignore(av, "hash").values(
                hash=h, kind=asset.kind, name=asset.name, parent_hash=asset.parent,
                content=asset.content(), created_at=T.utcnow()).returning(av.c.hash)).first()
            if inserted is not None and members:
                s.execute(sa.insert(T.SkillLibraryMember.__table__),
                          [{"library_hash": h, "skill_hash": m, "position": i}
                           for i, m in enumerate(members)])
            return h

    def _insert_ignore(self, table: sa.Table, key: str) -> Any:
        """INSERT ... ON CONFLICT (key) DO NOTHING, in the engine's dialect."""
        if self.engine.dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        else:
            from sqlalchemy.dialects.sqlite import insert
        return insert(table).on_conflict_do_nothing(index_elements=[key])

    def _library_members(self, asset: Asset) -> list[str]:
        """Member skill hashes of a library: any asset with a `skills` list (SkillLibrary).
        Items may be references with a `.hash` (coevo.assets.skill.SkillRef) or hash strings,
        whose versions must already be stored, or Asset objects, which are stored here."""
        skills = getattr(asset, "skills", None)
        if not isinstance(skills, (list, tuple)) or not skills:
            return []
        out: list[str] = []
        for i, item in enumerate(skills):
            if isinstance(item, Asset):
                out.append(self.put_asset(item))
                continue
            h = item if isinstance(item, str) else getattr(item, "hash", None)
            if not isinstance(h, str):
                raise CoevoError(f"{asset.kind} {asset.name!r}: skills.{i}: expected a skill, "
                                 f"a reference with .hash or a hash, got {type(item).__name__}")
            av = T.AssetVersion.__table__
            with self.transaction() as s:
                if not s.execute(sa.select(av.c.seq).where(av.c.hash == h)).first():
                    raise NotFound(f"{asset.kind} {asset.name!r}: skills.{i} ({h[:12]}) is not "
                                   "in the store; put the member skills first")
            out.append(h)
        return list(dict.fromkeys(out))  # a skill listed twice is one member

    def resolve(self, kind: str | None, ref: str) -> AssetRecord:
        """Find one version by full hash, name (the latest version with that name) or unique
        hash prefix. Raises NotFound, or Ambiguous listing the candidates."""
        av = T.AssetVersion.__table__
        base = sa.select(av.c.hash, av.c.kind, av.c.name, av.c.parent_hash, av.c.created_at)
        if kind is not None:
            base = base.where(av.c.kind == kind)
        what = kind or "asset"
        with self.transaction() as s:
            row = s.execute(base.where(av.c.hash == ref)).first()
            if row is None:
                # A name means the latest version a person or the gate stood behind: a
                # candidate that was never accepted (rejected, pending, invalid) shares its
                # parent's name but must not become what a new run starts from.
                pt = T.Proposal.__table__
                unaccepted = sa.select(pt.c.candidate_hash).where(
                    pt.c.candidate_hash.is_not(None), pt.c.status != "accepted")
                accepted = sa.select(pt.c.candidate_hash).where(pt.c.status == "accepted")
                named = base.where(av.c.name == ref).order_by(av.c.seq.desc())
                row = s.execute(named.where(sa.or_(av.c.hash.not_in(unaccepted),
                                                   av.c.hash.in_(accepted)))).first()
                if row is None:  # only candidates carry this name: the latest of them
                    row = s.execute(named).first()
            hexref = is_hex(ref)
            if row is None and hexref and len(ref) >= MIN_PREFIX:
                rows = s.execute(base.where(av.c.hash.startswith(ref, autoescape=True))
                                 .order_by(av.c.seq).limit(11)).all()
                if len(rows) > 1:
                    raise Ambiguous(ref, [f"{r.hash[:12]} ({r.kind} {r.name})" for r in rows])
                row = rows[0] if rows else None
        if row is None:
            short = hexref and len(ref) < MIN_PREFIX
            hint = f" (hash prefixes need {MIN_PREFIX}+ hex digits)" if short else ""
            raise NotFound(f"no {what} version matches {ref!r}{hint}")
        return asset_record(row)

    def resolve_seed(self, kind: str, ref: str) -> AssetRecord:
        """The version a new run starts from, pinned once when the run is created:
        `name@hash` (or `name@prefix`) is exactly that version of that name; a full hash or
        unique prefix is that version; a plain name is the latest version of that name that
        no proposal produced (imported by `coevo init` or put by a person). Unlike `resolve`,
        a name never means a revision another run accepted: runs sharing a store must not
        start from each other's results."""
        if "@" in ref:
            name, _, version = ref.partition("@")
            rec = self.resolve(kind, version)
            if rec.hash != version and not rec.hash.startswith(version):
                raise NotFound(f"{kind} {ref!r}: {version!r} is not a hash or hash prefix")
            if rec.name != name:
                raise NotFound(f"{kind} {ref!r}: version {rec.hash[:12]} is named {rec.name!r}")
            return rec
        av, pt = T.AssetVersion.__table__, T.Proposal.__table__
        produced = sa.select(pt.c.candidate_hash).where(pt.c.candidate_hash.is_not(None))
        with self.transaction() as s:
            row = s.execute(sa.select(av.c.hash, av.c.kind, av.c.name, av.c.parent_hash,
                                      av.c.created_at)
                            .where(av.c.kind == kind, av.c.name == ref,
                                   av.c.hash.not_in(produced))
                            .order_by(av.c.seq.desc())).first()
        if row is not None:
            return asset_record(row)
        rec = self.resolve(kind, ref)  # a hash or prefix (a name alone is no seed)
        if rec.name == ref:
            raise NotFound(f"no seed version of {kind} {ref!r}: every stored version was made "
                           f"by a proposal; name one explicitly as {ref}@HASH")
        return rec

    def get_asset(self, kind: str | None, ref: str) -> Asset:
        """The stored version `ref` (see `resolve`) rebuilt as its asset class."""
        rec = self.resolve(kind, ref)
        av = T.AssetVersion.__table__
        with self.transaction() as s:
            content = s.execute(sa.select(av.c.content).where(av.c.hash == rec.hash)).scalar_one()
        return _asset_class(rec.kind).model_validate({**content, "parent": rec.parent})

    def list_assets(self, kind: str | None = None, name: str | None = None) -> list[AssetRecord]:
        """Stored versions, oldest first, optionally of one kind and name."""
        av = T.AssetVersion.__table__
        q = sa.select(av).order_by(av.c.seq)
        if kind is not None:
            q = q.where(av.c.kind == kind)
        if name is not None:
            q = q.where(av.c.name == name)
        with self.transaction() as s:
            return [asset_record(r) for r in s.execute(q)]

    def library_members(self, library: str, kind: str | None = "skill_library") -> list[str]:
        """Member skill hashes of a stored skill library, in library order."""
        m = T.SkillLibraryMember.__table__
        h = self.resolve(kind, library).hash
        with self.transaction() as s:
            return list(s.execute(sa.select(m.c.skill_hash).where(m.c.library_hash == h)
                                  .order_by(m.c.position)).scalars())

    def get_library(self, ref: str) -> tuple[Asset, list[Asset]]:
        """A stored skill library and its member skill versions (what an agent runs with)."""
        lib = self.get_asset("skill_library", ref)
        return lib, [self.get_asset("skill", h) for h in self.library_members(lib.hash)]

    def _lineage(self, ref: str, kind: str | None, up: bool) -> list[AssetRecord]:
        av = T.AssetVersion.__table__
        start = self.resolve(kind, ref).hash
        tree = (sa.select(av.c.hash, av.c.parent_hash, sa.literal(0).label("depth"))
                .where(av.c.hash == start).cte("lineage", recursive=True))
        step = av.c.hash == tree.c.parent_hash if up else av.c.parent_hash == tree.c.hash
        tree = tree.union_all(
            sa.select(av.c.hash, av.c.parent_hash, (tree.c.depth + 1).label("depth")).join(tree, step))
        q = (sa.select(av.c.hash, av.c.kind, av.c.name, av.c.parent_hash, av.c.created_at,
                       tree.c.depth).join(tree, tree.c.hash == av.c.hash)
             .where(tree.c.depth > 0).order_by(tree.c.depth, av.c.seq))
        with self.transaction() as s:
            return [asset_record(r, r.depth) for r in s.execute(q)]

    def ancestors(self, ref: str, kind: str | None = None) -> list[AssetRecord]:
        """Parent, grandparent, ... of a version (nearest first), one recursive query."""
        return self._lineage(ref, kind, up=True)

    def descendants(self, ref: str, kind: str | None = None) -> list[AssetRecord]:
        """Every version derived from `ref`, by depth then insertion order."""
        return self._lineage(ref, kind, up=False)

