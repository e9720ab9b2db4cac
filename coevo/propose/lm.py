"""The proposer LM: DSPy programs running on coevo's own model backends, with record/replay.

Every LLM proposer is a DSPy program (a `dspy.Signature` run by `dspy.Predict`). DSPy talks to
models through an *engine* (`engine.complete(dspy.lm15.Request) -> dspy.lm15.Response`); this
module's `BackendEngine` is that engine over any coevo `Backend` (`embedded`, `hf:PATH`,
`openai:URL`, `vllm:PATH`, `llamacpp:GGUF`), so a proposer runs offline on the embedded model
by default and on a served larger model by changing one string. The proposer model is
configured apart from the policy (`ProposerModel`): the policy is being trained, the proposer
must not drift with it.

Structured output goes through `dspy.JSONAdapter` (the default ChatAdapter cannot parse a
135M model's output at all; FACTS.md), and with `json_schema: true` (the default) the engine
passes the JSON Schema of the running signature's output fields to the backend as a
`Constraint` (coevo/models/constrain.py): grammar-constrained decoding on every backend
(llguidance masks for hf / embedded, structured outputs for vLLM and OpenAI-compatible servers,
a grammar for llama.cpp), so even the 135M model emits parseable JSON with exactly the
requested keys and types; its content is still its own, and the semantic checks (whitelist,
bounds, validity) stay where they are. A model that still fails (a string cut by max_tokens, a
backend that rejects the constraint) is an `invalid` proposal with the exact prompt, the raw
output and the error (stored, never a crash).
The adapter keeps only the signature's output fields and drops any other key silently;
`run_program` does not: an answer with a key outside the signature's outputs (a model obeying
an instruction planted in a transcript: `name`, `gate`, `splits`, ...; possible whenever no
constraint holds the keys, e.g. a replayed cassette or an unconstrained backend) is refused as
a whole, the offending keys named in the error.

Cassettes (record/replay). A cassette is a JSONL file of exchanges keyed by the sha256 of the
canonical request (messages + sampling settings, + the constraint's key when there is one). `mode`: `replay` answers only from the file
(a miss is an error naming the file and key: tests are offline and deterministic), `record`
always calls the model and appends, `auto` replays what is there and records the rest, `off`
ignores the file. Departure from DSPy's own cache: ours is a reviewable text file that ships
with the tests, keyed on what the model saw rather than on DSPy's call arguments.

`LITELLM_LOCAL_MODEL_COST_MAP=True` is set before dspy is imported: litellm (pulled in by
dspy) otherwise fetches a cost map from the network on import.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any, Literal

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402
from dspy.lm15 import Message, Response, TextPart, Usage  # noqa: E402
from dspy.utils.exceptions import AdapterParseError, DSPyError  # noqa: E402
from pydantic import BaseModel, ConfigDict, Field  # noqa: E402

from coevo.errors import CoevoError  # noqa: E402
from coevo.models.base import Request, Sampling  # noqa: E402
from coevo.models.constrain import Constraint  # noqa: E402
from coevo.models.grammars import bound_strings, clean_schema  # noqa: E402

CassetteMode = Literal["record", "replay", "auto", "off"]


class CassetteMiss(CoevoError):
    """Replay mode found no recorded answer: the test's prompt changed. Raised, not turned
    into an invalid proposal, because a silently different test is worse than a failing one."""

# The JSON schema of the running program's outputs, for engines that can force it.
_OUTPUT_SCHEMA: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "coevo_output_schema", default=None)


class ProposerModel(BaseModel):
    """Which model proposers run on, separate from the policy's `model` block."""

    model_config = ConfigDict(extra="forbid")
    backend: str = "embedded"  # a load_backend spec
    options: dict[str, Any] = Field(default_factory=dict)  # its constructor options
    max_tokens: int = Field(768, ge=16, le=16384)
    temperature: float = Field(0.7, ge=0.0, le=2.0)
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    top_k: int = Field(50, ge=0)
    seed: int | None = 0
    json_schema: bool = True  # constrain decoding to the signature's output JSON Schema
    # ... with every string capped so the whole answer fits in max_tokens (maxLength)
    bound_strings: bool = True

    @classmethod
    def parse(cls, model: "ProposerModel | str | dict[str, Any] | None") -> "ProposerModel":
        if model is None:
            return cls()
        if isinstance(model, ProposerModel):
            return model
        if isinstance(model, str):
            return cls(backend=model)
        try:
            return cls.model_validate(model)
        except ValueError as e:
            raise CoevoError(f"proposer model: {e}") from None


class ProgramCall(BaseModel):
    """One run of a DSPy program: its parsed outputs, or why there are none."""

    model_config = ConfigDict(extra="forbid")
    outputs: dict[str, Any] | None = None
    prompt: str = ""  # the exact messages sent (JSON), for audit
    raw_output: str = ""
    error: str | None = None
    model: str = ""
    forbidden_keys: list[str] = Field(default_factory=list)  # answer keys outside the outputs

    @property
    def ok(self) -> bool:
        return self.outputs is not None and self.error is None


# --- cassettes -----------------------------------------------------------------------------------


def exchange_key(messages: list[dict[str, Any]], sampling: dict[str, Any],
                 constraint: str | None = None) -> str:
    """sha256 of the canonical request: what the model saw, how it was asked to sample and
    (when constrained) the key of the grammar it had to follow."""
    request: dict[str, Any] = {"messages": messages, "sampling": sampling}
    if constraint is not None:
        request["constraint"] = constraint
    blob = json.dumps(request, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


class Cassette:
    """A JSONL file of {key, messages, sampling, output} exchanges (see module docstring)."""

    def __init__(self, path: str | Path, mode: CassetteMode = "auto"):
        if mode not in ("record", "replay", "auto", "off"):
            raise CoevoError(f"cassette {path}: mode must be record, replay, auto or off, not {mode!r}")
        self.path, self.mode = Path(path), mode
        self._lock = threading.Lock()
        self._answers: dict[str, str] = {}
        if mode in ("replay", "auto") and self.path.exists():
            for n, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    self._answers[row["key"]] = row["output"]
                except (ValueError, KeyError, TypeError) as e:
                    raise CoevoError(f"cassette {self.path}: line {n}: not an exchange ({e})") from None
        elif mode == "replay":
            raise CoevoError(f"cassette {self.path}: replay mode but the file does not exist")

    def lookup(self, key: str) -> str | None:
        return self._answers.get(key) if self.mode in ("replay", "auto") else None

    def miss(self, key: str) -> None:
        if self.mode == "replay":
            raise CassetteMiss(f"cassette {self.path}: no recorded exchange for request {key[:16]} "
                             "(re-record with mode=record, or the prompt changed)")

    def answer(self, messages: list[dict[str, Any]], sampling: dict[str, Any],
               generate: Any, constraint: str | None = None) -> str:
        """The recorded output for this request, else `generate()` (recorded per the mode)."""
        key = exchange_key(messages, sampling, constraint)
        output = self.lookup(key)
        if output is None:
            self.miss(key)
            output = generate()
            self.record(key, messages, sampling, output)
        return output

    def record(self, key: str, messages: list[dict[str, Any]], sampling: dict[str, Any],
               output: str) -> None:
        if self.mode not in ("record", "auto"):
            return
        row = {"key": key, "messages": messages, "sampling": sampling, "output": output}
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
            self._answers[key] = output


# --- the engine ----------------------------------------------------------------------------------


def _text(parts: Any) -> str:
    if parts is None:
        return ""
    if isinstance(parts, str):
        return parts
    return "".join(getattr(p, "text", "") or "" for p in parts)


def request_messages(request: Any) -> list[dict[str, Any]]:
    """A dspy.lm15.Request as OpenAI-style chat messages (system first)."""
    out = []
    if request.system is not None:
        out.append({"role": "system", "content": _text(request.system)})
    out.extend({"role": m.role, "content": m.text or ""} for m in request.messages)
    return out


class BackendEngine:
    """A DSPy engine over a coevo Backend, optionally behind a cassette.

    The backend is built lazily (a replayed test never loads a model). `backend=` injects an
    already built one (the loop's tiny test models; a shared vLLM engine)."""

    def __init__(self, model: ProposerModel, cassette: Cassette | None = None,
                 backend: Any = None):
        self.model, self.cassette, self._backend = model, cassette, backend
        self.calls = 0  # model calls actually made (cassette hits excluded)
        self.tokens = 0  # their prompt + output tokens (a replayed exchange computed none)

    @property
    def name(self) -> str:
        return getattr(self._backend, "name", None) or self.model.backend

    def constraint(self) -> Constraint | None:
        """The running program's output schema as a decoding constraint (None: off / none)."""
        schema = _OUTPUT_SCHEMA.get()
        if not self.model.json_schema or schema is None:
            return None
        # Closed objects: exactly the signature's keys (an open object lets a small model keep
        # writing invented keys until max_tokens cuts the JSON).
        # Bounded strings and arrays: a model looping inside a string cannot run past
        # max_tokens with the JSON still open (the answer would be lost).
        schema = clean_schema(schema)
        if self.model.bound_strings:
            schema = bound_strings(schema, self.model.max_tokens)
        return Constraint.of_json_schema(schema, source="proposer output schema")

    def backend(self) -> Any:
        if self._backend is None:
            from coevo.models.registry import load_backend

            self._backend = load_backend(self.model.backend, **self.model.options)
        return self._backend

    def sampling(self, request: Any) -> Sampling:
        cfg, m = request.config, self.model
        return Sampling(
            temperature=m.temperature if cfg.temperature is None else cfg.temperature,
            top_p=m.top_p if cfg.top_p is None else cfg.top_p,
            top_k=m.top_k if cfg.top_k is None else cfg.top_k,
            max_new_tokens=cfg.max_tokens or m.max_tokens, stop=list(cfg.stop or ()),
            seed=m.seed if cfg.seed is None else cfg.seed)

    def complete(self, request: Any) -> Response:
        messages = request_messages(request)
        sampling = self.sampling(request)
        constraint = self.constraint()
        output = (self.cassette.answer(messages, sampling.model_dump(mode="json"),
                                       lambda: self._generate(messages, sampling, constraint),
                                       constraint.key if constraint is not None else None)
                  if self.cassette else self._generate(messages, sampling, constraint))
        return Response(id=None, model=self.name, message=Message.assistant([TextPart(output)]),
                        finish_reason="stop", usage=Usage(input_tokens=0, output_tokens=0,
                                                          total_tokens=0))

    def _generate(self, messages: list[dict[str, Any]], sampling: Sampling,
                  constraint: Constraint | None = None) -> str:
        self.calls += 1
        [[c]] = self.backend().generate([Request(messages=messages, sampling=sampling,
                                                 constraint=constraint)])
        # Prefilled + generated tokens, the budget's unit (coevo/ledger.py); a backend that
        # returns no token ids (a hosted API) is estimated at 4 characters a token.
        self.tokens += (len(c.prompt_ids) + len(c.token_ids) if c.token_ids or c.prompt_ids else
                        (sum(len(str(m.get("content", ""))) for m in messages) + len(c.text)) // 4)
        if c.finish_reason == "error":
            # An infrastructure failure of the proposer model: the proposal is invalid with
            # this reason (run_program reports it), the round goes on.
            raise CoevoError(f"proposer model {self.name}: {c.error or 'generation failed'}")
        return c.text

    def stream(self, request: Any):  # DSPy asks for it; proposers never stream
        from dspy.lm15 import response_to_events

        return response_to_events(self.complete(request))

    def close(self) -> None:
        pass


def proposer_lm(model: ProposerModel | str | dict[str, Any] | None = None, *,
                cassette: str | Path | None = None, mode: CassetteMode = "auto",
                backend: Any = None) -> dspy.LM:
    """A dspy.LM that runs on a coevo backend (see the module docstring).

    model: a ProposerModel, a backend spec ("embedded", "openai:http://host/v1", ...) or a
    dict of ProposerModel fields. cassette: a .jsonl path for record/replay. backend: an
    already built Backend to use instead of loading `model.backend`."""
    spec = ProposerModel.parse(model)
    tape = Cassette(cassette, mode) if cassette is not None and mode != "off" else None
    engine = BackendEngine(spec, tape, backend)
    # "coevo/..." is only a label: a custom engine owns the connection, DSPy never routes it.
    lm = dspy.LM(f"coevo/{spec.backend.split(':', 1)[0]}", engine=engine, cache=False,
                 temperature=spec.temperature, max_tokens=spec.max_tokens)
    lm.coevo_engine = engine  # type: ignore[attr-defined]  (call counts, the model's name)
    return lm


def tokens_spent(lm: Any) -> int:
    """Prompt + output tokens the LM's engine has computed so far (0 for a foreign LM);
    a proposer charges the difference across its propose() (coevo/ledger.py)."""
    engine = getattr(lm, "coevo_engine", None)
    return int(getattr(engine, "tokens", 0))


def output_schema(signature: type[dspy.Signature]) -> dict[str, Any]:
    """The JSON schema of a signature's output fields (what JSONAdapter asks the model for)."""
    from pydantic import create_model

    fields = {name: (f.annotation, ...) for name, f in signature.output_fields.items()}
    return create_model(f"{signature.__name__}Output", **fields).model_json_schema()  # type: ignore[call-overload]


def run_program(lm: dspy.LM, program: Any, *, output_overrides: dict[str, Any] | None = None,
                **inputs: Any) -> ProgramCall:
    """Run a DSPy program once on `lm` with the JSON adapter; never raises for a model that
    failed to follow the format or a proposer model that failed (see the module docstring).

    `output_overrides` replaces the JSON Schema of named output fields in the decoding
    constraint with what this call's context allows (the incumbent's tool names, the number
    of criteria a round may add): what the proposer's own checks would refuse is then never
    sampled. The signature (and what the answer is parsed into) stays as it is."""
    signature = getattr(program, "signature", None)
    schema = output_schema(signature) if signature is not None else None
    if schema is not None and output_overrides:
        schema["properties"].update(output_overrides)
    token = _OUTPUT_SCHEMA.set(schema)
    start = len(lm.history)
    engine = getattr(lm, "coevo_engine", None)
    name = engine.name if engine is not None else str(lm.model)
    error, outputs = None, None
    try:
        with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
            pred = program(**inputs)
        outputs = dict(pred.toDict())
    except AdapterParseError as e:
        error = "the proposer model's output is not the requested JSON: " + _first_line(e)
    except CoevoError as e:
        error = str(e)
    except DSPyError as e:  # DSPy wraps what the engine raised
        cause = e.__cause__
        if isinstance(cause, CassetteMiss):
            raise cause from None
        error = str(cause) if isinstance(cause, CoevoError) else f"proposer LM call failed: {_first_line(e)}"
    except (ValueError, TypeError) as e:  # pydantic/DSPy field coercion of a parsed output
        error = f"the proposer model's output does not fit the signature: {_first_line(e)}"
    finally:
        _OUTPUT_SCHEMA.reset(token)
    prompt, raw = _exchange(lm.history[start:])
    if error is None and outputs is None:
        error = "the program returned nothing"
    extra = extra_keys(signature, raw) if error is None and signature is not None else []
    if extra:
        error = (f"the proposer model's output has keys outside the whitelist: {', '.join(extra)} "
                 f"(allowed: {', '.join(signature.output_fields)})")
    return ProgramCall(outputs=outputs, prompt=prompt, raw_output=raw, error=error, model=name,
                       forbidden_keys=extra)


def extra_keys(signature: Any, raw: str) -> list[str]:
    """Top-level keys of the model's JSON answer that are not the signature's output fields,
    read the way dspy.JSONAdapter reads the answer (json_repair, else the first {...} in it)."""
    import json_repair
    import regex

    fields = json_repair.loads(raw) if raw else None
    if not isinstance(fields, dict):
        match = regex.search(r"\{(?:[^{}]|(?R))*\}", raw or "", regex.DOTALL)
        fields = json_repair.loads(match.group(0)) if match else None
    if not isinstance(fields, dict):
        return []
    return sorted(str(k) for k in fields if k not in signature.output_fields)


def _first_line(e: Exception) -> str:
    text = " ".join(str(e).split())
    return text[:300]


def _exchange(entries: list[dict[str, Any]]) -> tuple[str, str]:
    """The prompt and raw output of the calls in `entries` (the last one if several)."""
    if not entries:
        return "", ""
    last = entries[-1]
    outs = last.get("outputs") or []
    raw = outs[0] if outs else ""
    raw = raw if isinstance(raw, str) else json.dumps(raw, default=str)
    return json.dumps(last.get("messages") or [], ensure_ascii=False, indent=1), raw
