"""`snug serve` as a person runs it: the address taken (or refused, by its flag) before the
model loads, the URL it really listens on with `--port 0`, and Ctrl+C (engine/server/cli.py)."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from engine.cli import main


def no_load(*_args, **_kwargs):
    raise AssertionError("the model was loaded")


def test_a_port_that_cannot_be_had_is_refused_before_the_load(tiny_checkpoint, monkeypatch, capsys):
    monkeypatch.setattr("engine.session.Engine.load", no_load)
    model = str(tiny_checkpoint("tied-l4-r1", "hf-fp32"))
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--model", model, "--port", "99999"])
    assert exit_info.value.code == 2
    assert "argument --port: 99999 is not a port" in capsys.readouterr().err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--model", model, "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "choose another with --port" in err
    host = "no-such-host.invalid"
    assert main(["serve", "--model", model, "--host", host, "--api-key", "k"]) == 2
    assert f"--host {host}: not an address or a name" in capsys.readouterr().err


def test_an_ipv6_loopback_in_brackets_needs_no_key():
    """`--host [::1]`, as a URL writes it: this machine's IPv6 loopback, not an address
    other machines reach (it was refused as one without --api-key)."""
    import argparse

    from engine.server.bind import check_bind
    from engine.server.cli import add_serve_parser

    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    args = parser.parse_args(["serve", "--model", "m", "--host", "[::1]"])
    assert args.host == "::1"
    check_bind(args.host, None)  # no UnsafeBind


def test_port_0_says_the_port_it_got_and_ctrl_c_stops_it_cleanly(tiny_checkpoint):
    model = tiny_checkpoint("tied-l4-r1", "hf-fp32")
    args = ["serve", "--model", str(model), "--port", "0", "--backend", "numpy"]
    args += ["--context", "256", "--streams", "1"]
    process = subprocess.Popen(
        [sys.executable, "-m", "engine.cli", *args],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = process.stderr.readline()
        found = re.search(r"serving \S+ on http://127\.0\.0\.1:(\d+)/v1 ", line)
        assert found, line
        port = int(found[1])
        assert port != 0
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        rest = process.communicate(timeout=30)[1]
    finally:
        process.kill()
    assert process.returncode == 130, rest
    assert "snug: the server stopped (Ctrl+C)" in rest and "Traceback" not in rest
