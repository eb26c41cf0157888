"""Units for sizes, bandwidths and times: parse what people write, print it back.

Sizes follow SI and IEC: ``GB`` is 10**9 bytes, ``GiB`` is 2**30 bytes.  A
capital ``B`` is a byte and a lower-case ``b`` a bit, so ``400Gb/s`` is 50
GB/s, as network links are quoted.  A plain number is bytes (for a size),
bytes per second (for a bandwidth) or seconds (for a time).

>>> parse_size("14GB"), parse_size("1.5GiB"), parse_size("4096")
(14000000000, 1610612736, 4096)
>>> parse_bandwidth("400Gb/s") == parse_bandwidth("50GB/s") == 50e9
True
>>> parse_time("5us"), parse_time("1.2ms"), parse_time("2")
(5e-06, 0.0012, 2.0)
>>> format_bytes(14e9), format_seconds(0.0311), format_bandwidth(450e9)
('14 GB', '31.1 ms', '450 GB/s')
"""

from __future__ import annotations

import math
import re

from ..errors import ArgumentError

_SI = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}
_IEC = {"ki": 2.0**10, "mi": 2.0**20, "gi": 2.0**30, "ti": 2.0**40, "pi": 2.0**50}

_NUMBER = r"(?P<num>[-+]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)"
# prefix (k, M, Gi...), then the unit: B/byte(s) for bytes, b/bit(s) for bits.
_QUANTITY = re.compile(
    _NUMBER + r"\s*(?P<prefix>[kKmMgGtTpP]i?)?(?P<unit>bytes?|bits?|B|b)?$")
_PER_SECOND = re.compile(r"(?:/s|/sec|ps)$", re.IGNORECASE)
_TIME = re.compile(
    _NUMBER + r"\s*(?P<unit>ns|us|µs|μs|ms|s|sec|min)?$")
# (multiplier, divisor): dividing by 1e6 gives 5us exactly 5e-06, multiplying by 1e-6 does not
_TIME_SCALE = {"ns": (1.0, 1e9), "us": (1.0, 1e6), "µs": (1.0, 1e6), "μs": (1.0, 1e6),
               "ms": (1.0, 1e3), "s": (1.0, 1.0), "sec": (1.0, 1.0), "min": (60.0, 1.0),
               None: (1.0, 1.0)}

SIZE_EXAMPLES = "14GB, 1.5GiB, 25MiB, 512KB, 4096 (bytes), 400Gb (bits)"
BANDWIDTH_EXAMPLES = "25GB/s, 1.25GB/s, 400Gb/s (bits), 100Gbps, 12.5GiB/s"
TIME_EXAMPLES = "5us, 1.2ms, 200ms, 2s, 0.5 (seconds)"


def _label(what: str) -> str:
    return f"{what} " if what else ""


def _quantity_bytes(text: str) -> float | None:
    """``text`` as a number of bytes, or None if it is not a size."""
    m = _QUANTITY.match(text.strip())
    if m is None:
        return None
    value = float(m["num"])
    prefix = (m["prefix"] or "").lower()
    unit = m["unit"]
    if prefix.endswith("i"):
        value *= _IEC[prefix]
    else:
        value *= _SI[prefix]
    if unit is not None and unit.startswith("b") and unit not in ("byte", "bytes"):
        value /= 8.0  # b, bit, bits
    elif unit is None and prefix:
        return None  # "14G": bytes or bits? Refuse to guess.
    return value


#: the largest size :func:`parse_size` takes (2^53 bytes: floats hold every whole number
#: up to it; ``--bytes 1e30`` was taken as 250,000,000,000,000,004,971,156,209,664 floats)
MAX_BYTES = 1 << 53


def parse_size(text: str | int | float, what: str = "", least: int = 0) -> int:
    """A byte count from ``"14GB"``, ``"1.5GiB"``, ``"400Gb"`` (bits) or ``"4096"``.

    Raises :class:`~ringlet.errors.ArgumentError` with examples if ``text``
    is not a size, is less than ``least`` bytes (negative, by default) or is not a
    whole number of bytes.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value: float | None = float(text)
    else:
        value = _quantity_bytes(str(text))
    if value is None or not math.isfinite(value):
        raise ArgumentError(
            f"{_label(what)}{text!r} is not a size; write e.g. {SIZE_EXAMPLES}. "
            f"GB = 10^9 bytes, GiB = 2^30 bytes, a lower-case b is a bit")
    if least > 0 and value < least:
        raise ArgumentError(f"{_label(what)}{text!r} must be at least {least} "
                            f"byte{'s' if least != 1 else ''}")
    if value < 0:
        raise ArgumentError(f"{_label(what)}{text!r} is negative; a size is >= 0 bytes")
    if value > MAX_BYTES:   # beyond, a float no longer holds every whole number of bytes
        raise ArgumentError(f"{_label(what)}{text!r} is more than 2^53 bytes (9 PB), the most "
                            f"ringlet counts")
    whole = round(value)
    if abs(value - whole) > 1e-6 * max(1.0, value):
        raise ArgumentError(f"{_label(what)}{text!r} is {value} bytes, not a whole number of bytes")
    return int(whole)


#: the longest time :func:`parse_time` takes (a latency, an overhead, a straggler's delay):
#: ``--latency 1e308`` times a schedule's rounds overflowed to an infinite time
MAX_SECONDS = 7 * 86400.0
#: the slowest bandwidth :func:`parse_bandwidth` takes: ``--bandwidth 1e-305GB/s`` made
#: beta times the bytes overflow to an infinite time
MIN_BANDWIDTH = 1.0


def parse_count(text: str | int | float, what: str = "", positive: bool = False) -> float:
    """A plain count such as ``"7e9"``, ``"500k"``, ``"1.3B"`` (billion) or ``"70M"``
    (``positive``: more than 0)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        m = re.match(_NUMBER + r"\s*(?P<suffix>[kKmMbBgGtT]?)$", str(text).strip())
        if m is None:
            raise ArgumentError(
                f"{_label(what)}{text!r} is not a number; write e.g. 7e9, 7B, 500k, 70M")
        scale = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
        value = float(m["num"]) * scale[m["suffix"].lower()]
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ArgumentError(f"{_label(what)}{text!r} must be a finite number "
                            f"{'> 0' if positive else '>= 0'}")
    return value


def parse_bandwidth(text: str | int | float, what: str = "") -> float:
    """Bytes per second from ``"25GB/s"``, ``"400Gb/s"`` (bits), ``"100Gbps"`` or ``"1e9"``.

    A plain number is bytes per second.  Raises
    :class:`~ringlet.errors.ArgumentError` with examples if ``text`` is not a
    bandwidth or is not > 0.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value: float | None = float(text)
    else:
        s = str(text).strip()
        stripped = _PER_SECOND.sub("", s)
        if stripped == s and not re.fullmatch(_NUMBER, s):
            value = None  # a size without "/s": say so rather than guess
        else:
            value = _quantity_bytes(stripped)
    if value is None or not math.isfinite(value):
        raise ArgumentError(
            f"{_label(what)}{text!r} is not a bandwidth; write e.g. {BANDWIDTH_EXAMPLES}. "
            f"GB/s = 10^9 bytes/s, a lower-case b is a bit (400Gb/s = 50GB/s)")
    if value <= 0:
        raise ArgumentError(f"{_label(what)}{text!r} must be > 0")
    if value < MIN_BANDWIDTH:
        raise ArgumentError(f"{_label(what)}{text!r} is less than 1 byte/s, the least ringlet "
                            f"takes")
    return value


def parse_time(text: str | int | float, what: str = "") -> float:
    """Seconds from ``"5us"``, ``"1.2ms"``, ``"200ms"``, ``"2s"`` or a plain number of seconds."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value: float | None = float(text)
    else:
        m = _TIME.match(str(text).strip())
        if m is None:
            value = None
        else:
            mult, div = _TIME_SCALE[m["unit"]]
            value = float(m["num"]) * mult / div
    if value is None or not math.isfinite(value):
        raise ArgumentError(f"{_label(what)}{text!r} is not a time; write e.g. {TIME_EXAMPLES}")
    if value < 0:
        raise ArgumentError(f"{_label(what)}{text!r} is negative; a time is >= 0")
    if value > MAX_SECONDS:
        raise ArgumentError(f"{_label(what)}{text!r} is more than a week (604,800 s), the longest "
                            f"time ringlet takes")
    return value


def _scaled(value: float, steps: list[tuple[float, str]], digits: int) -> str:
    for scale, name in steps:
        if abs(value) >= scale:
            return f"{_round(value / scale, digits)} {name}".rstrip()
    scale, name = steps[-1]
    return f"{_round(value / scale, digits)} {name}".rstrip()


def _round(x: float, digits: int) -> str:
    """``x`` to ``digits`` significant digits, without trailing zeros or exponent (but
    for absurd magnitudes, which would print a page of digits: ``1e+297``)."""
    if x == 0:
        return "0"
    if not math.isfinite(x):
        return str(x)   # inf, -inf, nan
    if not 1e-6 <= abs(x) < 1e15:
        return f"{x:.{digits}g}"
    decimals = max(0, digits - 1 - int(math.floor(math.log10(abs(x)))))
    text = f"{x:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def format_bytes(n: float, binary: bool = False, digits: int = 3) -> str:
    """``14e9`` -> ``"14 GB"``; with ``binary=True``, ``25 * 2**20`` -> ``"25 MiB"``."""
    if binary:
        steps = [(2.0**50, "PiB"), (2.0**40, "TiB"), (2.0**30, "GiB"), (2.0**20, "MiB"),
                 (2.0**10, "KiB"), (1.0, "B")]
    else:
        steps = [(1e15, "PB"), (1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB"), (1.0, "B")]
    return _scaled(float(n), steps, digits)


def format_bandwidth(bytes_per_second: float, digits: int = 4) -> str:
    """``450e9`` -> ``"450 GB/s"`` (``"-"`` if infinite: nothing to move)."""
    if not math.isfinite(bytes_per_second):
        return "-"
    return format_bytes(bytes_per_second, digits=digits) + "/s"


def format_seconds(seconds: float, digits: int = 3) -> str:
    """``0.0311`` -> ``"31.1 ms"``, ``5e-6`` -> ``"5 us"``, ``3725`` -> ``"1.03 h"``."""
    s = float(seconds)
    if s == 0:
        return "0 s"
    if not math.isfinite(s) or abs(s) >= 3600e6:   # a million hours: no page of digits
        return f"{s / 3600:.{digits}g} h"
    if abs(s) >= 3600:
        return f"{_round(s / 3600, digits)} h"
    if abs(s) >= 60:
        return f"{_round(s / 60, digits)} min"
    return _scaled(s, [(1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns")], digits)


def format_count(n: float) -> str:
    """``7e9`` -> ``"7B"``, ``5e5`` -> ``"500k"``, ``70e6`` -> ``"70M"``."""
    for scale, name in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{_round(n / scale, 4)}{name}"
    return _round(n, 4)


def format_usd(usd: float) -> str:
    """Dollars with sensible precision: ``$180``, ``$2.07e-03``."""
    if usd == 0:
        return "$0"
    if abs(usd) >= 1e15:   # absurd magnitudes: no page of digits
        return f"${usd:.3g}"
    if abs(usd) >= 1:
        return f"${usd:,.2f}" if abs(usd) < 100 else f"${usd:,.0f}"
    return f"${usd:.2e}"


def bus_factor_of(formula: str, nranks: int) -> float:
    """nccl-tests' busbw / algbw from its formula as printed: ``2(n-1)/n``, ``(n-1)/n``
    or ``1``."""
    n = nranks
    factors = {"2(n-1)/n": 2.0 * (n - 1) / n, "(n-1)/n": (n - 1) / n, "1": 1.0}
    if formula not in factors:
        raise ValueError(f"unknown bus factor {formula!r}")
    return factors[formula]
