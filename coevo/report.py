"""One self-contained HTML report of a run: plots, rounds, budgets and every proposal with the
gate's reason.

Self-contained means one file that opens offline and can be attached to a review: CSS is
inline, plots are inline SVG drawn by matplotlib (Agg backend, no display needed), and nothing
is loaded from a URL (no CDN scripts, fonts or images). matplotlib's SVG output carries a
DOCTYPE and RDF metadata naming w3.org / purl.org URLs; both are stripped, leaving only the
`xmlns` namespace declaration, which browsers never fetch.

The numbers come from coevo.audit's extractors (the same ones the terminal views use); its
module docstring lists the round-summary keys read (`val_score`, `test_score`, `evaluations`,
`incumbent`, `checkpoint(s)`, `rl_steps` / `rl`) and the budget limits read from the run
config. A plot whose data is missing is replaced by a "no data" note naming the key to write.
"""

from __future__ import annotations

import html
import io
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from coevo.audit import (
    ASSET_SLOTS,
    BudgetRow,
    ProposalRow,
    RLStep,
    RoundRow,
    budget_rows,
    fmt,
    proposal_rows,
    rl_steps,
    round_rows,
    short,
)
from coevo.errors import CoevoError
from coevo.reach import run_val_pairs
from coevo.store.records import ReviewRecord
from coevo.store.store import Store

_STATUSES = ("accepted", "rejected", "invalid", "pending")
_COLORS = {"accepted": "#2e7d32", "rejected": "#c62828", "invalid": "#8e24aa", "pending": "#f9a825"}

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2rem auto;max-width:72rem;
color:#222;padding:0 1rem}
h1{margin-bottom:.2rem}.meta{color:#666;margin-top:0}
h2{border-bottom:1px solid #ddd;padding-bottom:.2rem;margin-top:2rem}
table{border-collapse:collapse;width:100%;font-size:.9rem}
th,td{border:1px solid #ddd;padding:.3rem .5rem;text-align:left;vertical-align:top}
th{background:#f5f5f5}td.num{text-align:right;font-variant-numeric:tabular-nums}
code{font-size:.85rem}.plots{display:grid;grid-template-columns:repeat(auto-fit,minmax(30rem,1fr));
gap:1rem}.plot{border:1px solid #eee;padding:.5rem}.plot svg{width:100%;height:auto}
.nodata{color:#888;font-style:italic;padding:2rem;text-align:center}
.accepted{color:#2e7d32;font-weight:600}.rejected{color:#c62828;font-weight:600}
.invalid{color:#8e24aa;font-weight:600}.pending{color:#b28704;font-weight:600}
"""


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


# --- plots -----------------------------------------------------------------------------------


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)  # no display; also safe inside a headless CLI
    import matplotlib.pyplot as plt

    return plt


def _svg(fig: Any) -> str:
    """The figure as an inline <svg> element without URL-bearing preamble or metadata."""
    plt = _pyplot()
    buf = io.StringIO()
    # A fixed hash salt makes element ids (and so the whole report) reproducible.
    with plt.rc_context({"svg.hashsalt": "coevo", "svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    return re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)


def _nodata(title: str, hint: str) -> str:
    return f'<div class="nodata"><b>{_esc(title)}</b>: no data ({_esc(hint)})</div>'


def _plot(body: str) -> str:
    return f'<div class="plot">{body}</div>'


def plot_val_scores(rounds: Sequence[RoundRow]) -> str:
    """Validation score per round (test score marked where a round has it)."""
    val = [(r.index, r.val_score) for r in rounds if r.val_score is not None]
    test = [(r.index, r.test_score) for r in rounds if r.test_score is not None]
    if not val and not test:
        return _nodata("validation score per round", 'write summary["val_score"] per round')
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    if val:
        ax.plot([i for i, _ in val], [v for _, v in val], "o-", label="val (incumbent)")
    if test:
        ax.plot([i for i, _ in test], [v for _, v in test], "s", color="#c62828", label="test")
    ax.set_xlabel("round")
    ax.set_ylabel("score")
    ax.set_title("validation score per round")
    ax.set_xticks(sorted({r.index for r in rounds}))
    ax.grid(alpha=0.3)
    ax.legend()
    return _svg(fig)


def plot_rl_reward(steps: Sequence[RLStep]) -> str:
    """RL mean reward per step, one colour per round."""
    if not steps:
        return _nodata("RL reward per step",
                       'write summary["rl_steps"] = [{"step", "reward_mean"}], or store train trajectories')
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    by_round: dict[int, list[RLStep]] = defaultdict(list)
    for s in steps:
        by_round[s.round].append(s)
    for r, ss in sorted(by_round.items()):
        ax.plot([s.step for s in ss], [s.reward_mean for s in ss], ".-", label=f"round {r}")
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward")
    ax.set_title("RL reward per step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _svg(fig)


def acceptance_by_proposer(props: Sequence[ProposalRow]) -> dict[str, dict[str, int]]:
    """proposer -> status -> count (every status present, zeros included)."""
    counts: dict[str, Counter] = defaultdict(Counter)
    for p in props:
        counts[p.proposer][p.status] += 1
    return {k: {s: c[s] for s in _STATUSES} for k, c in sorted(counts.items())}


def plot_acceptance(props: Sequence[ProposalRow]) -> str:
    """Stacked bars: proposals per proposer by status."""
    table = acceptance_by_proposer(props)
    if not table:
        return _nodata("acceptance by proposer", "no proposals recorded for this run")
    plt = _pyplot()
    names = list(table)
    fig, ax = plt.subplots(figsize=(6, 0.6 + 0.5 * max(3, len(names))))
    left = [0] * len(names)
    for s in _STATUSES:
        vals = [table[n][s] for n in names]
        if any(vals):
            ax.barh(names, vals, left=left, color=_COLORS[s], label=s)
            left = [a + b for a, b in zip(left, vals)]
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # counts, not fractions
    ax.set_xlabel("proposals")
    ax.set_title("acceptance by proposer")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))  # off the bars
    return _svg(fig)


def plot_budgets(budgets: Sequence[BudgetRow], rounds: Sequence[RoundRow]) -> str:
    """One panel per budget kind: spend per round, with the run's limit when one is set.
    Kinds have different units (rollouts, tokens, seconds), hence separate panels."""
    kinds = [b for b in budgets if b.spent > 0 or b.limit]
    if not kinds:
        return _nodata("budget use", "nothing charged with store.add_budget")
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(kinds), figsize=(2.4 * len(kinds) + 1, 3), squeeze=False)
    for ax, b in zip(axes[0], kinds):
        xs = [r.index for r in rounds]
        cumulative, total = [], 0.0
        for r in rounds:
            total += r.budget.get(b.kind, 0.0)
            cumulative.append(total)
        ax.bar([str(x) for x in xs], [r.budget.get(b.kind, 0.0) for r in rounds], color="#5c6bc0")
        if len(xs) > 1:
            ax.plot([str(x) for x in xs], cumulative, "k.--", label="cumulative")
        if b.limit:
            ax.axhline(b.limit, color="#c62828", lw=1, label=f"limit {fmt(b.limit, 1)}")
        ax.set_title(f"{b.kind}\n{fmt(b.spent, 1)} spent", fontsize="small")
        ax.set_xlabel("round")
        ax.tick_params(labelsize="small")
        if b.limit or len(xs) > 1:
            ax.legend(fontsize="x-small")
    fig.tight_layout()
    return _svg(fig)


# --- tables ----------------------------------------------------------------------------------


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], numeric: frozenset[int] | set[int] = frozenset()) -> str:
    """An HTML table; cells are pre-escaped HTML."""
    head = "".join(f"<th>{_esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(
        f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>"
        for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _code(ref: str | None) -> str:
    return f'<code title="{_esc(ref)}">{_esc(short(ref))}</code>' if ref else "-"


def _rounds_table(rounds: Sequence[RoundRow]) -> str:
    if not rounds:
        return '<p class="nodata">no rounds</p>'
    rows = [[_esc(r.index), _esc(r.status), fmt(r.val_score), fmt(r.test_score),
             *(_code(r.incumbent.get(k)) for k in ASSET_SLOTS), _code(r.checkpoint),
             f"{r.accepted}/{r.proposals}", fmt(r.budget.get("rollouts")),
             fmt(r.budget.get("tokens"))] for r in rounds]
    return _table(["round", "status", "val", "test", *ASSET_SLOTS, "checkpoint",
                   "accepted/proposals", "rollouts", "tokens"], rows, numeric={0, 2, 3, 9, 10})


def _budgets_table(budgets: Sequence[BudgetRow]) -> str:
    if not budgets:
        return '<p class="nodata">no budget charges and no limits in the run config</p>'
    rows = [[_esc(b.kind), fmt(b.spent, 1), fmt(b.limit, 1),
             f"{b.fraction:.0%}" if b.fraction is not None else "-"] for b in budgets]
    return _table(["kind", "spent", "limit", "used"], rows, numeric={1, 2, 3})


def _acceptance_table(props: Sequence[ProposalRow]) -> str:
    table = acceptance_by_proposer(props)
    if not table:
        return ""
    rows = []
    for name, c in table.items():
        decided = c["accepted"] + c["rejected"]
        rate = f"{c['accepted'] / decided:.0%}" if decided else "-"
        rows.append([_esc(name), *(str(c[s]) for s in _STATUSES), rate])
    return _table(["proposer", *_STATUSES, "accept rate (of decided)"], rows,
                  numeric={1, 2, 3, 4, 5})


def _proposals_table(props: Sequence[ProposalRow]) -> str:
    if not props:
        return '<p class="nodata">no proposals</p>'
    rows = [[_code(p.id), fmt(p.round), _esc(p.proposer), _esc(p.kind),
             f'<span class="{_esc(p.status)}">{_esc(p.status)}</span>', _code(p.parent),
             _code(p.candidate), f"{p.mean_diff:+.3f}" if p.mean_diff is not None else "-",
             fmt(p.p_value, 4), str(p.rollouts), _esc(p.reason)] for p in props]
    return _table(["id", "round", "proposer", "kind", "status", "parent", "candidate",
                   "mean diff", "p", "rollouts", "reason"], rows, numeric={1, 7, 8, 9})


def _reach_table(pairs: Sequence[Any]) -> str:
    """Reach or solve between consecutive val evaluations (coevo/reach.py)."""
    if not pairs:
        return ('<p class="nodata">no two val evaluations to compare (splits.track_val stores '
                'one at the start and after every round)</p>')
    num = lambda x, sign="": "-" if x is None else f"{x:{sign}.3f}"  # noqa: E731
    signed = lambda x: num(x, "+")  # noqa: E731
    pct = lambda x: "-" if x is None else f"{x:.0%}"  # noqa: E731
    rows = [[_esc(p.a), _esc(p.b), str(p.tasks), num(p.p_a), num(p.p_b), signed(p.gain),
             signed(p.reach), signed(p.solve), pct(p.new_fraction_b)] for p in pairs]
    return _table(["from", "to", "tasks", "val from", "val to", "gain", "REACH", "SOLVE",
                   "to's episodes on new states"], rows, numeric={2, 3, 4, 5, 6, 7, 8})


def _reviews_table(reviews: Sequence[ReviewRecord]) -> str:
    rows = [[_esc(f"{r.created_at:%Y-%m-%d %H:%M}"), _code(r.proposal), _esc(r.by),
             _esc(r.decision), _esc(r.note)] for r in reviews]
    return _table(["when", "proposal", "by", "decision", "note"], rows)


# --- the report --------------------------------------------------------------------------------


def render_report(store: Store, run: str) -> str:
    """The report as an HTML string (see `write_report`)."""
    rec = store.get_run(run)
    rounds = round_rows(store, rec)
    budgets = budget_rows(store, rec)
    props = proposal_rows(store, run=rec.id)
    steps = rl_steps(store, rec)
    reviews = store.reviews(run=rec.id)  # gate.human_review: who approved or vetoed what
    reach = run_val_pairs(store, rec.id)
    plots = "".join(_plot(body) for body in (
        plot_val_scores(rounds), plot_rl_reward(steps), plot_acceptance(props),
        plot_budgets(budgets, rounds)))
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>coevo report: {_esc(rec.name)}</title><style>{_CSS}</style></head><body>
<h1>coevo run {_esc(rec.name)}</h1>
<p class="meta">id <code>{_esc(rec.id)}</code> &middot; mode {_esc(rec.mode)} &middot;
status {_esc(rec.status)} &middot; {len(rounds)} rounds &middot; {len(props)} proposals
&middot; generated {generated}</p>
<h2>Plots</h2><div class="plots">{plots}</div>
<h2>Rounds</h2>{_rounds_table(rounds)}
<h2>Budgets</h2>{_budgets_table(budgets)}
<h2>Reach or solve</h2><p class="meta">Each val gain split into REACH (success through states
the earlier evaluation never reached) and SOLVE (from states both reached); REACH + SOLVE =
gain (coevo/reach.py).</p>{_reach_table(reach)}
<h2>Acceptance by proposer</h2>{_acceptance_table(props) or '<p class="nodata">no proposals</p>'}
<h2>Proposals</h2>{_proposals_table(props)}
{f"<h2>Human reviews</h2>{_reviews_table(reviews)}" if reviews else ""}
</body></html>
"""


def write_report(store: Store, run: str, out_path: str | Path) -> Path:
    """Write the run's self-contained HTML report to `out_path` (folders are created); returns
    the path. Raises NotFound for an unknown run, CoevoError when the file cannot be written."""
    text = render_report(store, run)
    path = Path(out_path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise CoevoError(f"{path}: cannot write the report: {e.strerror or e}") from None
    return path
