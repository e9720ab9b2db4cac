"""The `coevo` command line. Each command is a few lines calling the library; its docstring is
its help. Errors a user can act on print as one line and exit non-zero (coevo/oneline.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from coevo import cli_output as out
from coevo.cli_output import JsonOption
from coevo.errors import CoevoError
from coevo.cliflags import TrackOption, choice, not_empty, proposal_status
from coevo.oneline import OneLineGroup
from coevo.terminal import escaped, safe

app = typer.Typer(cls=OneLineGroup, no_args_is_help=True, add_completion=False,
                  help="Model-harness co-evolution: RL on the weights, gated revisions of the "
                       "harness, skills and rubrics, every decision stored for review.")
harness_app = typer.Typer(no_args_is_help=True, help="Harness versions: list, show, diff, export.")
skills_app = typer.Typer(no_args_is_help=True, help="Skill versions: list, show.")
rubrics_app = typer.Typer(no_args_is_help=True, help="Rubric versions: list, show.")
db_app = typer.Typer(no_args_is_help=True, help="The store's schema: upgrade, current.")
runs_app = typer.Typer(no_args_is_help=True, help="Co-evolution runs: list, show.")
proposals_app = typer.Typer(no_args_is_help=True,
                            help="Proposals and their gate decisions: list, show, approve, veto.")
app.add_typer(harness_app, name="harness")
app.add_typer(skills_app, name="skills")
app.add_typer(rubrics_app, name="rubrics")
app.add_typer(db_app, name="db")
app.add_typer(runs_app, name="runs")
app.add_typer(proposals_app, name="proposals")

console = Console()

DbOption = typer.Option(None, "--db", help="Store URL or SQLite path (default: $COEVO_DB or ./coevo.db).")


@app.callback()
def _main() -> None:
    # Offline by design: no hub id is ever contacted; litellm (via dspy) must not fetch its
    # cost map either. Set before any of those libraries is imported.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def _store(db: Optional[str]):
    from coevo.store import Store

    return Store.open(db)


def seed_root(assets: Optional[Path]) -> Path:
    """Where seed assets live: --assets, else the current folder when it has harnesses/, else
    the source checkout this package was installed from (an editable install)."""
    if assets is not None:
        if not (assets / "harnesses").is_dir():
            what = "does not exist" if not assets.exists() else "has no harnesses/ folder"
            raise CoevoError(f"--assets {assets}: {what} (a seed folder holds harnesses/ "
                             "skills/ rubrics/)")
        return assets
    here = Path.cwd()
    if (here / "harnesses").is_dir():
        return here
    checkout = Path(__file__).resolve().parent.parent
    if (checkout / "harnesses").is_dir():
        return checkout
    raise CoevoError("no seed assets found: run in a folder with harnesses/ skills/ rubrics/ or pass --assets")


def _short(h: Optional[str]) -> str:
    return h[:12] if h else "-"


# ---------------------------------------------------------------------------------------------
# Store and seed assets


@app.command()
def init(
    assets: Optional[Path] = typer.Option(None, "--assets", help="Folder holding harnesses/ skills/ rubrics/."),
    db: Optional[str] = DbOption,
) -> None:
    """Create or upgrade the store and import the seed assets (all or nothing)."""
    from coevo.assets import load_seed_dir

    root = seed_root(assets)
    found = load_seed_dir(root)  # every file validated before anything is written
    store = _store(db)
    known = {r.hash for r in store.list_assets()}
    with store.transaction():
        hashes = [store.put_asset(a) for a in found]
    table = Table(title=f"seed assets from {root}")
    for col in ("kind", "name", "version", "status"):
        table.add_column(col)
    for a, h in zip(found, hashes):
        table.add_row(a.kind, a.name, _short(h), "exists" if h in known else "new")
    out.show(console, table)
    console.print(f"store: {store.url} (schema {store.current_revision()})")


@db_app.command("upgrade")
def db_upgrade(db: Optional[str] = DbOption) -> None:
    """Apply every pending migration."""
    from coevo.store import Store

    store = Store.open(db, migrate=False)
    before = store.current_revision()
    store.upgrade()
    console.print(f"{store.url}: {before or '(blank)'} -> {store.current_revision()}")


@db_app.command("current")
def db_current(db: Optional[str] = DbOption) -> None:
    """Print the store's schema revision and the newest one this coevo knows."""
    from coevo.store import Store

    store = Store.open(db, migrate=False)
    console.print(f"current: {store.current_revision() or '(blank)'}  head: {store.head_revision()}")


# ---------------------------------------------------------------------------------------------
# Versions: list / show / diff / export. A reference is a name (latest version), a full hash
# or a unique hash prefix.


def _list(kind: str, db: Optional[str], as_json: bool) -> None:
    store = _store(db)
    rows = store.list_assets(kind)
    table = Table(title=f"{kind} versions")
    for col in ("name", "version", "parent", "created"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.name, _short(r.hash), _short(r.parent), r.created_at.strftime("%Y-%m-%d %H:%M:%S"))
    out.emit(console, as_json, lambda: out.assets_doc(store, kind), lambda: table)


def _show(kind: str, ref: str, db: Optional[str], as_json: bool) -> None:
    from coevo.assets import format_asset

    store = _store(db)
    if as_json:
        return out.print_json(out.asset_doc(store, kind, ref))
    rec = store.resolve(kind, ref)
    asset = store.get_asset(kind, rec.hash)
    console.print(f"# {kind} {rec.name} {rec.hash} (parent {_short(rec.parent)})", highlight=False, soft_wrap=True)
    # Plain print: rich markup would eat brackets inside prompts and schemas; `safe` shows
    # what YAML leaves raw (bidi overrides) as escapes.
    sys.stdout.write(safe(format_asset(asset)))
    sys.stdout.flush()


@harness_app.command("list")
def harness_list(db: Optional[str] = DbOption, as_json: bool = JsonOption) -> None:
    """List stored harness versions."""
    _list("harness", db, as_json)


@harness_app.command("show")
def harness_show(ref: str, db: Optional[str] = DbOption, as_json: bool = JsonOption) -> None:
    """Print a harness version as its YAML file."""
    _show("harness", ref, db, as_json)


@harness_app.command("diff")
def harness_diff(a: str, b: str, db: Optional[str] = DbOption) -> None:
    """Field-level unified diff between two harness versions."""
    from coevo.assets import format_diff

    store = _store(db)
    sys.stdout.write(safe(format_diff(store.get_asset("harness", a), store.get_asset("harness", b))))


@harness_app.command("export")
def harness_export(
    ref: str,
    out: Optional[Path] = typer.Option(None, "--out", help="File to write (default: stdout)."),
    openai: Optional[Path] = typer.Option(None, "--openai", help="Write an OpenAI chat-completions request body (JSON) instead."),
    db: Optional[str] = DbOption,
) -> None:
    """Write a harness version back to an editable YAML file (or an OpenAI request body)."""
    from coevo.assets import dump_asset, format_asset

    if openai is not None:
        from coevo.cli_io import export_openai

        return export_openai(ref, openai, db)
    asset = _store(db).get_asset("harness", ref)
    if out is None:  # verbatim into a pipe or file; a terminal gets control characters escaped
        text = format_asset(asset)
        sys.stdout.write(safe(text) if sys.stdout.isatty() else text)
    else:
        console.print(f"wrote {dump_asset(asset, out)}")


@skills_app.command("list")
def skills_list(db: Optional[str] = DbOption, as_json: bool = JsonOption) -> None:
    """List stored skill versions."""
    _list("skill", db, as_json)


@skills_app.command("show")
def skills_show(ref: str, db: Optional[str] = DbOption, as_json: bool = JsonOption) -> None:
    """Print a skill version as its SKILL.md."""
    _show("skill", ref, db, as_json)


@rubrics_app.command("list")
def rubrics_list(db: Optional[str] = DbOption, as_json: bool = JsonOption) -> None:
    """List stored rubric versions."""
    _list("rubric", db, as_json)


@rubrics_app.command("show")
def rubrics_show(ref: str, db: Optional[str] = DbOption, as_json: bool = JsonOption) -> None:
    """Print a rubric version as its YAML file."""
    _show("rubric", ref, db, as_json)


# ---------------------------------------------------------------------------------------------
# Running agents


def load_agent_assets(store, harness: str, rubric: Optional[str], skills: Optional[str]):
    """AgentAssets from stored versions. The rubric defaults to the one named like the
    harness (seed pairs share names); the skill library to `seed` when it exists."""
    from coevo.errors import NotFound
    from coevo.executors import AgentAssets

    h = store.get_asset("harness", harness)
    r = None
    try:
        r = store.get_asset("rubric", rubric or h.name)
    except NotFound:
        if rubric:
            raise
    lib, members = None, []
    try:
        lib, members = store.get_library(skills or "seed")
    except NotFound:
        if skills:
            raise
    return AgentAssets(harness=h, rubric=r, library=lib, skills=members)


@app.command("eval")
def eval_cmd(
    harness: str = typer.Option(..., "--harness", help="Harness name, hash or hash prefix."),
    env: str = typer.Option(..., "--env", callback=not_empty, help="e.g. bfcl:simple_python, rg:basic_arithmetic"),
    split: str = typer.Option("val", "--split", callback=choice("train", "val", "test"), help="train | val | test"),
    n: Optional[int] = typer.Option(None, "--n", min=1, help="Number of tasks (default: the whole split)."),
    samples: int = typer.Option(1, "--samples", min=1, help="Episodes per task."),
    model: str = typer.Option("embedded", "--model", help="embedded | hf:PATH | openai:URL[?tokenizer=PATH] | llamacpp:PATH | vllm:PATH"),
    checkpoint: Optional[str] = typer.Option(None, "--checkpoint", help="Stored checkpoint (LoRA adapter): id, sha256 or a unique prefix of either."),
    rubric: Optional[str] = typer.Option(None, "--rubric", help="Rubric version (default: named like the harness)."),
    skills: Optional[str] = typer.Option(None, "--skills", help="Skill library version (default: seed)."),
    seed: int = typer.Option(0, "--seed"),
    executor: str = typer.Option("local", "--executor", callback=choice("local", "ray"), help="local | ray"),
    track: Optional[str] = TrackOption,
    db: Optional[str] = DbOption,
    as_json: bool = JsonOption,
) -> None:
    """Evaluate fixed assets (+ checkpoint) on a split; store every trajectory and result."""
    from coevo.cli_progress import Bars
    from coevo.evaluate import evaluate
    from coevo.executors import make_executor
    from coevo.models.registry import load_backend
    from coevo.oneline import err

    store = _store(db)
    assets = load_agent_assets(store, harness, rubric, skills)
    ui = err if as_json else console  # with --json, stdout holds the document only
    with ui.status(f"loading {escaped(model)}"):
        backend = load_backend(model) if executor == "local" else None
    # llm_judge criteria are answered by the policy's own model (as in a run without `judge`)
    ex = make_executor(executor, backend=model, judge=model) if executor != "local" else None
    with Bars(ui) as bars:
        result = evaluate(store, env, assets, backend, split=split, n=n, samples=samples,
                          seed=seed, checkpoint=checkpoint, executor=ex, judge=backend,
                          progress=bars.counter(f"eval {env} {split}"))
    out.emit(console, as_json, lambda: result.model_dump(mode="json"),
             lambda: out.eval_table(result))
    if track:
        from coevo.tracking.observer import track_evaluation

        track_evaluation(track, result, dict(harness=assets.harness.hash, env=env, split=split, n=n,
                         samples=samples, model=model, checkpoint=checkpoint, seed=seed),
                         say=lambda m: console.print(escaped(m), highlight=False))



# ---------------------------------------------------------------------------------------------
# Audit: what was proposed, what the gate decided and why.


@runs_app.command("list")
def runs_list(db: Optional[str] = DbOption, as_json: bool = JsonOption) -> None:
    """List runs with their rounds, acceptances and last validation score."""
    from coevo.audit import runs_table

    store = _store(db)
    out.emit(console, as_json, lambda: out.runs_doc(store), lambda: runs_table(store))


@runs_app.command("show")
def runs_show(run: str, db: Optional[str] = DbOption, as_json: bool = JsonOption) -> None:
    """Rounds (val and test scores, incumbent versions), budgets and checkpoints of a run."""
    from coevo.audit import run_view

    store = _store(db)
    out.emit(console, as_json, lambda: out.run_doc(store, run), lambda: run_view(store, run))


@proposals_app.command("list")
def proposals_list(
    run: Optional[str] = typer.Option(None, "--run", help="Only this run (id or name)."),
    status: Optional[str] = typer.Option(None, "--status", callback=proposal_status,
                                         help="accepted | rejected | invalid | pending"),
    db: Optional[str] = DbOption,
    as_json: bool = JsonOption,
) -> None:
    """List proposals with the gate's reason for each decision."""
    from coevo.audit import proposals_table

    store = _store(db)
    out.emit(console, as_json, lambda: out.proposals_doc(store, run, status),
             lambda: proposals_table(store, run=run, status=status))


@proposals_app.command("stats")
def proposals_stats(
    run: Optional[str] = typer.Option(None, "--run", help="Only this run (id or name)."),
    db: Optional[str] = DbOption,
    as_json: bool = JsonOption,
) -> None:
    """Per proposer: valid rate, gated, accept rate and the mean accepted gain."""
    from coevo.proposer_stats import proposer_stats, stats_table

    store = _store(db)
    out.emit(console, as_json, lambda: [s.doc() for s in proposer_stats(store, run)],
             lambda: stats_table(store, run=run))


@proposals_app.command("show")
def proposals_show(
    id: str,
    prompt: bool = typer.Option(False, "--prompt", help="Also print the proposer's prompt and raw output."),
    db: Optional[str] = DbOption,
    as_json: bool = JsonOption,
) -> None:
    """A proposal: diff against its parent, rationale, per-task evidence, statistics, reason."""
    from coevo.audit import find_proposal, proposal_view

    store = _store(db)
    p = find_proposal(store, id)
    out.emit(console, as_json, lambda: out.proposal_doc(store, p),
             lambda: proposal_view(store, p.id, show_prompt=prompt))


def _review(id: str, decision: str, by: str, note: str, db: Optional[str]) -> None:
    from coevo.audit import find_proposal

    store = _store(db)
    p = find_proposal(store, id)
    store.add_review(p.id, decision=decision, by=by, note=note)
    console.print(f"{decision} of proposal {p.id[:12]} by {escaped(by.strip())} recorded; the run "
                  "applies it at its next round start", highlight=False)


ByOption = typer.Option(..., "--by", help="Who reviews (stored with the review).")
NoteOption = typer.Option("", "--note", help="Why (stored with the review).")


@proposals_app.command("approve")
def proposals_approve(id: str, by: str = ByOption, note: str = NoteOption,
                      db: Optional[str] = DbOption) -> None:
    """Approve a candidate the gate passed and the run holds for review (gate.human_review)."""
    _review(id, "approve", by, note, db)


@proposals_app.command("veto")
def proposals_veto(id: str, by: str = ByOption, note: str = NoteOption,
                   db: Optional[str] = DbOption) -> None:
    """Veto a candidate the gate passed and the run holds for review: it is rejected."""
    _review(id, "veto", by, note, db)


@app.command()
def lineage(
    version: str,
    kind: Optional[str] = typer.Option(None, "--kind", callback=choice("harness", "skill", "skill_library", "rubric"),
                                       help="harness | skill | skill_library | rubric"),
    db: Optional[str] = DbOption,
    as_json: bool = JsonOption,
) -> None:
    """Tree of a version's ancestors and descendants, with the status of each proposal."""
    from coevo.audit import lineage_tree

    store = _store(db)
    out.emit(console, as_json, lambda: out.lineage_doc(store, version, kind),
             lambda: lineage_tree(store, version, kind=kind))


@app.command()
def report(
    run: str,
    out: Path = typer.Option(Path("report.html"), "--out", "-o", help="HTML file to write."),
    db: Optional[str] = DbOption,
) -> None:
    """Write a self-contained HTML report of a run (plots and the proposals table)."""
    from coevo.report import write_report

    console.print(f"wrote {write_report(_store(db), run, out)}")


@app.command()
def serve(
    db: Optional[str] = DbOption,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (loopback by default)."),
    port: int = typer.Option(8765, "--port", min=0, max=65535, help="Port to listen on (0: any free port)."),
    review: bool = typer.Option(False, "--review", help="Add approve / veto of held candidates."),
    token: Optional[str] = typer.Option(None, "--token", help="Review token (default: "
                                        "$COEVO_SERVE_TOKEN); required with --review off loopback."),
) -> None:
    """Reviewer web app: runs, rounds, proposals with their evidence, blame, lineage."""
    from coevo.serve import serve as serve_app

    serve_app(db, host=host, port=port, review=review, token=token,
              echo=lambda m: console.print(escaped(m), highlight=False, soft_wrap=True))


# ---------------------------------------------------------------------------------------------
# The main job


@app.command("run")
def run_cmd(
    config: Optional[Path] = typer.Argument(None, help="Run config YAML (see training/)."),
    overrides: Optional[list[str]] = typer.Argument(None, help="Dotted overrides: rounds=3 gate.alpha=0.1"),
    resume: Optional[str] = typer.Option(None, "--resume", help="Continue this run where it stopped."),
    track: Optional[str] = TrackOption,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the gate's power (minimum "
                                 "detectable effect, val_n for gate.target_effect); load no "
                                 "model, write nothing."),
    db: Optional[str] = DbOption,
) -> None:
    """Run the co-evolution loop: RL stage, proposals, validation gate, per round; then test."""
    from coevo.config import RunConfig
    from coevo.tracking import with_track_flag

    if config is None and resume is None:
        raise CoevoError("give a run config YAML, or --resume RUN")
    if dry_run:
        from coevo.gateplan import dry_run as power_lines
        from coevo.store.queries import open_readonly

        if config is None:
            with open_readonly(db) as store:
                cfg = RunConfig.of_run(store.get_run(resume).config, overrides or ())
        else:
            cfg = RunConfig.load(config, overrides or ())
        for line in power_lines(cfg, db, resume):
            console.print(escaped(line), highlight=False, soft_wrap=True)
        return
    store = _store(db)
    if config is None:  # resume from the config stored with the run
        cfg = RunConfig.of_run(store.get_run(resume).config, overrides or ())
    else:
        cfg = RunConfig.load(config, overrides or ())
    _run_and_summarise(with_track_flag(cfg, track), store, resume)


def _run_and_summarise(cfg, store, resume: Optional[str]) -> None:
    import time

    from coevo.loop import run_coevolution

    from coevo.cli_progress import Bars

    t0 = time.perf_counter()
    with Bars(console) as bars:  # messages print above the live bars
        res = run_coevolution(cfg, store, resume=resume, on_count=bars,
                              progress=lambda m: console.print(escaped(m), highlight=False))
    console.print(f"\n[bold]run {escaped(res.name)}[/bold] ({res.run[:12]}) finished in {time.perf_counter() - t0:.0f} s")
    def score(summary: dict, key: str) -> str:
        val, ci = summary.get(f"{key}_score"), summary.get(f"{key}_ci") or [None, None]
        if val is None:
            return "n/a"
        return f"{val:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if None not in ci else "")

    if res.rounds and "val_start_score" in res.rounds[0]:
        console.print(f"val before: {score(res.rounds[0], 'val_start')} (seed assets, base model)",
                      highlight=False)
    for i, summary in enumerate(res.rounds):
        spent = summary.get("spent", {})
        console.print(f"round {i}: val {score(summary, 'val')}, {len(summary.get('accepted', []))} "
                      f"accepted, {spent.get('rollouts', 0):.0f} rollouts", highlight=False)
    if res.rounds:
        console.print(f"val after: {score(res.rounds[-1], 'val')} (final incumbent and checkpoint)",
                      highlight=False)
    for p in store.proposals(run=res.run):
        reason = (p.error or "")
        decisions = store.decisions(p.id)
        if decisions:
            reason = decisions[-1].reason
        console.print(f"  {p.status:9} {escaped(f'{p.proposer:10}')} {escaped(reason[:160])}",
                      highlight=False)
    if res.final is not None:
        console.print(f"test: {res.final.line()}", highlight=False)
        start = (res.rounds[0].get("evaluations") or {}).get("test_start") if res.rounds else None
        if start is not None:
            from coevo.evaluate import paired_difference, task_outcomes

            d, lo, hi, n = paired_difference(
                task_outcomes(store.get_evaluation(res.final.evaluation)),
                task_outcomes(store.get_evaluation(start)))
            gap = "-" if d is None else f"{d:+.3f}" + ("" if lo is None else f" [{lo:+.3f}, {hi:+.3f}]")
            console.print(f"test, seed assets and base model vs final: {score(res.rounds[0], 'test_start')}"
                          f" -> {res.final.mean:.3f}; paired difference {gap} over {n} tasks "
                          "(Student-t)", highlight=False)
    name = escaped(res.name)
    console.print(f"audit: coevo serve (in a browser) | coevo runs show {name} | "
                  f"coevo proposals list --run {name} | coevo report {name} --out report.html",
                  highlight=False)


@app.command()
def quickstart(
    rounds: int = typer.Option(2, "--rounds", min=1),
    seed: Optional[int] = typer.Option(
        None, "--seed", help="Run seed: RL sampling, shuffles and the gate's per-task seeds "
        "(default: the config's, 0); the val and test tasks stay the frozen split."),
    db: Optional[str] = DbOption,
) -> None:
    """Initialise the store and run a small gated co-evolution on the embedded default model."""
    import time

    from coevo.config import RunConfig

    init(assets=None, db=db)
    root = seed_root(None)
    name = f"quickstart-{time.strftime('%Y%m%d-%H%M%S')}"
    over = [f"name={name}", f"rounds={rounds}"] + ([f"seed={seed}"] if seed is not None else [])
    cfg = RunConfig.load(root / "training" / "quickstart.yaml", over)
    store = _store(db)
    _run_and_summarise(cfg, store, None)
    from coevo.report import write_report

    out = write_report(store, name, Path(f"{name}.html"))
    console.print(f"report: {out}")


import coevo.cli_io  # noqa: E402,F401  (registers the import/export commands)
import coevo.cli_compare  # noqa: E402,F401  (registers `coevo compare-checkpoints`)
import coevo.cli_train  # noqa: E402,F401  (registers `coevo train`)

if __name__ == "__main__":  # pragma: no cover
    app()
