from app.entry import main, no_display_reason


def test_no_display_is_said_plainly(capsys, monkeypatch):
    assert no_display_reason({}, "linux") is not None
    assert no_display_reason({"DISPLAY": ":0"}, "linux") is None
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
