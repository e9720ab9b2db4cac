"""Typed edit operations on the incumbent's assets: what the `edits` proposer's model picks
from, instead of rewriting an asset whole (coevo/propose/edits.py).

Each operator is a pydantic model with a `kind` literal and short bounded slots, registered by
kind in `OPERATORS`. Per round it says which of its forms are allowed (`branches(view)`: JSON
Schema objects whose enums hold what this round offers: the rule indices that exist, the
trajectory refs listed to the model, the knobs with their declared bounds, the library's
skills), what the model reads about it (`menu(view)`), and how it changes the asset
(`apply(work, view)` on the asset's JSON data; a skipped operation returns why). The anyOf of
every offered branch is the grammar the model decodes under, and the same schema validates a
replayed or unconstrained answer (`coevo.propose.edits.parse_edits`), so an edit that is not
offered is refused before anything is applied. The child is then built through the asset's
own validation (`candidate_from_changes` -> `child`), and the loop's `check_candidate`
re-checks the whitelist; no operator reaches code, a tool's contract, or a field outside it.

Operators (target asset in brackets):
- `add_rule(error_kind, text)` [harness]: one line appended to the rules block of the system
  prompt (`<rules>` ... `</rules>`, numbered, at its end; created on first use), addressing an
  error kind seen in this round's failed episodes (`error_kinds`);
- `drop_rule(index)`: removes a rule of that block (the hand-written prompt is never touched);
- `add_demo(trajectory_ref)` / `replace_demo(index, trajectory_ref)` / `drop_demo(index)`:
  demos built from the round's successful train trajectories the way the `demos` proposer
  builds them (`coevo.propose.demos.select` + `to_demo`), listed to the model as t1, t2, ...;
- `retrieve_demos(k)` [harness]: `demo_selection` from static to retrieve (the k demos closest to
  each task, from the harness's demos and a pool of the offered episodes);
- `tighten_answer_format(text)`, `set_tool_doc(preamble)` (offered when the harness shows tool
  docs), `toggle_constrain(value)` (decoding.constrain among `KNOB_CHOICES`; tool_calls only
  when tools are shown), `set_knob(name, value)` (a knob of `coevo.propose.harness.KNOBS`
  within its field's bounds);
- `activate_skill(name)` [skill_library] for a hidden member (retired is final, as in the
  `skills` proposer's lifecycle) and `retire_skill(name)` for an active or hidden one.

Indices are 1-based and refer to the incumbent as the model saw it; several edits of one answer
apply in order, and one whose target an earlier edit already removed is skipped (recorded with
why, not an error). Extension point: an operator for a new harness field is one more
`Operator` subclass passed to `register` (as `retrieve_demos` is); its `branches` returns []
while a harness has nothing for it to do.
"""

from __future__ import annotations

import inspect
import json
import re
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from coevo.assets.harness import POOL_MAX, Demo, Harness
from coevo.assets.skill import Skill, SkillLibrary
from coevo.propose.harness import KNOB_CHOICES, KNOBS, _bounds, knob_field, knob_schema, knob_value
from coevo.registry import Registry

RULES_OPEN, RULES_CLOSE = "<rules>", "</rules>"
MAX_RULES = 8
SLOT_CHARS = 160  # the longest text slot (a rule, an answer format, a preamble)
MAX_DEMOS = 16  # Harness.demos max_length
# One line starting with a visible character: a rule is one line of its block. (A pattern also
# keeps bound_strings from re-capping a slot: the caps here are sized to max_tokens already,
# coevo.propose.edits.slot_caps.)
ONE_LINE = r"^\S[^\n\r]*$"
# An instruction slot: one line of at least two words, the first starting with a letter. The
# embedded 135M model, held to ONE_LINE only, filled 5 of 6 rules with digits copied from the
# digest ("1.00", "215002"; bench/README.md, "Proposer validity").
WORDS = r"^[A-Za-z][^\n\r]* [^\n\r]*$"
# Knobs that only matter when the harness shows tools; toggle_constrain owns `constrain`.
TOOL_KNOBS = frozenset({"tool_doc_format", "reflect_on_tool_error", "reflection_prompt",
                        "max_calls", "allow_text"})
_RULES = re.compile(r"\n*^" + re.escape(RULES_OPEN) + r"\n(?P<body>(?:.*\n)*?)"
                    + re.escape(RULES_CLOSE) + r"\s*\Z", re.MULTILINE)
_NUMBERED = re.compile(r"^\d+\.\s+")


# --- the rules block ------------------------------------------------------------------------------


def split_rules(prompt: str) -> tuple[str, list[str]]:
    """The system prompt without its trailing rules block, and the block's rules.

    >>> split_rules("Be brief.\\n\\n<rules>\\n1. Say yes.\\n2. Say no.\\n</rules>")
    ('Be brief.', ['Say yes.', 'Say no.'])
    >>> split_rules("Be brief.")
    ('Be brief.', [])
    """
    m = _RULES.search(prompt)
    if m is None:
        return prompt, []
    rules = [_NUMBERED.sub("", ln).strip() for ln in m.group("body").splitlines()]
    return prompt[:m.start()].rstrip(), [r for r in rules if r]


def join_rules(base: str, rules: Sequence[str]) -> str:
    """`base` with a numbered rules block at its end (none when `rules` is empty)."""
    if not rules:
        return base
    lines = "\n".join(f"{i}. {r}" for i, r in enumerate(rules, 1))
    return f"{base.rstrip()}\n\n{RULES_OPEN}\n{lines}\n{RULES_CLOSE}"


# --- what a round allows ----------------------------------------------------------------------------


class DemoRef(BaseModel):
    """A successful train trajectory offered as a demo, as the model sees it (`ref`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    ref: str
    trajectory: str  # its id
    task: str
    demo: Demo
    text: str = ""  # the short transcript shown to the model


class EditView(BaseModel):
    """The incumbent and what this round offers: every operator's allowed slot values come
    from here (so the grammar and the checks agree)."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)
    harness: Harness
    library: SkillLibrary | None = None
    skills: dict[str, Skill] = Field(default_factory=dict)  # library members by name
    error_kinds: dict[str, int] = Field(default_factory=dict)  # kind -> failed episodes
    refs: dict[str, DemoRef] = Field(default_factory=dict)
    knobs: tuple[str, ...] = ()
    offers_tools: bool = False  # the harness shows tool docs to the policy
    text_cap: int = Field(SLOT_CHARS, ge=8, le=SLOT_CHARS)

    @property
    def rules(self) -> list[str]:
        return split_rules(self.harness.system_prompt)[1]

    def member_states(self) -> dict[str, str]:
        return {r.name: r.state for r in self.library.skills} if self.library else {}


class Skip(Exception):
    """An edit that has nothing left to do (its target went with an earlier edit)."""


# --- operators ----------------------------------------------------------------------------------------


class Operator(BaseModel):
    """Contract: `branches(view)` -> the JSON Schema objects of this operation allowed in this
    round ([]: not offered); `menu(view)` -> its line in the prompt; `apply(work, view)`
    changes `work` (the target asset's JSON data; for a skill library {member: state}) or
    raises Skip; `record(view)` -> what the audit stores (slots + what they resolved to)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    target: ClassVar[str] = "harness"

    @classmethod
    def op(cls) -> str:
        """The operator's kind (its registry name)."""
        return cls.model_fields["kind"].default

    @classmethod
    @abstractmethod
    def branches(cls, view: EditView) -> list[dict[str, Any]]: ...

    @classmethod
    @abstractmethod
    def menu(cls, view: EditView) -> str: ...

    @abstractmethod
    def apply(self, work: dict[str, Any], view: EditView) -> None: ...

    def record(self, view: EditView) -> dict[str, Any]:
        return {"kind": self.op(), **self.model_dump(mode="json", exclude={"kind"})}


OPERATORS: Registry[type[Operator]] = Registry("edit operator")
ORDER: list[str] = []  # registration order: the order the model reads the menu in


def register(cls: type[Operator]) -> type[Operator]:
    """Registers an operator class; one missing part of the contract is refused here, not
    when a round first offers it."""
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(cls.__abstractmethods__))
        raise TypeError(f"operator {cls.__name__}: does not implement {missing}")
    OPERATORS.add(cls.op(), cls)
    ORDER.append(cls.op())
    return cls


def _branch(kind: str, **slots: Any) -> dict[str, Any]:
    return {"type": "object", "properties": {"kind": {"const": kind}, **slots},
            "required": ["kind", *slots], "additionalProperties": False}


def text_slot(cap: int) -> dict[str, Any]:
    return {"type": "string", "minLength": 4, "maxLength": cap, "pattern": WORDS}


def _indices(n: int) -> dict[str, Any]:
    return {"enum": list(range(1, n + 1))}


def _list(values: Sequence[str]) -> str:
    return ", ".join(values)


Line = Field(min_length=4, max_length=SLOT_CHARS, pattern=WORDS)


@register
class AddRule(Operator):
    kind: Literal["add_rule"] = "add_rule"
    error_kind: str = Field(max_length=80)
    text: str = Line

    @classmethod
    def branches(cls, view: EditView) -> list[dict[str, Any]]:
        if len(view.rules) >= MAX_RULES or not view.error_kinds:
            return []
        return [_branch(cls.op(), error_kind={"enum": list(view.error_kinds)},
                        text=text_slot(view.text_cap))]

    @classmethod
    def menu(cls, view: EditView) -> str:
        kinds = _list(f"{k} ({n} episodes)" for k, n in view.error_kinds.items())
        return (f"add_rule(error_kind, text): append one rule line (<= {view.text_cap} chars) "
                f"to the system prompt's rules; error_kind is what it fixes: {kinds}")

    def apply(self, work: dict[str, Any], view: EditView) -> None:
        base, rules = split_rules(work["system_prompt"])
        if self.text.strip() in rules:
            raise Skip("already a rule")
        work["system_prompt"] = join_rules(base, [*rules, self.text.strip()])


@register
class DropRule(Operator):
    kind: Literal["drop_rule"] = "drop_rule"
    index: int = Field(ge=1, le=MAX_RULES)

    @classmethod
    def branches(cls, view: EditView) -> list[dict[str, Any]]:
        n = len(view.rules)
        return [_branch(cls.op(), index=_indices(n))] if n else []

    @classmethod
    def menu(cls, view: EditView) -> str:
        return f"drop_rule(index): remove rule 1..{len(view.rules)} of the rules block"

    def apply(self, work: dict[str, Any], view: EditView) -> None:
        rule = view.rules[self.index - 1]
        base, rules = split_rules(work["system_prompt"])
        if rule not in rules:
            raise Skip(f"rule {self.index} was already dropped")
        rules.remove(rule)
        work["system_prompt"] = join_rules(base, rules)

    def record(self, view: EditView) -> dict[str, Any]:
        return {**super().record(view), "rule": view.rules[self.index - 1]}


def _demo(d: Demo) -> dict[str, Any]:
    return d.model_dump(mode="json")


class _DemoOp(Operator):
    def _ref(self, view: EditView) -> DemoRef:
        return view.refs[self.trajectory_ref]  # type: ignore[attr-defined]

    def _new(self, work: dict[str, Any], view: EditView) -> dict[str, Any]:
        """The referenced trajectory's demo, unless the harness already has it."""
        new = _demo(self._ref(view).demo)
        if new in work["demos"]:
            raise Skip("already a demo")
        return new

    def _at(self, work: dict[str, Any], view: EditView) -> int:
        old = _demo(view.harness.demos[self.index - 1])  # type: ignore[attr-defined]
        if old not in work["demos"]:
            raise Skip(f"demo {self.index} was already removed")  # type: ignore[attr-defined]
        return work["demos"].index(old)

    def record(self, view: EditView) -> dict[str, Any]:
        out = super().record(view)
        if "trajectory_ref" in out:
            ref = self._ref(view)
            out.update(trajectory=ref.trajectory, task=ref.task)
        if "index" in out:
            out["demo_source"] = view.harness.demos[out["index"] - 1].source
        return out


Ref = Field(max_length=8, pattern=r"^t[0-9]{1,2}$")


@register
class AddDemo(_DemoOp):
    kind: Literal["add_demo"] = "add_demo"
    trajectory_ref: str = Ref

    @classmethod
    def branches(cls, view: EditView) -> list[dict[str, Any]]:
        if not view.refs or len(view.harness.demos) >= MAX_DEMOS:
            return []
        return [_branch(cls.op(), trajectory_ref={"enum": list(view.refs)})]

    @classmethod
    def menu(cls, view: EditView) -> str:
        return (f"add_demo(trajectory_ref): add a successful episode as a worked example; "
                f"refs: {_list(view.refs)}")

    def apply(self, work: dict[str, Any], view: EditView) -> None:
        new = self._new(work, view)
        if len(work["demos"]) >= MAX_DEMOS:
            raise Skip(f"the harness already has {MAX_DEMOS} demos")
        work["demos"].append(new)


@register
class ReplaceDemo(_DemoOp):
    kind: Literal["replace_demo"] = "replace_demo"
    index: int = Field(ge=1, le=MAX_DEMOS)
    trajectory_ref: str = Ref

    @classmethod
    def branches(cls, view: EditView) -> list[dict[str, Any]]:
        if not view.refs or not view.harness.demos:
            return []
        return [_branch(cls.op(), index=_indices(len(view.harness.demos)),
                        trajectory_ref={"enum": list(view.refs)})]

    @classmethod
    def menu(cls, view: EditView) -> str:
        return (f"replace_demo(index, trajectory_ref): put a successful episode in place of "
                f"demo 1..{len(view.harness.demos)}; refs: {_list(view.refs)}")

    def apply(self, work: dict[str, Any], view: EditView) -> None:
        new = self._new(work, view)
        work["demos"][self._at(work, view)] = new


@register
class DropDemo(_DemoOp):
    kind: Literal["drop_demo"] = "drop_demo"
    index: int = Field(ge=1, le=MAX_DEMOS)

    @classmethod
    def branches(cls, view: EditView) -> list[dict[str, Any]]:
        n = len(view.harness.demos)
        return [_branch(cls.op(), index=_indices(n))] if n else []

    @classmethod
    def menu(cls, view: EditView) -> str:
        return f"drop_demo(index): remove demo 1..{len(view.harness.demos)}"

    def apply(self, work: dict[str, Any], view: EditView) -> None:
        del work["demos"][self._at(work, view)]



@register
class RetrieveDemos(_DemoOp):
    """Switch the harness from static demos to per-task retrieval (`demo_selection`), with a
    pool of the round's successful train episodes offered as refs."""

    kind: Literal["retrieve_demos"] = "retrieve_demos"
    k: int = Field(ge=1, le=4)

    @classmethod
    def branches(cls, view: EditView) -> list[dict[str, Any]]:
        if view.harness.demo_selection.select != "static" or not view.refs:
            return []
        return [_branch(cls.op(), k={"enum": [1, 2, 3, 4]})]

    @classmethod
    def menu(cls, view: EditView) -> str:
        return (f"retrieve_demos(k): show each task the k worked examples closest to it, from "
                f"the current demos and the {len(view.refs)} offered episodes")

    def apply(self, work: dict[str, Any], view: EditView) -> None:
        if (work.get("demo_selection") or {}).get("select", "static") != "static":
            raise Skip("demos are already retrieved")
        pool = [d for d in (_demo(r.demo) for r in view.refs.values()) if d not in work["demos"]]
        work["demo_selection"] = {"select": "retrieve", "k": self.k, "pool": pool[:POOL_MAX]}

    def record(self, view: EditView) -> dict[str, Any]:
        return {**Operator.record(self, view),
                "pool": [r.trajectory for r in view.refs.values()]}

class _TextOp(Operator):
    field: ClassVar[str]
    slot: ClassVar[str]
    what: ClassVar[str]

    @classmethod
    def offered(cls, view: EditView) -> bool:
        return True

    @classmethod
    def branches(cls, view: EditView) -> list[dict[str, Any]]:
        return [_branch(cls.op(), **{cls.slot: text_slot(view.text_cap)})] \
            if cls.offered(view) else []

    @classmethod
    def menu(cls, view: EditView) -> str:
        return f"{cls.op()}({cls.slot}): {cls.what} (one line, <= {view.text_cap} chars)"

    def apply(self, work: dict[str, Any], view: EditView) -> None:
        value = getattr(self, self.slot).strip()
        if value == work[self.field]:
            raise Skip(f"{self.field} is already this text")
        work[self.field] = value


@register
class TightenAnswerFormat(_TextOp):
    kind: Literal["tighten_answer_format"] = "tighten_answer_format"
    text: str = Line
    field, slot, what = "answer_format", "text", "replace the answer-format instructions"


@register
class SetToolDoc(_TextOp):
    kind: Literal["set_tool_doc"] = "set_tool_doc"
    preamble: str = Line
    field, slot, what = "tool_doc_preamble", "preamble", "replace the line above the tool list"

    @classmethod
    def offered(cls, view: EditView) -> bool:
        return view.offers_tools


def _set(work: dict[str, Any], path: Sequence[str], value: Any) -> None:
    node = work
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value


def _get(work: dict[str, Any], path: Sequence[str]) -> Any:
    node: Any = work
    for part in path:
        node = node[part]
    return node


@register
class ToggleConstrain(Operator):
    kind: Literal["toggle_constrain"] = "toggle_constrain"
    value: str = Field(max_length=32)

    @classmethod
    def values(cls, view: EditView) -> list[str]:
        now = view.harness.decoding.constrain.mode
        if now not in KNOB_CHOICES["constrain"]:  # a json_schema / regex body set by a person
            return []
        return [v for v in KNOB_CHOICES["constrain"]
                if v != now and (v != "tool_calls" or view.offers_tools)]

    @classmethod
    def branches(cls, view: EditView) -> list[dict[str, Any]]:
        values = cls.values(view)
        return [_branch(cls.op(), value={"enum": values})] if values else []

    @classmethod
    def menu(cls, view: EditView) -> str:
        return (f"toggle_constrain(value): grammar-constrained decoding, now "
                f"{json.dumps(view.harness.decoding.constrain.mode)}; value: "
                f"{_list(json.dumps(v) for v in cls.values(view))}")

    def apply(self, work: dict[str, Any], view: EditView) -> None:
        _set(work, KNOBS["constrain"], self.value)


@register
class SetKnob(Operator):
    kind: Literal["set_knob"] = "set_knob"
    name: str = Field(max_length=64)
    value: bool | int | float | str

    @classmethod
    def offered(cls, view: EditView) -> list[str]:
        return [k for k in view.knobs if k != "constrain"
                and (view.offers_tools or k not in TOOL_KNOBS) and cls.value_schema(view, k)]

    @classmethod
    def value_schema(cls, view: EditView, knob: str) -> dict[str, Any] | None:
        """The knob's value schema (coevo.propose.harness.knob_schema), minus the current
        value where the choices are finite (None: no other value)."""
        now = knob_value(view.harness, knob)
        schema = knob_schema(knob)
        if schema.get("type") == "boolean":
            return {"const": not now}
        if "enum" in schema:
            rest = [v for v in schema["enum"] if v != now]
            return {"enum": rest} if rest else None
        if schema.get("type") == "string":
            return text_slot(view.text_cap)
        return schema

    @classmethod
    def branches(cls, view: EditView) -> list[dict[str, Any]]:
        return [_branch(cls.op(), name={"const": k}, value=cls.value_schema(view, k))
                for k in cls.offered(view)]

    @classmethod
    def menu(cls, view: EditView) -> str:
        knobs = "; ".join(f"{k} = {json.dumps(knob_value(view.harness, k))} "
                          f"({_bounds(*knob_field(k))})" for k in cls.offered(view))
        return f"set_knob(name, value): set one setting within its bounds: {knobs}"

    def apply(self, work: dict[str, Any], view: EditView) -> None:
        path = KNOBS[self.name]
        if _get(work, path) == self.value:
            raise Skip(f"{self.name} is already {json.dumps(self.value)}")
        _set(work, path, self.value)


class _SkillOp(Operator):
    target: ClassVar[str] = "skill_library"
    states: ClassVar[tuple[str, ...]]
    new: ClassVar[str]
    what: ClassVar[str]
    name: str = Field(max_length=64)

    @classmethod
    def names(cls, view: EditView) -> list[str]:
        return [n for n, s in view.member_states().items() if s in cls.states and n in view.skills]

    @classmethod
    def branches(cls, view: EditView) -> list[dict[str, Any]]:
        names = cls.names(view)
        return [_branch(cls.op(), name={"enum": names})] if names else []

    @classmethod
    def menu(cls, view: EditView) -> str:
        return f"{cls.op()}(name): {cls.what}: {_list(cls.names(view))}"

    def apply(self, work: dict[str, Any], view: EditView) -> None:
        if work[self.name] == self.new:
            raise Skip(f"skill {self.name} is already {self.new}")
        work[self.name] = self.new


@register
class ActivateSkill(_SkillOp):
    kind: Literal["activate_skill"] = "activate_skill"
    states, new, what = ("hidden",), "active", "show a hidden skill to the agent again"


@register
class RetireSkill(_SkillOp):
    kind: Literal["retire_skill"] = "retire_skill"
    states, new, what = ("active", "hidden"), "retired", "retire a skill for good"


# --- the per-call schema, parsing, applying -----------------------------------------------------------


def offered(view: EditView, ops: Sequence[str] | None = None) -> list[type[Operator]]:
    """The registered operators (or those named in `ops`) with a branch allowed this round."""
    return [cls for cls in (OPERATORS.get(n) for n in (ops or ORDER))
            if cls.branches(view)]


def edits_schema(view: EditView, max_ops: int, ops: Sequence[str] | None = None
                 ) -> dict[str, Any] | None:
    """The JSON Schema of the `edits` answer: 1..max_ops items, each one allowed branch of an
    offered operator (None: nothing is offered this round)."""
    branches = [b for cls in offered(view, ops) for b in cls.branches(view)]
    if not branches:
        return None
    return {"type": "array", "minItems": 1, "maxItems": max_ops, "items": {"anyOf": branches}}
