"""`textarena:<game>` on a real TextArena game (GuessTheNumber-v0, 1..20, 10 guesses): the
adapter's mapping (tasks per seed, moves, the game's reward as outcome) with scripted moves,
one `coevo eval` through the whole runtime, and the one-line error without the extra."""

from __future__ import annotations

import re
import sys

import pytest
from typer.testing import CliRunner

from coevo.assets.harness import Harness
from coevo.cli import app
from coevo.envs.base import Response
from coevo.envs.registry import make_env
from coevo.errors import CoevoError
from coevo.models.registry import BACKENDS
from coevo.models.scripted import ScriptedBackend
from coevo.store import Store

pytest.importorskip("textarena")
runner = CliRunner()
GAME = "textarena:GuessTheNumber-v0"


def bisect(messages: list[dict]) -> str:
    """A binary-search player over 1..20: bounds from its own guesses and the game's hints."""
    lo, hi = 1, 20
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            guess = int(re.search(r"\[(\d+)\]", m["content"]).group(1))
            hint = messages[i + 1]["content"] if i + 1 < len(messages) else ""
            lo, hi = (guess + 1, hi) if "higher" in hint else (lo, guess - 1) if "lower" in hint else (lo, hi)
    return f"My guess is [{(lo + hi) // 2}]."


def play(env, task, moves, limit: int | None = None):
    """Play `moves` (texts, or a callable of the conversation) until the game ends; the state."""
    state = env.start(task)
    convo = list(task.messages)
    for k in range(limit or 100):
        text = moves(convo) if callable(moves) else moves[k]
        convo.append({"role": "assistant", "content": text})
        answer = env.act(state, text)
        if answer is None:
            break
        convo.extend(answer)
    return state, convo


def test_mapping_on_guess_the_number():
    env = make_env(GAME)
    val, test = env.tasks("val"), env.tasks("test")
    assert len(val) > 50 and not {t.id for t in val} & {t.id for t in test}
    assert [t.id for t in make_env(GAME).tasks("val", 5)] == [t.id for t in val[:5]]
    task = val[0]
    seed = task.metadata["seed"]
    assert task.id == f"{GAME}@{seed}" and task.family == "GuessTheNumber-v0"
    assert task.messages[0]["role"] == "user"
    assert "guess the number between 1 and 20" in task.messages[0]["content"]

    # A win: the game's hints lead the binary search to the number, reward 1.
    state, convo = play(env, task, bisect)
    won = env.score(task, state, Response())
    assert (won.outcome, won.success) == (1.0, True)
    assert won.details == {"progress": 1.0, "won": 1.0, "finished": 1.0, "invalid_move": 0.0}
    assert won.info["moves"] == len(state.moves) and won.info["reward"] == 1.0
    assert "correct number" in won.info["reason"].lower()
    target = int(re.search(r"\[(\d+)\]", state.moves[-1]).group(1))
    hints = [m["content"] for m in convo if m["role"] == "user"][1:]
    assert hints and all(h in ("The target number is higher.", "The target number is lower.")
                         for h in hints)

    # The same seed is the same game: wrong guesses, the last at distance d, until the game's
    # turn limit ends it with its progress reward 1 - d / 19 (textarena 0.7.4 checks the limit
    # before counting the move, so the 11th guess is the last of "10 turns").
    wrong = [n for n in range(1, 21) if n != target]
    far = wrong[:10] + wrong[-1:]
    state, _ = play(env, task, [f"[{n}]" for n in far])
    lost = env.score(task, state, Response())
    expected = 1 - abs(far[-1] - target) / 19
    assert lost.outcome == pytest.approx(expected) and not lost.success
    assert lost.details["progress"] == pytest.approx(expected) and lost.info["moves"] == 11
    assert lost.details["won"] == 0.0 and "turn limit" in lost.info["reason"]
    # ... and with outcome=win only a win counts; the progress stays partial credit.
    binary = make_env(f"{GAME}?outcome=win")
    bstate, _ = play(binary, task, [f"[{n}]" for n in far])
    bscore = binary.score(task, bstate, Response())
    assert bscore.outcome == 0.0 and bscore.details["progress"] == pytest.approx(expected)

    # Two invalid moves in a row end the game: no guess made, progress 0.
    state, convo = play(env, task, ["hello", "no number here"])
    invalid = env.score(task, state, Response())
    assert (invalid.outcome, invalid.details["invalid_move"], invalid.info["moves"]) == (0.0, 1.0, 2)
    assert "invalid move" in convo[2]["content"].lower()  # the first one is a warning

    # A game the episode left unfinished scores 0 and says why.
    state, _ = play(env, task, ["[1]" if target != 1 else "[2]"], limit=1)
    open_game = env.score(task, state, Response())
    assert (open_game.outcome, open_game.details["finished"]) == (0.0, 0.0)
    assert "not over after 1 moves" in open_game.info["error"]


def test_unsupported_games_and_options_are_one_clear_error():
    for spec, words in [("textarena:TicTacToe-v0", "not a single-player game"),
                        ("textarena:Nope-v0", "unknown game 'Nope-v0'"),
                        (f"{GAME}?outcome=draw", "outcome must be one of reward, win"),
                        (f"{GAME}?bogus=1", "unexpected keyword argument 'bogus'")]:
        with pytest.raises(CoevoError, match=re.escape(words)):
            make_env(spec)
    # Game options are the game's keyword arguments and part of every task id.
    wide = make_env(f"{GAME}?max_number=50")
    task = wide.tasks("train", 1)[0]
    assert task.id.startswith("textarena:GuessTheNumber-v0?max_number=50@")
    assert "between 1 and 50" in task.messages[0]["content"]


def test_coevo_eval_plays_the_game_through_the_runtime(tmp_path, monkeypatch):
    """`coevo eval` with a scripted binary-search player and a 3-move turn limit: the stored
    outcome of every task is what the same moves give played directly against the adapter
    (1 where the number is found within 3 guesses, 0 where the game is still open)."""
    db = f"sqlite:///{tmp_path / 'c.db'}"
    Store.open(db).put_asset(Harness.model_validate({
        "name": "guesser", "system_prompt": "Guess the number. Write it in square brackets.",
        "workflow": {"max_turns": 3}, "decoding": {"temperature": 0.0, "max_new_tokens": 16}}))
    players = []

    def backend(arg, **opts):
        players.append(ScriptedBackend(lambda request, i: bisect(request.messages)))
        return players[-1]

    monkeypatch.setitem(BACKENDS._items, "scripted", backend)
    r = runner.invoke(app, ["eval", "--harness", "guesser", "--env", GAME, "--split", "val",
                            "--n", "8", "--model", "scripted", "--db", db])
    assert r.exit_code == 0, r.output

    env = make_env(GAME)
    expected = {}
    for task in env.tasks("val", 8):
        state, _ = play(env, task, bisect, limit=3)
        expected[task.id] = env.score(task, state, Response()).outcome
    assert set(expected.values()) == {0.0, 1.0}  # some found in 3 guesses, some not
    stored = Store.open(db).trajectories(split="val")
    assert {t.task_id: t.outcome for t in stored} == expected
    for t in stored:
        assert len(t.turns) == (len(t.messages) - 1) // 2  # system, task, (move, answer)...
        hints = [m["content"] for m in t.messages[2:] if m["role"] == "user"]
        assert all("target number is" in h for h in hints)
        assert len(hints) == len(t.turns) - 1  # the last move got no answer in the episode
    mean = sum(expected.values()) / len(expected)
    assert f"{mean:.3f}" in r.output


def test_missing_extra_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "textarena", None)  # as if it were not installed
    with pytest.raises(CoevoError, match=re.escape("pip install 'coevo[textarena]'")):
        make_env(GAME)
    db = f"sqlite:///{tmp_path / 'c.db'}"
    Store.open(db).put_asset(Harness.model_validate({"name": "guesser", "system_prompt": "Play."}))
    r = runner.invoke(app, ["eval", "--harness", "guesser", "--env", GAME, "--model",
                            "openai:http://127.0.0.1:9/v1", "--db", db])
    lines = r.output.strip().splitlines()
    assert r.exit_code != 0 and len(lines) == 1, r.output
    assert "textarena" in lines[0] and "pip install 'coevo[textarena]'" in lines[0]
