"""helpers.ncu: the raw CSV reader and the refusal without Nsight Compute (profiling itself needs a GPU)."""
import pytest

from helpers import ncu


def test_raw_rows_keeps_only_profiled_launches_in_order():
    text = "\n".join(['==PROF== Connected', 'program output', '"ID","Kernel Name","m"', '"","","%"',
                      '"0","first","1,234.5"', '"1","second","7"', '==PROF== Disconnected'])
    rows = ncu.raw_rows(text)
    assert [r["Kernel Name"] for r in rows] == ["first", "second"]
    assert ncu.number(rows[0], "m") == 1234.5


def test_profile_names_the_missing_tool(monkeypatch):
    monkeypatch.setattr(ncu.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="ncu .* is not on the PATH"):
        ncu.profile(["true"])
