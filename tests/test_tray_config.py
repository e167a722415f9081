"""Tray config parsing (defaults, bad files naming the line), templates, hotkey strings, token budget."""
from __future__ import annotations

import datetime as dt

import pytest

from trayapp import mapreduce
from trayapp.config import default_config, default_text, ensure_config_file, load_config, parse_config
from trayapp.keys import HotkeyError, canonical, parse_hotkey, to_keyboard, to_pynput
from trayapp.templates import EN, ZH, detect_lang, render_messages, resolve_lang


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_shipped_defaults_parse(lang):
    cfg = default_config(lang)
    ids = [t.id for t in cfg.templates]
    assert ids == ["quick_ask", "summarize", "rewrite", "translate", "todo"]
    assert cfg.template("quick_ask").hotkey == "alt+win+q"  # canonical order: ctrl, alt, shift, win
    assert len({t.hotkey for t in cfg.templates}) == 5
    assert {t.output for t in cfg.templates} == {"paste", "notify", "window"}
    assert cfg.backend.kind == "local" and cfg.backend.port == 18000
    assert set(cfg.backend.models) >= {"qwen2.5-3b", "qwen2.5-7b"}
    if lang == "zh":
        assert [t.title for t in cfg.templates[1:]] == ["总结", "改写", "翻译", "待办"]


def test_first_run_writes_defaults_and_never_overwrites(tmp_path):
    p = tmp_path / "deepinfer" / "config.toml"
    ensure_config_file(p, "zh")
    assert p.read_text(encoding="utf-8") == default_text("zh")
    p.write_text(default_text("en").replace('title = "Summarize"', 'title = "TL;DR"'), encoding="utf-8")
    cfg, issues = load_config(p, "zh")
    assert not issues and cfg.template("summarize").title == "TL;DR" and cfg.path == p


def test_syntax_error_names_the_line_and_keeps_defaults(tmp_path):
    p = tmp_path / "config.toml"
    p.write_text('[tray]\nlang = "auto"\n\n[[templates]]\nid = "x"\nprompt = "unterminated\n', encoding="utf-8")
    cfg, issues = load_config(p, "en")
    assert len(issues) == 1 and issues[0].line == 6 and "line 6" in str(issues[0])
    assert [t.id for t in cfg.templates] == [t.id for t in default_config("en").templates]


def test_bad_values_name_their_lines():
    text = """[tray]
copy_timeout_s = "slow"

[backend]
kind = "cloud"

[[templates]]
id = "ok"
prompt = "Fix: {text}"
hotkey = "ctrl+alt+1"
tittle = "typo"

[[templates]]
id = "bad_output"
prompt = "{text}"
output = "speak"

[[templates]]
id = "dup_key"
hotkey = "Ctrl+Alt+1"
prompt = "{text}"

[[templates]]
id = "no_text"
prompt = "Summarize this"
max_tokens = 12.5

[[templates]]
title = "no id"
"""
    cfg, issues = parse_config(text)
    by_line = {i.line: i.message for i in issues}
    assert "copy_timeout_s must be a number" in by_line[2] and cfg.copy_timeout_s == 1.5
    assert "kind must be local or remote" in by_line[5] and cfg.backend.kind == "local"
    assert "unknown key 'tittle' ignored" in by_line[11]
    assert "output must be paste, notify or window" in by_line[16]
    assert "already used by 'ok'" in by_line[20]
    assert "must contain {text}" in by_line[25]
    assert "max_tokens must be an integer" in by_line[26]
    assert "needs id" in by_line[28]
    assert [t.id for t in cfg.templates] == ["ok"]  # bad templates skipped, the good one kept


def test_out_of_range_numbers_name_their_lines_and_keep_defaults():
    """A port of 70000, a negative or NaN timeout, a remote URL that is not HTTP would fail later, far from the file."""
    text = """[tray]
copy_timeout_s = nan
paste_restore_delay_s = -1

[backend]
kind = "remote"
port = 70000
context_tokens = -5
url = "ftp://example.com"
"""
    cfg, issues = parse_config(text)
    by_line = {i.line: i.message for i in issues}
    assert "copy_timeout_s must be 0.05..30.0" in by_line[2] and cfg.copy_timeout_s == 1.5
    assert "paste_restore_delay_s must be 0.0..30.0" in by_line[3] and cfg.paste_restore_delay_s == 0.5
    assert "port must be 1..65535, got 70000" in by_line[7] and cfg.backend.port == 18000
    assert "context_tokens must be 0.." in by_line[8] and cfg.backend.context_tokens == 0
    assert "url must start with http:// or https://" in by_line[9] and cfg.backend.url.startswith("http://127.0.0.1")
    cfg, issues = parse_config('[backend]\nkind = "remote"\nurl = "https://api.example.com/v1"\nport = 18001\n')
    assert not issues and cfg.backend.url == "https://api.example.com/v1" and cfg.backend.port == 18001


def test_backend_gguf_pack_reaches_the_engine_config():
    """[backend] gguf_pack: a packing the engine knows goes to the local endpoint's EngineConfig; "" keeps the
    engine's default; anything else is named with its line and ignored."""
    from engine.config import GGUF_PACK
    from trayapp.backend import LocalEndpoint

    cfg, issues = parse_config('[backend]\nmodel = "qwen2.5-3b"\ngguf_pack = "kquant"\n', "en")
    assert not issues and cfg.backend.gguf_pack == "kquant"
    seen = []
    LocalEndpoint("m", 1, starter=lambda c: seen.append(c), gguf_pack=cfg.backend.gguf_pack).start()
    LocalEndpoint("m", 1, starter=lambda c: seen.append(c)).start()
    assert [c.gguf_pack for c in seen] == ["kquant", GGUF_PACK] and seen[0].fit_context
    cfg, issues = parse_config('[backend]\n\ngguf_pack = "4bit"\n', "en")
    assert cfg.backend.gguf_pack == "" and "gguf_pack must be one of" in {i.line: i.message for i in issues}[3]
    # [backend] cpu_weights likewise (a machine without an NVIDIA GPU): int4 unless the config says otherwise
    assert parse_config("", "en")[0].backend.cpu_weights == "int4"
    cfg, issues = parse_config('[backend]\ncpu_weights = "int8"\n', "en")
    assert not issues and cfg.backend.cpu_weights == "int8"
    assert parse_config('[backend]\ncpu_weights = "dense"\n', "en")[0].backend.cpu_weights == "dense"
    LocalEndpoint("m", 1, starter=lambda c: seen.append(c), cpu_weights=cfg.backend.cpu_weights).start()
    assert seen[-1].cpu_weights == "int8" and seen[0].cpu_weights == "dense"
    cfg, issues = parse_config('[backend]\ncpu_weights = "int2"\n', "en")
    assert cfg.backend.cpu_weights == "" and "cpu_weights must be one of" in {i.line: i.message for i in issues}[2]


def test_no_valid_template_falls_back_to_defaults():
    cfg, issues = parse_config('[[templates]]\nid = "a"\nprompt = "no variable"\n', "en")
    assert [t.id for t in cfg.templates][:2] == ["quick_ask", "summarize"]
    assert any("default templates" in str(i) for i in issues)


def test_render_variables_and_languages():
    cfg = default_config("zh")
    tr = cfg.template("translate")
    msgs = render_messages(tr, "明天开会", "auto", today=dt.date(2026, 11, 30))
    assert msgs[0]["role"] == "system" and msgs[1]["content"].endswith("翻译成English：\n\n明天开会")
    todo = render_messages(cfg.template("todo"), "Send {date} report", "auto", today=dt.date(2026, 11, 30))
    assert "今天是 2026-11-30" in todo[1]["content"] and "Send {date} report" in todo[1]["content"]
    assert resolve_lang("opposite", "hello world") == ZH and resolve_lang("auto", "你好，世界") == ZH
    assert resolve_lang("Français", "x") == "Français" and detect_lang("print(x)  # 注释") == EN


def test_hotkey_strings():
    assert parse_hotkey("Win+Alt+Q") == (frozenset({"win", "alt"}), "q")
    assert canonical("alt+super+Q") == "alt+win+q"
    assert to_pynput("win+alt+q") == "<alt>+<cmd>+q" and to_pynput("ctrl+f5") == "<ctrl>+<f5>"
    assert to_keyboard("ctrl+shift+1") == "ctrl+shift+1"
    with pytest.raises(HotkeyError):
        parse_hotkey("ctrl+alt")


def test_token_estimate_is_an_upper_bound_of_the_real_tokenizer(tokenizer):
    samples = ["明天下午三点前把实验报告发给导师，并附上结果表格。" * 5,
               "The quarterly report covers sales in the northern region, which rose by twelve percent. " * 5,
               "def f(x):\n    return {k: v for k, v in x.items() if v}\n" * 5,
               "混合 mixed 文本 with English and 中文，还有数字 12345 和 URL https://example.com/a?b=c",
               "    if (a[i] != b[j]) { x += y * 2; } // TODO\n" * 5, "1234567890 " * 10, "ÄÖÜ ß naïve café 😀 " * 5]
    for s in samples:
        real = len(tokenizer.encode(s))
        assert real <= mapreduce.estimate_tokens(s) <= 3 * real + 8, (s[:20], real, mapreduce.estimate_tokens(s))


def test_split_chunks_respects_the_budget():
    text = "第一段。" * 200 + "\n" + "A sentence here. " * 300 + "\n" + "x" * 5000
    chunks = mapreduce.split_chunks(text, 300)
    assert all(mapreduce.estimate_tokens(c) <= 300 for c in chunks)
    squash = lambda s: "".join(s.split())  # noqa: E731 - sentence splits drop the spaces between sentences
    assert squash("".join(chunks)) == squash(text)
