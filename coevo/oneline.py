"""The one place where the CLI turns a failure into one line.

Every command of `coevo` runs inside `OneLineGroup.main`: an error a user can act on
(`CoevoError`), a usage error (an unknown flag, `--n abc`) and an operating-system error on a
file the user named (`--out` into a folder that cannot be written) each print a single
`error: ...` line on stderr and exit non-zero. Library warnings (deprecations, a tokenizer's
advice) are silenced for the command's duration: they are noise between the user and that line.
A bug (any other exception) still shows its traceback.
"""

from __future__ import annotations

import logging
import sys
import warnings
from typing import Any

import typer
from rich.console import Console
from typer import _click  # typer's own copy of click: the exceptions it raises
from typer.core import TyperGroup

from coevo.errors import CoevoError
from coevo.terminal import escaped

err = Console(stderr=True)


def one_line(text: str) -> str:
    """`text` on one line: every run of whitespace (a library's multi-line message) becomes
    one space.

    >>> one_line("connection refused\\n\\tIs the server running?")
    'connection refused Is the server running?'
    """
    return " ".join(str(text).split())


def say_error(message: str) -> None:
    err.print(f"[red]error:[/red] {escaped(one_line(message))}", highlight=False, soft_wrap=True)


def os_error_line(e: OSError) -> str:
    """`PATH: reason` for an OSError about a file (`cannot write /x/y: Permission denied`)."""
    where = e.filename if e.filename is not None else ""
    reason = e.strerror or str(e)
    return f"{where}: {reason}" if where else reason


class OneLineGroup(TyperGroup):
    """A typer group whose failures print as one line (see the module docstring)."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quiet = _quiet_library_logs()
            try:
                code = self._run(args, prog_name, complete_var, **extra)
            finally:
                logging.getLogger().removeHandler(quiet)
        if not standalone_mode:
            return code
        sys.exit(code)

    def _run(self, args: Any, prog_name: str | None, complete_var: str | None, **extra: Any) -> int:
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _click.ClickException as e:
            if type(e).__name__ == "NoArgsIsHelpError":  # the help is already printed
                return e.exit_code
            say_error(e.format_message())
            return e.exit_code
        except typer.Abort:
            say_error("aborted")
            return 1
        except CoevoError as e:
            say_error(str(e))
            return 1
        except OSError as e:
            say_error(os_error_line(e))
            return 1
        return rv if isinstance(rv, int) else 0


def _quiet_library_logs() -> logging.Handler:
    """A handler on the root logger, so Python's last-resort handler does not print library
    warnings to stderr; returned to be removed when the command ends."""
    handler = logging.NullHandler()
    logging.getLogger().addHandler(handler)
    return handler
