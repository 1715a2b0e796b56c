from app.entry import main, no_display_reason


def test_no_display_is_said_plainly(capsys, monkeypatch):
    assert no_display_reason({}, "linux") is not None
    assert no_display_reason({"DISPLAY": ":0"}, "linux", lambda d: True) is None
    assert no_display_reason({"DISPLAY": ":0"}, "linux", lambda d: None) is None  # no libxcb
    closed = no_display_reason({"DISPLAY": ":99"}, "linux", lambda d: False)
    assert closed is not None and "DISPLAY=:99" in closed
    assert no_display_reason({"WAYLAND_DISPLAY": "wayland-0"}, "linux") is None
    assert no_display_reason({"QT_QPA_PLATFORM": "offscreen"}, "linux") is None
    assert no_display_reason({}, "win32") is None
    for var in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr("sys.platform", "linux")
    assert main([]) == 2
    assert "no display" in capsys.readouterr().err


def test_subcommands_reach_the_engine_cli(capsys):
    assert main(["plan", "--shape", "0.8B", "--card-gib", "4"]) == 0
    assert "verdict: fits" in capsys.readouterr().out


def test_a_display_no_x_server_answers_is_found_before_qt_aborts(tmp_path):
    """A display number with no server behind it (libxcb's own answer): refused by name."""
    from app.entry import x_reachable

    if x_reachable(":0") is None:
        return  # no libxcb here to ask
    assert x_reachable(":987") is False
    assert "DISPLAY=:987" in (no_display_reason({"DISPLAY": ":987"}, "linux") or "")
