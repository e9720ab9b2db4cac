"""The harness: everything around the weights that decides what the model sees and how its
output is read (system prompt, tools, tool-call and answer formats, workflow, demos, skill
activation, decoding).

Tools come from two places. An environment offers task functions (BFCL's functions, a
simulated API) as OpenAI function specs on each Task; the harness says how to show them
(`tool_doc_format`) and how the model must call them (`tool_format`). The harness may add its
own tools (`tools`, e.g. a calculator), implemented by coevo's tool registry. When a harness
tool and a task function share a name the task function wins: it is what the verifier checks.

Tool-call formats (parsed by coevo/envs/callparse.py):
- "json": `{"name": ..., "arguments": {...}}` or a list of them;
- "python": BFCL's prompting format `[func(a=1, b="x")]`;
- "chat_template": the model's native tool-call tags; the specs are passed to the chat
  template (`Request.tools`) instead of being written into the system message.

Every numeric knob carries pydantic bounds, so a proposer's revision outside them fails
validation like any other bad file rather than reaching the runtime.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import jsonschema
from pydantic import (BaseModel, ConfigDict, Field, JsonValue, field_validator, model_serializer,
                      model_validator)

from coevo.assets.base import Asset, LimitedText, Text
from coevo.assets.io import PATTERN_HINTS
from coevo.linear_regex import compile_pattern
from coevo.models.base import Sampling
from coevo.models.constrain import Constraint
from coevo.models.grammars import tool_call_constraint
from coevo.sandbox import DEFAULT_SANDBOX, SANDBOXES

if TYPE_CHECKING:
    from coevo.assets.skill import Skill

# Identifier-like, dots allowed between parts (BFCL names functions like `math.factorial`).
TOOL_NAME = r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*$"
ASSET_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
PATTERN_HINTS[TOOL_NAME] = "an identifier (letters, digits, '_'; dots between parts)"
PATTERN_HINTS[ASSET_NAME] = "letters, digits, '_', '.', '-', starting with a letter or digit"


def check_json_schema(schema: Any, object_only: bool = False) -> None:
    """Raise ValueError unless `schema` is a valid JSON Schema (by its `$schema`, else 2020-12).

    >>> check_json_schema({"type": "object", "properties": {"x": {"type": "integer"}}})
    >>> check_json_schema({"type": "objekt"})
    Traceback (most recent call last):
    ...
    ValueError: invalid JSON Schema at type: 'objekt' is not valid under any of the given schemas
    """
    if not isinstance(schema, dict):
        raise ValueError(f"a JSON Schema must be a mapping, got {type(schema).__name__}")
    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        cls.check_schema(schema)
    except jsonschema.SchemaError as e:
        where = ".".join(str(p) for p in e.absolute_path) or "(root)"
        raise ValueError(f"invalid JSON Schema at {where}: {e.message}") from None
    except Exception as e:  # noqa: BLE001 - e.g. an unhashable value in `enum`; still bad input
        raise ValueError(f"invalid JSON Schema: {type(e).__name__}: {e}") from None
    if object_only and schema.get("type") != "object":
        raise ValueError('function parameters must be an object schema ("type": "object")')


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FunctionSpec(_Model):
    name: str = Field(max_length=64, pattern=TOOL_NAME)
    description: Text = ""
    parameters: dict[str, JsonValue] = Field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )

    @field_validator("parameters")
    @classmethod
    def _schema(cls, v: dict[str, Any]) -> dict[str, Any]:
        check_json_schema(v, object_only=True)
        return v


class ToolSpec(_Model):
    """An OpenAI function-calling tool spec: {"type": "function", "function": {...}}, plus
    `sandbox`: what a harness tool that runs code (`python`) runs it in (coevo/sandbox.py).
    "bwrap", the default, isolates it; "none" is UNSAFE: the model's code runs as the calling
    user, with every file and the network that user can reach. Only a person may set it: a
    proposal that changes it is invalid (coevo.propose.base.tool_contract_changes)."""

    type: Literal["function"] = "function"
    function: FunctionSpec
    sandbox: str = DEFAULT_SANDBOX

    @field_validator("sandbox")
    @classmethod
    def _known_sandbox(cls, v: str) -> str:
        if v not in SANDBOXES:
            raise ValueError(f"unknown sandbox {v!r}; known: {', '.join(SANDBOXES.names())}")
        return v

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> Any:
        data = handler(self)
        # The default is left out, so a harness hashes as it did before `sandbox` existed.
        if isinstance(data, dict) and data.get("sandbox") == DEFAULT_SANDBOX:
            del data["sandbox"]
        return data


class AnswerExtraction(_Model):
    """How the final answer is read from the last assistant message.

    last_message: the whole message (stripped); regex: the last match of `pattern` (its group
    `group`, default 1 when the pattern has groups, else the whole match); tool_call: the answer
    is the final turn's tool calls (the runtime takes them from the parsed calls).
    """

    method: Literal["last_message", "regex", "tool_call"] = "last_message"
    pattern: str | None = Field(None, max_length=500)
    group: int | None = Field(None, ge=0, le=9)

    @model_validator(mode="after")
    def _pattern(self) -> "AnswerExtraction":
        if self.method != "regex":
            if self.pattern is not None or self.group is not None:
                raise ValueError(f"pattern/group are only used with method 'regex', not {self.method!r}")
            return self
        if not self.pattern:
            raise ValueError("method 'regex' needs a pattern")
        try:  # RE2 (coevo/linear_regex.py): a proposal's pattern runs in linear time
            compiled = compile_pattern(self.pattern)
        except ValueError as e:
            raise ValueError(f"pattern does not compile: {e}") from None
        if self.group is not None and self.group > compiled.groups:
            raise ValueError(f"group {self.group} but the pattern has {compiled.groups} groups")
        return self

    def extract(self, text: str) -> str | None:
        """The answer text, or None when a regex finds nothing (the answer is missing).

        >>> AnswerExtraction(method="regex", pattern=r"Answer:\\s*(\\S+)").extract("2+2\\nAnswer: 4")
        '4'
        """
        if self.method != "regex":
            return text.strip()
        compiled = compile_pattern(self.pattern or "")
        matches = list(compiled.finditer(text))
        if not matches:
            return None
        group = self.group if self.group is not None else (1 if compiled.groups else 0)
        value = matches[-1].group(group)
        return None if value is None else value.strip()


class Workflow(_Model):
    max_turns: int = Field(1, ge=1, le=32)
    # After a tool error (unknown tool, bad arguments, exception, timeout) add
    # `reflection_prompt` as a user message before the next policy turn.
    reflect_on_tool_error: bool = False
    reflection_prompt: LimitedText(2000) = (
        "The tool call failed (see the error above). Fix the call and try again.")
    answer_extraction: AnswerExtraction = Field(default_factory=AnswerExtraction)


class DemoMessage(_Model):
    role: Literal["user", "assistant", "tool"]
    content: Text
    name: str | None = Field(None, max_length=64)  # the tool's name, for role "tool"


class Demo(_Model):
    """A worked example: chat messages placed between the system message and the task."""

    messages: list[DemoMessage] = Field(min_length=2, max_length=16)
    source: str | None = None  # task id or trajectory id it was bootstrapped from

    @field_validator("messages")
    @classmethod
    def _shape(cls, v: list[DemoMessage]) -> list[DemoMessage]:
        if v[0].role != "user":
            raise ValueError("a demo starts with a user message")
        if v[-1].role != "assistant":
            raise ValueError("a demo ends with an assistant message (the answer to imitate)")
        return v


POOL_MAX = 512  # demos in a retrieval pool


def demo_messages(demos: Sequence[Demo]) -> list[dict[str, Any]]:
    """Demos flattened into chat messages, in order."""
    return [m.model_dump(exclude_none=True) for d in demos for m in d.messages]


class DemoSelection(_Model):
    """`demo_selection`: which demos a task is shown.

    static (the default): every demo of `demos`, in order, on every task (what a harness did
    before this knob existed). retrieve: per task, the `k` demos of `demos` + `pool` lexically
    closest to the task (BM25 of the task's prompt and offered functions against each demo's
    messages; coevo/agent/demos.py), best first: DSPy's KNNFewShot with BM25 for the embedding.
    A demo whose `source` is the task being run, or a val or test task of the environment, is
    never retrieved; proposers build the pool from train trajectories only.

    The pool is part of the harness's content, so its content is in the harness hash: a
    changed pool is a new harness version. A harness file may give `pool_file: PATH` (JSON
    lines, one demo each, relative to the harness file) instead of `pool`; it is read and
    inlined when the file is loaded. Written `demo_selection: retrieve` or in full."""

    select: Literal["static", "retrieve"] = "static"
    k: int = Field(2, ge=1, le=8)
    pool: list[Demo] = Field(default_factory=list, max_length=POOL_MAX)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return {"select": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _pool_needs_retrieve(self) -> "DemoSelection":
        if self.pool and self.select != "retrieve":
            raise ValueError("a pool is only used with select: retrieve")
        return self


class SkillActivation(_Model):
    # bm25: the runtime ranks active skills by name + description against the task and shows
    # the top_k; all: every active skill; none: no skills.
    method: Literal["bm25", "all", "none"] = "bm25"
    top_k: int = Field(2, ge=0, le=8)


class Constrain(_Model):
    """`decoding.constrain`: grammar-constrained decoding (coevo/models/grammars.py).

    none: free text. tool_calls: per task, a grammar built from the offered functions in the
    harness's `tool_format` (offered names only; arguments per each function's schema, required
    keys required, no unknown keys; 1..`max_calls` calls; with `allow_text` a plain-text answer
    is allowed instead of a call, for environments where that can be right). A task that offers
    no functions is answered unconstrained (there is nothing to call). json_schema: the whole
    completion is JSON valid under `json_schema`. regex: the whole completion matches `regex`
    (llguidance's regex dialect, linear time).

    `strings` (tool_calls, python tool format): free, or copy: every string argument without
    an enum or const is a span of whole words of the task's own text (its user messages;
    coevo/models/grammars.py `copy_terminal`), the pointer-style extraction a small model gets
    wrong by inventing or paraphrasing. A value the task does not spell out (a date reformatted,
    a unit spelled differently) cannot be written then: the gate decides whether that trade
    pays on an environment.

    Written in YAML as `constrain: tool_calls`, `constrain: {json_schema: {...}}`,
    `constrain: {regex: ...}` or in full (`{mode: tool_calls, max_calls: 2}`)."""

    mode: Literal["none", "tool_calls", "json_schema", "regex"] = "none"
    max_calls: int = Field(1, ge=1, le=16)
    allow_text: bool = False
    strings: Literal["free", "copy"] = "free"
    json_schema: dict[str, JsonValue] | None = None
    regex: str | None = Field(None, min_length=1, max_length=2000)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, str):
            return {"mode": data}
        if isinstance(data, dict) and "mode" not in data:
            given = [k for k in ("json_schema", "regex") if data.get(k) is not None]
            if len(given) == 1:
                return {**data, "mode": given[0]}
        return data

    @model_validator(mode="after")
    def _body(self) -> "Constrain":
        for key in ("json_schema", "regex"):
            if (getattr(self, key) is not None) != (self.mode == key):
                raise ValueError(f"mode {self.mode!r} " + (f"needs `{key}`" if self.mode == key
                                                          else f"takes no `{key}`"))
        if self.json_schema is not None:
            check_json_schema(self.json_schema)
        if self.mode in ("json_schema", "regex"):
            self.constraint().check()  # UnsupportedConstraint is a ValueError: a clear field error
        if self.strings != "free" and self.mode != "tool_calls":
            raise ValueError(f"strings: {self.strings} needs mode tool_calls")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> Any:
        data = handler(self)
        # The default is left out, so a harness hashes as it did before `strings` existed.
        if isinstance(data, dict) and data.get("strings") == "free":
            del data["strings"]
        return data

    def constraint(self, specs: Sequence[dict[str, Any]] = (), tool_format: str = "json",
                   source: str = "", copy_from: str = "") -> Constraint | None:
        """The Constraint of one turn that offers `specs`, or None (mode none, or tool_calls
        with no function offered). `copy_from`: the task's text, for `strings: copy`."""
        if self.mode == "none":
            return None
        if self.mode == "json_schema":
            return Constraint.of_json_schema(dict(self.json_schema or {}), source=source)
        if self.mode == "regex":
            return Constraint.of_regex(self.regex or "", source=source)
        if not specs:
            return None
        return tool_call_constraint(specs, tool_format, self.max_calls, self.allow_text,
                                    source=source,
                                    copy_from=copy_from if self.strings == "copy" else None)


class Decoding(_Model):
    """Mirrors coevo.models.base.Sampling (minus the per-request seed), with tighter bounds
    for what a proposer may choose; `constrain` is the grammar (see Constrain)."""

    temperature: float = Field(0.7, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, le=1000)
    max_new_tokens: int = Field(256, ge=1, le=4096)
    stop: list[str] = Field(default_factory=list, max_length=8)
    constrain: Constrain = Field(default_factory=Constrain)

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: list[str]) -> list[str]:
        if any(not s for s in v):
            raise ValueError("a stop string must not be empty")
        return v


class Harness(Asset):
    kind = "harness"
    editable_fields = frozenset(
        {
            "system_prompt",
            "tools",
            "tool_format",
            "tool_doc_format",
            "tool_doc_preamble",
            "answer_format",
            "workflow",
            "demos",
            "demo_selection",
            "skills",
            "decoding",
        }
    )

    name: str = Field(min_length=1, max_length=64, pattern=ASSET_NAME)
    description: Text = ""
    system_prompt: LimitedText(20_000)
    tools: list[ToolSpec] = Field(default_factory=list, max_length=32)
    tool_format: Literal["json", "python", "chat_template"] = "json"
    tool_doc_format: Literal["json", "python_signature"] = "json"
    tool_doc_preamble: LimitedText(2000) = "You can call these functions:"
    answer_format: LimitedText(5000) = ""
    workflow: Workflow = Field(default_factory=Workflow)
    demos: list[Demo] = Field(default_factory=list, max_length=16)
    demo_selection: DemoSelection = Field(default_factory=DemoSelection)
    skills: SkillActivation = Field(default_factory=SkillActivation)
    decoding: Decoding = Field(default_factory=Decoding)

    @field_validator("tools")
    @classmethod
    def _unique_tools(cls, v: list[ToolSpec]) -> list[ToolSpec]:
        names = [t.function.name for t in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"tool {dup[0]!r} is defined twice")
        return v

    @model_validator(mode="after")
    def _copy_needs_python(self) -> "Harness":
        if self.decoding.constrain.strings == "copy" and self.tool_format != "python":
            raise ValueError("decoding.constrain.strings: copy is implemented for tool_format "
                             f"python only, not {self.tool_format}")
        return self

    def content(self) -> dict[str, Any]:
        # An unconstrained harness with static demos hashes as it did before
        # `decoding.constrain` and `demo_selection` existed, so stored versions keep their
        # identity; any other setting (a retrieval pool with its demos) is part of the hash.
        data = super().content()
        if self.decoding.constrain == Constrain():
            data["decoding"].pop("constrain", None)
        if self.demo_selection == DemoSelection():
            data.pop("demo_selection", None)
        return data

    @classmethod
    def inline_files(cls, data: dict[str, Any], source: str) -> dict[str, Any]:
        """A harness file's data with `demo_selection.pool_file` read and inlined as `pool`
        (the path is relative to the file; AssetError names the file, line and field)."""
        sel = data.get("demo_selection")
        if not isinstance(sel, dict) or "pool_file" not in sel:
            return data
        from pathlib import Path

        from coevo.errors import AssetError
        from coevo.jsonlines import read_objects, validate_line

        sel = dict(sel)
        ref = sel.pop("pool_file")
        if "pool" in sel or not isinstance(ref, str) or not ref:
            raise AssetError(source, "demo_selection.pool_file",
                             "give a file path (and no `pool` next to it)")
        path = Path(source).parent / ref
        sel["pool"] = [validate_line(Demo, d, where).model_dump(mode="json", exclude_none=True)
                       for where, d in read_objects(str(path), "demo")]
        return {**data, "demo_selection": sel}

    def demo_candidates(self) -> list[Demo]:
        """Every demo a task may be shown: `demos`, plus the pool when retrieving."""
        if self.demo_selection.select == "retrieve":
            return [*self.demos, *self.demo_selection.pool]
        return list(self.demos)

    def sampling(self, seed: int | None = None) -> Sampling:
        return Sampling(**self.decoding.model_dump(exclude={"constrain"}), seed=seed)

    def constraint(self, task_tools: Sequence[dict[str, Any]] = (),
                   copy_from: str = "") -> Constraint | None:
        """The grammar of a policy turn of a task offering `task_tools` (None: free text);
        `copy_from` is the task's text (`decoding.constrain.strings: copy` copies from it).
        Raises UnsupportedConstraint when a function's schema cannot be expressed."""
        specs = self.tool_specs(task_tools)
        return self.decoding.constrain.constraint(specs, self.tool_format,
                                                  source=f"harness {self.name}",
                                                  copy_from=copy_from)

    def tool_specs(self, task_tools: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
        """Task functions then harness tools, as OpenAI specs (what `Request.tools` gets)."""
        specs = [normalize_function_spec(t) for t in task_tools]
        taken = {s["function"]["name"] for s in specs}
        own = [t.model_dump(mode="json", exclude={"sandbox"}) for t in self.tools
               if t.function.name not in taken]
        return specs + own

    def demo_messages(self) -> list[dict[str, Any]]:
        """All (static) demos flattened into chat messages, in order."""
        return demo_messages(self.demos)

    def render_system(
        self, task_tools: Sequence[dict[str, Any]] = (), skills: Sequence["Skill"] = ()
    ) -> str:
        """The system message: prompt, tool docs, activated skills, answer format.

        The answer format comes last, nearest to the conversation, because small models follow
        the most recent instruction best. Skills that are not active and, with the "none"
        activation method, all skills are left out; choosing which active skills to pass is
        the runtime's job (coevo/agent/skills.py).
        """
        parts = [self.system_prompt]
        specs = self.tool_specs(task_tools)
        if specs and self.tool_format != "chat_template":
            parts.append(self.tool_doc_preamble + "\n" + render_tool_docs(specs, self.tool_doc_format))
        if self.skills.method != "none":
            shown = [s.render() for s in skills if s.state == "active"]
            parts.extend(shown)
        parts.append(self.answer_format)
        return "\n\n".join(p for p in parts if p)


# ---------------------------------------------------------------------------------------------
# Rendering task functions


def normalize_function_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """Accept {"type": "function", "function": {...}} or a bare {"name", ...} (BFCL's own
    shape) and return the wrapped OpenAI form. A spec without a name is a programming error of
    the environment, reported as such."""
    fn = spec.get("function", spec) if spec.get("type", "function") == "function" else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise ValueError(f"not an OpenAI function spec (no function name): {json.dumps(spec)[:200]}")
    return {"type": "function", "function": fn}


def render_tool_docs(specs: Sequence[dict[str, Any]], fmt: str) -> str:
    fns = [normalize_function_spec(s)["function"] for s in specs]
    if fmt == "json":
        # One compact object per line: the model sees each function as a unit, and the prompt
        # stays short (prompt tokens dominate a 135M model's CPU step time).
        return "\n".join(json.dumps(fn, ensure_ascii=False) for fn in fns)
    if fmt == "python_signature":
        return "\n\n".join(python_signature(fn) for fn in fns)
    raise ValueError(f"unknown tool_doc_format {fmt!r}; known: json, python_signature")


_PY_TYPES = {
    "string": "str",
    "integer": "int",
    "number": "float",
    "float": "float",
    "boolean": "bool",
    "array": "list",
    "tuple": "tuple",
    "object": "dict",
    "dict": "dict",
    "null": "None",
    "any": "Any",
}


def _py_type(schema: Any) -> str:
    if not isinstance(schema, dict):
        return "Any"
    if "enum" in schema and isinstance(schema["enum"], list):
        return "Literal[" + ", ".join(json.dumps(v) for v in schema["enum"]) + "]"
    t = schema.get("type")
    if isinstance(t, list):
        return " | ".join(_PY_TYPES.get(str(x), str(x)) for x in t)
    name = _PY_TYPES.get(str(t), str(t) if t else "Any")
    if name == "list" and isinstance(schema.get("items"), dict):
        return f"list[{_py_type(schema['items'])}]"
    return name


def python_signature(fn: dict[str, Any]) -> str:
    """A function spec as a Python stub with a docstring (required parameters first).

    >>> print(python_signature({"name": "area", "description": "Triangle area.",
    ...     "parameters": {"type": "object", "required": ["base"], "properties": {
    ...         "base": {"type": "integer", "description": "The base."},
    ...         "unit": {"type": "string", "default": "cm"}}}}))
    def area(base: int, unit: str = "cm"):
        \"\"\"Triangle area.
    <BLANKLINE>
        Args:
            base: The base.
            unit
        \"\"\"
    """
    params = fn.get("parameters") or {}
    props = params.get("properties") or {}
    required = [p for p in params.get("required") or [] if p in props]
    optional = [p for p in props if p not in required]
    args = []
    for p in required + optional:
        arg = f"{p}: {_py_type(props[p])}"
        if p not in required:
            default = props[p].get("default") if isinstance(props[p], dict) else None
            arg += " = " + ("None" if default is None else json.dumps(default, ensure_ascii=False))
        args.append(arg)
    doc = str(fn.get("description") or "").strip().replace("\n", "\n    ")
    lines = [f"def {fn['name']}({', '.join(args)}):", '    """' + doc]
    if props:
        lines += ["", "    Args:"]
        for p in required + optional:
            desc = props[p].get("description", "") if isinstance(props[p], dict) else ""
            lines.append(f"        {p}: {desc}".rstrip() if desc else f"        {p}")
    lines.append('    """')
    return "\n".join(lines)
