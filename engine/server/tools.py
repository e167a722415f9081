"""Tool calls: when a request carries tools, an answer that is a call of one of them is returned as OpenAI
`tool_calls` (finish_reason "tool_calls"). Qwen2.5 writes a call in one of three shapes, all accepted:

    <tool_call>{"name": ..., "arguments": {...}}</tool_call>     (its chat template's format; several allowed)
    ```json\\n{"name": ..., "arguments": {...}}\\n```              (fenced, common at higher temperatures)
    {"name": ..., "arguments": {...}}                            (bare JSON, or a JSON list of such objects;
                                                                  what a forced tool_choice's grammar produces)

Text outside <tool_call> blocks or fences becomes the message content. Streaming holds the output back while
it may still become a call (may_be_tool_call) and then sends OpenAI's deltas (stream_deltas).
"""
from __future__ import annotations

import json
import re
import uuid

from engine.server.errors import APIError

TOOL_RE = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)  # a last block may lack its close tag
FENCE_RE = re.compile(r"```[ \t]*([A-Za-z_]*)[ \t]*\n(.*?)(?:```|\Z)", re.S)  # max_tokens may cut the close
OPEN = "<tool_call>"


NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function's name


def check_tools(tools: list | None) -> None:
    """Refuse (400) a tools list the model would see garbled or not at all: every entry must be
    {"type": "function", "function": {"name": ..., "parameters": {...}?}}, as /v1/responses already demands."""
    seen = set()
    for i, t in enumerate(tools or []):
        f = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function":
            raise APIError(400, f"tools[{i}]: only function tools are supported "
                           '({"type": "function", "function": {"name": ..., "parameters": {...}}})',
                           param=f"tools.{i}", code="unsupported_value")
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not NAME_RE.fullmatch(f["name"]):
            raise APIError(400, f"tools[{i}].function needs a name of 1-64 letters, digits, '_' or '-'",
                           param=f"tools.{i}.function.name", code="invalid_value")
        if "parameters" in f and f["parameters"] is not None and not isinstance(f["parameters"], dict):
            raise APIError(400, f"tools[{i}].function.parameters must be a JSON Schema object",
                           param=f"tools.{i}.function.parameters", code="invalid_type")
        if f["name"] in seen:
            raise APIError(400, f"tools[{i}]: the function name {f['name']!r} is offered twice",
                           param=f"tools.{i}.function.name", code="invalid_value")
        seen.add(f["name"])


def tool_names(tools: list | None, tool_choice) -> set[str] | None:
    """Names of the offered functions; None when tool calls are not to be parsed."""
    if not tools or tool_choice == "none":
        return None
    names = set()
    for t in tools:
        f = t.get("function") if isinstance(t, dict) else None
        if isinstance(f, dict) and isinstance(f.get("name"), str):
            names.add(f["name"])
    return names


def _may_be_json_call(s: str) -> bool:
    """s (stripped) could still be the start of {"name": ...} or [{"name": ...}, ...]"""
    if s.startswith("["):
        s = s[1:].lstrip()
        if s == "":
            return True
    if s.startswith("{"):
        rest = s[1:].lstrip()
        return rest == "" or rest.startswith('"')
    return s == ""


def may_be_tool_call(text: str) -> bool:
    """While streaming: could this output prefix still become a tool call? (then hold it back)"""
    s = text.lstrip()
    if s.startswith(OPEN) or OPEN.startswith(s) or _may_be_json_call(s):
        return True
    if s.startswith("```") or "```".startswith(s):
        head, nl, rest = s[3:].partition("\n")
        if not nl:  # still in the fence's language tag
            tag = head.strip().lower()
            return "json".startswith(tag) or "tool_call".startswith(tag)
        return _may_be_json_call(rest.lstrip())
    return False


def _objects(text: str) -> list | None:
    """All JSON values in text (whitespace between them), or None if anything else is there."""
    dec, out, i = json.JSONDecoder(), [], 0
    while i < len(text):
        if text[i].isspace():
            i += 1
            continue
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return None
        out.extend(obj if isinstance(obj, list) else [obj])
    return out


def _candidates(text: str) -> tuple[str | None, list | None]:
    """-> (content outside the call markup, the JSON objects that may be calls)."""
    if OPEN in text:
        blocks = TOOL_RE.findall(text)
        content = TOOL_RE.sub("", text).strip() or None
        objs = []
        for b in blocks:
            o = _objects(b)
            if o is None:
                return text, None
            objs += o
        return content, objs
    fences = [(lang, body) for lang, body in FENCE_RE.findall(text)]
    if fences and all(lang.lower() in ("", "json", "tool_call") for lang, _ in fences):
        objs = []
        for _, body in fences:
            o = _objects(body)
            if o is None:
                return text, None
            objs += o
        return FENCE_RE.sub("", text).strip() or None, objs
    s = text.strip()
    if s.startswith(("{", "[")):
        return None, _objects(s)
    return text, None


def parse_tool_calls(text: str, names: set[str], parallel: bool = True) -> tuple[str | None, list[dict]]:
    """-> (content, tool_calls); tool_calls is [] when the text is not a well-formed call of an offered
    function (then content is the whole text). parallel=False keeps only the first call."""
    content, objs = _candidates(text)
    if not objs:
        return text, []
    calls = []
    for o in objs:
        if not isinstance(o, dict) or not isinstance(o.get("name"), str) or (names and o["name"] not in names):
            return text, []
        args = o.get("arguments", o.get("parameters", {}))
        calls.append({"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                      "function": {"name": o["name"],
                                   "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)}})
    return content, calls[:1] if not parallel else calls


def stream_deltas(calls: list[dict]) -> list[dict]:
    """OpenAI's streamed shape of tool calls: per call, a delta with index, id, type, name and empty
    arguments, then one with the arguments (clients concatenate arguments by index)."""
    out = []
    for i, c in enumerate(calls):
        f = c["function"]
        out.append({"index": i, "id": c["id"], "type": "function", "function": {"name": f["name"], "arguments": ""}})
        out.append({"index": i, "function": {"arguments": f["arguments"]}})
    return out
