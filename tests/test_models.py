"""Model backends: the HF sampling loop against a tiny random Llama built here (no downloads),
the registry, the scripted stand-in, and (slow) the embedded SmolLM2. The OpenAI-compatible
client, vLLM and llama.cpp have their own files (test_openai.py, test_vllm.py,
test_llamacpp.py)."""

from __future__ import annotations

import time

import pytest
import torch

from coevo.errors import CoevoError
from coevo.models import load_backend
from coevo.models.base import Backend, Completion, Request, Sampling
from coevo.models.hf import HFBackend, first_stop, sample_seed
from coevo.models.scripted import ScriptedBackend
from coevo.registry import UnknownName

CHATML = (
    "{% if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "call get_weather with city Paris and unit celsius",
    '{"name": "add", "arguments": {"a": 1, "b": 2}}',
    "user asks a question and the assistant answers it",
] * 20


def _byte_level_ascii() -> list[str]:
    # GPT-2's byte -> unicode map, restricted to printable ASCII + newline so every token the
    # random model can sample decodes to valid text (no half UTF-8 sequences at a cut).
    from tokenizers import pre_tokenizers

    full = pre_tokenizers.ByteLevel.alphabet()
    keep = {chr(b) for b in range(33, 127)} | {chr(256 + 32), chr(256 + 10)}  # Ġ (space), Ċ (\n)
    return sorted(c for c in full if c in keep)


def build_tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=specials, initial_alphabet=_byte_level_ascii(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    fast.chat_template = CHATML
    return fast


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    tok = build_tiny_tokenizer()
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None,
    )
    model = LlamaForCausalLM(cfg)
    # Random init gives a near-uniform next-token distribution; sharpen it so greedy and
    # sampled outputs differ and a 1e-4 logprob check is a real check, not noise on log(1/V).
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)
    path = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def backend(tiny_dir):
    return HFBackend.from_pretrained(tiny_dir, device="cpu")


def chat(text: str, **sampling) -> Request:
    return Request(messages=[{"role": "user", "content": text}], sampling=Sampling(**sampling))


def full_forward_logprobs(b: HFBackend, prompt: list[int], ids: list[int]) -> torch.Tensor:
    """log p(ids[t] | prompt + ids[:t]) by one unpadded forward, no cache: the ground truth."""
    seq = torch.tensor([prompt + ids])
    with torch.no_grad():
        logits = b.model(input_ids=seq).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    n = len(prompt)
    return lp[n - 1 : n - 1 + len(ids)].gather(1, torch.tensor(ids)[:, None])[:, 0]


# -- HF backend ---------------------------------------------------------------------------


def test_hf_backend_satisfies_protocol_and_shapes(backend):
    assert isinstance(backend, Backend)
    reqs = [chat("the quick fox", temperature=1.0, max_new_tokens=12, seed=1, top_k=0),
            Request(prompt_ids=[5, 6, 7, 8, 9], n=3, sampling=Sampling(max_new_tokens=7, seed=2))]
    out = backend.generate(reqs)
    assert [len(o) for o in out] == [1, 3]
    for group, req in zip(out, reqs):
        for c in group:
            assert c.finish_reason in ("stop", "length")
            assert 1 <= len(c.token_ids) == len(c.logprobs) <= req.sampling.max_new_tokens
            assert all(lp <= 0.0 for lp in c.logprobs)
            assert c.trainable and c.error is None
    assert out[1][0].prompt_ids == [5, 6, 7, 8, 9]
    expected = backend.tokenizer.encode(
        backend.tokenizer.apply_chat_template(reqs[0].messages, add_generation_prompt=True,
                                              tokenize=False), add_special_tokens=False)
    assert out[0][0].prompt_ids == expected
    assert backend.tokenizer.decode(out[0][0].prompt_ids).endswith("<|im_start|>assistant\n")


def sampled_reference(logits: torch.Tensor, ids: list[int], temperature: float, top_k: int,
                      top_p: float) -> torch.Tensor:
    """An independent, position-by-position statement of the distribution a token is drawn
    from (temperature, then top-k, then the nucleus) and the token's log-probability under it."""
    out = []
    for row, tok in zip(logits, ids):
        x = row / (temperature if temperature > 0 else 1.0)
        order = sorted(range(len(x)), key=lambda i: -float(x[i]))
        keep = order[:top_k] if top_k else order
        if top_p < 1.0:
            probs = torch.softmax(x[keep], -1).tolist()
            mass, nucleus = 0.0, []
            for i, p in zip(keep, probs):
                if mass >= top_p:
                    break
                nucleus.append(i)
                mass += p
            keep = nucleus
        assert tok in keep, "a sampled token outside the support"
        out.append(float(x[tok] - torch.logsumexp(x[keep], -1)))
    return torch.tensor(out)


def full_forward_logits(b, prompt: list[int], ids: list[int]) -> torch.Tensor:
    seq = torch.tensor([prompt + ids])
    with torch.no_grad():
        logits = b.model(input_ids=seq).logits[0].float()
    n = len(prompt)
    return logits[n - 1 : n - 1 + len(ids)]


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 20, 0.9), (1.3, 0, 1.0),
                                                     (0.5, 0, 0.8), (1.0, 5, 1.0)])
def test_logprobs_are_those_of_the_sampled_distribution(backend, temperature, top_k, top_p):
    # The stored behaviour log-prob is the sampled token's log-probability under the tempered,
    # top-k / top-p filtered distribution it was drawn from (not the raw one): the quantity
    # the trainer recomputes, so the first update's importance ratio is exactly 1.
    req = Request(prompt_ids=backend.tokenizer.encode("call get_weather with"), n=4,
                  sampling=Sampling(temperature=temperature, top_k=top_k, top_p=top_p,
                                    max_new_tokens=16, seed=11))
    [group] = backend.generate([req])
    for c in group:
        logits = full_forward_logits(backend, req.prompt_ids, c.token_ids)
        ref = sampled_reference(logits, c.token_ids, temperature, top_k, top_p)
        torch.testing.assert_close(torch.tensor(c.logprobs), ref, atol=1e-5, rtol=0)
        raw = torch.log_softmax(logits, -1).gather(1, torch.tensor(c.token_ids)[:, None])[:, 0]
        assert (torch.tensor(c.logprobs) - raw).abs().max() > 1e-3  # not the raw distribution
    assert len({tuple(c.token_ids) for c in group}) > 1  # the 4 samples are not clones


def test_shared_prefill_equals_separate_prefills(tiny_dir, backend):
    separate = HFBackend(backend.model, backend.tokenizer, share_prefill=False)
    reqs = [chat("the lazy dog", temperature=1.0, max_new_tokens=10, seed=3, top_p=0.95),
            chat("the lazy dog", temperature=1.0, max_new_tokens=10, seed=4)]
    reqs[0].n = 4
    a, b = backend.generate(reqs), separate.generate(reqs)
    for ga, gb in zip(a, b):
        for ca, cb in zip(ga, gb):
            assert ca.token_ids == cb.token_ids
            torch.testing.assert_close(ca.logprobs, cb.logprobs, atol=1e-4, rtol=0)


def test_batch_composition_does_not_change_a_request(backend):
    target = chat("assistant answers", temperature=1.0, max_new_tokens=14, seed=21)
    alone = backend.generate([target])[0][0]
    others = [Request(prompt_ids=list(range(3, 40)), n=3,
                      sampling=Sampling(max_new_tokens=5, seed=9)),
              chat("x", temperature=0.0, max_new_tokens=20)]
    mixed = backend.generate([others[0], target, others[1]])[1][0]
    assert mixed.token_ids == alone.token_ids
    torch.testing.assert_close(mixed.logprobs, alone.logprobs, atol=1e-4, rtol=0)
    # Splitting the batch into micro-batches does not change it either.
    small = HFBackend(backend.model, backend.tokenizer, max_batch=1)
    assert small.generate([others[0], target])[1][0].token_ids == alone.token_ids


def test_seeds_reproduce_and_differ(backend):
    r = chat("brown fox", temperature=1.0, max_new_tokens=12, seed=7)
    a, b = backend.generate([r])[0][0], backend.generate([r])[0][0]
    assert a.token_ids == b.token_ids
    other = backend.generate([chat("brown fox", temperature=1.0, max_new_tokens=12, seed=8)])
    assert other[0][0].token_ids != a.token_ids
    assert sample_seed(7, 0) != sample_seed(7, 1)


def test_greedy_is_argmax_and_deterministic(backend):
    r = chat("question", temperature=0.0, max_new_tokens=10)
    a = backend.generate([r])[0][0]
    b = backend.generate([r, chat("other text", temperature=0.0, max_new_tokens=3)])[0][0]
    assert a.token_ids == b.token_ids
    # Each greedy token is the argmax of a fresh full forward.
    seq = list(a.prompt_ids)
    for tok in a.token_ids:
        with torch.no_grad():
            logits = backend.model(input_ids=torch.tensor([seq])).logits[0, -1]
        assert int(logits.argmax()) == tok
        seq.append(tok)


def test_top_k_one_is_greedy(backend):
    greedy = backend.generate([chat("fox", temperature=0.0, max_new_tokens=8)])[0][0]
    topk1 = backend.generate([chat("fox", temperature=1.5, top_k=1, max_new_tokens=8, seed=3)])
    assert topk1[0][0].token_ids == greedy.token_ids
    tiny_p = backend.generate([chat("fox", temperature=1.5, top_p=1e-6, max_new_tokens=8, seed=4)])
    assert tiny_p[0][0].token_ids == greedy.token_ids


@pytest.mark.parametrize("temperature,top_k", [(1.0, 0), (0.5, 0), (1.0, 3)])
def test_sample_frequencies_match_the_distribution(backend, temperature, top_k):
    # 600 one-token samples of one prompt: the empirical frequency of each of the likeliest
    # tokens must match softmax(logits / T) (renormalized over the top-k) within 4 sigma.
    prompt = backend.tokenizer.encode("the lazy")
    n = 600
    out = backend.generate([Request(prompt_ids=prompt, n=n, sampling=Sampling(
        temperature=temperature, top_k=top_k, max_new_tokens=1, seed=123))])[0]
    with torch.no_grad():
        logits = backend.model(input_ids=torch.tensor([prompt])).logits[0, -1]
    p = torch.softmax(logits / temperature, -1)
    if top_k:
        keep = torch.topk(p, top_k).indices
        p = torch.zeros_like(p).index_fill_(0, keep, 1.0) * p
        p = p / p.sum()
    counts = torch.bincount(torch.tensor([c.token_ids[0] for c in out]), minlength=p.numel())
    for tok in torch.topk(p, 3).indices.tolist():
        sigma = (p[tok] * (1 - p[tok]) / n).sqrt()
        assert abs(counts[tok] / n - p[tok]) < 4 * sigma + 1e-3, (tok, counts[tok], p[tok])
    if top_k:
        assert set(torch.nonzero(counts).flatten().tolist()) <= set(keep.tolist())


def test_max_new_tokens_gives_length(backend):
    eos = backend.tokenizer.eos_token_id
    # Forbid nothing, but check: either EOS ended it (stop) or it hit the limit exactly.
    out = backend.generate([Request(prompt_ids=[7, 8, 9], n=6,
                                    sampling=Sampling(temperature=1.0, max_new_tokens=3,
                                                      seed=1))])[0]
    for c in out:
        if c.finish_reason == "length":
            assert len(c.token_ids) == 3 and eos not in c.token_ids
        else:
            assert c.token_ids[-1] == eos
    assert any(c.finish_reason == "length" for c in out)


def test_eos_stops_and_is_kept_in_tokens(tiny_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    # A bias on the output layer makes EOS the argmax at every step: greedy stops at once.
    head = torch.nn.Linear(model.lm_head.in_features, model.lm_head.out_features, bias=True)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[tok.eos_token_id] = 1e4
    model.lm_head = head
    b = HFBackend(model, tok)
    c = b.generate([chat("hi", temperature=0.0, max_new_tokens=20)])[0][0]
    assert c.finish_reason == "stop"
    assert c.token_ids == [tok.eos_token_id] and len(c.logprobs) == 1
    assert c.text == ""  # EOS is a special token: sampled and kept, but not text


def test_stop_strings_cut_text_keep_tokens(backend):
    base = backend.generate([chat("the quick", temperature=0.0, max_new_tokens=40)])[0][0]
    text = base.text
    assert len(text) > 12, text
    stop = text[6:9]
    cut = text.find(stop)
    c = backend.generate([chat("the quick", temperature=0.0, max_new_tokens=40,
                               stop=["@@never@@", stop])])[0][0]
    assert c.finish_reason == "stop"
    assert c.text == text[:cut]
    assert c.token_ids == base.token_ids[: len(c.token_ids)]
    assert stop in backend.tokenizer.decode(c.token_ids)  # the sampled stop tokens are kept
    assert first_stop("ab<END>c</s>", ["</s>", "<END>"]) == 2


def test_bad_request_is_an_error_completion_not_a_raise(backend):
    reqs = [Request(n=2), chat("fine", temperature=0.0, max_new_tokens=4),
            Request(prompt_ids=[]),
            Request(prompt_ids=[1, 2], messages=[{"role": "user", "content": "x"}])]
    out = backend.generate(reqs)
    assert [c.finish_reason for c in out[0]] == ["error", "error"]
    assert "neither messages nor prompt_ids" in out[0][0].error
    assert out[1][0].finish_reason in ("stop", "length") and out[1][0].token_ids
    assert out[2][0].finish_reason == "error" and "empty" in out[2][0].error
    assert out[3][0].finish_reason == "error" and not out[3][0].trainable


def test_backend_failure_is_isolated_to_its_request(backend):
    # An out-of-vocabulary id makes the embedding lookup raise (as an OOM would): the batch
    # is retried request by request, so only the bad request becomes an error.
    vocab = backend.model.config.vocab_size
    good = chat("lazy dog", temperature=1.0, max_new_tokens=6, seed=2)
    alone = backend.generate([good])[0][0]
    out = backend.generate([good, Request(prompt_ids=[1, vocab + 5])])
    assert out[0][0].token_ids == alone.token_ids  # regenerated from its seed after the retry
    assert out[1][0].finish_reason == "error"
    assert "IndexError" in out[1][0].error


def test_tools_are_rendered_with_the_chat_template(backend):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    r = Request(messages=[{"role": "user", "content": "hi"}], tools=tools,
                sampling=Sampling(temperature=0.0, max_new_tokens=2))
    c = backend.generate([r])[0][0]
    assert "get_weather" in backend.tokenizer.decode(c.prompt_ids)


def test_load_adapter_changes_outputs_and_can_switch(tiny_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    def make_adapter(seed: int, where):
        torch.manual_seed(seed)
        base = AutoModelForCausalLM.from_pretrained(tiny_dir)
        peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8,
                                                     target_modules=["q_proj", "v_proj"]))
        with torch.no_grad():  # LoRA B starts at zero (a no-op); make the adapters matter
            for n, p in peft_model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.5)
        peft_model.save_pretrained(where)
        return where

    a1, a2 = make_adapter(1, tmp_path / "a1"), make_adapter(2, tmp_path / "a2")
    b = HFBackend.from_pretrained(tiny_dir, device="cpu")
    r = Request(prompt_ids=[5, 6, 7], sampling=Sampling(temperature=0.0, max_new_tokens=12))
    base_lp = b.generate([r])[0][0].logprobs
    b.load_adapter(a1)
    lp1 = b.generate([r])[0][0].logprobs
    b.load_adapter(a2)
    lp2 = b.generate([r])[0][0].logprobs
    assert b.adapter == str(a2)
    assert lp1 != base_lp and lp2 != lp1
    assert len(b.model.peft_config) == 1  # the old adapter was deleted, not kept around
    # Reloading adapter 1 reproduces its outputs exactly.
    b.load_adapter(a1)
    assert b.generate([r])[0][0].logprobs == pytest.approx(lp1, abs=1e-5)
    with pytest.raises(CoevoError, match="adapter_config.json"):
        b.load_adapter(tmp_path)


def test_generate_restores_training_mode(backend):
    backend.model.train()
    backend.generate([chat("x", temperature=0.0, max_new_tokens=2)])
    assert backend.model.training
    backend.model.eval()


# -- registry -----------------------------------------------------------------------------


def test_registry_hf_and_unknown_kind(tiny_dir):
    b = load_backend(f"hf:{tiny_dir}", device="cpu")
    assert isinstance(b, HFBackend) and b.name == f"hf:{tiny_dir}"
    with pytest.raises(UnknownName, match="known: .*embedded.*hf.*llamacpp.*openai.*vllm"):
        load_backend("tgi:whatever")
    with pytest.raises(CoevoError, match="hf: needs a path"):
        load_backend("hf:")
    with pytest.raises(CoevoError, match="does not exist"):
        load_backend("hf:/no/such/dir")


def test_optional_backends_fail_clearly_without_their_extra():
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        with pytest.raises(CoevoError, match=r"pip install .*llama-cpp-python"):
            load_backend("llamacpp:/tmp/x.gguf")
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(CoevoError, match=r"coevo\[vllm\]"):
            load_backend("vllm:/tmp/model")


# -- scripted stand-in --------------------------------------------------------------------


def test_scripted_backend_replays_with_real_token_ids(tiny_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    s = ScriptedBackend(["the answer <END> trailing", "second"], tokenizer=tok)
    out = s.generate([chat("q", stop=["<END>"]), Request(prompt_ids=[4, 5], n=1)])
    first, second = out[0][0], out[1][0]
    assert first.text == "the answer " and first.finish_reason == "stop"
    assert tok.decode(first.token_ids, skip_special_tokens=True).startswith("the answer")
    assert len(first.logprobs) == len(first.token_ids) and first.trainable
    assert first.prompt_ids == tok.encode(tok.apply_chat_template(
        [{"role": "user", "content": "q"}], add_generation_prompt=True, tokenize=False),
        add_special_tokens=False)
    assert second.text == "second" and second.prompt_ids == [4, 5]
    assert second.token_ids[-1] == tok.eos_token_id
    assert [r.prompt_ids for r in s.requests] == [None, [4, 5]]
    exhausted = s.generate([chat("more")])[0][0]
    assert exhausted.finish_reason == "error" and "script exhausted" in exhausted.error
    capped = ScriptedBackend(["one two three four five six"], tokenizer=tok)
    c = capped.generate([chat("q", max_new_tokens=2)])[0][0]
    assert c.finish_reason == "length" and len(c.token_ids) == 2


def test_scripted_backend_without_tokenizer_is_untrainable():
    s = ScriptedBackend(lambda req, i: f"reply {i}")
    out = s.generate([chat("a"), chat("b")])
    assert [c[0].text for c in out] == ["reply 0", "reply 1"]
    assert not out[0][0].trainable and out[0][0].token_ids == []


# -- embedded (real model) ----------------------------------------------------------------


@pytest.mark.slow
def test_embedded_answers_a_chat_message():
    from coevo.models.embedded import embedded_model_dir

    path = embedded_model_dir()
    assert (path / "model.safetensors").is_file() and (path / "coevo-cache.json").is_file()
    t = time.perf_counter()
    b = load_backend("embedded")
    load_s = time.perf_counter() - t
    assert load_s < 30, load_s  # from the cache, not a 16 s GGUF dequantization each time
    c = b.generate([chat("What is the capital of France? Answer in one word.",
                         temperature=0.0, max_new_tokens=16)])[0][0]
    assert c.text.strip() and c.finish_reason in ("stop", "length")
    assert b.tokenizer.decode(c.token_ids, skip_special_tokens=True) == c.text
    assert "Paris" in c.text
    assert isinstance(c, Completion) and len(c.logprobs) == len(c.token_ids)
