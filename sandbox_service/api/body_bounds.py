"""What a request body may cost to parse: a bound on its JSON values, checked before pydantic.

Parsing costs per value, not per byte: pydantic builds its tree whole and holds the GIL while
it does (measured: a 60 MiB body of ``[]`` items took 5.4 s to 15 s on the event loop, 3.1 GiB
peak, whether on the loop or in a thread). A legitimate body is a few large strings and a few
values per request (a full batch of 1,024 is about 12,000), so values are counted first and a
body over ``max_body_values`` is refused (413) without being parsed. The count is of the
characters that open a container or separate values (``[`` ``{`` ``,`` ``:``) outside strings:
a count over every byte first (C speed, 0.1 s for 60 MiB); only when that is over the limit
(strings full of commas) a scan that skips strings, stopping at the limit and letting other
requests run between large strings.
"""

from __future__ import annotations

import asyncio
import re

STRUCTURE = (b"[", b"{", b",", b":")
# A whole string (possessive: no backtracking), or one structural character outside strings.
TOKEN = re.compile(rb'"(?:[^"\\]++|\\.)*+"|[\[{,:]')
YIELD_EVERY = 4 * 1024 * 1024  # bytes scanned between two turns of the event loop


class BodyTooComplex(Exception):
    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"request body holds more than {limit} JSON values")


async def check_values(body: bytes, limit: int) -> None:
    """Raise ``BodyTooComplex`` when ``body`` holds more than ``limit`` JSON values."""
    if sum(body.count(c) for c in STRUCTURE) <= limit:
        return
    found, scanned = 0, 0
    for token in TOKEN.finditer(body):
        if token.end() - token.start() == 1:
            found += 1
            if found > limit:
                raise BodyTooComplex(limit)
        elif token.end() - scanned > YIELD_EVERY:
            scanned = token.end()
            await asyncio.sleep(0)
