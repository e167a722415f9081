"""Request bodies of the OpenAI-compatible endpoints (pydantic: they also make /openapi.json).

Every OpenAI field is honoured or refused with a 400; docs/api.md lists them (fields that carry no
generation semantics, such as user, metadata and store, are accepted and documented as informational).
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictFloat, StrictStr, WithJsonSchema
from pydantic_core import PydanticCustomError

from engine.runtime.sampling import MAX_STOP, MAX_STOP_BYTES


def _json_int(v):
    """JSON Schema's integer: 8 and 8.0 pass; "8", true and 8.5 do not (pydantic's lax int takes "8" and
    true, its strict int refuses 8.0, which the schema allows)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
        raise PydanticCustomError("int_type", "Input should be a valid integer")
    return int(v)


JsonInt = Annotated[int, BeforeValidator(_json_int)]


def json_int(**bounds):
    """JsonInt with bounds (ge=1, ...) that /openapi.json shows as minimum/maximum."""
    return Annotated[int, Field(**bounds), BeforeValidator(_json_int)]


# What the published schema promises is what the server accepts (schemathesis checks both ways); the handlers
# still validate these fields themselves, with messages that say what to send instead.
RESPONSE_FORMAT_SCHEMA = {"anyOf": [{"type": "object", "required": ["type"], "properties": {
    "type": {"enum": ["text", "json_object", "json_schema"]}, "json_schema": {"type": "object"}}}, {"type": "null"}]}
LOGIT_BIAS_SCHEMA = {"anyOf": [{"type": "object", "propertyNames": {"pattern": "^[0-9]{1,6}$"},
                                "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}},
                               {"type": "null"}]}
TOOL_CHOICE_SCHEMA = {"anyOf": [{"enum": ["none", "auto", "required"]}, {
    "type": "object", "required": ["type", "function"], "properties": {
        "type": {"enum": ["function"]}, "function": {"type": "object", "required": ["name"],
                                                     "properties": {"name": {"type": "string"}}}}}, {"type": "null"}]}


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class TextPart(_Open):
    type: Literal["text"]
    text: StrictStr


class ToolFunction(_Open):
    name: StrictStr
    arguments: Union[StrictStr, dict[str, Any]] = "{}"


class ToolCall(_Open):
    id: StrictStr | None = None
    type: Literal["function"] = "function"
    function: ToolFunction


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]  # developer = system (newer OpenAI clients)
    content: Union[StrictStr, list[Union[TextPart, StrictStr]], None] = None
    name: StrictStr | None = None
    tool_call_id: StrictStr | None = None
    tool_calls: list[ToolCall] | None = None


class StreamOptions(_Open):
    include_usage: StrictBool | None = False


_STOP_STR = {"type": "string", "maxLength": MAX_STOP_BYTES}
_STOP_SCHEMA = [_STOP_STR, {"type": "array", "items": _STOP_STR, "maxItems": MAX_STOP}, {"type": "null"}]


class SamplingFields(_Open):
    model: StrictStr | None = Field(None, description="a model id from GET /v1/models (default model if omitted)")
    max_tokens: json_int(ge=1) | None = Field(None, description="default: the rest of the context window")
    max_completion_tokens: json_int(ge=1) | None = Field(None, description="same as max_tokens (newer clients)")
    temperature: StrictFloat | None = Field(None, ge=0, le=2, description="0 = greedy; default 0.7")
    top_p: StrictFloat | None = Field(None, gt=0, le=1)
    top_k: json_int(ge=0) | None = Field(None, description="extension: 0 = off")
    seed: JsonInt | None = None
    stop: Union[StrictStr, list[StrictStr], None] = Field(
        None, description=f'a string, a list of at most {MAX_STOP}, "" or null; each at most {MAX_STOP_BYTES} bytes',
        json_schema_extra=lambda s: s.update(anyOf=_STOP_SCHEMA))
    n: json_int(ge=1) | None = Field(None, json_schema_extra={"maximum": 1},
                          description="only 1 is supported (n > 1 is refused with 400)")
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    presence_penalty: StrictFloat | None = Field(None, ge=-2, le=2, description="-2..2, subtracted once per token already output")
    frequency_penalty: StrictFloat | None = Field(None, ge=-2, le=2, description="-2..2, subtracted per occurrence in the output")
    logit_bias: Annotated[dict[str, float] | None, WithJsonSchema(LOGIT_BIAS_SCHEMA)] = Field(None, description="token id -> bias in [-100, 100]")
    user: StrictStr | None = Field(None, description="informational (no effect on the output)")
    logprobs: Union[StrictBool, JsonInt, None] = Field(
        None, description="chat: true = the chosen tokens' logprobs; completions: 0..5 alternatives per token")
    response_format: Annotated[dict[str, Any] | None, WithJsonSchema(RESPONSE_FORMAT_SCHEMA)] = Field(
        None, description='{"type": "text" | "json_object" | "json_schema", "json_schema": {...}}: '
                          "grammar-constrained output")
    ignore_eos: StrictBool | None = Field(False, description="extension (benchmarks): always generate max_tokens")
    speculative: StrictBool | None = Field(False, description="extension: prompt-lookup speculative decoding "
                                           "(drafts copied from the prompt; the same tokens under greedy)")


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = Field(None, description="passed to the chat template")
    tool_choice: Annotated[Union[StrictStr, dict[str, Any], None], WithJsonSchema(TOOL_CHOICE_SCHEMA)] = Field(
        None, description='"none", "auto", "required" or {"type": "function", "function": {"name": ...}} '
                          "(required / named: the output is a valid call, grammar-constrained)")
    parallel_tool_calls: StrictBool | None = Field(None, description="false: at most one tool call is returned")
    top_logprobs: json_int(ge=0) | None = Field(None, description="0..5 alternatives per token (needs logprobs)")


_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 151642}, "minItems": 1}
_PROMPT_SCHEMA = [{"type": "string", "minLength": 1},
                  {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "maxItems": 1},
                  _IDS, {"type": "array", "items": _IDS, "minItems": 1, "maxItems": 1}]


class CompletionRequest(SamplingFields):
    prompt: Union[StrictStr, list[StrictStr], list[JsonInt], list[list[JsonInt]]] = Field(
        description="text, [text], token ids or [token ids] (one prompt per request)",
        json_schema_extra=lambda s: s.update(anyOf=_PROMPT_SCHEMA))
    suffix: StrictStr | None = Field(None, description="fill-in-the-middle: text after the cursor")
    echo: StrictBool | None = False
    best_of: json_int(ge=1) | None = Field(None, json_schema_extra={"maximum": 1}, description="only 1 is supported")
