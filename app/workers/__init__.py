"""Long-lived worker objects that run on their own QThreads."""
