"""Filling a template: {text}, {lang}, {date}; and the language of a text (for {lang} = auto / opposite)."""
from __future__ import annotations

import datetime as _dt

from trayapp.config import Template

ZH, EN = "中文", "English"


def cjk_share(text: str) -> float:
    """Share of CJK ideographs among the non-space characters."""
    chars = [c for c in text if not c.isspace()]
    if not chars:
        return 0.0
    return sum(1 for c in chars if "\u3400" <= c <= "\u9fff" or "\uf900" <= c <= "\ufaff") / len(chars)


def detect_lang(text: str) -> str:
    return ZH if cjk_share(text) >= 0.2 else EN


def resolve_lang(setting: str, text: str) -> str:
    """'auto' -> the text's language; 'opposite' -> the other of Chinese/English; else the literal value."""
    s = (setting or "auto").strip()
    if s.lower() == "auto":
        return detect_lang(text)
    if s.lower() == "opposite":
        return EN if detect_lang(text) == ZH else ZH
    return s


def fill(pattern: str, text: str, lang: str, date: str) -> str:
    # Plain replacement, not str.format: prompts and selected code may contain other braces.
    # {text} goes last so a selection containing "{date}" is left as the user wrote it.
    return pattern.replace("{lang}", lang).replace("{date}", date).replace("{text}", text)


def render_messages(tpl: Template, text: str, default_lang: str = "auto",
                    today: _dt.date | None = None) -> list[dict]:
    """OpenAI chat messages for one run of the template on `text`."""
    lang = resolve_lang(tpl.lang or default_lang, text)
    date = (today or _dt.date.today()).isoformat()
    msgs = []
    if tpl.system:
        msgs.append({"role": "system", "content": fill(tpl.system, "", lang, date)})
    msgs.append({"role": "user", "content": fill(tpl.prompt, text, lang, date)})
    return msgs
