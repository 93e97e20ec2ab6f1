"""``blockc/files.py``: the one byte formatter."""
from __future__ import annotations

import pytest

from blockc.files import format_bytes


@pytest.mark.parametrize("n, text", [
    (0, "0 B"), (512, "512 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (128 << 10, "128 KiB"),
    (int(22.3 * 2**30), "22.3 GiB"), (int(2.27 * 2**50), "2.27 PiB"), (12 << 20, "12 MiB"), (8 << 30, "8 GiB"),
    (-3 << 20, "-3 MiB"), (1 << 70, "1024 EiB"),
    # frontends/module's .3g once printed these as "1e+03 KiB"
    (1000 << 10, "1000 KiB"), (int(999.7 * 1024), "1000 KiB"), (1023 << 20, "1023 MiB"),
])
def test_format_bytes(n, text):
    assert format_bytes(n) == text
