"""RL rollouts on an OpenAI-compatible server from the CLI: `coevo train --rollout-model
openai:URL?tokenizer=PATH` against a loopback server speaking vLLM's shape (token-id prompts,
`token_id:N` tokens with log-probabilities, runtime LoRA loading). The stored trajectories
carry the tokenizer's prompt ids and the server's completion ids and log-probs, every step's
adapter reached the server before its rollouts, and the RL batch builder takes them."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from coevo.agent.context import render
from coevo.cli import app
from coevo.errors import CoevoError
from coevo.models.registry import load_backend
from coevo.registry import BadOptions
from coevo.rl.batch import microbatches, plan_grpo
from coevo.store import Store
from tiny_glue import save_tiny_model, tiny_harness

runner = CliRunner()
REPLIES = ("apple pie", "42 apples")  # FirstCharEnv: a letter first wins, a digit loses


class VLLMLike:
    """A vLLM-shaped server on 127.0.0.1 for the tiny model: `/completions` on token-id
    prompts answers, per prompt, REPLIES[0] and REPLIES[1] in turn, tokenized with the model's
    tokenizer plus EOS, each token `token_id:N` with log-prob -0.25 * (position + 1);
    `/load_lora_adapter` and `/unload_lora_adapter` record what they were asked."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.completions: list[dict] = []  # per choice: model, seed, prompt, ids, logprobs
        self.adapters: list[dict] = []
        self._turns: dict[tuple, int] = {}
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, payload, status: int = 200) -> None:
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                found = self.path == "/v1/models"
                self.reply({"data": [{"id": "tiny"}]} if found else {}, 200 if found else 404)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path.endswith("_lora_adapter"):
                    path = body.get("lora_path")
                    outer.adapters.append({"op": self.path.rsplit("/", 1)[1], **body, "complete":
                                           bool(path) and (Path(path) / "adapter_model.safetensors").is_file()})
                    return self.reply(f"Success: LoRA adapter '{body['lora_name']}'")
                assert self.path == "/v1/completions" and body["return_tokens_as_token_ids"]
                choices = [outer.choice(body, i) for i in range(body["n"])]
                self.reply({"id": "c", "choices": choices, "prompt_token_ids": body["prompt"]})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def choice(self, body: dict, i: int) -> dict:
        prompt = tuple(body["prompt"])
        with self._lock:
            k = self._turns[prompt] = self._turns.get(prompt, -1) + 1
        text = REPLIES[k % 2]
        ids = self.tok.encode(text, add_special_tokens=False) + [self.tok.eos_token_id]
        lps = [-0.25 * (j + 1) for j in range(len(ids))]
        with self._lock:
            self.completions.append({"model": body["model"], "seed": body.get("seed"),
                                     "prompt": list(prompt), "ids": ids, "logprobs": lps})
        return {"index": i, "text": text, "finish_reason": "stop",
                "logprobs": {"tokens": [f"token_id:{t}" for t in ids], "token_logprobs": lps}}

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture()
def tiny(tiny_dir):
    from transformers import AutoTokenizer

    path = tiny_dir
    server = VLLMLike(AutoTokenizer.from_pretrained(str(path)))
    yield path, server
    server.close()


def test_the_spec_names_the_tokenizer_and_bad_options_are_named(tiny):
    path, server = tiny
    b = load_backend(f"openai:{server.url}?tokenizer={path}&max_concurrency=2")
    assert b.tokenizer is not None and b.tokenizer.eos_token_id == server.tok.eos_token_id
    assert b.max_concurrency == 2 and b.base_url == server.url
    with pytest.raises(BadOptions, match="tokeniser"):
        load_backend(f"openai:{server.url}?tokeniser={path}")
    with pytest.raises(CoevoError, match="cannot load tokenizer"):
        load_backend(f"openai:{server.url}?tokenizer={path / 'missing'}")


def test_coevo_train_rolls_out_on_the_server_with_token_ids(tiny, tmp_path):
    path, server = tiny
    db = f"sqlite:///{tmp_path / 'c.db'}"
    Store.open(db).put_asset(tiny_harness(decoding={"temperature": 1.0, "max_new_tokens": 8}))
    r = runner.invoke(app, [
        "train", "--harness", "tiny", "--env", "tiny_glue:FirstCharEnv", "--model", f"hf:{path}",
        "--rollout-model", f"openai:{server.url}?tokenizer={path}", "--steps", "2",
        "--group-size", "4", "--tasks-per-step", "2", "--checkpoint-every", "2",
        "--lora-rank", "4", "--run", "remote", "--db", db])
    assert r.exit_code == 0, r.output

    # Before each step's rollouts the server loaded that step's adapter, complete on disk, and
    # the rollouts named it; the previous one was unloaded.
    loads = [a for a in server.adapters if a["op"] == "load_lora_adapter"]
    assert [Path(a["lora_path"]).name for a in loads] == ["step-0", "step-1"]
    assert all(a["complete"] for a in loads)
    assert [a["lora_name"] for a in server.adapters if a["op"] == "unload_lora_adapter"] == [
        loads[0]["lora_name"]]
    assert [c["model"] for c in server.completions] == [loads[0]["lora_name"]] * 8 + [
        loads[1]["lora_name"]] * 8

    store = Store.open(db)
    trajs = store.trajectories(run="remote")
    assert len(trajs) == 16 and all(t.trainable and t.status == "ok" for t in trajs)
    by_seed = {c["seed"]: c for c in server.completions}
    tok = server.tok
    for t in trajs:
        sent = by_seed[t.seed]
        prompt = tok.encode(render(tok, t.messages[:-1], generation_prompt=True),
                            add_special_tokens=False)
        # prompt ids: the named tokenizer's, as the server received them; then the server's
        # completion ids and log-probs, exactly, as the only policy tokens
        assert t.token_ids[:t.prompt_len] == prompt == sent["prompt"]
        assert t.token_ids[t.prompt_len:] == sent["ids"]
        assert t.loss_mask == [0] * t.prompt_len + [1] * len(sent["ids"])
        assert t.logprobs[t.prompt_len:] == sent["logprobs"]
        assert t.outcome == (1.0 if tok.decode(sent["ids"]).startswith("apple") else 0.0)

    # The RL batch builder takes them: every group has a winner and a loser, so all carry
    # signal, and the tensors hold the stored ids.
    step0 = [t for t in trajs if t.policy_step == 0]
    plan = plan_grpo(step0)
    assert plan.n_groups == 2 and plan.signal_fraction == 1.0 and plan.excluded == 0
    rows = {tuple(s.ids.tolist()) for s in plan.samples}
    assert rows == {tuple(t.token_ids) for t in step0}
    mbs = microbatches(plan.groups, max_tokens=4096)
    assert sum(int(mb.mask.sum()) for mb in mbs) == sum(t.sampled_tokens for t in step0)
    assert sum(float(mb.old_logp.sum()) for mb in mbs) == pytest.approx(
        sum(by_seed[t.seed]["logprobs"][k] for t in step0 for k in range(len(by_seed[t.seed]["ids"]))))
    ckpt = store.latest_checkpoint("remote")
    assert ckpt is not None and ckpt.step == 2
