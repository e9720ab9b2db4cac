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
    return _in_checkout(path) or path.resolve().name


def _in_checkout(path: Path) -> str | None:
    """`path` relative to the checkout it lies in (this one or another coevo clone), or None."""
    path = path.resolve()
    root = REPO if path.is_relative_to(REPO) else checkout_of(path.parent)
    return str(path.relative_to(root)) if root else None


def checkout_of(path: Path) -> Path | None:
    """The coevo checkout `path` lies in (the nearest folder up with a `.git` and this script
    at bench/coevolution.py), or None: a file in some other repository is named by its name."""
    return next((p for p in (path, *path.parents)
                 if (p / ".git").exists() and (p / "bench" / "coevolution.py").is_file()), None)


def stored_command(argv: list[str]) -> str:
    """The command as the data file keeps it, naming no folder of the machine that ran it,
    whichever checkout it ran from: --data and --reuse files as `data_name` names them (a file
    no checkout holds as `<its name>`), a --results page in a checkout relative to it (else
    `<results>`), and the --out folder `<out>`; each given absolute or relative, as `--flag
    value` or `--flag=value`."""
    def named(flag: str, value: str) -> str:
        if flag == "--out":
            return "<out>"
        path = Path(value)
        fallback = "<results>" if flag == "--results" else f"<{path.resolve().name}>"
        return _in_checkout(path) or fallback

    flags = ("--data", "--reuse", "--results", "--out")
    out, flag = [], None
    for arg in argv:
        key, eq, value = arg.partition("=")
        if flag:
            arg = named(flag, arg)
        elif eq and key in flags:
            arg = f"{key}={named(key, value)}"
        flag = arg if arg in flags else None
        out.append(arg)
    return "python bench/coevolution.py " + " ".join(out)


def portable(report: dict[str, Any], out: Path) -> dict[str, Any]:
    """`report` with this checkout's path written "." and the --out folder "<out>" wherever
    they occur (the command is named by `stored_command`; these are the configs' seed_dir and
    checkpoint folders), so the stored data and the page name no folder of the machine."""
    text = json.dumps(report, default=str)
    for path, name in ((out.resolve(), "<out>"), (REPO.resolve(), ".")):
        text = text.replace(json.dumps(str(path))[1:-1], name)
    return json.loads(text)
