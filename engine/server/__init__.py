"""The OpenAI-compatible HTTP server (`snug serve`) over the engine's scheduler.

    protocol.py   request bodies -> typed requests; errors in the OpenAI error shape
    reply.py      the reply's text -> stop strings, thinking, answer and tool calls
    app.py        the ASGI app (starlette): routes, key, body limit, streaming (SSE)
    runner.py     uvicorn on a thread (tests, the app's server switch, the benchmark)
    cli.py        `snug serve`

Importing this package does not import starlette or uvicorn: `engine.cli` registers the
subcommand without paying for them.
"""
