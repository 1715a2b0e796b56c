"""Long-lived worker objects that run on their own QThreads.

Their GUI-side handles are in app/controllers.py; the NVML poller, which only feeds
app.state.machine, keeps its handle beside its worker.
"""
