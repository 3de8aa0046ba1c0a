import pytest

from launcher.units import format_bytes, parse_bytes, parse_count, parse_duration


@pytest.mark.parametrize("text,expected", [
    ("2GiB", 2 * 1024**3), ("512MiB", 512 * 1024**2), ("8GB", 8 * 10**9), ("100", 100),
    ("1.5 GiB", int(1.5 * 1024**3)),
])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text,expected", [
    ("30B", 30 * 10**9), ("125M", 125 * 10**6), ("1.3e9", 1_300_000_000), ("7b", 7 * 10**9),
])
def test_parse_count(text, expected):
    assert parse_count(text) == expected


@pytest.mark.parametrize("bad", ["lots", "2 parsecs", "", "-"])
def test_bad_input(bad):
    with pytest.raises(ValueError):
        parse_bytes(bad)
    with pytest.raises(ValueError):
        parse_count(bad)


def test_format_bytes():
    assert format_bytes(None) == "?"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(80 * 1024**3) == "80.0 GiB"


@pytest.mark.parametrize("text,expected", [
    ("3600", 3600), (3600, 3600), ("90m", 5400), ("12h", 43200), ("2d", 172800), (" 1.5H ", 5400),
    ("45s", 45), ("0.5m", 30),
])
def test_parse_duration(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["soon", "-1h", "1.5 weeks", "", "1e3", "١٢h", True, "90 m s"])
def test_parse_duration_refuses(text):
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)
