"""Tray settings: one TOML file (engine.paths.config_file()), parsed into dataclasses.

Defaults live in assets/templates/default.{zh,en}.toml and are copied to the user's config file on
first run. A bad file never stops the tray: every problem becomes a ConfigIssue naming its line,
the bad value (or template) is dropped and the default kept, and the tray shows the issues as a
notification.
"""
from __future__ import annotations

import locale
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from engine.assets_path import asset
from engine.config import CPU_WEIGHTS, GGUF_PACKS  # torch-free, like engine.paths
from engine.paths import config_file, models_dir
from trayapp.keys import HotkeyError, canonical

OUTPUT_MODES = ("paste", "notify", "window")
BACKEND_KINDS = ("local", "remote")
PACK_CHOICES = ("",) + GGUF_PACKS  # [backend] gguf_pack: "" = the engine's default
CPU_WEIGHT_CHOICES = ("",) + CPU_WEIGHTS  # [backend] cpu_weights: "" = the engine's default
_TEMPLATES_DIR = asset("templates")


@dataclass(slots=True)
class Template:
    """One task bound to a hotkey. prompt/system may use {text}, {lang}, {date}."""

    id: str
    title: str
    prompt: str
    system: str = ""
    hotkey: str = ""  # "win+alt+q"; "" = menu only
    output: str = "paste"  # paste | notify | window
    max_tokens: int = 256
    temperature: float = 0.0
    lang: str = ""  # "" -> TrayConfig.lang; "auto" | "opposite" | a literal language name


# the default ids' model arguments when [backend.models] does not name them: Ollama registry names, pulled on first use
DEFAULT_MODEL_ARGS = {"qwen2.5-3b": "qwen2.5:3b", "qwen2.5-7b": "qwen2.5:7b"}


@dataclass(slots=True)
class BackendConfig:
    kind: str = "local"  # local (in-process endpoint) | remote (any OpenAI-compatible URL)
    model: str = "qwen2.5-3b"
    port: int = 18000
    url: str = "http://127.0.0.1:18000/v1"
    api_key: str = ""
    remote_model: str = ""
    context_tokens: int = 0  # 0 -> server's /health max_context, else 4096
    # a GGUF's packing on the GPU (EngineConfig.gguf_pack: bytes | 6bit | kquant); "" = the engine's default
    gguf_pack: str = ""
    # on a machine without an NVIDIA GPU, how the CPU holds the weights (EngineConfig.cpu_weights): "int4" here (the
    # tray serves a person: a Q4_K_M file's 4-bit linears as their codes, the rest int8; a 3B decodes 1.55x faster
    # than in int8, and closer to the file: docs/quantization.md "The CPU path in int4"), "int8", "dense"
    # (float32, the engine's reference) or "" (the engine's default, dense); a GPU ignores it
    cpu_weights: str = "int4"
    # id -> model argument ({models} = engine.paths.models_dir()); the menu's radio items
    models: dict[str, str] = field(default_factory=dict)

    def model_arg(self, mid: str) -> str:
        arg = self.models.get(mid) or DEFAULT_MODEL_ARGS.get(mid, mid)
        return arg.replace("{models}", str(models_dir()))


@dataclass(slots=True)
class TrayConfig:
    templates: list[Template]
    backend: BackendConfig = field(default_factory=BackendConfig)
    lang: str = "auto"
    copy_timeout_s: float = 1.5
    paste_restore_delay_s: float = 0.5
    hotkeys: bool = True
    path: Path | None = None

    def template(self, tid: str) -> Template:
        for t in self.templates:
            if t.id == tid:
                return t
        raise KeyError(tid)


@dataclass(slots=True)
class ConfigIssue:
    line: int  # 1-based, 0 = whole file
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}" if self.line else self.message


def default_lang() -> str:
    """'zh' when the user's locale is Chinese, else 'en' (chooses the default template file)."""
    for var in ("LC_ALL", "LC_MESSAGES", "LANG"):
        if os.environ.get(var):
            return "zh" if os.environ[var].lower().startswith("zh") else "en"
    loc = (locale.getlocale()[0] or "").lower()
    return "zh" if loc.startswith(("zh", "chinese")) else "en"


def default_text(lang: str | None = None) -> str:
    name = f"default.{lang or default_lang()}.toml"
    return (_TEMPLATES_DIR / name).read_text(encoding="utf-8")


def default_config(lang: str | None = None) -> TrayConfig:
    cfg, issues = parse_config(default_text(lang))
    assert not issues, issues  # the shipped defaults are tested
    return cfg


def ensure_config_file(path: Path | None = None, lang: str | None = None) -> Path:
    """Write the default config on first run (never overwrites an existing file)."""
    path = path or config_file()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(default_text(lang), encoding="utf-8")
    return path


def load_config(path: Path | None = None, lang: str | None = None) -> tuple[TrayConfig, list[ConfigIssue]]:
    path = ensure_config_file(path, lang)
    try:
        text = path.read_text(encoding="utf-8-sig")  # tolerate a BOM written by Windows editors
    except (OSError, UnicodeDecodeError) as e:
        cfg = default_config(lang)
        cfg.path = path
        return cfg, [ConfigIssue(0, f"cannot read {path} ({e}); using the defaults")]
    cfg, issues = parse_config(text, lang)
    cfg.path = path
    return cfg, issues


# ---------------------------------------------------------------- parsing

_TEMPLATE_KEYS = {"id", "title", "prompt", "system", "hotkey", "output", "max_tokens", "temperature", "lang"}
_TYPES = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


class _Lines:
    """Finds the line of `key` inside the n-th [[templates]] block or a [table] (for messages)."""

    def __init__(self, text: str):
        self.lines = text.splitlines()

    def header(self, table: str, index: int) -> int:
        return self.of("", table, index)

    def of(self, key: str, table: str, index: int | None = None) -> int:
        """1-based line of `key` in the table (its header line when key is "" or absent)."""
        header = re.compile(r"^\s*\[\[\s*%s\s*\]\]" % re.escape(table) if index is not None
                            else r"^\s*\[\s*%s\s*\]" % re.escape(table))
        start, seen = None, -1
        for i, ln in enumerate(self.lines):
            if header.match(ln):
                seen += 1
                if index is None or seen == index:
                    start = i
                    break
        if start is None:
            return 0
        keyre = re.compile(r'^\s*"?%s"?\s*=' % re.escape(key))
        for i in range(start + 1, len(self.lines) if key else start + 1):
            if re.match(r"^\s*\[", self.lines[i]):
                break
            if keyre.match(self.lines[i]):
                return i + 1
        return start + 1


def _take(d: dict, key: str, typ: type, default, issues, where: str, line: int, bounds: tuple | None = None,
          note: str = ""):
    """d[key] if it has the type (and lies in bounds = (lo, hi), NaN never does: a port of 70000 or a negative
    timeout would fail later, far from its line), else the default and an issue naming the line."""
    if key not in d:
        return default
    v = d[key]
    if typ is float and isinstance(v, int) and not isinstance(v, bool):
        v = float(v)
    if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
        issues.append(ConfigIssue(line, f"{where}{key} must be {_TYPES[typ]}, got {v!r}; using {default!r}"))
        return default
    if bounds is not None and not bounds[0] <= v <= bounds[1]:
        issues.append(ConfigIssue(line, f"{where}{key} must be {bounds[0]}..{bounds[1]}{note}, got {v!r}; "
                                  f"using {default!r}"))
        return default
    return v


def parse_config(text: str, lang: str | None = None) -> tuple[TrayConfig, list[ConfigIssue]]:
    """Parse TOML text. Never raises: problems come back as issues and defaults fill in."""
    issues: list[ConfigIssue] = []
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"line (\d+)", str(e))
        return default_config(lang), [ConfigIssue(int(m.group(1)) if m else 0,
                                                  f"TOML syntax error ({e}); using the default settings")]
    lines = _Lines(text)
    tray, be = data.get("tray", {}), data.get("backend", {})
    if not isinstance(tray, dict) or not isinstance(be, dict):
        return default_config(lang), [ConfigIssue(0, "[tray] and [backend] must be tables; using the defaults")]
    base = BackendConfig()

    def t(key, typ, default, bounds=None):
        return _take(tray, key, typ, default, issues, "[tray] ", lines.of(key, "tray"), bounds)

    def b(key, typ, default, bounds=None, note=""):
        return _take(be, key, typ, default, issues, "[backend] ", lines.of(key, "backend"), bounds, note)

    backend = BackendConfig(
        kind=b("kind", str, base.kind), model=b("model", str, base.model), port=b("port", int, base.port, (1, 65535)),
        url=b("url", str, base.url), api_key=b("api_key", str, ""), remote_model=b("remote_model", str, ""),
        context_tokens=b("context_tokens", int, 0, (0, 1 << 20), " (0: the model's own)"),
        gguf_pack=b("gguf_pack", str, ""),
        cpu_weights=b("cpu_weights", str, base.cpu_weights))
    if backend.kind == "remote" and not re.match(r"https?://[^/\s]+", backend.url):
        issues.append(ConfigIssue(lines.of("url", "backend"), f"[backend] url must start with http:// or https://, "
                                  f"got {backend.url!r}; using {base.url!r}"))
        backend.url = base.url
    if backend.cpu_weights not in CPU_WEIGHT_CHOICES:
        issues.append(ConfigIssue(lines.of("cpu_weights", "backend"), f"[backend] cpu_weights must be one of "
                                  f"{', '.join(repr(p) for p in CPU_WEIGHT_CHOICES)}, got {backend.cpu_weights!r}; "
                                  "using the engine's default"))
        backend.cpu_weights = ""
    if backend.gguf_pack not in PACK_CHOICES:
        issues.append(ConfigIssue(lines.of("gguf_pack", "backend"), f"[backend] gguf_pack must be one of "
                                  f"{', '.join(repr(p) for p in PACK_CHOICES)}, got {backend.gguf_pack!r}; "
                                  "using the engine's default"))
        backend.gguf_pack = ""
    if backend.kind not in BACKEND_KINDS:
        issues.append(ConfigIssue(lines.of("kind", "backend"),
                                  f"[backend] kind must be local or remote, got {backend.kind!r}; using local"))
        backend.kind = "local"
    models = be.get("models", base.models)
    if isinstance(models, dict) and all(isinstance(v, str) for v in models.values()):
        backend.models = dict(models)
    else:
        issues.append(ConfigIssue(lines.of("models", "backend"),
                                  "[backend.models] must map model ids to model arguments (strings)"))
    templates = _parse_templates(data.get("templates"), lines, issues)
    if not templates:
        if "templates" in data:
            issues.append(ConfigIssue(0, "no valid [[templates]]; using the default templates"))
        templates = default_config(lang).templates
    cfg = TrayConfig(templates=templates, backend=backend, lang=t("lang", str, "auto"),
                     copy_timeout_s=t("copy_timeout_s", float, 1.5, (0.05, 30.0)),
                     paste_restore_delay_s=t("paste_restore_delay_s", float, 0.5, (0.0, 30.0)),
                     hotkeys=t("hotkeys", bool, True))
    return cfg, issues


def _parse_templates(raw, lines: _Lines, issues: list[ConfigIssue]) -> list[Template]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        issues.append(ConfigIssue(lines.of("templates", "templates"), "templates must be [[templates]] tables"))
        return []
    out: list[Template] = []
    hotkeys: dict[str, str] = {}
    for i, d in enumerate(raw):
        where = f"template #{i + 1} "
        head = lines.header("templates", i)
        missing = [k for k in ("id", "prompt") if not isinstance(d.get(k), str) or not d.get(k)]
        if missing:
            issues.append(ConfigIssue(head, f"{where}needs {' and '.join(missing)} (a non-empty string); skipped"))
            continue
        tid = d["id"]
        where = f"template {tid!r}: "

        def g(key, typ, default):
            return _take(d, key, typ, default, issues, where, lines.of(key, "templates", i))

        tpl = Template(id=tid, title=g("title", str, tid), prompt=d["prompt"], system=g("system", str, ""),
                       hotkey=g("hotkey", str, "").strip().lower(), output=g("output", str, "paste"),
                       max_tokens=g("max_tokens", int, 256), temperature=g("temperature", float, 0.0),
                       lang=g("lang", str, ""))
        for key in d:
            if key not in _TEMPLATE_KEYS:  # typos would otherwise be ignored silently
                issues.append(ConfigIssue(lines.of(key, "templates", i), f"{where}unknown key {key!r} ignored"))
        bad: list[tuple[str, str]] = []  # (key, message): the template is skipped
        if tpl.output not in OUTPUT_MODES:
            bad.append(("output", f"output must be paste, notify or window, got {tpl.output!r}"))
        if not 1 <= tpl.max_tokens <= 32768:
            bad.append(("max_tokens", f"max_tokens must be 1..32768, got {tpl.max_tokens}"))
        if not 0.0 <= tpl.temperature <= 2.0:
            bad.append(("temperature", f"temperature must be 0..2, got {tpl.temperature}"))
        if "{text}" not in tpl.prompt:
            bad.append(("prompt", "prompt must contain {text}"))
        if tpl.hotkey:
            try:
                tpl.hotkey = canonical(tpl.hotkey)
            except HotkeyError as e:
                bad.append(("hotkey", e.message))
            if tpl.hotkey in hotkeys:
                bad.append(("hotkey", f"hotkey {tpl.hotkey} is already used by {hotkeys[tpl.hotkey]!r}"))
        if any(x.id == tid for x in out):
            bad.append(("id", "duplicate id"))
        if bad:
            for key, msg in bad:
                issues.append(ConfigIssue(lines.of(key, "templates", i), f"{where}{msg}; template skipped"))
            continue
        if tpl.hotkey:
            hotkeys[tpl.hotkey] = tid
        out.append(tpl)
    return out
