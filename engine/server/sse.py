"""Server-sent events: `data: {json}\\n\\n` frames, a final `data: [DONE]\\n\\n`, then the response
ENDS (Connection: close, seed article 5.17: a kept-alive stream leaves `curl -N` hanging)."""
from __future__ import annotations

import json
from typing import AsyncIterator

from fastapi.responses import StreamingResponse

DONE = "data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "Connection": "close", "X-Accel-Buffering": "no"}


def frame(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


def sse_response(frames: AsyncIterator[str]) -> StreamingResponse:
    """Starlette listens for the client's disconnect and cancels `frames` (its finally runs)."""
    return StreamingResponse(frames, media_type="text/event-stream; charset=utf-8", headers=SSE_HEADERS)
