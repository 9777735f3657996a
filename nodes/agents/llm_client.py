"""One structured chat call to any OpenAI-compatible endpoint (OpenAI, ``vllm serve``, ...), via ChatOpenAI.

Configuration (flags win over the environment; the CLI maps its flags onto ``TuneOptions`` and ``api_key``):
=====================  =============================  ===========================================
setting                from ``TuneOptions`` / arg     environment fallback
=====================  =============================  ===========================================
model                  ``llm_model``                  ``MART_LLM_MODEL`` (required)
base URL               ``llm_base_url``               ``OPENAI_BASE_URL`` (unset = api.openai.com)
API key                ``api_key`` argument           ``OPENAI_API_KEY`` (``EMPTY`` for a custom URL)
timeout per request    ``llm_timeout_s``              -
structured output      ``structured`` argument        ``MART_LLM_STRUCTURED`` = json_schema (default),
                                                      function_calling or json_mode
HTTP retries           ``max_retries`` argument       ``MART_LLM_MAX_RETRIES`` (default 2)
repair rounds          ``repair_rounds`` argument     ``MART_LLM_REPAIR_ROUNDS`` (default 2, max 2)
streaming (SSE)        ``streaming`` argument         ``MART_LLM_STREAM`` = 1 (default off)
answer tokens          ``max_tokens`` argument        ``MART_LLM_MAX_TOKENS`` (default 4096)
=====================  =============================  ===========================================

An answer longer than ``MAX_ANSWER_CHARS`` is refused unparsed, and a response body over
``MAX_RESPONSE_BYTES`` is refused unread (its ``Content-Length``, or the bytes as they arrive): an endpoint
that ignores ``max_tokens`` cannot make mart hold, parse, store or re-send megabytes. An answer that echoes
the API key has it replaced by ``[redacted]`` before anything reads it.

Timeouts, 429 and 5xx are retried by the openai client with exponential backoff (it honours
``Retry-After``), at most ``max_retries`` times: one call takes at most about
``(max_retries + 1) x timeout`` plus the backoff waits. The API key is held by the client only (as a
``SecretStr``); it is never logged, stored or put in graph state, and error messages are scrubbed of it.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from mart.nodes.agents.schemas import openai_function, openai_response_format

if TYPE_CHECKING:
    from mart.state.options import TuneOptions

StructuredMethod = Literal["json_schema", "function_calling", "json_mode"]
STRUCTURED_METHODS: tuple[str, ...] = ("json_schema", "function_calling", "json_mode")
DEFAULT_MAX_RETRIES = 2
MAX_MAX_RETRIES = 6
DEFAULT_REPAIR_ROUNDS = 2
MAX_REPAIR_ROUNDS = 2
DEFAULT_MAX_TOKENS = 4096
MAX_ANSWER_CHARS = 64_000
"""Longest answer parsed; a few candidates with rationales fit in ~4k characters."""
MAX_RESPONSE_BYTES = 1 << 20
"""Longest HTTP response body read (the answer in its JSON envelope, or its SSE chunks): beyond it the
response is dropped unread, whatever the endpoint says its length is."""
PLACEHOLDER_API_KEY = "EMPTY"
"""Sent to a custom base URL when no key is configured (``vllm serve`` without ``--api-key`` accepts any)."""


class LLMConfigError(ValueError):
    """The LLM agents are asked for but cannot be configured (no model, no key, bad method)."""


@dataclass(frozen=True)
class LLMSettings:
    """Resolved, secret-free settings of the LLM agents (safe to log)."""

    model: str
    base_url: str | None
    timeout_s: float
    max_retries: int
    structured: StructuredMethod
    repair_rounds: int
    streaming: bool
    strict: bool = True
    price_per_mtok: tuple[float, float] | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS

    @classmethod
    def resolve(
        cls,
        options: TuneOptions,
        *,
        structured: str | None = None,
        max_retries: int | None = None,
        repair_rounds: int | None = None,
        streaming: bool | None = None,
        max_tokens: int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> LLMSettings:
        """Options and arguments first, then the environment, then defaults.

        Raises:
            LLMConfigError: no model configured, or an unknown structured-output method.
        """
        env = os.environ if env is None else env
        model = options.llm_model or env.get("MART_LLM_MODEL")
        if not model:
            raise LLMConfigError(
                "the LLM agents need a model: pass --llm-model (TuneOptions.llm_model) or set MART_LLM_MODEL"
            )
        method = structured or env.get("MART_LLM_STRUCTURED") or "json_schema"
        if method not in STRUCTURED_METHODS:
            raise LLMConfigError(f"MART_LLM_STRUCTURED must be one of {list(STRUCTURED_METHODS)}, but got {method!r}")
        retries = max_retries if max_retries is not None else _env_int(env, "MART_LLM_MAX_RETRIES", DEFAULT_MAX_RETRIES)
        repairs = repair_rounds if repair_rounds is not None else _env_int(env, "MART_LLM_REPAIR_ROUNDS", DEFAULT_REPAIR_ROUNDS)
        stream = streaming if streaming is not None else env.get("MART_LLM_STREAM", "").lower() in ("1", "true", "yes")
        tokens = max_tokens if max_tokens is not None else _env_int(env, "MART_LLM_MAX_TOKENS", DEFAULT_MAX_TOKENS)
        if tokens < 1:
            raise LLMConfigError(f"MART_LLM_MAX_TOKENS must be at least 1, but got {tokens}")
        return cls(
            model=model,
            base_url=options.llm_base_url or env.get("OPENAI_BASE_URL") or None,
            timeout_s=float(options.llm_timeout_s),
            max_retries=max(0, min(int(retries), MAX_MAX_RETRIES)),
            structured=method,  # type: ignore[arg-type]
            repair_rounds=max(0, min(int(repairs), MAX_REPAIR_ROUNDS)),
            streaming=stream,
            price_per_mtok=options.llm_price_per_mtok,
            max_tokens=int(tokens),
        )

    def cost_usd(self, prompt_tokens: int, completion_tokens: int) -> float | None:
        if self.price_per_mtok is None:
            return None
        price_in, price_out = self.price_per_mtok
        return (prompt_tokens * price_in + completion_tokens * price_out) / 1e6


def resolve_api_key(api_key: str | None, base_url: str | None, env: Mapping[str, str] | None = None) -> str:
    """The ``api_key`` argument, else ``$OPENAI_API_KEY``, else a placeholder for a custom base URL.

    Raises:
        LLMConfigError: no key for api.openai.com.
    """
    env = os.environ if env is None else env
    key = api_key or env.get("OPENAI_API_KEY")
    if key:
        return key
    if base_url:
        return PLACEHOLDER_API_KEY
    raise LLMConfigError(
        "the LLM agents need an API key for api.openai.com: set OPENAI_API_KEY (or pass --llm-api-key), "
        "or point --llm-base-url / OPENAI_BASE_URL at a server that needs none"
    )


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw in (None, ""):
        return default
    try:
        return int(raw)
    except ValueError:
        raise LLMConfigError(f"{name} must be an integer, but got {raw!r}") from None


# --------------------------------------------------------------------------- errors


class LLMCallError(Exception):
    """The endpoint did not answer usably (after the client's retries).

    ``kind``: timeout, rate_limit, server, auth, not_found, bad_request, connection, other.
    ``fatal``: retrying later in the session is pointless (bad key, unknown model).
    """

    def __init__(self, kind: str, message: str, *, fatal: bool = False) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.fatal = fatal
        self.latency_s = 0.0


_KEYLIKE = re.compile(r"\b(sk|key|token)-[A-Za-z0-9_\-\*\.]{4,}", re.IGNORECASE)


def redact(text: str, secret: str | None = None, limit: int = 300) -> str:
    """``text`` without the secret or anything key-like, on one line, at most ``limit`` characters."""
    if secret and secret != PLACEHOLDER_API_KEY:
        text = text.replace(secret, "***")
    text = _KEYLIKE.sub(lambda m: m.group(1) + "-***", text)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def classify_error(exc: BaseException, secret: str | None = None) -> LLMCallError:
    """Map an openai/httpx exception to an ``LLMCallError`` with a scrubbed message."""
    import openai  # noqa: PLC0415 - optional extra, imported when used

    msg = redact(str(exc) or type(exc).__name__, secret)
    big = _too_large_cause(exc)
    if big is not None:  # the client wraps it (after its retries) in a connection error
        return LLMCallError("too_large", str(big))
    if isinstance(exc, openai.APITimeoutError):
        return LLMCallError("timeout", msg)
    if isinstance(exc, openai.APIConnectionError):
        return LLMCallError("connection", msg)
    if isinstance(exc, openai.RateLimitError):
        return LLMCallError("rate_limit", msg)
    if isinstance(exc, (openai.AuthenticationError, openai.PermissionDeniedError)):
        return LLMCallError("auth", msg, fatal=True)
    if isinstance(exc, openai.NotFoundError):
        return LLMCallError("not_found", msg, fatal=True)
    if isinstance(exc, openai.BadRequestError):
        return LLMCallError("bad_request", msg)
    if isinstance(exc, openai.APIStatusError):
        return LLMCallError("server" if exc.status_code >= 500 else "other", msg)
    if isinstance(exc, TimeoutError):
        return LLMCallError("timeout", msg)
    return LLMCallError("other", f"{type(exc).__name__}: {msg}")


# --------------------------------------------------------------------------- the HTTP client


class ResponseTooLarge(Exception):
    """The endpoint's response body is over ``MAX_RESPONSE_BYTES`` (refused unread)."""


def capped_http_client(limit: int = MAX_RESPONSE_BYTES, deadline_s: float | None = None):
    """An ``httpx.Client`` whose responses are refused once their body passes ``limit`` bytes: at once when
    ``Content-Length`` says so, else while the bytes arrive (SSE, chunked), so at most ``limit`` are held.

    ``deadline_s``: a wall-clock limit on each request, connect + headers + body together. httpx's own timeouts
    are per phase and per read, so an endpoint that sends one byte every few seconds would hold a call for as
    long as it likes; here a timer shuts the request's socket down at the deadline (whatever it is blocked
    in), and the request ends in ``httpx.ReadTimeout``, which the openai client treats as any other timeout.
    Connections are not kept alive, so that each request has a socket of its own to shut down."""
    import socket  # noqa: PLC0415
    import threading  # noqa: PLC0415

    import httpx  # noqa: PLC0415 - optional extra, imported when used

    class _Deadline:
        """One request's deadline: shuts its socket down when it passes."""

        def __init__(self, seconds: float) -> None:
            self.seconds = seconds
            self.at = time.monotonic() + seconds
            self.sock: socket.socket | None = None
            self.passed = False
            self._timer = threading.Timer(seconds, self._fire)
            self._timer.daemon = True
            self._timer.start()

        def _fire(self) -> None:
            self.passed = True
            if self.sock is not None:
                try:
                    self.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        def trace(self, name: str, info: dict) -> None:  # httpcore's "trace" request extension
            if name == "connection.connect_tcp.complete" and info.get("return_value") is not None:
                self.sock = info["return_value"].get_extra_info("socket")
                if self.passed:
                    self._fire()
            self.check()

        def check(self) -> None:
            if self.passed or time.monotonic() >= self.at:
                self.passed = True
                raise httpx.ReadTimeout(f"no complete answer within the {self.seconds:g} s deadline")

        def cancel(self) -> None:
            self._timer.cancel()

    class _Capped(httpx.SyncByteStream):
        def __init__(self, inner: Any, deadline: _Deadline | None) -> None:
            self.inner = inner
            self.deadline = deadline

        def __iter__(self):
            seen = 0
            try:
                for chunk in self.inner:
                    if self.deadline is not None:
                        self.deadline.check()
                    seen += len(chunk)
                    if seen > limit:
                        raise ResponseTooLarge(f"the response is over {limit} bytes; refused unread")
                    yield chunk
            except httpx.TransportError:
                if self.deadline is not None:
                    self.deadline.check()  # the socket was shut down at the deadline: say so
                raise

        def close(self) -> None:
            if self.deadline is not None:
                self.deadline.cancel()
            self.inner.close()

    class _Transport(httpx.HTTPTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            deadline = _Deadline(deadline_s) if deadline_s else None
            if deadline is not None:
                request.extensions = {**request.extensions, "trace": deadline.trace}
            try:
                resp = super().handle_request(request)
            except (httpx.TransportError, ResponseTooLarge):
                if deadline is not None:
                    deadline.cancel()
                    deadline.check()
                raise
            length = resp.headers.get("content-length")
            if length and length.isdigit() and int(length) > limit:
                resp.close()
                raise ResponseTooLarge(f"the response is {length} bytes, over {limit}; refused unread")
            return httpx.Response(resp.status_code, headers=resp.headers, stream=_Capped(resp.stream, deadline),
                                  extensions=resp.extensions, request=request)

    limits = httpx.Limits(max_keepalive_connections=0) if deadline_s else httpx.Limits()
    return httpx.Client(transport=_Transport(limits=limits))


def _too_large_cause(exc: BaseException | None) -> ResponseTooLarge | None:
    while exc is not None:
        if isinstance(exc, ResponseTooLarge):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


# --------------------------------------------------------------------------- the call


@dataclass
class LLMReply:
    """One answered call: the raw answer text, its JSON (or why it is not JSON), usage and latency."""

    text: str
    data: Any = None
    parse_error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0


class StructuredChat:
    """A ChatOpenAI bound to one output schema; ``invoke(messages)`` returns an ``LLMReply``.

    The request is shaped by ``with_structured_output(..., include_raw=True)`` (``response_format``
    json_schema, forced tool call, or json_object); the answer is parsed here from the raw message, so
    that malformed JSON yields a message the repair round can quote instead of an exception.
    """

    def __init__(self, settings: LLMSettings, api_key: str, schema: type[BaseModel]) -> None:
        from langchain_openai import ChatOpenAI  # noqa: PLC0415 - the llm extra, imported when used

        self.settings = settings
        self.schema = schema
        self._secret = api_key
        llm = ChatOpenAI(
            model=settings.model,
            base_url=settings.base_url,
            api_key=api_key,
            timeout=settings.timeout_s,
            max_retries=settings.max_retries,
            streaming=settings.streaming,
            max_tokens=settings.max_tokens,
            stream_usage=True,
            use_responses_api=False,
            http_client=capped_http_client(deadline_s=settings.timeout_s),
        )
        if settings.structured == "json_schema":
            # A dict (not the class) keeps ChatOpenAI on the plain `create` path: a malformed answer comes
            # back as text to quote, rather than as an exception from the client's own parser.
            target: Any = openai_response_format(schema, strict=settings.strict)
            self._runnable = llm.with_structured_output(target, method="json_schema", include_raw=True)
        elif settings.structured == "function_calling":
            target = openai_function(schema, strict=settings.strict)
            self._runnable = llm.with_structured_output(target, method="function_calling", include_raw=True)
        else:
            self._runnable = llm.with_structured_output(None, method="json_mode", include_raw=True)
        self.tool_name = openai_function(schema)["name"]

    def __repr__(self) -> str:  # never show the client (it holds the key)
        return f"StructuredChat(model={self.settings.model!r}, schema={self.schema.__name__})"

    def invoke(self, messages: list[Any]) -> LLMReply:
        """Raises:
        LLMCallError: the endpoint failed (timeout, 429 or 5xx after retries, auth, ...)."""
        start = time.monotonic()
        try:
            out = self._runnable.invoke(messages)
        except Exception as e:  # noqa: BLE001 - openai/httpx errors; anything else is reported the same way
            err = classify_error(e, self._secret)
            err.latency_s = time.monotonic() - start
            raise err from None
        latency = time.monotonic() - start
        raw = out["raw"] if isinstance(out, dict) else out
        usage = getattr(raw, "usage_metadata", None) or {}
        text, data, error = self._parse(raw)
        return LLMReply(
            text=text,
            data=data,
            parse_error=error,
            prompt_tokens=int(usage.get("input_tokens") or 0),
            completion_tokens=int(usage.get("output_tokens") or 0),
            latency_s=latency,
        )

    def _scrub(self, text: str) -> str:
        """The answer without the API key (a model that echoes it must not get it stored or shown)."""
        secret = self._secret
        if not secret or secret == PLACEHOLDER_API_KEY or secret not in text:
            return text
        return text.replace(secret, "[redacted]")

    def _parse(self, raw: Any) -> tuple[str, Any, str | None]:
        for call in getattr(raw, "tool_calls", None) or []:
            text = json.dumps(call.get("args"))
            if len(text) > MAX_ANSWER_CHARS:
                return _too_long(self._scrub(text))
            clean = self._scrub(text)
            return clean, (call.get("args") if clean == text else json.loads(clean)), None
        for bad in getattr(raw, "invalid_tool_calls", None) or []:
            text = self._scrub(str(bad.get("args") or ""))
            if len(text) > MAX_ANSWER_CHARS:
                return _too_long(text)
            return text, None, f"the tool call's arguments are not valid JSON ({_json_error(text)})"
        content = getattr(raw, "content", "")
        if isinstance(content, list):
            content = "".join(c.get("text", "") if isinstance(c, dict) else str(c) for c in content)
        text = str(content or "")
        if len(text) > MAX_ANSWER_CHARS:
            return _too_long(self._scrub(text))
        text = self._scrub(text)
        if not text.strip():
            return text, None, "the answer is empty (expected one JSON object)"
        try:
            return text, json.loads(_strip_fences(text)), None
        except json.JSONDecodeError:
            return text, None, f"the answer is not valid JSON ({_json_error(_strip_fences(text))})"


def _too_long(text: str) -> tuple[str, Any, str | None]:
    # keep only the head: it is quoted back (cut again) and recorded; the rest is dropped unparsed
    return (text[:2000], None, f"the answer is {len(text)} characters long, over the limit of {MAX_ANSWER_CHARS}; "
            "answer with one short JSON object")


def _strip_fences(text: str) -> str:
    t = text.strip()
    m = re.match(r"^```(?:json)?\s*(.*?)\s*```$", t, re.DOTALL)
    return m.group(1) if m else t


def _json_error(text: str) -> str:
    try:
        json.loads(text)
    except json.JSONDecodeError as e:
        return f"{e.msg} at line {e.lineno} column {e.colno}"
    return "unexpected"
