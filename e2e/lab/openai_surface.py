"""Every parameter vLLM serves on /v1/chat/completions and /v1/completions, sent through the official `openai`
client: one request per parameter, each either served (200, and the answer shows the parameter took effect)
or refused with a 4xx that names the problem. A 5xx, a dropped connection or a dead engine is a failure: one
client's request must never take a replica down (the `logprobs` request that killed the EngineCore in the CPU
image, runtime/serving/engine.py).

Used against the host's runtime in tier 3 (tests/runtime/test_rt_serving.py) and against a pod of the CPU
runtime image through its Service in tier 4 (e2e/test_api_surface.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import openai

MODEL = "tiny"
MESSAGES = [{"role": "user", "content": "Name three colours."}]
PROMPT = "The colours of the rainbow are"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
JSON_SCHEMA = {
    "name": "colour",
    "schema": {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}},
        "required": ["name"],
        "additionalProperties": False,
    },
}


@dataclass(frozen=True)
class Case:
    """One request: `endpoint` is "chat" or "completions"; `served` says it must be answered 200 (else a 4xx
    is also right: a parameter the engine's configuration does not enable); `check` tests the answer."""

    name: str
    endpoint: str
    params: dict[str, Any]
    served: bool = True
    check: Callable[[Any], bool] = field(default=lambda reply: True)


def _chat_logprobs(reply: Any, top: int) -> bool:
    content = reply.choices[0].logprobs.content
    return bool(content) and all(len(token.top_logprobs) == top for token in content)


def _completion_logprobs(reply: Any, top: int) -> bool:
    logprobs = reply.choices[0].logprobs
    return bool(logprobs.tokens) and all(len(entry) >= top for entry in logprobs.top_logprobs)


def _stream(chunks: Any) -> bool:
    """A streamed answer: text chunks, then the usage chunk that stream_options asked for."""
    seen = list(chunks)
    usage = [chunk.usage for chunk in seen if chunk.usage is not None]
    return len(seen) > 1 and len(usage) == 1 and usage[0].completion_tokens > 0


CASES = [
    Case("chat: plain", "chat", {}, check=lambda r: r.choices[0].message.role == "assistant"),
    Case("chat: logprobs", "chat", {"logprobs": True}, check=lambda r: _chat_logprobs(r, 0)),
    Case(
        "chat: top_logprobs",
        "chat",
        {"logprobs": True, "top_logprobs": 3},
        check=lambda r: _chat_logprobs(r, 3),
    ),
    Case("chat: n", "chat", {"n": 2, "temperature": 1.0}, check=lambda r: len(r.choices) == 2),
    Case("chat: seed", "chat", {"seed": 7, "temperature": 1.0}),
    Case("chat: stop", "chat", {"stop": ["\n", "."]}),
    Case("chat: temperature and top_p", "chat", {"temperature": 0.7, "top_p": 0.9}),
    Case("chat: penalties", "chat", {"presence_penalty": 0.5, "frequency_penalty": 0.5}),
    Case("chat: logit_bias", "chat", {"logit_bias": {"5": 10}}),
    Case("chat: max_completion_tokens", "chat", {"max_completion_tokens": 4, "max_tokens": openai.omit}),
    Case("chat: user", "chat", {"user": "someone"}),
    Case(
        "chat: response_format json_object",
        "chat",
        {"response_format": {"type": "json_object"}},
    ),
    Case(
        "chat: response_format json_schema",
        "chat",
        {"response_format": {"type": "json_schema", "json_schema": JSON_SCHEMA}},
    ),
    Case("chat: tools, tool_choice none", "chat", {"tools": [WEATHER_TOOL], "tool_choice": "none"}),
    # "auto" needs the server's --enable-auto-tool-choice and a parser: a 400 without them.
    Case(
        "chat: tools, tool_choice auto",
        "chat",
        {"tools": [WEATHER_TOOL], "tool_choice": "auto"},
        served=False,
    ),
    Case(
        "chat: tools, a named tool",
        "chat",
        {"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
        served=False,
    ),
    Case(
        "chat: stream with usage",
        "chat",
        {"stream": True, "stream_options": {"include_usage": True}},
        check=_stream,
    ),
    Case("chat: prompt_logprobs", "chat", {"extra_body": {"prompt_logprobs": 2}}),
    Case("chat: top_k and min_p", "chat", {"extra_body": {"top_k": 5, "min_p": 0.05}}),
    Case("chat: ignore_eos", "chat", {"extra_body": {"ignore_eos": True}}),
    Case("completions: plain", "completions", {}, check=lambda r: r.choices[0].text is not None),
    Case("completions: logprobs", "completions", {"logprobs": 2}, check=lambda r: _completion_logprobs(r, 2)),
    Case(
        "completions: echo with logprobs",
        "completions",
        {"echo": True, "logprobs": 1},
        check=lambda r: r.choices[0].text.startswith(PROMPT),
    ),
    Case("completions: n", "completions", {"n": 3, "temperature": 1.0}, check=lambda r: len(r.choices) == 3),
    Case("completions: best_of", "completions", {"best_of": 2, "n": 1}, served=False),
    Case("completions: seed", "completions", {"seed": 11, "temperature": 1.0}),
    Case("completions: stop", "completions", {"stop": ["."]}),
    Case("completions: suffix", "completions", {"suffix": " and more."}, served=False),
    Case("completions: logit_bias", "completions", {"logit_bias": {"5": -100}}),
    Case(
        "completions: stream with usage",
        "completions",
        {"stream": True, "stream_options": {"include_usage": True}},
        check=_stream,
    ),
    Case("completions: prompt_logprobs", "completions", {"extra_body": {"prompt_logprobs": 1}}),
    Case(
        "completions: response_format json_object",
        "completions",
        {"extra_body": {"response_format": {"type": "json_object"}}},
    ),
    Case("completions: a token-id prompt", "completions", {"prompt": [1, 2, 3, 4]}),
    # Refused ones: each must be a 4xx, never a 5xx.
    Case("chat: logprobs too many", "chat", {"logprobs": True, "top_logprobs": 100_000}, served=False),
    Case("completions: logprobs too many", "completions", {"logprobs": 100_000}, served=False),
    Case("chat: n zero", "chat", {"n": 0}, served=False),
    Case("chat: negative max_tokens", "chat", {"max_tokens": -1}, served=False),
]


@dataclass(frozen=True)
class Outcome:
    case: Case
    status: int  # 200, or the error's HTTP status; 0 when no HTTP answer came
    problem: str | None = None  # why the outcome is wrong; None when it is right

    def __str__(self) -> str:
        return f"{self.case.name}: {self.status} {self.problem}"


def send(client: openai.OpenAI, case: Case, max_tokens: int = 8) -> Outcome:
    """`case` sent once; what came back, judged."""
    params: dict[str, Any] = {"model": MODEL, "max_tokens": max_tokens, **case.params}
    try:
        if case.endpoint == "chat":
            reply: Any = client.chat.completions.create(messages=MESSAGES, **params)
        else:
            reply = client.completions.create(**{"prompt": PROMPT, **params})
    except openai.APIStatusError as exc:
        if not case.served and 400 <= exc.status_code < 500:
            return Outcome(case, exc.status_code)
        return Outcome(case, exc.status_code, str(exc)[:300])
    except openai.APIConnectionError as exc:
        return Outcome(case, 0, f"no answer: {exc}")
    if not case.check(reply):
        return Outcome(case, 200, "served, but the answer does not show the parameter")
    return Outcome(case, 200)


def sweep(client: openai.OpenAI) -> list[Outcome]:
    """Every case, one after another; the outcomes that are wrong (none: every promise held)."""
    return [outcome for outcome in (send(client, case) for case in CASES) if outcome.problem]


# vLLM's app of the pinned version, built without an engine, with every task and the development routes on
# (VLLM_SERVER_DEV_MODE): every route some configuration of it mounts. Printed as JSON by a subprocess, so
# that the variable and vLLM's imports stay out of the caller.
_ROUTES_SCRIPT = """
import json, sys, typing, warnings
warnings.simplefilter("ignore")
from vllm import tasks
from vllm.entrypoints.launchers.app import build_app
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
every = typing.get_args(tasks.GenerationTask) + typing.get_args(tasks.PoolingTask)
args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", sys.argv[1]])
app = build_app(args, supported_tasks=every)
print(json.dumps(sorted({(m, r.path) for r in app.routes for m in (getattr(r, "methods", None) or ["GET"])})))
"""


def vllm_routes(python: str, model_dir: str) -> list[tuple[str, str]]:
    """(method, path) of every route vLLM's app can mount, path parameters filled in with "x"."""
    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", HF_HUB_OFFLINE="1")
    done = subprocess.run(
        [python, "-c", _ROUTES_SCRIPT, model_dir],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    routes = json.loads(done.stdout.strip().splitlines()[-1])
    return [(method, re.sub(r"\{[^}]+\}", "x", path)) for method, path in routes if method != "HEAD"]
