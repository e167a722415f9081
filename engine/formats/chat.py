"""Chat template rendering with the model's own Jinja template (as transformers renders it)."""
from __future__ import annotations

import json
from functools import lru_cache

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.errors import BadRequestError

# Used when a model ships no template (ChatML is Qwen's format).
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if loop.first and message.role != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

ROLES = ("system", "user", "assistant", "tool")


def _raise(msg):
    raise TemplateError(msg)


@lru_cache(maxsize=8)
def _compile(template: str):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(
        x, indent=indent, ensure_ascii=ensure_ascii)
    env.globals["raise_exception"] = _raise
    return env.from_string(template)


def normalize_messages(messages: list) -> list[dict]:
    """Validate OpenAI-style messages; content may be a string or a list of text parts."""
    if not isinstance(messages, list) or not messages:
        raise BadRequestError("messages must be a non-empty list")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise BadRequestError(f"messages[{i}] must be an object")
        role = m.get("role")
        if role not in ROLES:
            raise BadRequestError(f"messages[{i}].role {role!r} is not one of {', '.join(ROLES)}")
        content = m.get("content")
        if content is None:
            content = ""
        elif isinstance(content, list):
            parts = []
            for p in content:
                if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str):
                    parts.append(p["text"])
                elif isinstance(p, str):
                    parts.append(p)
                else:
                    raise BadRequestError(f"messages[{i}].content: only text parts are supported")
            content = "".join(parts)
        elif not isinstance(content, str):
            raise BadRequestError(f"messages[{i}].content must be a string or a list of text parts")
        msg = {"role": role, "content": content}
        for k in ("name", "tool_calls", "tool_call_id"):
            if k in m and m[k] is not None:
                msg[k] = m[k]
        out.append(msg)
    return out


def render_chat(template: str | None, messages: list, add_generation_prompt: bool = True,
                tools: list | None = None) -> str:
    msgs = normalize_messages(messages)
    try:
        return _compile(template or CHATML_TEMPLATE).render(
            messages=msgs, add_generation_prompt=add_generation_prompt, tools=tools or None,
            bos_token="", eos_token="<|im_end|>")
    except TemplateError as e:
        raise BadRequestError(f"chat template failed: {e}") from e
