"""Tray icon images, drawn with PIL (no files needed at run time): a speech bubble whose colour
is the state. `python -m trayapp.icons assets/icons` writes the PNG/ICO set for installers."""
from __future__ import annotations

import sys
from pathlib import Path

from PIL import Image, ImageDraw

STATES = ("loading", "ready", "busy", "error", "paused")
COLORS = {"loading": (245, 166, 35), "ready": (46, 174, 96), "busy": (52, 120, 219),
          "error": (220, 60, 50), "paused": (140, 140, 140)}


def make_icon(state: str = "ready", size: int = 64) -> Image.Image:
    s = size / 64
    img = Image.new("RGBA", (size, size), (0, 0, 0, 0))
    d = ImageDraw.Draw(img)
    color = COLORS.get(state, COLORS["error"])
    d.rounded_rectangle([4 * s, 6 * s, 60 * s, 46 * s], radius=12 * s, fill=color)  # bubble
    d.polygon([(16 * s, 44 * s), (14 * s, 60 * s), (30 * s, 45 * s)], fill=color)  # tail
    white = (255, 255, 255, 255)
    if state == "busy":  # three dots: working
        for x in (18, 32, 46):
            d.ellipse([(x - 5) * s, 21 * s, (x + 5) * s, 31 * s], fill=white)
    elif state == "error":  # exclamation mark
        d.rounded_rectangle([28 * s, 12 * s, 36 * s, 31 * s], radius=3 * s, fill=white)
        d.ellipse([28 * s, 34 * s, 36 * s, 42 * s], fill=white)
    elif state == "loading":  # hourglass
        d.polygon([(20 * s, 13 * s), (44 * s, 13 * s), (32 * s, 26 * s)], fill=white)
        d.polygon([(20 * s, 39 * s), (44 * s, 39 * s), (32 * s, 26 * s)], fill=white)
    elif state == "paused":  # pause bars
        d.rectangle([22 * s, 14 * s, 29 * s, 38 * s], fill=white)
        d.rectangle([35 * s, 14 * s, 42 * s, 38 * s], fill=white)
    else:  # ready: "D" of DeepInfer
        d.rounded_rectangle([20 * s, 13 * s, 44 * s, 39 * s], radius=11 * s, outline=white, width=max(1, int(5 * s)))
        d.rectangle([20 * s, 13 * s, 26 * s, 39 * s], fill=white)
    return img


def write_set(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for st in STATES:
        p = folder / f"tray-{st}.png"
        make_icon(st, 64).save(p)
        out.append(p)
    ico = folder / "deepinfer.ico"
    make_icon("ready", 256).save(ico, sizes=[(16, 16), (24, 24), (32, 32), (48, 48), (64, 64), (256, 256)])
    out.append(ico)
    return out


if __name__ == "__main__":
    for p in write_set(Path(sys.argv[1] if len(sys.argv) > 1 else "assets/icons")):
        print(p)
