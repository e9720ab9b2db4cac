"""`coevo train`: one RL stage (multi-turn GRPO, LoRA) under fixed assets, as a run of its own
that `--resume` continues with its stored settings (coevo/train_settings.py)."""

from __future__ import annotations

from typing import Optional

import typer

from coevo.cli import DbOption, _store, app, console, load_agent_assets
from coevo.cliflags import TrackOption, choice, not_empty, positive, run_name
from coevo.errors import CoevoError
from coevo.terminal import escaped
from coevo.train_settings import TrainSettings, resume_settings, stored_agent_assets


@app.command("train")
def train_cmd(
    ctx: typer.Context,
    harness: Optional[str] = typer.Option(None, "--harness", help="Harness name, hash or hash prefix (with --resume: the stored one)."),
    env: Optional[str] = typer.Option(None, "--env", callback=not_empty, help="e.g. bfcl:simple_python (with --resume: the stored one)"),
    steps: int = typer.Option(10, "--steps", min=1),
    group_size: int = typer.Option(4, "--group-size", min=2, help="G: samples per task (GRPO group)."),
    tasks_per_step: int = typer.Option(4, "--tasks-per-step", min=1),
    model: str = typer.Option("embedded", "--model", help="embedded | hf:PATH (local weights)"),
    run: Optional[str] = typer.Option(None, "--run", callback=run_name,
                                      help="Run name (default: train-<harness>-<env>)."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run from its latest checkpoint, with the settings it was started with (a differing flag is refused)."),
    lr: float = typer.Option(1e-4, "--lr", callback=positive),
    lora_rank: int = typer.Option(16, "--lora-rank", min=1),
    checkpoint_every: int = typer.Option(5, "--checkpoint-every", min=1),
    warmup_steps: int = typer.Option(0, "--warmup-steps", min=0, help="Supervised steps on successes first."),
    seed: int = typer.Option(0, "--seed"),
    rubric: Optional[str] = typer.Option(None, "--rubric"),
    skills: Optional[str] = typer.Option(None, "--skills"),
    executor: str = typer.Option("local", "--executor", callback=choice("local", "ray"),
                                 help="local (live policy) | ray (actors load each step's adapter)"),
    actors: int = typer.Option(2, "--actors", min=1, help="Ray actors (with --executor ray)."),
    rollout_model: Optional[str] = typer.Option(None, "--rollout-model", help="Roll out on another engine that loads each step's adapter: vllm:PATH, or a vLLM server as openai:URL?tokenizer=PATH."),
    track: Optional[str] = TrackOption,
    db: Optional[str] = DbOption,
) -> None:
    """Run one RL stage (multi-turn GRPO, LoRA) under fixed assets; checkpoints go to the store."""
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    from coevo.models.registry import load_backend
    from coevo.observer import observing
    from coevo.rl.config import LoraSettings, TrainConfig
    from coevo.rl.stage import StageConfig, rl_stage
    from coevo.rl.trainer import Trainer
    from coevo.tracking import observer_for, resumed_spec

    store = _store(db)
    given = {"env": env, "model": model, "steps": steps, "group_size": group_size,
             "tasks_per_step": tasks_per_step, "lr": lr, "lora_rank": lora_rank,
             "checkpoint_every": checkpoint_every, "warmup_steps": warmup_steps, "seed": seed}
    assets = load_agent_assets(store, harness, rubric, skills) if harness else None
    if assets is not None:
        given.update(harness=assets.harness.hash, rubric=assets.rubric and assets.rubric.hash,
                     skill_library=assets.library and assets.library.hash)
    if run is None and not (harness and env):
        raise CoevoError("train: give --harness and --env (or --run NAME with --resume)")
    name = run or f"train-{assets.harness.name}-{env.replace(':', '-')}"
    if resume:
        rec = store.get_run(name)
        # typer vendors click: compare the source by name, not with click's enum
        explicit = {k for k in given if getattr(ctx.get_parameter_source(
            "skills" if k == "skill_library" else k), "name", None) == "COMMANDLINE"}
        settings = resume_settings(name, rec.config, given, explicit)
        if settings.harness is None:
            raise CoevoError(f"run {name!r} stores no harness: give --harness")
        assets = stored_agent_assets(store, settings)
    else:
        if assets is None or env is None:
            raise CoevoError("train: give --harness and --env")
        settings = TrainSettings(**given)
        rec = store.create_run(name, config=settings.model_dump(), mode="weight-only")
        store.start_round(rec.id, 0)
    env, model, steps = settings.env, settings.model, settings.steps
    watch = observer_for(resumed_spec(track, rec.config), store,
                         lambda m: console.print(escaped(m), highlight=False))
    with store.executing(rec.id), observing(watch, rec.id):  # the lease; an error: failed
        store.set_run_status(rec.id, "running")
        with console.status(f"loading {escaped(model)}"):
            backend = load_backend(model)
        lora = LoraSettings(rank=settings.lora_rank, alpha=2.0 * settings.lora_rank)
        trainer = Trainer(backend.model, TrainConfig(lr=settings.lr, lora=lora, seed=settings.seed,
                                                     warmup_steps=settings.warmup_steps),
                          base_model=model, tokenizer=backend.tokenizer)
        cfg = StageConfig(steps=steps, tasks_per_step=settings.tasks_per_step,
                          samples=settings.group_size, seed=settings.seed,
                          checkpoint_every=settings.checkpoint_every)
        from coevo.executors import LocalExecutor, make_executor

        remote = None
        if executor != "local":
            remote = make_executor(executor, backend=rollout_model or model, num_actors=actors,
                                   judge=model)
        elif rollout_model:
            remote = LocalExecutor(load_backend(rollout_model), judge=backend)
        cols = (TextColumn("[bold]RL[/bold]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[info]}"))
        # steps take tens of seconds: estimate the speed over ten minutes (rich's default: 30 s)
        with Progress(*cols, console=console, speed_estimate_period=600.0) as bar:
            task = bar.add_task("rl", total=steps, info="")

            def on_step(log) -> None:
                bar.update(task, completed=log.index, info=(
                    f"reward {log.reward_mean:.3f} signal {log.signal_fraction:.2f} loss {log.loss:+.4f} "
                    f"kl {log.kl:.4f} {log.rollout_tokens_per_s:.0f} tok/s"))
                bar.console.print(f"step {log.step}: reward {log.reward_mean:.3f}, signal {log.signal_fraction:.2f}, "
                                  f"loss {log.loss:+.4f}, kl {log.kl:.4f}, rollout {log.rollout_tokens_per_s:.0f} tok/s, "
                                  f"train {log.train_tokens_per_s:.0f} tok/s"
                                  + (f", checkpoint {log.checkpoint[:12]}" if log.checkpoint else ""), highlight=False)
                watch.rl_step(0, log)

            result = rl_stage(store, rec.id, 0, env, assets, trainer, cfg, tokenizer=backend.tokenizer,
                              resume=resume, on_step=on_step, executor=remote, judge=backend)
        if remote is not None:
            remote.close()
        store.finish_round(rec.id, 0, summary={"rl": result.model_dump(mode="json")})
        watch.round_done(0)
        store.set_run_status(rec.id, "done")
        console.print(f"run {escaped(name)}: steps {result.start_step}..{result.end_step}, checkpoint {result.checkpoint}; "
                      f"evaluate with: coevo eval --harness {assets.harness.hash[:12]} --env {escaped(env)} "
                      f"--checkpoint {result.checkpoint}", highlight=False)
