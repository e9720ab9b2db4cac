"""Executors: the job model, the local executor, the registry, and a local Ray cluster (2 CPUs)
that must give the same trajectories as the local executor on a tiny model saved to disk."""

from __future__ import annotations

import ipaddress
import json
import os
from pathlib import Path

import pytest
import torch

import tiny_glue
from coevo.assets.skill import Skill, SkillLibrary
from coevo.errors import CoevoError
from coevo.executors import (
    AgentAssets,
    BackendSpec,
    EpisodeJob,
    Executor,
    LocalExecutor,
    _shards,
    executor_names,
    failed_trajectories,
    make_executor,
    start_local_ray,
)
from coevo.models.hf import HFBackend
from coevo.models.scripted import ScriptedBackend
from coevo.registry import UnknownName
from tiny_glue import EchoToolEnv, FirstCharEnv, tiny_harness, tiny_tokenizer

torch.set_num_threads(1)  # tiny models run slower with more threads on a shared 2-core box


def echo_script(request, index):
    """Calls echo with the task's word, then answers with the tool's output."""
    text = tiny_tokenizer().decode(request.prompt_ids, skip_special_tokens=False)
    word = next(w for w in EchoToolEnv.WORDS if f"Echo the word {w}." in text)
    if "<|im_start|>tool" not in text:
        return json.dumps({"name": "echo", "arguments": {"text": word}})
    return f"The word is {text.rsplit('<|im_start|>tool' + chr(10), 1)[1].split('<|im_end|>')[0]}."


def test_shards_are_contiguous_and_cover_everything():
    assert _shards(5, 2) == [(0, 3), (3, 5)]
    assert _shards(2, 4) == [(0, 1), (1, 2)]  # never an empty shard
    assert _shards(7, 3) == [(0, 3), (3, 5), (5, 7)]


def test_local_executor_runs_every_episode_in_task_sample_order():
    env = EchoToolEnv()
    tasks = env.tasks("val", 3)
    assets = AgentAssets(harness=tiny_harness(workflow={"max_turns": 3},
                                              decoding={"temperature": 0.0,
                                                        "max_new_tokens": 40}))
    ex = LocalExecutor(ScriptedBackend(echo_script, tiny_tokenizer()))
    assert isinstance(ex, Executor)
    trajs = ex.run(EpisodeJob(env=env, tasks=tasks, assets=assets, samples=2, seed=3,
                              split="val", checkpoint=None))
    assert [(t.task_id, t.sample_index) for t in trajs] == [
        (t.id, i) for t in tasks for i in range(2)]
    assert all(t.outcome == 1.0 and len(t.turns) == 2 and t.split == "val" for t in trajs)
    assert {t.harness for t in trajs} == {assets.harness.hash}


def test_agent_assets_builds_or_checks_the_skill_library():
    s1 = Skill.model_validate({"name": "brief", "description": "Be brief.", "body": "Short."})
    s2 = Skill.model_validate({"name": "calm", "description": "Stay calm.", "body": "Calm."})
    a = AgentAssets(harness=tiny_harness(), skills=[s1, s2])
    assert a.library is not None and a.library.hash == SkillLibrary.from_skills("adhoc", [s1, s2]).hash
    assert a.hashes()["skill_library"] == a.library.hash and a.hashes()["rubric"] is None
    with pytest.raises(ValueError, match="calm"):  # the library names a skill not given
        AgentAssets(harness=tiny_harness(), library=SkillLibrary.from_skills("lib", [s1, s2]),
                    skills=[s1])


def test_job_rejects_a_non_environment_and_registry_lists_names():
    with pytest.raises(ValueError, match="Environment"):
        EpisodeJob(env=42, tasks=[], assets=AgentAssets(harness=tiny_harness()))
    assert executor_names() == ["local", "ray"]
    with pytest.raises(UnknownName, match="known: local, ray"):
        make_executor("slurm")
    with pytest.raises(CoevoError, match="needs a backend"):
        make_executor("local", backend=None)


def test_failed_trajectories_are_missing_data():
    env = FirstCharEnv()
    job = EpisodeJob(env=env, tasks=env.tasks("train", 2), samples=3,
                     assets=AgentAssets(harness=tiny_harness()))
    out = failed_trajectories(job, "worker lost")
    assert len(out) == 6 and all(t.infra_failed and t.outcome is None and t.reward is None
                                 for t in out)
    assert [t.sample_index for t in out] == [0, 1, 2, 0, 1, 2]


def _comparable(t):
    return (t.task_id, t.sample_index, t.seed, t.token_ids, t.loss_mask, t.reward, t.outcome,
            t.answer, t.status, t.harness, t.group_id)


def listening_addresses(root: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """Local addresses of the TCP sockets in LISTEN state held by process `root` or any of
    its descendants, read from /proc (what `ss -ltnp` shows, without needing iproute2)."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    pids, frontier = {root}, [root]
    while frontier:
        kids = [p for p, pp in parent.items() if pp in frontier and p not in pids]
        pids.update(kids)
        frontier = kids
    inodes = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            continue
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] != "0A" or f[9] not in inodes:  # 0A = LISTEN
                continue
            raw = bytes.fromhex(f[1].split(":")[0])
            # the kernel prints each 32-bit word in host (little-endian) order
            words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            out.append(ipaddress.ip_address(words))
    return out


def _loopback(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)



def test_a_second_local_ray_of_the_process_starts_after_home_changed(tmp_path, monkeypatch):
    """Ray's token auth caches the token in the process and its servers re-read ~/.ray: a
    second instance after HOME changed (every test gets its own HOME) aborted its GCS."""
    import ray

    for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(k, raising=False)
    for n in (1, 2):
        home = tmp_path / f"home{n}"
        home.mkdir()
        monkeypatch.setenv("HOME", str(home))
        start_local_ray(1, object_store_memory=80 * 1024 * 1024)
        try:
            assert ray.get(ray.remote(lambda x: x * 2).remote(n)) == 2 * n
        finally:
            ray.shutdown()
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "token":  # the first instance's token
        assert os.environ["RAY_AUTH_TOKEN_PATH"] == str(tmp_path / "home1" / ".ray" / "auth_token")

def test_ray_executor_matches_local_executor(tmp_path):
    import ray
    import ray.cloudpickle

    # The test environment lives in a test module the workers cannot import: ship it by value.
    ray.cloudpickle.register_pickle_by_value(tiny_glue)
    model_dir = tiny_glue.save_tiny_model(tmp_path / "tiny")
    env = FirstCharEnv()
    job = EpisodeJob(env=env, tasks=env.tasks("train", 5), samples=3, seed=11,
                     assets=AgentAssets(harness=tiny_harness(decoding={
                         "temperature": 1.0, "max_new_tokens": 6})))
    local = LocalExecutor(HFBackend.from_pretrained(model_dir, device="cpu")).run(job)

    spec = BackendSpec(spec=f"hf:{model_dir}", options={"device": "cpu"})
    ex = make_executor("ray", backend=spec, num_actors=2, num_cpus=2,
                       object_store_memory=80 * 1024 * 1024)
    try:
        assert ray.is_initialized() and len(ex.models) == 2
        # The local Ray (GCS, raylet, this driver's and both actors' gRPC servers) listens on
        # the loopback only: by default it listened on every interface.
        listening = listening_addresses(os.getpid())
        assert len(listening) >= 5 and [ip for ip in listening if not _loopback(ip)] == []
        assert ray.util.get_node_ip_address() == "127.0.0.1"
        remote = ex.run(job)
        assert len(remote) == len(local) == 15
        assert [_comparable(t) for t in remote] == [_comparable(t) for t in local]
        for a, b in zip(remote, local):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        assert len({tuple(t.token_ids) for t in local}) > 5  # samples really differ by seed
        # A job that cannot start fails with the environment's own message, not a Ray trace.
        with pytest.raises(CoevoError, match="'nope' is neither a known kind"):
            ex.run(job.model_copy(update={"env": "nope:x"}))
        # No CPU left for another actor: a bounded wait, then a clear error.
        with pytest.raises(CoevoError, match="not ready within 3 s"):
            make_executor("ray", backend=spec, num_actors=1, ready_timeout_s=3)
        # A backend that cannot be built on the workers is a one-line CoevoError (0 CPUs:
        # the two actors above hold both).
        with pytest.raises(CoevoError, match="could not be built.*does not exist"):
            make_executor("ray", backend=BackendSpec(spec=f"hf:{tmp_path / 'missing'}"),
                          num_actors=1, cpus_per_actor=0)
    finally:
        ex.close()
        ray.cloudpickle.unregister_pickle_by_value(tiny_glue)
    assert not ray.is_initialized()
