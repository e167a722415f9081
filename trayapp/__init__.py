"""DeepInfer tray assistant: hotkeys on selected text -> templates -> local model -> paste back.

Never imports torch (tests/test_tray_import.py checks): the model lives in the endpoint's engine
thread, reached over HTTP; pystray, keyboard, pynput and tkinter are imported lazily too.
"""
