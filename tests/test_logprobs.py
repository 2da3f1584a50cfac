"""Log-probabilities through the OpenAI API (issue 54): `logprobs` / `top_logprobs` on chat, `logprobs` and `echo` on
completions, streamed and not, computed from the same logits the batched engine samples from. The real model."""
import numpy as np
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from pyinfer.runtime.sampling import log_softmax  # noqa: E402

KEY = "lp-key"


@pytest.fixture(scope="module")
def server(real_model_path):
    from support.serve_helpers import start_server, stop_server

    base, loop, model, srv, t = start_server(real_model_path, KEY)
    yield base, loop, model
    stop_server(srv, t, loop)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key=KEY, max_retries=0)


def test_echo_scores_the_prompt_as_the_model_does(server, client, real_model):
    """echo + logprobs: every prompt token after the first gets log p(token | what precedes it), equal to the
    single-sequence model's log-softmax (the perplexity path) to 1e-4; the first has none."""
    prompt = "The quick brown fox jumps over the lazy dog. It was a sunny day"
    ids = real_model.tokenize(prompt)
    r = client.completions.create(model=client.models.list().data[0].id,
                                  prompt=prompt, max_tokens=3, temperature=0, echo=True, logprobs=3)
    lp = r.choices[0].logprobs
    assert r.choices[0].text.startswith(prompt)
    n = len(ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    want = log_softmax(real_model.eval(ids, all_logits=True))
    got = np.array(lp.token_logprobs[1:n], np.float64)
    np.testing.assert_allclose(got, want[np.arange(n - 1), ids[1:]], atol=1e-4)
    assert all(1 <= len(t) <= 3 for t in lp.top_logprobs[1:])  # keyed by text: two ids may decode alike
    # Greedy: each generated token is its step's most likely one.
    for k in range(n, len(lp.tokens)):
        assert lp.token_logprobs[k] == pytest.approx(max(lp.top_logprobs[k].values()), abs=1e-9)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)


def test_chat_logprobs_streamed_and_not(server, client):
    model = client.models.list().data[0].id
    msgs = [{"role": "user", "content": "Name a color."}]
    whole = client.chat.completions.create(model=model, messages=msgs, max_tokens=6, temperature=0, logprobs=True,
                                           top_logprobs=2)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens
    for c in content:
        assert len(c.top_logprobs) == 2 and c.logprob == pytest.approx(c.top_logprobs[0].logprob, abs=1e-9)
        assert c.logprob <= 0 and bytes(c.bytes).decode("utf-8", "replace") == c.token
    streamed = [e for ch in client.chat.completions.create(model=model, messages=msgs, max_tokens=6, temperature=0,
                                                            logprobs=True, top_logprobs=2, stream=True)
                if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    assert [(c.token, round(c.logprob, 6)) for c in streamed] == [(c.token, round(c.logprob, 6)) for c in content]
    plain = client.chat.completions.create(model=model, messages=msgs, max_tokens=6, temperature=0)
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == whole.choices[0].message.content


def test_echo_alone_and_logprobs_zero(server, client):
    model = client.models.list().data[0].id
    r = client.completions.create(model=model, prompt="Hello there", max_tokens=2, temperature=0, echo=True)
    assert r.choices[0].text.startswith("Hello there") and r.choices[0].logprobs is None
    r = client.completions.create(model=model, prompt="Hello there", max_tokens=2, temperature=0, logprobs=0)
    lp = r.choices[0].logprobs
    assert len(lp.token_logprobs) == r.usage.completion_tokens and all(t == {} for t in lp.top_logprobs)


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 21},
     "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": 3}, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 21}, "logprobs"),
])
def test_bad_logprob_requests_are_400_naming_the_field(server, path, body, param):
    import httpx

    r = httpx.post(server[0] + path, json=dict(body, max_tokens=2), headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
