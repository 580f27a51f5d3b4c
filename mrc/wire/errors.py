"""The one error the wire codecs raise on bad input.

Holds `DecodeError`, raised by every decoder in `mrc.wire` when bytes from the network do not
form a valid header or packet (docs/WIRE.md: "decoders are strict"). Encoders, fed by our own code,
raise plain `ValueError` for out-of-range fields instead. What to do about a bad packet (count it,
drop it, close the connection) is left to `mrc.core`.
"""

from __future__ import annotations


class DecodeError(ValueError):
    """Bytes that do not decode. `field` names the offending field (or "length")."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def __reduce__(self) -> tuple[type[DecodeError], tuple[str, str]]:
        return (type(self), (self.field, self.message))
