"""The app's state: settings, chat history, model catalog, the machine, fit verdicts.

Values, and QObjects that signal their changes. No threads here, and nothing here runs the
engine: app/controllers.py and app/workers/ do.
"""
