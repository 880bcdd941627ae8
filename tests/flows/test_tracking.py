"""MLflow tags: what a run releases about its data."""


def test_released_fingerprint_is_keyed_and_the_key_file_is_private(tmp_path, monkeypatch):
    """data.fingerprint is an HMAC under a secret key: stable for one key, different under another, and
    never the plain content hash; without the variable a per-user key file is created, owner-only."""
    import stat

    from flows.tracking import KEY_ENV, released_fingerprint

    plain = "ab" * 32
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    first = released_fingerprint(plain)
    key_file = tmp_path / ".privzo" / "fingerprint.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600 and len(key_file.read_text()) == 64
    assert released_fingerprint(plain) == first != plain
    monkeypatch.setenv(KEY_ENV, "another key")
    assert released_fingerprint(plain) not in (first, plain)
    assert [f.name for f in key_file.parent.iterdir()] == ["fingerprint.key"]  # no temporary file left


def test_a_damaged_key_file_is_refused_never_used(tmp_path, monkeypatch):
    """An empty or cut key (a write that never finished) would make every keyed fingerprint computable."""
    import pytest

    from flows.tracking import KEY_ENV, keyed_rows

    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".privzo").mkdir()
    (tmp_path / ".privzo" / "fingerprint.key").write_text("")
    with pytest.raises(ValueError, match=r"fingerprint key .* holds 0 characters, fewer than 32: it is damaged"):
        keyed_rows(["ab" * 32])
