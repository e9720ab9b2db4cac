"""The `python` tool's sandbox (coevo/sandbox.py) against the escapes a hostile program tries:
reading host secrets, writing outside its folder, editing a coevo SQLite store, reaching a local
TCP server, serving on 0.0.0.0, and leaving a `setsid` process running past the timeout. Each
runs real model-style code through the real tool and a real bwrap, and the assertions read the
host side (files, the database, a listener's accept count, /proc), not only the observation."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sqlite3
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from coevo.agent.episode import harness_tools
from coevo.agent.tools import execute, resolve_tools
from coevo.assets.harness import Harness
from coevo.errors import CoevoError
from coevo.sandbox import SANDBOXES, Bubblewrap, Limits, interpreter_paths
from coevo.trajectory import ToolCall, ToolResult

REPO = Path(__file__).resolve().parent.parent


def run_python(code: str, timeout: float = 5.0, sandbox: str = "bwrap") -> ToolResult:
    tools = resolve_tools(["python"], {"python": sandbox})
    return asyncio.run(execute(ToolCall(name="python", arguments={"code": code}), tools, timeout))


def probe(code: str, **kw) -> dict:
    """Run `code`, which ends by printing one JSON object, and return that object."""
    r = run_python(code, **kw)
    assert r.error is None, r.error
    return json.loads(r.content.strip().splitlines()[-1])


TRY = '''
import json
def attempt(fn):
    try:
        return "ok: " + repr(fn())[:80]
    except Exception as e:
        return type(e).__name__
'''


def test_host_secrets_and_files_are_not_readable(bwrap, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET")
    paths = ["/etc/shadow", "/etc/passwd", str(secret), str(REPO / "README.md"),
             os.path.expanduser("~"), "/root/.ssh", "/proc/1/environ"]
    got = probe(TRY + f"print(json.dumps({{p: attempt(lambda p=p: open(p).read()) "
                      f"for p in {paths!r}}}))")
    assert got["/etc/shadow"] == got["/etc/passwd"] == got[str(secret)] == "FileNotFoundError"
    assert got[str(REPO / "README.md")] == "FileNotFoundError"
    assert all(not v.startswith("ok") for p, v in got.items() if p != "/proc/1/environ")
    # /proc is the sandbox's own: PID 1 there is bwrap's init, started with a bare PATH
    # (the test process has COEVO_DB, HOME, ... set)
    assert got["/proc/1/environ"] == "ok: 'PATH=/usr/bin:/bin\\x00'"
    assert "TOP-SECRET" not in json.dumps(got)


def test_writes_outside_the_private_folder_fail_and_leave_the_host_unchanged(bwrap, tmp_path):
    name = f"coevo-pwned-{uuid.uuid4().hex[:8]}"  # new each run: its absence means something
    targets = [str(tmp_path / "out.txt"), f"/usr/{name}", str(REPO / name),
               os.path.join(interpreter_paths()[0], name) if interpreter_paths() else
               f"/usr/lib/{name}", f"/etc/{name}"]
    code = TRY + f'''
import os
got = {{t: attempt(lambda t=t: open(t, "w").write("x")) for t in {targets!r}}}
got["work"] = attempt(lambda: open("work.txt", "w").write("kept?"))
got["tmp"] = attempt(lambda: open("/tmp/{name}", "w").write("kept?"))
got["cwd"], got["uid"] = os.getcwd(), os.getuid()
print(json.dumps(got))
'''
    got = probe(code)
    for t in targets:
        assert got[t] in ("FileNotFoundError", "OSError", "PermissionError"), (t, got[t])
        assert not Path(t).exists()
    # its own folder and /tmp are writable, private and gone afterwards
    assert got["work"] == got["tmp"] == "ok: 5" and got["cwd"] == "/work" and got["uid"] == 65534
    assert not Path("/work/work.txt").exists() and not Path(f"/tmp/{name}").exists()


def test_a_coevo_sqlite_store_outside_cannot_be_modified(bwrap, tmp_path, monkeypatch):
    db = tmp_path / "coevo.db"
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE runs (name TEXT)")
        c.execute("INSERT INTO runs VALUES ('kept')")
    before = db.read_bytes()
    monkeypatch.setenv("COEVO_DB", f"sqlite:///{db}")
    code = TRY + f'''
import os, sqlite3
def tamper(path):
    c = sqlite3.connect("file:" + path + "?mode=rw", uri=True)
    c.execute("UPDATE runs SET name = 'pwned'")
    c.execute("DROP TABLE runs")
    c.commit()
print(json.dumps({{"tamper": attempt(lambda: tamper({str(db)!r})),
                  "env": sorted(os.environ)}}))
'''
    got = probe(code)
    assert got["tamper"] == "OperationalError"  # unable to open database file
    assert "COEVO_DB" not in got["env"] and "HOME" in got["env"]
    assert db.read_bytes() == before
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT name FROM runs").fetchall() == [("kept",)]


def test_a_local_tcp_server_is_unreachable(bwrap):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted: list[object] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except TimeoutError:
                pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        got = probe(TRY + f'''
import socket
def connect(host):
    s = socket.create_connection((host, {port}), timeout=2)
    s.sendall(b"hello")
print(json.dumps({{"loopback": attempt(lambda: connect("127.0.0.1")),
                  "localhost": attempt(lambda: connect("localhost")),
                  "outside": attempt(lambda: connect("192.0.2.1")),
                  "interfaces": [n for _, n in socket.if_nameindex()]}}))
''')
    finally:
        stop.set()
        t.join()
        server.close()
    assert got["loopback"] == "ConnectionRefusedError" and not got["localhost"].startswith("ok")
    assert got["outside"] == "OSError"  # network is unreachable: no route at all
    assert got["interfaces"] == ["lo"] and accepted == []


def test_serving_on_all_interfaces_is_useless(bwrap):
    with socket.socket() as s:  # a port free on the host
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = f'''
import socket, time
s = socket.socket(); s.bind(("0.0.0.0", {port})); s.listen()
print("listening", flush=True)
time.sleep(2.5)
'''
    result: list[ToolResult] = []
    runner = threading.Thread(target=lambda: result.append(run_python(code, timeout=5)))
    runner.start()
    reached = []
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            reached.append(True)
        except OSError:
            pass
        time.sleep(0.05)
    runner.join()
    assert result[0].error is None and result[0].content.strip() == "listening"
    assert reached == []


def _processes_with(marker: str) -> list[int]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker in (d / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(d.name))
            except OSError:
                continue
    return found


def _gone(marker: str) -> bool:
    """No process has `marker` in its command line, within a second: bwrap returns as soon as
    the program's exit status is known, while the kernel is still killing the rest of its
    PID namespace."""
    deadline = time.monotonic() + 1.0
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.02)
    return _processes_with(marker) == []


@pytest.mark.parametrize("main_exits", [False, True])
def test_a_setsid_child_dies_with_the_program_and_the_timeout_holds(bwrap, main_exits):
    marker = f"31.{uuid.uuid4().int % 10**8:08d}"  # a unique sleep length to find it by
    spawn = (f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
             f"'import os, time; os.setsid(); time.sleep({marker})'])\n")
    code = spawn + ("print('spawned')" if main_exits else "import time\ntime.sleep(1)\nwhile True: pass")
    t0 = time.perf_counter()
    r = run_python(code, timeout=2.0)
    wall = time.perf_counter() - t0
    if main_exits:
        assert r.error is None and r.content.strip() == "spawned"
    else:
        assert r.error == "timeout: python: no result within 2s"
    assert wall < 4.5  # the old tool waited for the escaped child: 30 s
    assert _gone(marker)


def test_rlimits_still_apply_inside(bwrap):
    r = run_python("print('x' * 3_000_000)")  # stdout is a file capped at 1 MiB
    assert "File too large" in r.error
    r = run_python("a = bytearray(2_000_000_000)")
    assert "MemoryError" in r.error
    # 200 sleeping processes: the 64-process cap stops them, except for a host root (the
    # kernel exempts uid 0 from RLIMIT_NPROC); either way none outlives the program
    marker = f"31.{uuid.uuid4().int % 10**8:08d}"
    got = probe(TRY + f"""import os
def spawn():
    for i in range(200):
        if os.fork() == 0:
            os.execv("/usr/bin/sleep", ["sleep", "{marker}"])
    return i
print(json.dumps({{"fork": attempt(spawn)}}))""")
    assert got["fork"] == ("ok: 199" if os.geteuid() == 0 else "BlockingIOError")
    assert _gone(marker)


def test_without_bwrap_the_tool_refuses_and_runs_nothing(tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap to be found
    r = run_python(f"open({str(marker)!r}, 'w').write('x')")
    assert r.error.startswith("python: sandbox 'bwrap' unavailable, code not run: bwrap not "
                              "found on PATH (install bubblewrap")
    assert r.content == f"Error: {r.error}" and not marker.exists()
    assert Bubblewrap("no-such-bwrap").problem().startswith("no-such-bwrap not found on PATH")


def test_sandbox_none_is_an_explicit_unsafe_opt_out(tmp_path):
    marker = tmp_path / "ran"
    spec = {"function": {"name": "python", "parameters": {
        "type": "object", "properties": {"code": {"type": "string"}}}}}
    safe = Harness.model_validate({"name": "h", "system_prompt": "s", "tools": [spec]})
    unsafe = Harness.model_validate({"name": "h", "system_prompt": "s",
                                     "tools": [{**spec, "sandbox": "none"}]})
    assert harness_tools(safe)["python"].sandbox.name == "bwrap"
    assert harness_tools(unsafe)["python"].sandbox.unsafe
    # unisolated indeed: the code writes a host file (why it is documented as unsafe)
    r = run_python(f"open({str(marker)!r}, 'w').write('x')", sandbox="none")
    assert r.error is None and marker.read_text() == "x"
    # the default leaves the hash of existing harnesses alone; the opt-out is part of it
    assert "sandbox" not in safe.content()["tools"][0] and safe.hash != unsafe.hash
    assert unsafe.content()["tools"][0]["sandbox"] == "none"
    assert "sandbox" not in json.dumps(unsafe.tool_specs())  # never shown to the model
    with pytest.raises(ValueError, match="unknown sandbox 'docker'; known: bwrap, none"):
        Harness.model_validate({"name": "h", "system_prompt": "s",
                                "tools": [{**spec, "sandbox": "docker"}]})
    calc = Harness.model_validate({"name": "h", "system_prompt": "s", "tools": [
        {"function": {"name": "calculator"}, "sandbox": "none"}]})
    with pytest.raises(CoevoError, match="tool 'calculator' runs no code"):
        harness_tools(calc)


def test_limits_and_registry():
    assert SANDBOXES.names() == ["bwrap", "none"]
    assert Limits().file_mb == 1 and Limits().processes == 64
    assert all(not p.startswith("/usr/") for p in interpreter_paths())
    assert any(sys.executable.startswith(p) or os.path.realpath(sys.executable).startswith(p)
               for p in interpreter_paths()) or sys.executable.startswith("/usr/")
