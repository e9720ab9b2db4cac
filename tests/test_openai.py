"""The OpenAI-compatible client against a loopback server started here: request bodies,
trainable token ids, errors, and how constraints travel (response_format, vLLM's
structured_outputs / guided_* fields), are rejected, or are ignored by a server."""

from __future__ import annotations

import doctest
import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from coevo.errors import CoevoError
from coevo.models import dialects, load_backend
from coevo.models.base import Request, Sampling
from coevo.models.constrain import Constraint
from coevo.models.openai import OpenAIBackend

OPENAI = {"model", "messages", "prompt", "n", "temperature", "top_p", "max_tokens", "stop",
          "seed", "logprobs", "tools", "response_format"}
VLLM_EXTRAS = {"return_tokens_as_token_ids", "return_token_ids", "top_k"}
# What each personality knows: vLLM >= 0.12 ("vllm"), vLLM < 0.10.2 ("vllm-old"), OpenAI.
KNOWN = {"vllm": OPENAI | VLLM_EXTRAS | {"structured_outputs"},
         "vllm-old": OPENAI | VLLM_EXTRAS | {"guided_json", "guided_regex", "guided_grammar"},
         "strict": OPENAI}
CONSTRAINT_KEYS = {"response_format", "structured_outputs", "guided_json", "guided_regex",
                   "guided_grammar"}
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
          "additionalProperties": False}
JSON_C = Constraint.of_json_schema(SCHEMA, source="harness fc@1")
LARK = 'start: "yes" | "no"'


class _Server:
    """A tiny OpenAI-compatible server on 127.0.0.1; the model name picks a personality:
    'vllm' / 'vllm-old' return token ids and prompt ids, honour the constraint fields their
    vLLM knows (answering `constrained_text`) and, like vLLM, ignore fields they do not know;
    a grammar containing INVALID is refused with HTTP 400 as vLLM's validation does.
    'strict' rejects unknown fields with HTTP 400, as OpenAI's API does. 'plain' returns text
    only and ignores everything; 'slow' and 'broken' time out and fail."""

    def __init__(self):
        self.seen: list[dict] = []
        self.headers: list[dict] = []
        self.constrained_text = '{"a":1}'
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def reply(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.seen.append({"path": self.path, **body})
                outer.headers.append(dict(self.headers))
                model = body.get("model")
                if model == "slow":
                    time.sleep(1.0)
                if model == "broken":
                    return self.reply(500, {"error": {"message": "engine died"}})
                known = KNOWN.get(model)
                unknown = sorted(set(body) - known) if known else []
                if model == "strict" and unknown:
                    return self.reply(400, {"error": {
                        "message": f"Unrecognized request argument supplied: {unknown[0]}"}})
                if "INVALID" in json.dumps(body.get("structured_outputs", {})):
                    return self.reply(400, {"error": {"message": "Grammar error: bad rule"}})
                honoured = known is not None and bool(CONSTRAINT_KEYS & set(body) & known)
                tokens = model in ("vllm", "vllm-old")
                choices = []
                for i in range(body.get("n", 1)):
                    text = outer.constrained_text if honoured else f"hello {i}"
                    c: dict = {"index": i, "finish_reason": "length" if i else "stop"}
                    if self.path.endswith("/chat/completions"):
                        c["message"] = {"role": "assistant", "content": text}
                    else:
                        c["text"] = text
                    if tokens:
                        toks = [{"token": f"token_id:{100 + i}", "logprob": -0.5},
                                {"token": f"token_id:{200 + i}", "logprob": -1.25}]
                        if self.path.endswith("/chat/completions"):
                            c["logprobs"] = {"content": toks}
                        else:
                            c["logprobs"] = {"tokens": [t["token"] for t in toks],
                                             "token_logprobs": [t["logprob"] for t in toks]}
                    choices.append(c)
                resp: dict = {"id": "x", "object": "chat.completion", "choices": choices}
                if tokens:
                    resp["prompt_token_ids"] = [1, 2, 3]
                self.reply(200, resp)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def server():
    s = _Server()
    yield s
    s.close()


def chat(text: str, constraint: Constraint | None = None, **sampling) -> Request:
    return Request(messages=[{"role": "user", "content": text}], sampling=Sampling(**sampling),
                   constraint=constraint)


def ids_request(constraint: Constraint | None = None, **sampling) -> Request:
    return Request(prompt_ids=[9, 8, 7], sampling=Sampling(**sampling), constraint=constraint)


# -- plain requests -----------------------------------------------------------------------


def test_openai_vllm_shape_gives_trainable_token_ids(server, monkeypatch):
    monkeypatch.setenv("MY_KEY", "sekrit")
    b = load_backend(f"openai:{server.url}", model="vllm", api_key_env="MY_KEY",
                     exact_logprobs=True)
    out = b.generate([chat("hi", temperature=0.5, max_new_tokens=9, stop=["\n"], seed=3,
                           top_k=5)])
    c = out[0][0]
    assert c.text == "hello 0" and c.token_ids == [100, 200] and c.logprobs == [-0.5, -1.25]
    assert c.prompt_ids == [1, 2, 3] and c.trainable and c.finish_reason == "stop"
    sent = server.seen[0]
    assert sent["path"] == "/v1/chat/completions"
    assert sent["logprobs"] is True and sent["return_tokens_as_token_ids"] is True
    assert sent["max_tokens"] == 9 and sent["stop"] == ["\n"] and sent["seed"] == 3
    assert sent["top_k"] == 5 and sent["temperature"] == 0.5
    assert server.headers[0]["Authorization"] == "Bearer sekrit"


def test_openai_raw_server_logprobs_train_only_untempered_unfiltered(server):
    # Without exact_logprobs the server is taken to report raw log-probs (vLLM's default):
    # they are the sampled distribution's only at temperature 1 with no filters.
    b = OpenAIBackend(server.url, model="vllm")
    tempered, plain, greedy_topk = (c[0] for c in b.generate([
        chat("hi", temperature=0.5), chat("hi", temperature=1.0),
        chat("hi", temperature=0.0, top_k=5)]))
    assert not tempered.trainable and tempered.token_ids == [100, 200]  # ids kept
    assert tempered.logprobs == [-0.5, -1.25]
    assert plain.trainable and not greedy_topk.trainable


def test_openai_n_samples_and_prompt_ids_route(server):
    b = OpenAIBackend(server.url, model="vllm")
    out = b.generate([Request(prompt_ids=[9, 8, 7], n=2,
                              sampling=Sampling(temperature=1.0, max_new_tokens=4))])
    assert [c.token_ids for c in out[0]] == [[100, 200], [101, 201]]
    assert [c.finish_reason for c in out[0]] == ["stop", "length"]
    assert server.seen[0]["path"] == "/v1/completions"
    assert server.seen[0]["prompt"] == [9, 8, 7] and server.seen[0]["n"] == 2
    assert out[0][0].prompt_ids == [9, 8, 7] and out[0][0].trainable


def test_openai_plain_shape_is_untrainable(server):
    b = OpenAIBackend(server.url, model="plain")
    c = b.generate([chat("hi")])[0][0]
    assert c.text == "hello 0" and not c.trainable and c.token_ids == []
    assert c.finish_reason == "stop" and c.error is None


def test_openai_http_error_and_timeout_are_error_completions(server):
    broken = OpenAIBackend(server.url, model="broken", retries=0)
    c = broken.generate([chat("hi")])[0]
    assert len(c) == 1 and c[0].finish_reason == "error" and "500" in c[0].error
    slow = OpenAIBackend(server.url, model="slow", timeout=0.2, retries=0)
    t = time.perf_counter()
    c = slow.generate([Request(messages=[{"role": "user", "content": "x"}], n=2)])[0]
    assert time.perf_counter() - t < 0.9
    assert [x.finish_reason for x in c] == ["error", "error"]
    assert "timed out" in c[0].error.lower() or "timeout" in c[0].error.lower()
    dead = OpenAIBackend("http://127.0.0.1:9/v1", model="x", retries=0, timeout=1.0)
    assert dead.generate([chat("x")])[0][0].finish_reason == "error"


def test_openai_bad_options_are_clear_errors(server, monkeypatch):
    monkeypatch.delenv("NOPE_KEY", raising=False)
    with pytest.raises(CoevoError, match="NOPE_KEY"):
        OpenAIBackend(server.url, model="plain", api_key_env="NOPE_KEY")
    with pytest.raises(CoevoError, match="constraint_fields must be one of"):
        OpenAIBackend(server.url, model="vllm", constraint_fields="guided_decoding")


# -- constraints ----------------------------------------------------------------------------


def test_json_schema_on_chat_is_a_strict_response_format(server):
    b = OpenAIBackend(server.url, model="vllm")
    c = b.generate([chat("hi", JSON_C, temperature=1.0)])[0][0]
    sent = server.seen[0]
    assert sent["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "harness_fc_1", "schema": SCHEMA, "strict": True}}
    assert not {"structured_outputs", "guided_json"} & set(sent)
    assert c.text == '{"a":1}' and c.token_ids == [100, 200]
    # The grammar masks of a server are coevo's only when it says so (exact_logprobs).
    assert not c.trainable
    exact = OpenAIBackend(server.url, model="vllm", exact_logprobs=True)
    assert exact.generate([chat("hi", JSON_C, temperature=0.7)])[0][0].trainable


def test_lark_regex_and_token_id_prompts_use_structured_outputs(server):
    b = OpenAIBackend(server.url, model="vllm")
    server.constrained_text = "yes"
    lark = b.generate([chat("ok?", Constraint.of_lark(LARK))])[0][0]
    assert server.seen[-1]["structured_outputs"] == {"grammar": "%llguidance {}\n" + LARK}
    assert "response_format" not in server.seen[-1] and lark.text == "yes"
    server.constrained_text = "42"
    regex = b.generate([ids_request(Constraint.of_regex("[0-9]+"))])[0][0]
    assert server.seen[-1]["path"] == "/v1/completions"
    assert server.seen[-1]["structured_outputs"] == {"regex": "[0-9]+"} and regex.text == "42"
    server.constrained_text = '{"a":7}'
    js = b.generate([ids_request(JSON_C)])[0][0]
    assert server.seen[-1]["structured_outputs"] == {"json": JSON_C.text}
    assert "response_format" not in server.seen[-1] and js.text == '{"a":7}'


def test_guided_field_style_for_older_vllm_servers(server):
    b = OpenAIBackend(server.url, model="vllm-old", constraint_fields="guided")
    server.constrained_text = "no"
    c = b.generate([chat("ok?", Constraint.of_lark(LARK)),
                    ids_request(Constraint.of_regex("n.*"))])
    # The two requests are sent concurrently: find each by its endpoint, not its order.
    by_path = {s["path"]: s for s in server.seen}
    assert by_path["/v1/chat/completions"]["guided_grammar"] == "%llguidance {}\n" + LARK
    assert by_path["/v1/completions"]["guided_regex"] == "n.*"
    assert not any("structured_outputs" in s for s in server.seen)
    assert [g[0].text for g in c] == ["no", "no"] and c[0][0].error is None


def test_a_server_ignoring_the_fields_fails_the_request_once(server):
    # vLLM before 0.10.2 does not know `structured_outputs` and ignores it: the answer comes
    # back unconstrained. The check against the grammar turns it into an error (all n), and
    # nothing is resent.
    b = OpenAIBackend(server.url, model="vllm-old")
    out = b.generate([Request(prompt_ids=[1, 2], n=2, constraint=Constraint.of_regex("[0-9]+"))])
    assert len(server.seen) == 1 and server.seen[0]["structured_outputs"] == {"regex": "[0-9]+"}
    assert [c.finish_reason for c in out[0]] == ["error", "error"]
    err = out[0][0].error
    assert "does not follow the regex constraint" in err and "structured_outputs" in err
    assert "'hello 0'" in err
    # With the check off the text is returned as the server sent it.
    unchecked = OpenAIBackend(server.url, model="vllm-old", verify_constraints=False)
    assert unchecked.generate([ids_request(Constraint.of_regex("[0-9]+"))])[0][0].text == "hello 0"


def test_a_rejected_constraint_is_a_named_error_never_resent(server):
    b = OpenAIBackend(server.url, model="vllm", retries=3)
    c = b.generate([chat("x", Constraint.of_lark('start: "INVALID"'))])[0][0]
    assert len(server.seen) == 1  # no retry, and no unconstrained retry
    assert c.finish_reason == "error" and c.error.startswith(
        "the server rejected a request constrained by a lark grammar (sent as: "
        "structured_outputs): ")
    assert "HTTP 400" in c.error and "Grammar error: bad rule" in c.error


def test_plain_openai_endpoints_take_json_schemas_on_chat_only(server):
    b = OpenAIBackend(server.url, model="strict", token_ids=False)
    ok = b.generate([chat("hi", JSON_C, temperature=0.2, max_new_tokens=5)])[0][0]
    assert server.seen[0] == {
        "path": "/v1/chat/completions", "model": "strict", "n": 1, "temperature": 0.2,
        "top_p": 1.0, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
        "response_format": dialects.response_format(JSON_C)}
    assert ok.text == '{"a":1}' and ok.error is None and not ok.trainable
    out = b.generate([chat("hi", Constraint.of_regex("[0-9]+")),
                      chat("hi", Constraint.of_lark(LARK)), ids_request(JSON_C)])
    assert len(server.seen) == 1  # refused before sending: nothing sampled unconstrained
    for group, kind, what in zip(out, ["regex", "lark", "json_schema"],
                                 ["a chat request", "a chat request", "a token-id prompt"]):
        assert group[0].finish_reason == "error"
        assert group[0].error.startswith(f"{kind} constraint on {what} needs vLLM's "
                                         "structured-output request fields")
        assert "token_ids=False" in group[0].error


def test_a_server_rejecting_unknown_fields_names_kind_and_message(server):
    # A strict server given vLLM's token-id extras refuses the whole request: the error names
    # the constraint kind, the field that carried it and the server's own message.
    b = OpenAIBackend(server.url, model="strict")
    c = b.generate([chat("hi", JSON_C)])[0][0]
    assert c.finish_reason == "error" and len(server.seen) == 1
    assert "constrained by a json_schema grammar (sent as: response_format)" in c.error
    assert "HTTP 400" in c.error and "Unrecognized request argument supplied: " in c.error


def test_constraint_fields_none_sends_no_vllm_fields(server):
    b = OpenAIBackend(server.url, model="vllm", constraint_fields="none")
    c = b.generate([chat("x", Constraint.of_regex("a"))])[0][0]
    assert c.finish_reason == "error" and "constraint_fields='none'" in c.error
    assert server.seen == []


def test_dialects_doctests_and_no_heavy_imports():
    assert doctest.testmod(dialects).failed == 0
    code = ("import sys, coevo.models.openai; "
            "print(sorted(m for m in ('torch', 'llguidance', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_violation_accepts_prefixes_and_padded_json():
    assert dialects.violation(JSON_C, '{"a": 1}') == ""  # another engine's whitespace
    assert dialects.violation(JSON_C, '{"a":') == ""  # cut by max_tokens or a stop string
    assert "doesn't satisfy the grammar" in dialects.violation(JSON_C, "Sure! {")
    assert dialects.violation(Constraint.of_lark('?start: x\nx: "ab"'), "ab") == ""
