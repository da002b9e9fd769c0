"""Settings that contradict each other are refused with a message naming the KS_* variables."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from kernelsearch.service.settings import LEASE_MARGIN, Settings, SettingsError, get_settings, load_settings


def test_a_lease_shorter_than_a_few_heartbeats_is_refused() -> None:
    with pytest.raises(ValidationError, match="KS_LEASE_S"):
        Settings(lease_seconds=5, heartbeat_seconds=10)
    ok = Settings(lease_seconds=LEASE_MARGIN * 2.0, heartbeat_seconds=2.0)
    assert ok.lease_seconds == 6.0


def test_load_settings_says_which_variables(monkeypatch) -> None:
    monkeypatch.setenv("KS_LEASE_SECONDS", "5")
    monkeypatch.delenv("KS_HEARTBEAT_SECONDS", raising=False)
    get_settings.cache_clear()
    try:
        with pytest.raises(SettingsError) as info:
            load_settings()
        msg = str(info.value)
        assert "KS_LEASE_S (5)" in msg and "KS_HEARTBEAT_S (10)" in msg
        monkeypatch.setenv("KS_LOOKUP_TIMEOUT_S", "0")
        monkeypatch.setenv("KS_LEASE_SECONDS", "60")
        get_settings.cache_clear()
        with pytest.raises(SettingsError, match="KS_LOOKUP_TIMEOUT_S"):
            load_settings()
    finally:
        get_settings.cache_clear()


def test_the_default_database_is_absolute_and_the_same_from_any_directory(tmp_path, monkeypatch) -> None:
    """Unset KS_DATABASE_URL: one SQLite file under the user's data directory, not ./var."""
    from sqlalchemy.engine import make_url

    monkeypatch.delenv("KS_DATABASE_URL", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    here = Settings().database_url
    monkeypatch.chdir(tmp_path)
    assert Settings().database_url == here
    db = make_url(here).database
    assert db is not None and db == str(tmp_path / "data" / "kernelsearch" / "kernelsearch.db")
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert make_url(Settings().database_url).database == str(
        tmp_path / "home" / ".local" / "share" / "kernelsearch" / "kernelsearch.db")


def test_client_settings_follow_the_environment_and_are_built_once_per_environment(monkeypatch,
                                                                                 caplog) -> None:
    from kernelsearch.service.client_settings import _client_settings_for, client_settings

    _client_settings_for.cache_clear()
    monkeypatch.setenv("KS_AUTOTUNE_TIMEOUT_S", "1.5")
    first = client_settings()
    assert first.autotune_timeout_s == 1.5
    assert client_settings() is first  # the hooks ask per key: not rebuilt
    monkeypatch.setenv("KS_AUTOTUNE_TIMEOUT_S", "2.5")
    assert client_settings().autotune_timeout_s == 2.5
    monkeypatch.setenv("KS_AUTOTUNE_TIMEOUT_S", "-1")
    for _ in range(2):  # a bad value: its default, warned about once per environment
        assert client_settings().autotune_timeout_s == 0.25
    assert caplog.text.count("KS_AUTOTUNE_TIMEOUT_S='-1' is not accepted") == 1


def test_a_duration_ends_in_s_and_its_older_seconds_name_still_works(monkeypatch, caplog) -> None:
    """One suffix for seconds: KS_LEASE_S; a documented KS_LEASE_SECONDS is still read, with a
    warning naming the variable to use, and errors name the current variable."""
    monkeypatch.delenv("KS_LEASE_S", raising=False)
    monkeypatch.setenv("KS_LEASE_SECONDS", "90")
    get_settings.cache_clear()
    try:
        assert get_settings().lease_seconds == 90.0
        assert "KS_LEASE_SECONDS is deprecated: it is read as KS_LEASE_S" in caplog.text
        monkeypatch.setenv("KS_LEASE_S", "abc")
        get_settings.cache_clear()
        with pytest.raises(SettingsError, match="KS_LEASE_S: Input should be a valid number"):
            load_settings()
    finally:
        get_settings.cache_clear()
    assert Settings(lease_seconds=30, heartbeat_seconds=1).lease_seconds == 30.0
    assert "KS_SHIPPED_RECORDS" not in {f"KS_{n.upper()}" for n in Settings.model_fields}
