"""Rubrics: weighted criteria that give partial credit next to the verified outcome.

The reward the runtime computes (coevo/rewards.py) is

    reward = outcome_weight * outcome + sum_i(w_i * c_i) / sum_i(w_i)

where `outcome` is the environment verifier's score and `c_i` in [0, 1] is criterion i's score.
A criterion that cannot be scored (an LLM judge that failed) is missing data and drops out of
both sums, never a zero.

Criterion kinds (a discriminated union on `kind`, each with its own validated `params`):
- outcome: the verifier's outcome, or one of its partial-credit `details` (e.g. BFCL's).
- regex: a pattern searched in the extracted answer or the full final text, by RE2 (linear
  time, coevo/linear_regex.py: no backreferences or lookaround).
- json_schema: the answer parsed as JSON validates against a schema.
- tool_called: properties of the final turn's tool calls. With no constraints it pays for any
  call that decodes; `name_in_offered` pays only when every called name is one of the task's
  offered functions, the guard FACTS.md motivates (a "decodes" reward was hacked by copying the
  worked example's call verbatim).
- python: a "pkg.module:func" check, which must be registered (coevo/checks.py: by the
  project, or a plugin's `coevo.checks` entry point). The syntax is checked here; rubric files
  and proposals naming an unregistered check are refused where they come in (coevo.assets.io,
  coevo.propose.base.check_candidate), and the callable is imported only at reward time.
- llm_judge: a question put to a model, answered on a 0..scale scale.

Predicates rubrics (DARS-style, dependency-aware): a criterion may list `requires`, ids of
criteria that must pass (score >= 0.5, as paid) before it pays; with a failed prerequisite it
pays 0, with a missing one it is missing (coevo.rewards.paid_criteria), so partial credit
follows the dependency order. Unknown ids and cycles are schema errors (`PrerequisiteCycle`
names the cycle). The stored per-criterion scores stay the raw check results; the reward
applies the prerequisites. Departure from DARS: the predicates are coevo's criterion kinds
(not a separate predicate language), and the validity gate's partial-credit AUC still reads
the raw scores.

Weights are data a proposer may revise, but a revision may not lower the verified outcome's
share of the reward (`Rubric.outcome_share`), and rubric candidates are gated on how well their
partial credit AND the trainer's whole reward predict the verified outcome (coevo/validity.py),
so a rubric that pays for unverified progress cannot win by itself.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import (BaseModel, ConfigDict, Field, JsonValue, field_validator, model_serializer,
                      model_validator)

from coevo.assets.base import Asset, LimitedText, Text
from coevo.assets.harness import ASSET_NAME, check_json_schema
from coevo.assets.io import PATTERN_HINTS
from coevo.linear_regex import compile_pattern

CRITERION_ID = r"^[a-z0-9]+(?:[_-][a-z0-9]+)*$"
CALLABLE_REF = r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$"
PATTERN_HINTS[CRITERION_ID] = "a lowercase slug (letters, digits, single - or _)"
PATTERN_HINTS[CALLABLE_REF] = "'package.module:function'"


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OutcomeParams(_Params):
    # None: the verifier's outcome; a name: that key of the environment's Score.details.
    detail: str | None = Field(None, min_length=1, max_length=64)


class RegexParams(_Params):
    pattern: str = Field(min_length=1, max_length=1000)
    target: Literal["answer", "text"] = "answer"  # extracted answer, or the whole final text
    must_match: bool = True  # False: pays when the pattern is absent (e.g. no refusal phrase)
    ignore_case: bool = False

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, v: str) -> str:
        # Matched by RE2 (coevo/linear_regex.py): a proposal's pattern runs in linear time.
        try:
            compile_pattern(v)
        except ValueError as e:
            raise ValueError(f"does not compile: {e}") from None
        return v


class JsonSchemaParams(_Params):
    json_schema: dict[str, JsonValue]
    target: Literal["answer", "text"] = "answer"

    @field_validator("json_schema")
    @classmethod
    def _valid(cls, v: dict[str, Any]) -> dict[str, Any]:
        check_json_schema(v)
        return v


class ToolCalledParams(_Params):
    name_in_offered: bool = False  # every called name is one of the task's offered functions
    name: str | None = Field(None, min_length=1, max_length=64)  # a call to exactly this name
    required_args: bool = False  # the called function's required parameters are all given
    args_match: bool = False  # argument values match (the environment's score details decide)


class PythonParams(_Params):
    callable: str = Field(pattern=CALLABLE_REF, max_length=200)
    kwargs: dict[str, JsonValue] = Field(default_factory=dict)


class LlmJudgeParams(_Params):
    question: LimitedText(4000, min_length=1)
    scale: int = Field(5, ge=1, le=100)  # the judge answers 0..scale; the score is n / scale


class _CriterionBase(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str = Field(min_length=1, max_length=64, pattern=CRITERION_ID)
    description: Text = ""
    weight: float = Field(1.0, ge=0.0, le=100.0)
    # Prerequisites (predicates rubrics): ids of criteria that must pass for this one to pay.
    requires: list[Annotated[str, Field(pattern=CRITERION_ID, max_length=64)]] = Field(
        default_factory=list, max_length=8)

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> Any:
        data = handler(self)
        # Left out when empty, so a rubric hashes as it did before prerequisites existed.
        if isinstance(data, dict) and not data.get("requires"):
            data.pop("requires", None)
        return data


class OutcomeCriterion(_CriterionBase):
    kind: Literal["outcome"]
    params: OutcomeParams = Field(default_factory=OutcomeParams)


class RegexCriterion(_CriterionBase):
    kind: Literal["regex"]
    params: RegexParams


class JsonSchemaCriterion(_CriterionBase):
    kind: Literal["json_schema"]
    params: JsonSchemaParams


class ToolCalledCriterion(_CriterionBase):
    kind: Literal["tool_called"]
    params: ToolCalledParams = Field(default_factory=ToolCalledParams)


class PythonCriterion(_CriterionBase):
    kind: Literal["python"]
    params: PythonParams


class LlmJudgeCriterion(_CriterionBase):
    kind: Literal["llm_judge"]
    params: LlmJudgeParams


Criterion = Annotated[
    Union[
        OutcomeCriterion,
        RegexCriterion,
        JsonSchemaCriterion,
        ToolCalledCriterion,
        PythonCriterion,
        LlmJudgeCriterion,
    ],
    Field(discriminator="kind"),
]
PASS = 0.5  # a prerequisite passes when its (paid) score is at least this


class PrerequisiteCycle(ValueError):
    """Criteria that require each other, directly or through others: none could ever pay."""


def prerequisite_order(criteria: Any) -> list[str]:
    """Criterion ids with every prerequisite before the criteria that require it (input order
    otherwise). An unknown prerequisite is a ValueError; a cycle a PrerequisiteCycle naming it.

    >>> from types import SimpleNamespace as C
    >>> prerequisite_order([C(id="b", requires=["a"]), C(id="a", requires=[])])
    ['a', 'b']
    >>> prerequisite_order([C(id="a", requires=["b"]), C(id="b", requires=["a"])])
    Traceback (most recent call last):
    ...
    coevo.assets.rubric.PrerequisiteCycle: prerequisite cycle: a -> b -> a
    """
    req = {c.id: list(c.requires) for c in criteria}
    for cid, pre in req.items():
        for p in pre:
            if p not in req:
                raise ValueError(f"criterion {cid!r} requires {p!r}, which is not a criterion")
    order: list[str] = []
    state: dict[str, int] = {}  # 1 = on the current path, 2 = placed

    def visit(cid: str, path: list[str]) -> None:
        if state.get(cid) == 2:
            return
        if state.get(cid) == 1:
            cycle = path[path.index(cid):] + [cid]
            raise PrerequisiteCycle(f"prerequisite cycle: {' -> '.join(cycle)}")
        state[cid] = 1
        for p in req[cid]:
            visit(p, path + [cid])
        state[cid] = 2
        order.append(cid)

    for cid in req:
        visit(cid, [])
    return order


CRITERION_KINDS = ("outcome", "regex", "json_schema", "tool_called", "python", "llm_judge")


class Rubric(Asset):
    kind = "rubric"
    editable_fields = frozenset({"description", "outcome_weight", "criteria"})

    name: str = Field(min_length=1, max_length=64, pattern=ASSET_NAME)
    description: Text = ""
    outcome_weight: float = Field(1.0, ge=0.0, le=100.0)
    criteria: list[Criterion] = Field(default_factory=list, max_length=32)

    @field_validator("criteria")
    @classmethod
    def _criteria(cls, v: list[Any]) -> list[Any]:
        ids = [c.id for c in v]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"id {dup[0]!r} is used twice")
        if v and sum(c.weight for c in v) <= 0:  # sum(w_i) is the reward's denominator
            raise ValueError("the weights sum to 0; give at least one a positive weight")
        prerequisite_order(v)
        return v

    @model_validator(mode="after")
    def _nonzero(self) -> "Rubric":
        if not self.criteria and self.outcome_weight <= 0:
            raise ValueError("outcome_weight is 0 and there are no criteria: the reward is always 0")
        return self

    def outcome_share(self) -> float:
        """The verified outcome's share of the largest reward this rubric can pay:
        (outcome_weight + w_o / W) / (outcome_weight + 1), where w_o / W is the weight share of
        the criteria that are the outcome itself (kind outcome, no detail); 1.0 without
        criteria. A revision may not lower it (coevo.propose.base.check_candidate): partial
        credit must never come to outweigh the verified outcome in the reward the policy is
        trained on.

        >>> Rubric.model_validate({"name": "r", "criteria": [
        ...     {"id": "o", "kind": "outcome", "weight": 2.0},
        ...     {"id": "x", "kind": "regex", "params": {"pattern": "x"}}]}).outcome_share()
        0.8333333333333333
        """
        if not self.criteria:
            return 1.0
        total = sum(c.weight for c in self.criteria)
        own = sum(c.weight for c in self.criteria
                  if c.kind == "outcome" and c.params.detail is None)
        return (self.outcome_weight + own / total) / (self.outcome_weight + 1.0)

    def criterion(self, id: str) -> Any:
        for c in self.criteria:
            if c.id == id:
                return c
        raise KeyError(f"rubric {self.name!r} has no criterion {id!r}; ids: {', '.join(c.id for c in self.criteria)}")

    @property
    def ids(self) -> list[str]:
        return [c.id for c in self.criteria]
