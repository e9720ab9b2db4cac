"""The `gepa` proposer: GEPA's reflective evolutionary search over the harness's text fields.

GEPA (Agrawal et al. 2025; the `gepa` package) keeps a pool of candidates (dicts of component
name -> text), repeatedly picks one from the Pareto front, runs it on a minibatch with traces,
asks a reflection LM to rewrite one component from those traces and their feedback, keeps the
rewrite if it beats its parent on the minibatch, and scores kept candidates on a validation
set. Here:

- components = the incumbent harness's text fields (`system_prompt`, `answer_format`,
  `tool_doc_preamble` by default; only `Harness.editable_fields` that are plain text may be
  chosen), seeded with their current values;
- the system under search = coevo's own agent runtime (`run_episodes`) with the candidate's
  texts on the incumbent's harness, skills and rubric, on a policy backend from an option
  (`load_backend` spec, default "embedded"; an injected backend in tests), every candidate on
  the same sampling seeds (paired); score = the environment verifier's outcome (or the reward);
- data = a seeded sample of at most `tasks` TRAIN tasks named by the round's train
  trajectories, looked up in the environment's train split (so neither a val/test task nor a
  mislabelled trajectory can reach the search); GEPA's trainset and valset are both that
  sample;
- reflection LM = a coevo backend wrapped as str -> str (`ReflectionLM`), default the policy's
  spec, behind an optional cassette (coevo.propose.lm's JSONL record/replay, keyed by the sha256
  of the request) so tests are offline and deterministic;
- budget = `max_metric_calls` episodes (GEPA's own stopper), plus an iteration cap so a search
  whose reflection keeps failing still ends.

The result is at most ONE harness `Candidate`: GEPA's best candidate as
`incumbent.harness.child(**changed_fields)`, returned only when it scored strictly higher than
the seed on the search tasks; otherwise no candidate (GEPA found nothing better: not an invalid
proposal). Its prompt / raw_output are the reflection exchanges (each shortened). It then
passes through coevo's validation gate like any other candidate: the search score is on train
tasks and is a screening signal, not evidence.

Departures from the GEPA paper: no merge proposer (budgets here are tens of episodes, not
thousands); trainset = valset (a handful of train tasks; the real held-out check is coevo's
gate on val); an infrastructure failure scores 0 inside the search (GEPA needs a number; it is
counted and reported in the rationale) whereas the gate treats it as missing data; episodes
run on the backend given, i.e. on the incumbent's checkpoint only if that backend holds it.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import ValidationError

from coevo.assets.harness import Harness
from coevo.envs.base import Environment, Task
from coevo.errors import CoevoError
from coevo.models.base import Request, Sampling
from coevo.propose.base import Candidate, Incumbent, ProposalContext
from coevo.propose.digest import shorten
from coevo.propose.lm import Cassette, CassetteMiss, ProposerModel
from coevo.trajectory import Trajectory

log = logging.getLogger("coevo.propose.gepa")

TEXT_FIELDS = ("system_prompt", "answer_format", "tool_doc_preamble")  # plain-text editable


class ReflectionLM:
    """GEPA's `reflection_lm` (str | chat messages -> str) over a coevo backend, with a cassette.

    The backend is built lazily, so a replayed test never loads a model. Every exchange is kept
    in `exchanges` for the proposal's audit; errors are kept in `errors` because GEPA swallows
    a failed reflection (logs it and moves on) and the proposer must still report it."""

    def __init__(self, model: ProposerModel, cassette: Cassette | None = None,
                 backend: Any = None):
        self.model, self.cassette, self._backend = model, cassette, backend
        self.exchanges: list[tuple[list[dict[str, Any]], str]] = []
        self.errors: list[Exception] = []
        self.calls = 0  # model calls actually made (cassette hits excluded)

    @property
    def name(self) -> str:
        return getattr(self._backend, "name", None) or self.model.backend

    def sampling(self) -> Sampling:
        m = self.model
        return Sampling(temperature=m.temperature, top_p=m.top_p, top_k=m.top_k,
                        max_new_tokens=m.max_tokens, seed=m.seed)

    def __call__(self, prompt: str | list[dict[str, Any]]) -> str:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        sampling = self.sampling()
        try:
            output = (self.cassette.answer(messages, sampling.model_dump(mode="json"),
                                           lambda: self._generate(messages, sampling))
                      if self.cassette else self._generate(messages, sampling))
        except CoevoError as exc:  # CassetteMiss included: re-raised after the search
            self.errors.append(exc)
            raise
        self.exchanges.append((messages, output))
        return output

    def _generate(self, messages: list[dict[str, Any]], sampling: Sampling) -> str:
        if self._backend is None:
            from coevo.models.registry import load_backend

            self._backend = load_backend(self.model.backend, **self.model.options)
        self.calls += 1
        [[c]] = self._backend.generate([Request(messages=messages, sampling=sampling)])
        if c.finish_reason == "error":
            raise CoevoError(f"reflection model {self.name}: {c.error or 'generation failed'}")
        return c.text


class HarnessAdapter:
    """The `gepa.GEPAAdapter` that runs coevo's agent with a candidate's harness texts.

    GEPA's contract: never raise for one example (a candidate whose text breaks the harness
    schema scores 0 on every task with the validation error as feedback); scores are higher-is-
    better per example; trajectories only when `capture_traces`."""

    propose_new_texts = None  # use GEPA's own reflective proposer (InstructionProposalSignature)

    def __init__(self, env: Environment, incumbent: Incumbent, backend: Any, *,
                 seed: int, score: str, feedback_chars: int):
        self.env, self.incumbent, self.backend = env, incumbent, backend
        self.seed, self.score, self.feedback_chars = seed, score, feedback_chars
        self.episodes = 0
        self.tokens = 0  # prefilled + generated tokens of those episodes
        self.infra_failures = 0
        self.started: list[str] = []  # task ids run, for audit (train only, by construction)

    def harness(self, candidate: dict[str, str]) -> Harness:
        base = self.incumbent.harness
        data = base.model_dump(mode="json")
        data.update(candidate)
        return Harness.model_validate(data)

    def evaluate(self, batch: list[Task], candidate: dict[str, str], capture_traces: bool = False):
        from gepa import EvaluationBatch

        from coevo.agent.episode import run_episodes_sync

        try:
            harness = self.harness(candidate)
        except ValidationError as exc:
            err = exc.errors()[0]
            why = f"harness.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
            return EvaluationBatch(outputs=[why] * len(batch), scores=[0.0] * len(batch),
                                   trajectories=[why] * len(batch) if capture_traces else None)
        a = self.incumbent.agent_assets()
        # llm_judge criteria are answered by the policy's model, as in the loop's default
        trajs = run_episodes_sync(self.env, batch, harness, a.skills, a.rubric, self.backend,
                                  samples=1, seeds=self.seed, split="train", library=a.library,
                                  judge=self.backend)
        self.episodes += len(trajs)
        self.tokens += sum(len(t.token_ids) for t in trajs)
        self.started.extend(t.id for t in batch)
        scores = []
        for t in trajs:
            if t.infra_failed:
                self.infra_failures += 1
            value = t.reward if self.score == "reward" else t.outcome
            scores.append(float(value) if value is not None else 0.0)
        return EvaluationBatch(outputs=[_final_text(t) for t in trajs], scores=scores,
                               trajectories=list(trajs) if capture_traces else None)

    def make_reflective_dataset(self, candidate: dict[str, str], eval_batch: Any,
                                components_to_update: list[str]) -> dict[str, list[dict[str, Any]]]:
        n = self.feedback_chars
        records = []
        for t, s in zip(eval_batch.trajectories or [], eval_batch.scores):
            if isinstance(t, str):  # the candidate did not validate
                records.append({"Inputs": "(not run)", "Generated Outputs": "", "Feedback": t})
                continue
            records.append({"Inputs": shorten(_task_text(t), n),
                            "Generated Outputs": shorten(_final_text(t), n) or "(empty reply)",
                            "Feedback": _feedback(t, s)})
        return {c: records for c in components_to_update}


def _task_text(t: Trajectory) -> str:
    users = [m.get("content") for m in t.messages if m.get("role") == "user"]
    return next((u for u in reversed(users) if isinstance(u, str)), "") if users else ""


def _final_text(t: Trajectory) -> str:
    if t.turns:
        return t.turns[-1].text
    return t.answer or ""


def _feedback(t: Trajectory, score: float) -> str:
    if t.infra_failed:
        return f"The episode failed for an infrastructure reason ({t.error}); score {score:g}."
    parts = [f"Score {score:g} ({'solved' if t.success else 'not solved'} by the verifier)."]
    if t.criteria:
        parts.append("Rubric criteria: " + ", ".join(f"{k}={v:.2f}" for k, v in sorted(t.criteria.items())) + ".")
    errs = [x.parse_error for x in t.turns if x.parse_error]
    if errs:
        parts.append(f"Parse error: {errs[-1]}")
    return " ".join(parts)


class _Iterations:
    """A GEPA stopper: at most `n` iterations (a reflection that keeps failing spends no
    metric calls on the child, so the metric-call budget alone might not end the search)."""

    def __init__(self, n: int):
        self.n = n

    def __call__(self, gepa_state: Any) -> bool:
        return gepa_state.i + 1 >= self.n


class _Log:
    def log(self, message: str) -> None:
        log.debug("gepa: %s", message)


class GepaProposer:
    """See the module docstring. Options (YAML `proposers: [{name: gepa, options: {...}}]`):

    env: environment spec (default: the round's trajectories' env name); policy /
    policy_options: the backend episodes run on; reflection: the reflection model (a
    ProposerModel, spec string or dict; default the policy spec); cassette / mode: record /
    replay of reflection calls; fields: harness text fields searched; tasks: train tasks in the
    search; max_metric_calls: episodes GEPA may spend; minibatch: GEPA's reflection minibatch;
    max_iterations: iteration cap (default max_metric_calls); score: "outcome" or "reward";
    exchange_chars: per-exchange cap on the stored prompt / raw output; policy_backend /
    reflection_backend: already built backends (tests, a shared engine)."""

    def __init__(self, env: str | Environment | None = None, policy: str = "embedded",
                 policy_options: dict[str, Any] | None = None,
                 reflection: ProposerModel | str | dict[str, Any] | None = None,
                 cassette: str | None = None, mode: str = "auto",
                 fields: Sequence[str] = TEXT_FIELDS, tasks: int = 4,
                 max_metric_calls: int = 16, minibatch: int = 2,
                 max_iterations: int | None = None,
                 score: Literal["outcome", "reward"] = "outcome", seed: int = 0,
                 exchange_chars: int = 4000, feedback_chars: int = 400,
                 policy_backend: Any = None, reflection_backend: Any = None,
                 name: str = "gepa"):
        fields = tuple(fields)
        bad = [f for f in fields if f not in TEXT_FIELDS or f not in Harness.editable_fields]
        if bad or not fields or len(set(fields)) != len(fields):
            raise ValueError(f"fields: {bad or list(fields)}; choose distinct ones of "
                             f"{', '.join(TEXT_FIELDS)}")
        if tasks < 1 or minibatch < 1 or max_metric_calls < 1:
            raise ValueError("tasks, minibatch and max_metric_calls must be >= 1")
        if score not in ("outcome", "reward"):
            raise ValueError(f"score: {score!r}; expected outcome or reward")
        if mode not in ("record", "replay", "auto", "off"):
            raise ValueError(f"mode: {mode!r}; expected record, replay, auto or off")
        self.env, self.policy, self.policy_options = env, policy, dict(policy_options or {})
        self.reflection = ProposerModel.parse(
            reflection if reflection is not None else {"backend": policy,
                                                       "options": self.policy_options})
        self.cassette, self.mode = cassette, mode
        self.fields, self.tasks, self.minibatch = fields, tasks, minibatch
        self.max_metric_calls = max_metric_calls
        self.max_iterations = max_iterations or max_metric_calls
        self.score, self.seed = score, seed
        self.exchange_chars, self.feedback_chars = exchange_chars, feedback_chars
        self._policy, self.reflection_backend = policy_backend, reflection_backend
        self.name = name
        # The latest search, for inspection: GEPA's result, the reflection LM (its exchanges)
        # and the adapter (episodes run, task ids started).
        self.last_result: Any = None
        self.last_reflection: ReflectionLM | None = None
        self.last_adapter: HarnessAdapter | None = None
        # What the latest search spent, in the loop's budget kinds (the loop charges one
        # proposer call per proposer; these episodes are on top of it, see the report).
        self.last_cost: dict[str, float] = {}

    # -- what the search runs on --

    def _policy_backend(self) -> Any:
        if self._policy is None:
            from coevo.models.registry import load_backend

            self._policy = load_backend(self.policy, **self.policy_options)
        return self._policy

    def _environment(self, trajs: Sequence[Trajectory]) -> Environment:
        from coevo.executors import resolve_env

        env = self.env if self.env is not None else trajs[0].env
        return resolve_env(env)

    def search_tasks(self, ctx: ProposalContext, env: Environment) -> list[Task]:
        """At most `tasks` train tasks named by the round's train trajectories: a seeded
        sample (seed, round) of the ids, each looked up in the environment's TRAIN split."""
        ids = list(dict.fromkeys(t.task_id for t in ctx.trajectories if t.split == "train"))
        by_id = {t.id: t for t in env.tasks("train")}
        known = [i for i in ids if i in by_id]
        rng = random.Random(f"gepa:{self.seed}:{ctx.seed}:{ctx.round}")
        picked = rng.sample(known, min(self.tasks, len(known)))
        return [by_id[i] for i in picked]

    # -- the proposer --

    def propose(self, ctx: ProposalContext) -> list[Candidate]:
        import gepa

        train = [t for t in ctx.trajectories if t.split == "train" and not t.infra_failed]
        if not train:
            return []  # nothing to search on this round
        harness = ctx.incumbent.harness
        env = self._environment(train)
        tasks = self.search_tasks(ctx, env)
        if not tasks:
            return [Candidate(asset=None, proposer=self.name, kind="harness",
                              error=f"none of the round's train task ids is in {env.name}'s "
                                    "train split (is `env` the environment the run uses?)")]
        tape = (Cassette(self.cassette, self.mode)
                if self.cassette is not None and self.mode != "off" else None)
        lm = ReflectionLM(self.reflection, tape, self.reflection_backend)
        adapter = HarnessAdapter(env, ctx.incumbent, self._policy_backend(),
                                 seed=self.seed + ctx.seed, score=self.score,
                                 feedback_chars=self.feedback_chars)
        seed_candidate = {f: getattr(harness, f) for f in self.fields}
        result = gepa.optimize(
            seed_candidate=seed_candidate, trainset=tasks, valset=tasks, adapter=adapter,
            reflection_lm=lm, reflection_minibatch_size=min(self.minibatch, len(tasks)),
            max_metric_calls=self.max_metric_calls, stop_callbacks=[_Iterations(self.max_iterations)],
            module_selector="round_robin", use_merge=False, seed=self.seed + ctx.round,
            logger=_Log(), display_progress_bar=False, raise_on_exception=True)
        self.last_result, self.last_reflection, self.last_adapter = result, lm, adapter
        self.last_cost = {"rollouts": float(adapter.episodes), "tokens": float(adapter.tokens),
                          "proposer_calls": float(len(lm.exchanges))}
        miss = next((e for e in lm.errors if isinstance(e, CassetteMiss)), None)
        if miss is not None:
            raise miss  # a silently different test is worse than a failing one (lm.py)
        return self._candidate(ctx, result, seed_candidate, lm, adapter, len(tasks))

    def _candidate(self, ctx: ProposalContext, result: Any, seed_candidate: dict[str, str],
                   lm: ReflectionLM, adapter: HarnessAdapter, n_tasks: int) -> list[Candidate]:
        harness = ctx.incumbent.harness
        scores = result.val_aggregate_scores
        best_i = result.best_idx
        best = result.candidates[best_i]
        changed = {f: best[f] for f in self.fields if best.get(f) != seed_candidate[f]}
        prompt, raw = self._exchanges(lm)
        if not changed or scores[best_i] <= scores[0]:
            if lm.errors and not lm.exchanges:
                return [Candidate(asset=None, proposer=self.name, kind="harness",
                                  error=f"gepa: every reflection call failed: {lm.errors[-1]}",
                                  prompt=prompt, raw_output=raw)]
            log.info("gepa: no candidate beat the incumbent (%.3f) in %d candidates",
                     scores[0], len(scores))
            return []
        fields_text = ", ".join(sorted(changed))
        rationale = (f"GEPA reflective search over {', '.join(self.fields)} on {n_tasks} train "
                     f"task(s) of round {ctx.round}: the best of {len(scores)} candidates "
                     f"(changed: {fields_text}) scored {scores[best_i]:.3f} vs the incumbent's "
                     f"{scores[0]:.3f} ({self.score}, mean; {adapter.episodes} episodes, "
                     f"{adapter.infra_failures} infra failures scored 0, "
                     f"{len(lm.exchanges)} reflection calls on {lm.name})")
        effect = (f"{scores[best_i] - scores[0]:+.3f} mean {self.score} on the search tasks "
                  "(train; the validation gate decides)")
        try:
            asset = harness.child(**changed)
        except ValidationError as exc:
            err = exc.errors()[0]
            return [Candidate(asset=None, proposer=self.name, kind="harness",
                              error=f"harness.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}",
                              rationale=rationale, prompt=prompt, raw_output=raw)]
        return [Candidate(asset=asset, proposer=self.name, kind="harness", rationale=rationale,
                          predicted_effect=effect, prompt=prompt, raw_output=raw)]

    def _exchanges(self, lm: ReflectionLM) -> tuple[str, str]:
        n = self.exchange_chars
        prompts = [shorten(json.dumps(m, ensure_ascii=False), n) for m, _ in lm.exchanges]
        outputs = [shorten(o, n) for _, o in lm.exchanges]
        sep = "\n\n<<<NEXT REFLECTION CALL>>>\n\n"
        return sep.join(prompts), sep.join(outputs)

