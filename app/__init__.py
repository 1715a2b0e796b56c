"""Snug's PySide6 desktop app.

state/         settings, chat history, model catalog, the machine, fit verdicts
controllers.py EngineController, DownloadManager: what panels talk to; chat_controller.py
               ChatController, the chat on top of them
workers/       the QObjects that live on the engine, download and NVML threads
engine_bridge  the one seam to `engine.session` (EngineLike, LoadRequest, load_engine)
panels/, widgets/, main_window.py   the views
"""
