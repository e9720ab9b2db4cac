"""Isolated execution of model-written code (the harness's `python` tool).

A `Sandbox` runs a program with the model's code on stdin and returns what it printed. Kinds
are looked up by name in `SANDBOXES`:

- `bwrap` (the default): bubblewrap, the unprivileged sandbox Flatpak is built on (Debian
  package `bubblewrap`). The program runs in its own user, PID, network, IPC, UTS and cgroup
  namespaces (`--unshare-all`): no network but its own loopback, uid 65534 with every
  capability dropped and no further user namespaces, /usr and the interpreter's folders
  read-only, /proc of its own PID namespace, a minimal /dev, and a private size-capped tmpfs
  as /tmp and as its working folder /work. Nothing else of the host exists inside: no /etc, no
  home folder, no store file. `--new-session` (no terminal injection) and `--die-with-parent`
  (a killed caller takes the sandbox with it). bwrap's own init is PID 1 of the namespace; when
  it ends, because the program exited or the timeout killed bwrap's process group, the kernel
  kills every process left in the namespace, `setsid` children included.
- `none`: UNSAFE, for a harness that opts out explicitly (`sandbox: none` on the tool). The
  program runs as the calling user on the host, in an empty temporary folder with a clean
  environment: it can read and write every file that user can, reach the network, and leave
  a `setsid` child running after the timeout.

Both apply rlimits before exec (CPU seconds, address space, file size, process count), run the
program in its own session and kill that process group as a whole on timeout. Its stdout and
stderr go to unnamed files rather than pipes: the file-size rlimit caps them, and a child that
inherits them cannot keep the caller waiting past the timeout the way an open pipe does.
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Protocol, runtime_checkable

from coevo.registry import Registry

DEFAULT_SANDBOX = "bwrap"
UNSAFE_SANDBOXES = frozenset({"none"})
SANDBOX_UID = 65534  # "nobody": owns nothing on the host even if a mapping leaked
TMPFS_BYTES = 64 << 20  # each private tmpfs (/tmp, /work) is RAM: cap it


@dataclass(frozen=True)
class Limits:
    """rlimits of a sandboxed program (hard = soft, so the program cannot raise them)."""

    cpu_s: int = 5
    memory_mb: int = 512
    file_mb: int = 1  # also caps what it may print: stdout and stderr are files
    processes: int = 64  # no fork bombs

    def apply(self) -> None:  # runs in the child between fork and exec: no imports, no locks
        for res, value in ((resource.RLIMIT_CPU, self.cpu_s),
                           (resource.RLIMIT_AS, self.memory_mb << 20),
                           (resource.RLIMIT_FSIZE, self.file_mb << 20),
                           (resource.RLIMIT_NPROC, self.processes)):
            resource.setrlimit(res, (value, value))


@dataclass(frozen=True)
class Completed:
    returncode: int
    stdout: str
    stderr: str


class SandboxTimeout(TimeoutError):
    """The program did not finish in time; its process group was killed."""


@runtime_checkable
class Sandbox(Protocol):
    """Contract:
    - `problem()` is None when this sandbox can run programs on this machine, else one line
      saying why not (what is missing and how to get it). Callers must refuse to run code
      when it is not None, never fall back to a weaker sandbox.
    - `run(argv, stdin, timeout, limits, readable)` runs `argv` (argv[0] an absolute path)
      with `stdin` as its input, in an empty working folder, under `limits`, and returns its
      exit code and output. `readable` are host folders the program needs read-only (the
      interpreter's install); a sandbox that hides the host must show these. After
      `timeout` seconds it kills every process the program started and raises
      `SandboxTimeout`; it returns or raises within about `timeout` + a second.
    - `unsafe` is True when the program is not isolated from the host.
    """

    name: str
    unsafe: bool

    def problem(self) -> str | None: ...

    def run(self, argv: Sequence[str], stdin: str, timeout: float, limits: Limits,
            readable: Sequence[str] = ()) -> Completed: ...


SANDBOXES: Registry[Sandbox] = Registry("sandbox")


def interpreter_paths() -> list[str]:
    """The folders this Python interpreter is installed in (outside /usr, which every sandbox
    shows anyway): what a sandboxed `python` must be able to read. Nested ones are dropped."""
    found = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                           sys.base_exec_prefix,
                                           os.path.dirname(os.path.realpath(sys.executable)))}
    found = {p for p in found if p != "/" and not _under(p, "/usr")}
    return sorted(p for p in found if not any(q != p and _under(p, q) for q in found))


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _read(f: IO[bytes]) -> str:
    f.seek(0)
    return f.read().decode("utf-8", errors="replace")


def run_limited(cmd: Sequence[str], stdin: str, timeout: float, limits: Limits, *,
                cwd: str, env: dict[str, str]) -> Completed:
    """Run `cmd` in its own session under `limits`; on timeout SIGKILL its process group and
    raise SandboxTimeout. stdin, stdout and stderr are unnamed temporary files."""
    with tempfile.TemporaryFile() as fin, tempfile.TemporaryFile() as fout, \
            tempfile.TemporaryFile() as ferr:
        fin.write(stdin.encode("utf-8"))
        fin.seek(0)
        proc = subprocess.Popen(list(cmd), stdin=fin, stdout=fout, stderr=ferr, cwd=cwd, env=env,
                                start_new_session=True, preexec_fn=limits.apply, close_fds=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise SandboxTimeout(f"no result within {timeout:g}s") from None
        except BaseException:  # KeyboardInterrupt, cancellation: leave nothing running
            _kill_group(proc)
            raise
        return Completed(proc.returncode, _read(fout), _read(ferr))


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


class Bubblewrap:
    """The `bwrap` sandbox (module docstring)."""

    name = "bwrap"
    unsafe = False

    def __init__(self, executable: str = "bwrap"):
        self.executable = executable

    def problem(self) -> str | None:
        path = shutil.which(self.executable)
        if path is None:
            return (f"{self.executable} not found on PATH (install bubblewrap: "
                    "apt-get install bubblewrap)")
        return _probe(path)

    def command(self, bwrap: str, argv: Sequence[str], readable: Sequence[str]) -> list[str]:
        """The bwrap command line that runs `argv` isolated (module docstring)."""
        cmd = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns",
               "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--cap-drop", "ALL",
               "--die-with-parent", "--new-session", "--clearenv",
               "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", "/work",
               "--setenv", "PYTHONIOENCODING", "utf-8", "--setenv", "LANG", "C.UTF-8",
               "--ro-bind", "/usr", "/usr"]
        for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
            if os.path.islink(top):  # merged /usr: /bin -> usr/bin
                cmd += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                cmd += ["--ro-bind", top, top]
        for path in readable:
            if not _under(path, "/usr"):
                cmd += ["--ro-bind", path, path]
        cmd += ["--proc", "/proc", "--dev", "/dev",
                "--size", str(TMPFS_BYTES), "--tmpfs", "/tmp",
                "--size", str(TMPFS_BYTES), "--tmpfs", "/work", "--chdir", "/work",
                "--", *argv]
        return cmd

    def run(self, argv: Sequence[str], stdin: str, timeout: float, limits: Limits,
            readable: Sequence[str] = ()) -> Completed:
        problem = self.problem()
        if problem is not None:  # the caller should have asked; never run unsandboxed
            raise RuntimeError(f"sandbox {self.name!r} unavailable: {problem}")
        cmd = self.command(shutil.which(self.executable) or self.executable, argv, readable)
        with tempfile.TemporaryDirectory(prefix="coevo-bwrap-") as cwd:  # bwrap's own cwd
            return run_limited(cmd, stdin, timeout, limits, cwd=cwd, env={"PATH": "/usr/bin:/bin"})


@functools.lru_cache(maxsize=None)
def _probe(bwrap: str) -> str | None:
    """None if `bwrap` can build the sandbox here (user namespaces allowed, options known),
    else its error line. Once per process and executable: about 50 ms."""
    cmd = Bubblewrap().command(bwrap, [sys.executable, "-I", "-c", "pass"], interpreter_paths())
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{bwrap} cannot run: {exc}"
    if done.returncode != 0:
        lines = (done.stderr or "").strip().splitlines()
        why = lines[-1] if lines else f"exit code {done.returncode}"
        return f"{bwrap} cannot build a sandbox here: {why}"
    return None


class NoSandbox:
    """The `none` sandbox: UNSAFE, no isolation from the host (module docstring)."""

    name = "none"
    unsafe = True

    def problem(self) -> str | None:
        return None

    def run(self, argv: Sequence[str], stdin: str, timeout: float, limits: Limits,
            readable: Sequence[str] = ()) -> Completed:
        with tempfile.TemporaryDirectory(prefix="coevo-py-") as cwd:
            env = {"PATH": "/usr/bin:/bin", "HOME": cwd, "PYTHONIOENCODING": "utf-8"}
            return run_limited(argv, stdin, timeout, limits, cwd=cwd, env=env)


SANDBOXES.add("bwrap", Bubblewrap())
SANDBOXES.add("none", NoSandbox())
