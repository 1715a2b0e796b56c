"""Snug's PySide6 desktop app.

state/         settings, chat history, model catalog, the machine, fit verdicts
controllers.py EngineController, ChatController, DownloadManager: what panels talk to
workers/       the QObjects that live on the engine, download and NVML threads
engine_bridge  the one seam to `engine.session` (EngineLike, LoadRequest, load_engine)
panels/, widgets/, main_window.py   the views
"""
