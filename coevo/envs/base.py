"""The environment contract: tasks with verifiers.

An environment serves tasks of a split, optionally executes tool calls against its own
simulated world (multi-turn), and scores an episode with its own verifier. The verifier's
`outcome` is the ground truth; `details` carries the environment's partial-credit signals
(e.g. BFCL: output decodes, right function name, required arguments present, values right),
which rubrics may turn into reward but the gate never confuses with the outcome. `feedback` is
the verifier's own diagnosis of a failed episode (GEPA's "feedback function"): a normalized
kind (`wrong_type`, `missing_parameter`, `wrong_answer`, ...) and one short line, which the
round digest groups for the proposers (coevo/propose/feedback.py; train tasks only, since the
line may name the expected answer).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from coevo.trajectory import ToolCall, ToolResult

SPLITS = ("train", "val", "test")


class Task(BaseModel):
    """One environment instance. `answer` is the verifier's key: never shown to the agent."""

    model_config = ConfigDict(extra="forbid")
    id: str  # stable across runs: the split is a hash of it
    env: str  # e.g. "bfcl:simple_python"
    family: str = ""  # task family for capability-aware sampling (category, dataset, ...)
    messages: list[dict[str, Any]]  # the user-side conversation that opens the episode
    tools: list[dict[str, Any]] = Field(default_factory=list)  # OpenAI function specs offered
    answer: Any = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class Response(BaseModel):
    """What the agent produced, as the environment's verifier sees it."""

    model_config = ConfigDict(extra="forbid")
    text: str = ""  # final assistant text (after answer extraction)
    tool_calls: list[ToolCall] = Field(default_factory=list)  # the calls of the final turn
    all_tool_calls: list[list[ToolCall]] = Field(default_factory=list)  # every turn's calls
    parse_error: str | None = None


FEEDBACK_CHARS = 240  # one line: a proposer's digest holds several of them
FEEDBACK_KIND = r"^[a-z][a-z0-9_]{0,47}$"


class Feedback(BaseModel):
    """Why the verifier failed an episode: `kind` groups failures (snake_case, a small fixed
    vocabulary per environment), `text` is one line a person or proposer can act on. It may
    name the expected answer: never show it for a val or test task."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: str = Field(pattern=FEEDBACK_KIND)
    text: str = Field("", max_length=FEEDBACK_CHARS)

    @classmethod
    def of(cls, kind: str, text: str = "") -> "Feedback":
        """`text` on one line, cut to FEEDBACK_CHARS (head kept, marked with "...").

        >>> Feedback.of("wrong_answer", "expected 33,\\n given 32").text
        'expected 33, given 32'
        """
        line = " ".join(str(text).split())
        if len(line) > FEEDBACK_CHARS:
            line = line[: FEEDBACK_CHARS - 3] + "..."
        return cls(kind=kind, text=line)


class Score(BaseModel):
    model_config = ConfigDict(extra="forbid")
    outcome: float = Field(ge=0.0, le=1.0)
    success: bool
    details: dict[str, float] = Field(default_factory=dict)
    info: dict[str, Any] = Field(default_factory=dict)  # e.g. the checker's error message
    feedback: Feedback | None = None  # set on failures by the environments that can say why


@runtime_checkable
class Environment(Protocol):
    """Contract:
    - `tasks(split)` is deterministic: the same seed and sizes give the same tasks in the same
      order on every machine; train / val / test never overlap.
    - `single_turn`: the agent's first response is the answer (BFCL single-turn categories:
      tool calls are scored, not executed). Otherwise `start` + `step` run tool calls against
      the environment's own state until the agent answers or the harness's turn limit is hit.
    - Optional `next_turn(state) -> list[dict] | None`: multi-turn environments with several
      user turns (BFCL multi-turn) return the next user messages when the agent answers
      without a tool call, None when the conversation is over; a state with a `tools`
      attribute offers those tools from then on (functions revealed mid-episode).
    - Optional `act(state, text) -> list[dict] | None`: text games (TextArena), where every
      reply is a move. When the episode offers no tools, or the reply attempts no tool call,
      the runtime plays the reply's text with `act` and appends the returned user messages
      (the game's answer); None means the game is over. The reply of the harness's last turn
      is played too. `act` takes precedence over `next_turn`.
    - `score` receives the state `start` returned (multi-turn verifiers need the history).
    - `score` never raises for bad agent output: a malformed answer scores 0 with a reason in
      `info`. It raises `coevo.errors.InfraError` only when the verifier itself cannot run.
    """

    name: str
    single_turn: bool

    def tasks(self, split: str, n: int | None = None) -> list[Task]: ...

    def start(self, task: Task) -> Any: ...

    def step(self, state: Any, calls: list[ToolCall]) -> list[ToolResult]: ...

    def score(self, task: Task, state: Any, response: Response) -> Score: ...
