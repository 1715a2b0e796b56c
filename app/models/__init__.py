"""Qt-side models: settings, chat history, model catalog."""
