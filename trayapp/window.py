"""Optional result window (tkinter): streamed text, Copy and Close. Each window runs its own Tk
root in its own thread; other threads only put text into a queue the window polls, because Tk
must be driven from the thread that created it. Without tkinter/a display: None (the assistant
then copies the result and notifies instead)."""
from __future__ import annotations

import queue
import threading

from trayapp.templates import cjk_share


class ResultWindow:
    def __init__(self, title: str):
        self.q: queue.SimpleQueue = queue.SimpleQueue()
        self.text = ""
        ready = threading.Event()
        self.error: Exception | None = None
        self.thread = threading.Thread(target=self._main, args=(title, ready), daemon=True, name="tray-window")
        self.thread.start()
        ready.wait(5)
        if self.error:
            raise self.error

    def append(self, delta: str) -> None:
        self.text += delta
        self.q.put(("text", delta))

    def done(self, error: str | None = None) -> None:
        self.q.put(("done", error))

    def _main(self, title: str, ready: threading.Event) -> None:
        try:
            import tkinter as tk  # optional: not every Python ships Tk; loaded only when a window opens

            root = tk.Tk()
        except Exception as e:  # no tkinter or no display
            self.error = e
            ready.set()
            return
        root.title(f"DeepInfer - {title}")
        root.attributes("-topmost", True)
        box = tk.Text(root, wrap="word", width=64, height=16, font=("TkDefaultFont", 11))
        box.pack(fill="both", expand=True, padx=6, pady=6)
        bar = tk.Frame(root)
        bar.pack(fill="x")
        status = tk.Label(bar, text="…", anchor="w")
        status.pack(side="left", padx=6)

        def copy():
            root.clipboard_clear()
            root.clipboard_append(box.get("1.0", "end-1c"))
            status.config(text="copied")

        tk.Button(bar, text="Close", command=root.destroy).pack(side="right", padx=4, pady=4)
        tk.Button(bar, text="Copy", command=copy).pack(side="right", padx=4, pady=4)

        def poll():
            try:
                while True:
                    kind, val = self.q.get_nowait()
                    if kind == "text":
                        box.insert("end", val)
                        box.see("end")
                        if cjk_share(self.text) >= 0.2:  # Tk's word wrap sees a CJK run as one word
                            box.config(wrap="char")
                    else:
                        status.config(text=f"error: {val}" if val else "done")
            except queue.Empty:
                pass
            root.after(50, poll)

        ready.set()
        poll()
        root.mainloop()


def open_window(title: str):
    try:
        return ResultWindow(title)
    except Exception:
        return None
