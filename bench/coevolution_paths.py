"""How the co-evolution bench names files and folders in the data it stores: a data file
relative to the coevo checkout that holds it, the stored command and configs with no folder of
the machine that ran the bench (`.`, `<out>`, `<results>`, `<file name>`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def data_name(path: Path) -> str:
    """How the page names a data file: relative to the checkout that holds it (this one, or
    another clone the bench wrote into: `bench/data/...` reruns from either), or by its file
    name when no checkout holds it."""
    path = path.resolve()
    root = _root(path)
    return str(path.relative_to(root)) if root else path.name


def _root(path: Path) -> Path | None:
    """The checkout a resolved `path` lies in: this one, another coevo clone, or None."""
    return REPO if path.is_relative_to(REPO) else checkout_of(path.parent)


def checkout_of(path: Path) -> Path | None:
    """The coevo checkout `path` lies in (the nearest folder up with a `.git` and this script
    at bench/coevolution.py), or None: a file in some other repository is named by its name."""
    return next((p for p in (path, *path.parents)
                 if (p / ".git").exists() and (p / "bench" / "coevolution.py").is_file()), None)


_FILE_FLAGS = ("--data", "--reuse")


def stored_command(argv: list[str]) -> str:
    """The command as the data file keeps it: --data and --reuse files named as `data_name`
    names them (a file no checkout holds as `<its name>`) and the --out folder `<out>`, given
    absolute or relative, so the stored command names no folder of the machine that ran it,
    whichever checkout it ran from."""
    def shown(value: str) -> str:
        path = Path(value).resolve()
        root = _root(path)
        return str(path.relative_to(root)) if root else f"<{path.name}>"

    out, flag = [], None
    for arg in argv:
        key, eq, value = arg.partition("=")
        if flag:
            arg = "<out>" if flag == "--out" else shown(arg)
        elif eq and key == "--out":
            arg = "--out=<out>"
        elif eq and key in _FILE_FLAGS:
            arg = f"{key}={shown(value)}"
        flag = arg if arg in (*_FILE_FLAGS, "--out") else None
        out.append(arg)
    return "python bench/coevolution.py " + " ".join(out)


def portable(report: dict[str, Any], out: Path, results: Path | None = None) -> dict[str, Any]:
    """`report` with this checkout's path written "." and the --out folder "<out>" (in the
    command, the configs' seed_dir and checkpoint folders), and a --results page outside the
    checkout "<results>": the stored data and the page name no folder of the machine that ran
    the bench."""
    text = json.dumps(report, default=str)
    pairs = [(out.resolve(), "<out>")]
    if results is not None and not results.resolve().is_relative_to(REPO.resolve()):
        pairs.append((results.resolve(), "<results>"))
    for path, name in (*pairs, (REPO.resolve(), ".")):
        text = text.replace(json.dumps(str(path))[1:-1], name)
    return json.loads(text)
