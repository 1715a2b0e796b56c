"""The window's panels: each takes a model or controller and subscribes to its signals."""
