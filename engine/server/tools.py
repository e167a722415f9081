"""Tool calls: Qwen2.5 answers a `tools` request with `<tool_call>{"name", "arguments"}</tool_call>`
blocks (small models often emit the bare JSON object). When the request carried tools, such an
answer is returned as OpenAI `tool_calls` with finish_reason "tool_calls" (Continue agent mode)."""
from __future__ import annotations

import json
import re
import uuid

TOOL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
OPEN = "<tool_call>"


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


def may_be_tool_call(text: str) -> bool:
    """While streaming: could this output prefix still become a tool call? (then hold it back)"""
    s = text.lstrip()
    return s == "" or s.startswith("{") or s.startswith(OPEN) or OPEN.startswith(s)


def _objects(text: str) -> list | None:
    dec, out, i = json.JSONDecoder(), [], 0
    while i < len(text):
        if text[i].isspace():
            i += 1
            continue
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return None
        out.append(obj)
    return out


def parse_tool_calls(text: str, names: set[str]) -> tuple[str | None, list[dict]]:
    """-> (content, tool_calls); tool_calls is [] when the text is not a well-formed call."""
    blocks = TOOL_RE.findall(text)
    if blocks:
        content = TOOL_RE.sub("", text).strip() or None
        objs = [o for b in blocks for o in (_objects(b) or [None])]
    else:
        content, objs = None, _objects(text.strip()) if text.strip().startswith("{") else None
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
    return content, calls
