"""The size of a response as sent: each output stream, and all the results of one batch.

The executor caps what it captures (``max_output_bytes`` per stream), but JSON escapes a
control character to six bytes (``\\u0001``): 256 KiB of them is 1.5 MiB a stream, and a batch
of 1,024 such results 3 GiB. So before a result is answered, each stream is trimmed to
``ESCAPED_PER_BYTE`` times the cap as JSON-escaped (text, newlines and UTF-8 at the cap pass
whole), and a batch whose streams together escape to more than ``max_response_mb`` has each
stream trimmed to an equal share of it; a trimmed stream is flagged ``*_truncated`` and the
result's ``message`` says so; a notebook's cells share their stream's bound. The status is
the executor's: trimming is of what is sent only.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic_core import to_json

from sandbox_service.models import ExecuteResult
from sandbox_service.settings import Settings

ESCAPED_PER_BYTE = 2
STREAMS = ("stdout", "stderr")


def escaped_size(text: str) -> int:
    """Bytes of ``text`` as a JSON string, quotes excluded."""
    return len(to_json(text)) - 2


def _cut(text: str, limit: int) -> str:
    """The longest prefix of ``text`` whose escaped size is at most ``limit``."""
    low, high = 0, min(len(text), limit)
    while low < high:
        middle = (low + high + 1) // 2
        if escaped_size(text[:middle]) <= limit:
            low = middle
        else:
            high = middle - 1
    return text[:low]


def _sizes(result: ExecuteResult) -> list[int]:
    return [escaped_size(text) if text else 0 for text in (result.stdout, result.stderr)]


def _trimmed(result: ExecuteResult, sizes: list[int], limit: int) -> ExecuteResult:
    update: dict[str, object] = {}
    for name, size in zip(STREAMS, sizes, strict=True):
        if size > limit:
            update[name] = _cut(getattr(result, name), limit)
            update[f"{name}_truncated"] = True
    if not update:
        return result
    why = f"output trimmed to {limit} bytes per stream as sent (JSON-escaped)"
    update["message"] = f"{result.message}; {why}" if result.message else why
    return result.model_copy(update=update)


def bounded(results: Sequence[ExecuteResult], settings: Settings) -> list[ExecuteResult]:
    """``results`` with each stream within the per-stream bound, and all within the batch's."""
    stream_cap = ESCAPED_PER_BYTE * settings.max_output_bytes
    return _bound(results, stream_cap, settings.max_response_mb * 1024 * 1024)


def bounded_parts(
    outputs: Sequence[str], errors: Sequence[str], settings: Settings
) -> tuple[list[str], list[str]]:
    """The streams of one execution cut in parts (a notebook's cells): each stream's parts
    together within one stream's bound, in equal shares when over it."""
    stream_cap = ESCAPED_PER_BYTE * settings.max_output_bytes
    return _shared(outputs, stream_cap), _shared(errors, stream_cap)


def _shared(texts: Sequence[str], cap: int) -> list[str]:
    sizes = [escaped_size(t) for t in texts]
    if sum(sizes) <= cap:
        return list(texts)
    share = cap // len(texts)
    return [_cut(t, share) if size > share else t for t, size in zip(texts, sizes, strict=True)]


def _bound(
    results: Sequence[ExecuteResult], stream_cap: int, batch_cap: int
) -> list[ExecuteResult]:
    sizes = [_sizes(r) for r in results]
    limit = stream_cap
    if sum(min(s, stream_cap) for pair in sizes for s in pair) > batch_cap:
        limit = min(stream_cap, batch_cap // (len(STREAMS) * len(results)))
    return [_trimmed(r, s, limit) for r, s in zip(results, sizes, strict=True)]
