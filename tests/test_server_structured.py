"""Structured outputs and today's OpenAI surface with the real clients against the real server on the 0.5B:
openai `chat.completions.parse`, the request instructor's Mode.JSON sends, LangChain
`with_structured_output(method="json_schema")`, forced tool calls (also streamed), logprobs, the Responses
API (`responses.create` / `responses.stream`) and `models.retrieve`. Small max_tokens keep it fast."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from pydantic import BaseModel, ConfigDict

from engine.config import EngineConfig
from engine.server.app import ServerThread
from engine.server.tools import may_be_tool_call, parse_tool_calls


class Person(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str
    age: int


class City(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    city: str
    country: str
    population_millions: float


class Task(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    title: str
    done: bool
    tags: list[str]


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a timezone",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}


@pytest.fixture(scope="module")
def server(llm):
    srv = ServerThread(EngineConfig(port=0, device="cpu"), llm=llm).start()
    yield srv
    srv.stop()
    assert sorted(llm.runner.free_slots) == list(range(llm.cfg.max_batch))


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def _schema_format(m: type[BaseModel]) -> dict:
    return {"type": "json_schema", "json_schema": {"name": m.__name__, "schema": m.model_json_schema(), "strict": True}}


# --- structured outputs ------------------------------------------------------------------------------
def test_openai_parse_pydantic(client, model):
    r = client.chat.completions.parse(model=model, response_format=Person, max_tokens=40, temperature=0,
                                      messages=[{"role": "user", "content": "Bob is 30 years old. Who is he?"}])
    p = r.choices[0].message.parsed
    assert isinstance(p, Person) and p.age == 30 and "Bob" in p.name


def test_instructor_mode_json_request(client, model):
    """instructor 1.17 pins jiter < 0.15 (installing it downgrades openai 3.57, which needs jiter >= 0.16, to
    3.3), so this sends what its Mode.JSON sends: the schema in the system message, response_format json_object."""
    system = ("As a genius expert, your task is to understand the content and provide the parsed objects in json "
              f"that match the following json_schema:\n\n{json.dumps(Person.model_json_schema(), indent=2)}\n\n"
              "Make sure to return an instance of the JSON, not the schema itself")
    r = client.chat.completions.create(model=model, max_tokens=40, temperature=0,
                                       response_format={"type": "json_object"},
                                       messages=[{"role": "system", "content": system},
                                                 {"role": "user", "content": "Alice is 25 years old."}])
    text = r.choices[0].message.content
    assert isinstance(json.loads(text), dict)  # json_object: valid JSON, no ``` fences, whatever the model wanted
    Person.model_validate_json(text)


def test_langchain_with_structured_output(server, model):
    from langchain_openai import ChatOpenAI
    llm = ChatOpenAI(base_url=server.base_url, api_key="anything", model=model, max_tokens=40, temperature=0,
                     max_retries=0, timeout=120)
    out = llm.with_structured_output(City, method="json_schema").invoke(
        "Paris is the capital of France and has about 2.1 million inhabitants.")
    assert isinstance(out, City) and out.city == "Paris"


def test_twenty_structured_requests_valid(client, model):
    """20 constrained requests (3 schemas, sampling at temperature 0.8) batched with 2 plain ones:
    all 20 parse against their schema; the plain ones stay prose."""
    prompts = {Person: "{} is {} years old.", City: "{} is a city in {} with about {} million people.",
               Task: "Todo: {} (status done: {}), tags {}."}
    args = [("Ann", 41), ("Lyon", "France", 0.5), ("write report", "no", "work, urgent")]
    jobs = [(m, prompts[m].format(*a)) for _ in range(7) for m, a in zip(prompts, args)][:20]

    def one(job):
        m, text = job
        if m is None:
            return None, client.chat.completions.create(model=model, max_tokens=8, temperature=0,
                                                        messages=[{"role": "user", "content": text}])
        return m, client.chat.completions.create(model=model, max_tokens=60, temperature=0.8, seed=len(text),
                                                 response_format=_schema_format(m),
                                                 messages=[{"role": "user", "content": text}])
    plain = [(None, "Say hello in one word."), (None, "Name a colour.")]
    with ThreadPoolExecutor(6) as ex:
        results = list(ex.map(one, jobs[:10] + plain + jobs[10:]))
    valid = 0
    for m, r in results:
        if m is None:
            assert r.choices[0].message.content and r.choices[0].finish_reason in ("stop", "length")
            continue
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
        m.model_validate_json(r.choices[0].message.content)
        valid += 1
    assert valid == 20


def test_structured_output_streamed(client, model):
    stream = client.chat.completions.create(model=model, max_tokens=40, temperature=0, stream=True,
                                            response_format=_schema_format(Person),
                                            messages=[{"role": "user", "content": "Carl is 52 years old."}])
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert Person.model_validate_json(text).age == 52


def test_bad_response_format_is_400(client, model):
    import openai
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=msgs, max_tokens=4,
                                       response_format={"type": "xml"})
    assert e.value.body["param"] == "response_format.type"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model, messages=msgs, max_tokens=4, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "$ref": "#/nowhere"}}})


# --- tools -----------------------------------------------------------------------------------------
def test_forced_tool_call(client, model):
    msgs = [{"role": "user", "content": "How warm is it in Oslo right now?"}]
    r = client.chat.completions.create(model=model, messages=msgs, tools=[WEATHER, TIME], max_tokens=40,
                                       temperature=0, tool_choice={"type": "function",
                                                                   "function": {"name": "get_weather"}})
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1
    call = c.message.tool_calls[0]
    args = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and args["unit"] in ("celsius", "fahrenheit") and args["city"]
    r = client.chat.completions.create(model=model, messages=msgs, tools=[WEATHER, TIME], max_tokens=40,
                                       temperature=0, tool_choice="required")
    assert r.choices[0].message.tool_calls[0].function.name in ("get_weather", "get_time")


def test_forced_tool_call_streamed_deltas(client, model):
    stream = client.chat.completions.create(
        model=model, stream=True, max_tokens=40, temperature=0, tools=[WEATHER], tool_choice="required",
        messages=[{"role": "user", "content": "Weather in Rome?"}])
    calls, finish = {}, None
    for ch in stream:
        if not ch.choices:
            continue
        for d in ch.choices[0].delta.tool_calls or []:
            cur = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            cur["id"] = d.id or cur["id"]
            cur["name"] += (d.function.name or "") if d.function else ""
            cur["arguments"] += (d.function.arguments or "") if d.function else ""
        finish = ch.choices[0].finish_reason or finish
    assert finish == "tool_calls" and calls[0]["id"].startswith("call_") and calls[0]["name"] == "get_weather"
    assert json.loads(calls[0]["arguments"])["city"]


def test_tool_call_shapes_parsed():
    names = {"get_weather"}
    body = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    for text in (f"<tool_call>\n{body}\n</tool_call>", f"```json\n{body}\n```", body, f"[{body}]",
                 f"<tool_call>\n{body}", f"Let me check.\n```json\n{body}\n```", f"```json\n{body}\n"):
        content, calls = parse_tool_calls(text, names)
        assert calls and calls[0]["function"]["name"] == "get_weather", text
        assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo"}
    assert parse_tool_calls(f"Let me check.\n```json\n{body}\n```", names)[0] == "Let me check."
    assert parse_tool_calls("```python\nprint(1)\n```", names)[1] == []
    assert parse_tool_calls('{"name": "rm_rf", "arguments": {}}', names)[1] == []
    two = f"<tool_call>{body}</tool_call><tool_call>{body}</tool_call>"
    assert len(parse_tool_calls(two, names)[1]) == 2 and len(parse_tool_calls(two, names, parallel=False)[1]) == 1
    assert all(may_be_tool_call(p) for p in ("", "``", "```js", "```json\n", "```json\n{", "<tool", "{", '{ "na',
                                             "[", '[{"name"'))
    assert not any(may_be_tool_call(p) for p in ("Hello", "```python", "```json\nprint", "[see](x)", "{x}"))


# --- logprobs --------------------------------------------------------------------------------------
def test_chat_logprobs(client, model):
    msgs = [{"role": "user", "content": "Count: one, two,"}]
    r = client.chat.completions.create(model=model, messages=msgs, max_tokens=6, temperature=0, logprobs=True,
                                       top_logprobs=3)
    lp = r.choices[0].logprobs.content
    assert len(lp) == r.usage.completion_tokens or r.choices[0].finish_reason == "stop"
    assert "".join(t.token for t in lp) == r.choices[0].message.content
    for t in lp:
        assert len(t.top_logprobs) == 3 and t.logprob <= 0
        assert t.top_logprobs[0].token == t.token  # greedy: the chosen token is the most likely
    stream = client.chat.completions.create(model=model, messages=msgs, max_tokens=6, temperature=0,
                                            logprobs=True, top_logprobs=3, stream=True)
    streamed = [t for c in stream if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [(t.token, round(t.logprob, 3)) for t in streamed] == [(t.token, round(t.logprob, 3)) for t in lp]


def test_completion_logprobs_and_limits(client, model):
    import openai
    r = client.completions.create(model=model, prompt="def add(a, b):", max_tokens=5, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) > 0
    assert all(len(t) == 2 for t in lp.top_logprobs) and "".join(lp.tokens) == r.choices[0].text
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                       logprobs=True, top_logprobs=6)


# --- Responses API and models.retrieve --------------------------------------------------------------
def test_responses_create(client, model):
    r = client.responses.create(model=model, input="Say hello.", instructions="Answer in one short sentence.",
                                max_output_tokens=12, temperature=0)
    assert r.id.startswith("resp_") and r.output_text and r.usage.output_tokens <= 12
    assert r.status in ("completed", "incomplete")
    r = client.responses.create(model=model, max_output_tokens=40, temperature=0,
                                input=[{"role": "user", "content": [{"type": "input_text", "text": "Dan is 7."}]}],
                                text={"format": {"type": "json_schema", "name": "Person",
                                                 "schema": Person.model_json_schema(), "strict": True}})
    assert Person.model_validate_json(r.output_text).age == 7
    parsed = client.responses.parse(model=model, input="Eve is 19.", text_format=Person, max_output_tokens=40,
                                    temperature=0).output_parsed
    assert isinstance(parsed, Person) and parsed.age == 19


def test_responses_function_call(client, model):
    tool = {"type": "function", **WEATHER["function"]}
    r = client.responses.create(model=model, input="Weather in Lima?", tools=[tool], max_output_tokens=40,
                                temperature=0, tool_choice={"type": "function", "name": "get_weather"})
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and json.loads(calls[0].arguments)["city"]


def test_responses_stream(client, model):
    deltas, last = [], None
    with client.responses.stream(model=model, input="Say OK.", instructions="Reply with one word.",
                                 max_output_tokens=16, temperature=0) as stream:
        for ev in stream:
            last = ev.type
            if ev.type == "response.output_text.delta":
                deltas.append(ev.delta)
        assert last == "response.completed"
        assert stream.get_final_response().output_text == "".join(deltas) != ""


def test_responses_stream_events_raw(server, model):
    with httpx.stream("POST", server.base_url + "/responses", timeout=120, json={
            "model": model, "input": "Hi", "max_output_tokens": 4, "stream": True}) as r:
        types = [json.loads(line[6:])["type"] for line in r.iter_lines() if line.startswith("data: ")]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert "response.output_text.delta" in types and types[-1] in ("response.completed", "response.incomplete")


def test_models_retrieve(client, model):
    import openai
    assert client.models.retrieve(model).id == model
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_logit_bias_penalties_and_refused_fields(client, model, llm):
    import openai
    msgs = [{"role": "user", "content": "Say hello."}]
    base = client.chat.completions.create(model=model, messages=msgs, max_tokens=3, temperature=0, logprobs=True)
    first = base.choices[0].logprobs.content[0]
    tid = llm.tokenizer.encode(bytes(first.bytes).decode("utf-8"))[0]
    banned = client.chat.completions.create(model=model, messages=msgs, max_tokens=3, temperature=0, logprobs=True,
                                            logit_bias={str(tid): -100})
    assert banned.choices[0].logprobs.content[0].token != first.token
    for kw, param in (({"reasoning_effort": "high"}, "reasoning_effort"), ({"frequency_penalty": 3.0},
                      "frequency_penalty"), ({"logit_bias": {"999999": 1}}, "logit_bias"),
                      ({"modalities": ["text", "audio"]}, "modalities")):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=model, messages=msgs, max_tokens=2, **kw)
        assert e.value.body["param"] == param
