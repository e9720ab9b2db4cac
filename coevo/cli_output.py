"""What the list and show commands print, in three forms:

- **On a terminal**: rich tables, panels and trees, fitted to the terminal's width.
- **Into a pipe or a file** (stdout not a terminal): plain lines that do not depend on any
  width. A table is tab-separated values: a header line, then one line per row, every cell
  whole (never folded, cut or padded), no box drawing, no colour. A tab or newline inside a
  cell shows as `\\t` / `\\n`, the way coevo/terminal.py shows every control character. A
  view of several parts (`runs show`, `proposals show`) prints each titled table or panel
  after a `# title` line, parts apart by a blank line; a table's caption follows its rows as
  a `# ` line; a tree (`lineage`) is one node a line, two spaces of indent a level. So
  `coevo proposals list | cut -f1,5` gives ids and statuses.
- **`--json`**: one JSON document on stdout and nothing else (progress and messages go to
  stderr): the stored records as the store returns them (`model_dump(mode="json")`: ISO
  times, ids and hashes in full), keys in the records' field order. Non-ASCII text stays
  UTF-8; the characters coevo.terminal escapes are written as `\\uXXXX`.

The JSON documents: `runs list` [run]; `runs show` {run, rounds, budgets, checkpoints};
`proposals list` [proposal]; `proposals show` proposal, where a proposal is its record plus
`decisions` (each with its evidence and stages) and `reviews`; `lineage` {version, ancestors
(root first), descendants, proposals (those that wrote any of these versions)};
`harness|skills|rubrics list` [version record]; `... show` the version record plus `content`
(the stored, hashed fields); `eval` the EvalResult, with per-task results.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console, Group, RenderableType
from rich.errors import MarkupError
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from coevo.terminal import escaped, safe, safe_json

JsonOption = typer.Option(False, "--json", help="Print the stored data as one JSON document.")


def emit(console: Console, as_json: bool, data: Callable[[], Any],
         view: Callable[[], RenderableType]) -> None:
    """`data()` as JSON with --json, else `view()` (see `show`)."""
    if as_json:
        print_json(data())
    else:
        show(console, view())


def print_json(data: Any) -> None:
    sys.stdout.write(safe_json(data) + "\n")
    sys.stdout.flush()


def show(console: Console, view: RenderableType) -> None:
    """A view on `console`: rich on a terminal, plain lines (`plain_text`) anywhere else."""
    if console.is_terminal:
        console.print(view)
    else:
        console.file.write(plain_text(view))
        console.file.flush()


# --- plain text ----------------------------------------------------------------------------


def plain_text(view: RenderableType) -> str:
    """`view` as width-independent plain lines (the module docstring)."""
    if not isinstance(view, Group):
        return _part(view, titled=False)
    out: list[str] = []
    for part in view.renderables:
        titled = isinstance(part, (Table, Panel)) and bool(part.title)
        out.append(("\n" if out and titled else "") + _part(part, titled=True))
    return "".join(out)


def _part(r: RenderableType, titled: bool) -> str:
    if isinstance(r, Group):
        return plain_text(r)
    if isinstance(r, Table):
        return (_title(r.title) if titled else "") + _tsv(r)
    if isinstance(r, Panel):
        return _title(r.title) + _part(r.renderable, titled=False)
    if isinstance(r, Tree):
        return _tree(r, 0)
    text = _text(r)
    return text if text.endswith("\n") else text + "\n"


def _title(title: Any) -> str:
    return f"# {_cell(title)}\n" if title else ""


def _tsv(t: Table) -> str:
    lines = ["\t".join(_cell(c.header) for c in t.columns)] if t.show_header else []
    lines += ["\t".join(row) for row in zip(*([_cell(x) for x in c.cells] for c in t.columns))]
    if t.caption:
        lines.append(f"# {_cell(t.caption)}")
    return "".join(f"{line}\n" for line in lines)


def _tree(node: Tree, depth: int) -> str:
    return "  " * depth + _cell(node.label) + "\n" + "".join(_tree(c, depth + 1) for c in node.children)


def _cell(r: Any) -> str:
    return _text(r).replace("\t", "\\t").replace("\n", "\\n")


def _text(r: Any) -> str:
    """What rich would show of `r`, without styles; control characters as escapes."""
    if isinstance(r, Text):
        return safe(r.plain)
    if isinstance(r, str):  # rich reads a str cell as markup
        try:
            return safe(Text.from_markup(r).plain)
        except MarkupError:
            return safe(r)
    buf = Console(file=io.StringIO(), width=10_000, color_system=None, highlight=False)
    buf.print(r)
    return safe("\n".join(line.rstrip() for line in buf.file.getvalue().splitlines()))


# --- JSON documents of stored data -----------------------------------------------------------


def _dump(record: Any) -> dict[str, Any]:
    return record.model_dump(mode="json")


def _run(store: Any, rec: Any) -> dict[str, Any]:
    """The stored run, plus `shown_status` (`interrupted` for a `running` run no process holds)."""
    return {**_dump(rec), "shown_status": store.shown_status(rec)}


def runs_doc(store: Any) -> list[dict[str, Any]]:
    return [_run(store, r) for r in store.runs()]


def run_doc(store: Any, ref: str) -> dict[str, Any]:
    from coevo.audit import budget_rows, run_checkpoints

    rec = store.get_run(ref)
    return {"run": _run(store, rec), "rounds": [_dump(r) for r in store.rounds(rec.id)],
            "budgets": [_dump(b) for b in budget_rows(store, rec)],
            "checkpoints": [_dump(c) for _, c in run_checkpoints(store, rec)]}


def proposal_doc(store: Any, p: Any) -> dict[str, Any]:
    return {**_dump(p), "decisions": [_dump(d) for d in store.decisions(p.id)],
            "reviews": [_dump(r) for r in store.reviews(proposal=p.id)]}


def proposals_doc(store: Any, run: str | None, status: str | None) -> list[dict[str, Any]]:
    return [proposal_doc(store, p) for p in store.proposals(run=run, status=status)]


def lineage_doc(store: Any, ref: str, kind: str | None) -> dict[str, Any]:
    me = store.resolve(kind, ref)
    ancestors, descendants = list(reversed(store.ancestors(me.hash))), store.descendants(me.hash)
    versions = {me.hash, *(a.hash for a in ancestors), *(d.hash for d in descendants)}
    return {"version": _dump(me), "ancestors": [_dump(a) for a in ancestors],
            "descendants": [_dump(d) for d in descendants],
            "proposals": [_dump(p) for p in store.proposals() if p.candidate in versions]}


def assets_doc(store: Any, kind: str) -> list[dict[str, Any]]:
    return [_dump(r) for r in store.list_assets(kind)]


def asset_doc(store: Any, kind: str, ref: str) -> dict[str, Any]:
    rec = store.resolve(kind, ref)
    return {**_dump(rec), "content": store.get_asset(kind, rec.hash).content()}


# --- eval ------------------------------------------------------------------------------------


def eval_table(result: Any) -> Table:
    """`coevo eval`'s summary of an EvalResult."""
    t = Table(title=f"{escaped(result.env)} {escaped(result.split)} (evaluation "
                    f"{(result.evaluation or '-')[:12]})")
    for col in ("mean [95% CI]", "success", "reward", "turns", "tokens", "seconds", "infra fail"):
        t.add_column(col)
    f = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    ci = f"{f(result.mean)} [{f(result.ci_low)}, {f(result.ci_high)}]"
    t.add_row(ci, f(result.success_rate), f(result.reward_mean), f(result.mean_turns),
              str(result.tokens_total), f"{result.seconds:.1f}", str(result.n_infra_failures))
    if result.criteria:
        t.caption = "partial credit: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(result.criteria.items()))
    return t
