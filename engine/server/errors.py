"""OpenAI-style errors: {"error": {"message", "type", "param", "code"}} with the right status."""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.errors import BadRequestError, ContextOverflowError, DeepInferError, ModelFileError, ResourceError
from engine.runtime.worker_types import (EngineInternalError, ModelNotFoundError, ModelUnavailableError,
                                 QueueFullError, RequestTimeoutError)

RETRY_AFTER_S = 2
MEDIA_PARTS = ("image_url", "input_image", "image", "input_audio", "audio", "file", "input_file", "video_url")
HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 400: "invalid_request"}


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(self.message, self.type, self.param, self.code),
                            status_code=self.status, headers=self.headers)


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def from_engine(e: Exception) -> APIError:
    """Map an engine error to its HTTP status (also used for errors inside a stream)."""
    msg = f"{e.message.rstrip('.')}. Fix: {e.fix}" if isinstance(e, DeepInferError) and e.fix else str(e)
    if isinstance(e, ModelNotFoundError):
        return APIError(404, msg, "invalid_request_error", "model", "model_not_found")
    if isinstance(e, ContextOverflowError):
        return APIError(400, msg, "invalid_request_error", "messages", "context_length_exceeded")
    if isinstance(e, QueueFullError):
        return APIError(429, msg, "rate_limit_error", None, "queue_full",
                        headers={"Retry-After": str(RETRY_AFTER_S)})
    if isinstance(e, RequestTimeoutError):
        return APIError(504, msg, "timeout_error", None, "request_timeout")
    if isinstance(e, EngineInternalError):
        return APIError(500, msg, "server_error", None, "internal_error")
    if isinstance(e, (ModelUnavailableError, ModelFileError, ResourceError)):
        return APIError(503, msg, "service_unavailable", "model", "model_unavailable")
    if isinstance(e, (BadRequestError, DeepInferError)):
        return APIError(400, msg, "invalid_request_error", None, "invalid_value")
    return APIError(500, f"internal error: {e!r}", "server_error", None, "internal_error")


def _loc_param(loc) -> str | None:
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(parts) or None


def install(app: FastAPI):
    @app.exception_handler(APIError)
    async def _api(_: Request, e: APIError):
        return e.response()

    @app.exception_handler(DeepInferError)
    async def _engine(_: Request, e: DeepInferError):
        return from_engine(e).response()

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, e: RequestValidationError):
        errs = e.errors()
        first = errs[0] if errs else {}
        media = next((x for x in errs if isinstance(x.get("input"), dict)
                      and x["input"].get("type") in MEDIA_PARTS and "content" in x.get("loc", ())), None)
        if media is not None:  # one short answer instead of pydantic's long union message
            return APIError(400, "this model reads text only: send the content as text parts "
                                 f"({media['input']['type']} is not supported)", param="messages",
                            code="unsupported_content").response()
        if first.get("type") == "json_invalid":
            return APIError(400, f"the body is not valid JSON: {first.get('ctx', {}).get('error', '')}".strip(),
                            code="invalid_json").response()
        param = _loc_param(first.get("loc", ()))
        msg = "; ".join(f"{_loc_param(x.get('loc', ())) or 'body'}: {x.get('msg')}" for x in errs[:5])
        kind = first.get("type", "")
        code = "missing_required_parameter" if kind == "missing" else \
            "invalid_type" if kind.endswith(("_type", "_parsing")) or kind.startswith("literal") else "invalid_value"
        return APIError(400, msg or "invalid request", param=param, code=code).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, e: StarletteHTTPException):
        type_ = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        msg = "no such endpoint; see GET /openapi.json" if e.status_code == 404 else str(e.detail)
        code = HTTP_CODES.get(e.status_code, f"http_{e.status_code}")
        return APIError(e.status_code, msg, type_, code=code, headers=getattr(e, "headers", None)).response()

    @app.exception_handler(Exception)
    async def _any(_: Request, e: Exception):
        return APIError(500, f"internal error: {e!r}", "server_error", code="internal_error").response()
