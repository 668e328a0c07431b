"""A block hash's text form, in JSON answers, URLs and cursors: decimal or `0x` + hex.

Imports the store's domain model only. DESIGN: never a JSON number (JavaScript loses
precision above 2**53).
"""

from __future__ import annotations

from kvsi.store.model import U64_MASK, Hash


def format_hash(h: Hash) -> str:
    """JSON form of a block hash: decimal for ints, `0x` + lowercase hex for digests."""
    if isinstance(h, bytes):
        return "0x" + h.hex()
    return str(h)


def parse_hash(text: str) -> Hash:
    """Inverse of `format_hash` (signed input is accepted and made canonical).

    Raises ValueError naming what is wrong.
    """
    if text.startswith(("0x", "0X")):
        digits = text[2:]
        if not digits or len(digits) % 2:
            raise ValueError(f"hex block hash {text!r} needs an even, non-zero number of digits")
        try:
            return bytes.fromhex(digits)
        except ValueError:
            raise ValueError(f"block hash {text!r} is not valid hex") from None
    body = text[1:] if text.startswith("-") else text
    if not body.isascii() or not body.isdigit():
        raise ValueError(f"block hash {text!r} is neither a decimal integer nor 0x-hex")
    value = int(text)
    if not -(2**63) <= value < 2**64:
        raise ValueError(f"block hash {text!r} is outside the 64-bit range vLLM publishes")
    return value & U64_MASK
