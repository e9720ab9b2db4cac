"""TextArena single-player games as coevo environments: `textarena:<game id>[?kwarg=value]`.

TextArena (PyPI `textarena`, extra `coevo[textarena]`) plays text games through
`env.reset(num_players, seed)`, `env.get_observation()` and `env.step(action) -> (done, info)`,
and gives every player a reward when the game ends (`env.close() -> (rewards, game_info)`).
The mapping:

- Task: one (game, seed) pair. Seeds 0 .. `size`-1 (default 500) make the pool; the task id
  is `textarena:<game>[?kwargs]@<seed>` and train / val / test are cut by hashing ids
  (coevo/envs/splits.py), so the same spec gives the same tasks everywhere. `messages` is the
  game's first observation after `reset(num_players=1, seed=seed)`, as one user message;
  `family` is the game id; `metadata` holds the game and the seed; `answer` is None (the game
  itself is the verifier). Query options other than `size`, `split` and `outcome` are the
  game's own keyword arguments (`textarena:GuessTheNumber-v0?max_number=50`) and are part of
  the name, hence of every task id.
- Episode: `start(task)` makes a fresh game and resets it with the task's seed. Every policy
  turn that calls no tool is one move: the runtime hands the reply text to `act(state, text)`
  (coevo.envs.base), which calls `env.step(text)`; the game's messages since that move (its
  echo of the move left out) become the next user message. When the game is over `act`
  returns None and the episode ends. The harness's `workflow.max_turns` caps the moves; its
  last reply is still played.
- Score: `outcome` is the game's reward for player 0 clipped to [0, 1]. TextArena's
  single-player games pay 1 for a win and their own progress measure in [0, 1] (distance of
  the last guess, share of the puzzle solved) for a loss, the game's turn limit or a second
  invalid move in a row; with `?outcome=win` the outcome is 1 for a win and 0 otherwise.
  `success` means the reward is at least 1. `details` (partial credit, each in [0, 1]):
  `progress` (the clipped reward, which rubrics can pay for under `?outcome=win`), `won`,
  `finished`, `invalid_move` (the game ended on invalid moves). `info`: `reward` as the game
  gave it (possibly negative), `moves` played, the game's `reason` and its last observation.
  A game that is not over when the episode ends (the harness's turn limit came first) scores
  0 with `finished` 0 and the reason in `info["error"]`.
- Randomness: TextArena games draw from Python's global `random` (reseeded by `reset`). Each
  episode keeps its own `random` state and every call into the game runs under a lock with
  that state swapped in, so concurrent episodes neither share nor disturb a random stream and
  an episode is a function of its seed and its moves (a replay gives the same game).

Supported: games whose state after `reset(num_players=1)` is TextArena's
`SinglePlayerState`; any other game is refused at construction. Checked offline with
textarena 0.7.4 (`OFFLINE_GAMES`): 2048, Bandit, Blackjack, Crosswords, FifteenPuzzle,
FrozenLake, GuessTheNumber, LightsOut, LogicPuzzle, Mastermind, Minesweeper, PegJump, RushHour,
Secretary, Set, Sokoban, Sudoku, ThreeCardMonte, TowerOfHanoi. Countdown, Cryptarithm and
Slitherlink run too, but in 0.7.4 a game they end on invalid moves carries its message as the
reward: such an episode is an infrastructure error (missing data), not a score.
Not supported: multi-player games (and so TextArena's online play); games that need network
services or downloaded data (Wordle, Hangman, WordLadder, WordSearch fetch NLTK corpora;
GuessWho, TwentyQuestions ask an OpenRouter model), which fail at construction with the
game's own reason unless that data or service is there; tool calls (a game offers no
functions); TextArena's observation wrappers (coevo renders the new messages itself, the
conversation holds the history) - its action wrappers are kept, so in a `-v0` game a reply
without square brackets is wrapped in them whole, and `-raw` ids play the reply as written.
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from coevo.envs.base import Response, Score, Task
from coevo.envs.splits import SplitSpec, select, split_field
from coevo.errors import CoevoError, InfraError
from coevo.trajectory import ToolCall, ToolResult

T = TypeVar("T")

OFFLINE_GAMES = (
    "2048-v0", "Bandit-v0", "Blackjack-v0", "Crosswords-v0", "FifteenPuzzle-v0", "FrozenLake-v0",
    "GuessTheNumber-v0", "LightsOut-v0", "LogicPuzzle-v0", "Mastermind-v0", "Minesweeper-v0",
    "PegJump-v0", "RushHour-v0", "Secretary-v0", "Set-v0", "Sokoban-v0", "Sudoku-v0",
    "ThreeCardMonte-v0", "TowerOfHanoi-v0",
)
OUTCOMES = ("reward", "win")
PLAYER = 0
NO_MESSAGE = "(The game sent no message.) Your next move?"

# Python's global `random` is what the games draw from: one game call at a time, each with its
# episode's own state swapped in (module docstring).
_LOCK = threading.RLock()


def import_textarena() -> Any:
    try:
        import textarena
    except ImportError:
        raise CoevoError("textarena: environments need the textarena package: "
                         "`pip install 'coevo[textarena]'`") from None
    return textarena


def _isolated(rng: Any, fn: Callable[[], T]) -> tuple[T, Any]:
    """`fn()` with Python's global random state set to `rng`; (result, the state after)."""
    with _LOCK:
        outer = random.getstate()
        random.setstate(rng)
        try:
            return fn(), random.getstate()
        finally:
            random.setstate(outer)


def _unwrapped(game: Any) -> Any:
    """The game under TextArena's wrappers: observations are read here, raw."""
    import textarena as ta

    while isinstance(game, ta.Wrapper):
        game = game.env
    return game


def render(messages: list[tuple[int, str, Any]]) -> str:
    """The text of the game's new messages, the echo of the player's own move left out.

    >>> from types import SimpleNamespace as K
    >>> render([(0, "[5]", K(name="PLAYER_ACTION")), (-1, "Higher.", K(name="GAME_MESSAGE"))])
    'Higher.'
    """
    parts = [str(text).strip("\n") for sender, text, kind in messages
             if not (sender == PLAYER and getattr(kind, "name", "") == "PLAYER_ACTION")]
    return "\n".join(p for p in parts if p.strip())


def _kwargs_key(kwargs: dict[str, Any]) -> str:
    return "&".join(f"{k}={json.dumps(v, sort_keys=True)}" for k, v in sorted(kwargs.items()))


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip(" *") for ln in str(exc).splitlines() if ln.strip(" *")]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")


@dataclass
class GameState:
    """One episode's game: the TextArena env, its own random state, the moves played."""

    task_id: str
    game: Any
    rng: Any
    moves: list[str] = field(default_factory=list)
    done: bool = False
    reward: float | None = None
    game_info: dict[str, Any] = field(default_factory=dict)
    last_observation: str = ""


class TextArenaEnv:
    """`textarena:<game id>`: seeds of one single-player TextArena game as tasks."""

    single_turn = False

    def __init__(self, game: str, size: int = 500, split: SplitSpec | dict | None = None,
                 outcome: str = "reward", **game_kwargs: Any):
        import_textarena()  # the one-line error when the extra is missing, before anything else
        if size < 1:
            raise CoevoError(f"textarena:{game}: size must be >= 1, got {size}")
        if outcome not in OUTCOMES:
            raise CoevoError(f"textarena:{game}: outcome must be one of {', '.join(OUTCOMES)}, "
                             f"got {outcome!r}")
        self.game, self.size, self.outcome = game, size, outcome
        self.game_kwargs = dict(game_kwargs)
        self.split = split_field(split)
        key = _kwargs_key(self.game_kwargs)
        self.name = f"textarena:{game}" + (f"?{key}" if key else "")
        self._tasks: dict[int, Task] = {}
        self._check_single_player()

    # ------------------------------------------------------------------------------ games

    def _make(self) -> Any:
        if self.game not in import_textarena().envs.registration.ENV_REGISTRY:
            raise CoevoError(f"textarena: unknown game {self.game!r}; single-player games that "
                             f"run offline: {', '.join(OFFLINE_GAMES)}")
        try:
            return import_textarena().make(self.game, **self.game_kwargs)
        except Exception as e:  # a keyword the game does not take, a module that fails to load
            raise CoevoError(f"{self.name}: cannot make the game ({_first_line(e)})") from None

    def _reset(self, seed: int) -> tuple[Any, str, Any]:
        """(game, first observation, random state after the reset) for `seed`."""
        game = self._make()

        def reset() -> str:
            game.reset(num_players=1, seed=seed)
            return render(_unwrapped(game).get_observation()[1])

        try:
            first, rng = _isolated(random.Random(seed).getstate(), reset)
        except CoevoError:
            raise
        except (AssertionError, ValueError) as e:
            if "player" not in str(e).lower():
                raise CoevoError(f"{self.name}: the game cannot start here ({_first_line(e)})"
                                 ) from None
            raise CoevoError(f"{self.name}: not a single-player game ({_first_line(e)}); coevo "
                             "plays single-player games only") from None
        except Exception as e:  # NLTK data missing, an API key asked for, a player count refused
            raise CoevoError(f"{self.name}: the game cannot start here ({_first_line(e)}); "
                             f"single-player games that run offline: {', '.join(OFFLINE_GAMES)}"
                             ) from None
        return game, first, rng

    def _check_single_player(self) -> None:
        game, first, _ = self._reset(0)
        state = getattr(_unwrapped(game), "state", None)
        if not isinstance(state, import_textarena().SinglePlayerState):
            raise CoevoError(f"{self.name}: not a single-player game (its state is "
                             f"{type(state).__name__}); coevo plays single-player games only")
        self._tasks[0] = self._task(0, first)

    # ------------------------------------------------------------------------------ tasks

    def task_id(self, seed: int) -> str:
        return f"{self.name}@{seed}"

    def _task(self, seed: int, first: str) -> Task:
        return Task(id=self.task_id(seed), env=self.name, family=self.game,
                    messages=[{"role": "user", "content": first or NO_MESSAGE}],
                    metadata={"game": self.game, "seed": seed})

    def tasks(self, split: str, n: int | None = None) -> list[Task]:
        # Ids come from seeds alone; only the chosen tasks reset a game (some take seconds).
        seeds = select(range(self.size), split, self.split, n, key=self.task_id)
        out = []
        for seed in seeds:
            with _LOCK:
                if seed not in self._tasks:
                    self._tasks[seed] = self._task(seed, self._reset(seed)[1])
                out.append(self._tasks[seed])
        return out

    # ---------------------------------------------------------------------------- episode

    def start(self, task: Task) -> GameState:
        try:
            game, first, rng = self._reset(int(task.metadata["seed"]))
        except CoevoError as e:
            raise InfraError(str(e)) from None
        if (first or NO_MESSAGE) != task.messages[0]["content"]:
            raise InfraError(f"{task.id}: the game's first observation differs from the task's "
                             "(the game does not replay from its seed, or another textarena "
                             "version made the task)")
        return GameState(task_id=task.id, game=game, rng=rng)

    def act(self, state: GameState, text: str) -> list[dict[str, Any]] | None:
        """Play `text` as the next move; the game's answer as user messages, or None when
        the game is over (also when it already was)."""
        if state.done:
            return None

        def move() -> tuple[bool, str, Any]:
            done, _ = state.game.step(text)
            observation = render(_unwrapped(state.game).get_observation()[1])
            return bool(done), observation, state.game.close() if done else None

        (done, observation, closed), state.rng = _isolated(state.rng, move)
        state.moves.append(text)
        state.last_observation = observation
        if not done:
            return [{"role": "user", "content": observation or NO_MESSAGE}]
        rewards, game_info = closed
        state.done = True
        state.game_info = dict((game_info or {}).get(PLAYER, {}))
        raw = (rewards or {}).get(PLAYER)
        try:
            state.reward = float(raw)
        except (TypeError, ValueError):  # e.g. a game passing its arguments in the wrong order
            state.reward = None
            state.game_info["unreadable_reward"] = repr(raw)[:200]
        return None

    def step(self, state: Any, calls: list[ToolCall]) -> list[ToolResult]:
        msg = "this game offers no functions: write your move as text"
        return [ToolResult(name=c.name, content=f"Error: {msg}", error=msg) for c in calls]

    # ---------------------------------------------------------------------------- scoring

    def score(self, task: Task, state: Any, response: Response) -> Score:
        if not isinstance(state, GameState) or state.task_id != task.id:
            raise InfraError(f"{task.id}: score needs the GameState that start() returned")
        details = {"finished": float(state.done),
                   "invalid_move": float(bool(state.game_info.get("invalid_move")))}
        info: dict[str, Any] = {"moves": len(state.moves), "reward": state.reward,
                                "last_observation": state.last_observation}
        if state.done and state.reward is None:
            raise InfraError(f"{task.id}: the game ended without a numeric reward "
                             f"({state.game_info.get('unreadable_reward')})")
        if not state.done:
            details.update(progress=0.0, won=0.0)
            info["error"] = (f"the game was not over after {len(state.moves)} moves "
                             "(the harness's turn limit came first)")
            return Score(outcome=0.0, success=False, details=details, info=info)
        won = state.reward >= 1.0
        progress = min(1.0, max(0.0, state.reward))
        details.update(progress=progress, won=float(won))
        info["reason"] = state.game_info.get("reason")
        outcome = float(won) if self.outcome == "win" else progress
        return Score(outcome=outcome, success=won, details=details, info=info)
