"""A loopback OpenAI-compatible server for tests: ``POST /v1/chat/completions`` on 127.0.0.1.

It speaks what ``langchain_openai.ChatOpenAI`` sends: plain chat, structured output through
``response_format`` (``json_schema`` / ``json_object``) and through forced tool calls, and SSE streaming
when the request has ``stream: true`` (with a usage chunk when ``stream_options.include_usage`` is set).

Each test scripts the answers: ``stub.push(reply, ...)`` queues replies answered in order; once the
queue is empty the ``default`` responder answers (a callable ``RecordedRequest -> Reply``). Replies can
be JSON objects, verbatim (possibly malformed) text, HTTP errors (429/5xx with headers) or hangs.
Every request is recorded in ``stub.requests``. Everything is bounded: hangs end when the stub stops,
and the stub stops itself after ``max_lifetime_s``.

Example::

    with OpenAIStub(default=PlausibleAgent()) as stub:
        stub.push(Reply.error(429, headers={"retry-after-ms": "10"}))
        llm = ChatOpenAI(model="stub", base_url=stub.base_url, api_key="x")
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# --------------------------------------------------------------------------- requests and replies


@dataclass
class RecordedRequest:
    """One request as the stub saw it."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float = field(default_factory=time.monotonic)

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages") or [])

    @property
    def prompt(self) -> str:
        """All message texts joined (system, user, assistant), in order."""
        parts = []
        for m in self.messages:
            content = m.get("content")
            if isinstance(content, list):
                content = "".join(c.get("text", "") for c in content if isinstance(c, dict))
            parts.append(str(content or ""))
        return "\n".join(parts)

    @property
    def mode(self) -> str:
        """``json_schema``, ``json_object``, ``tools`` or ``text``: how the answer must be shaped."""
        if self.body.get("tools"):
            return "tools"
        rf = self.body.get("response_format") or {}
        return rf.get("type", "text") if isinstance(rf, dict) else "text"

    @property
    def schema_name(self) -> str | None:
        """Name of the requested output schema (json_schema name or the forced tool's name)."""
        if self.mode == "tools":
            choice = self.body.get("tool_choice")
            if isinstance(choice, dict):
                return choice.get("function", {}).get("name")
            return self.body["tools"][0]["function"]["name"]
        rf = self.body.get("response_format") or {}
        return (rf.get("json_schema") or {}).get("name") if isinstance(rf, dict) else None

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))


@dataclass
class Reply:
    """What the stub answers to one request.

    ``content`` is a dict/list (sent as JSON text) or a str (sent verbatim, malformed or not). It goes into
    the message content, or into the forced tool call's ``arguments`` when the request asked for tools.
    """

    content: Any = None
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    error_body: Any = None
    hang_s: float = 0.0
    drip_s: float = 0.0
    """> 0: send the headers at once, then one byte of the body every ``drip_s`` seconds (a slow-drip endpoint)."""
    usage: tuple[int, int] | None = None
    """(prompt_tokens, completion_tokens); estimated from the texts (~4 chars/token) when None."""

    @classmethod
    def json(cls, obj: Any, **kw: Any) -> Reply:
        return cls(content=obj, **kw)

    @classmethod
    def text(cls, text: str, **kw: Any) -> Reply:
        return cls(content=text, **kw)

    @classmethod
    def error(cls, status: int, message: str = "stub error", headers: dict[str, str] | None = None) -> Reply:
        body = {"error": {"message": message, "type": "stub_error", "code": status}}
        return cls(status=status, headers=dict(headers or {}), error_body=body)

    @classmethod
    def hang(cls, seconds: float) -> Reply:
        return cls(hang_s=seconds)

    @classmethod
    def drip(cls, every_s: float = 2.0) -> Reply:
        """Headers now, then one byte every ``every_s`` seconds (bounded like a hang: until the client leaves,
        the stub stops or ``max_hang_s`` has passed)."""
        return cls(drip_s=every_s)

    def text_payload(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return json.dumps(self.content)


Responder = Callable[[RecordedRequest], Reply]


# --------------------------------------------------------------------------- the server


class OpenAIStub:
    """A threaded HTTP server on 127.0.0.1 (port 0) that answers like OpenAI's chat completions API."""

    def __init__(
        self,
        default: Responder | None = None,
        *,
        model: str = "stub-model",
        max_lifetime_s: float = 300.0,
        max_hang_s: float = 30.0,
    ) -> None:
        self.default = default or (lambda req: Reply.error(500, "no reply queued"))
        self.model = model
        self.max_lifetime_s = max_lifetime_s
        self.max_hang_s = max_hang_s
        self.requests: list[RecordedRequest] = []
        self._queue: deque[Reply | Responder] = deque()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._timer: threading.Timer | None = None

    # lifecycle -------------------------------------------------------------------------------------
    def start(self) -> OpenAIStub:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_GET(self) -> None:  # /v1/models, for completeness
                if self.path.rstrip("/").endswith("/models"):
                    stub._send_json(self, 200, {"object": "list", "data": [{"id": stub.model, "object": "model"}]})
                else:
                    stub._send_json(self, 404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:
                stub._handle_post(self)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        self._timer = threading.Timer(self.max_lifetime_s, self.stop)
        self._timer.daemon = True
        self._timer.start()
        return self

    def stop(self) -> None:
        """Stop serving; pending hangs return at once. Safe to call twice."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self._timer is not None:
            self._timer.cancel()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> OpenAIStub:  # noqa: PYI034
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        assert self._server is not None, "start the stub first"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    # scripting -------------------------------------------------------------------------------------
    def push(self, *replies: Reply | Responder) -> None:
        """Queue replies (or per-request responders), answered in order before the default."""
        with self._lock:
            self._queue.extend(replies)

    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    def completions(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path.rstrip("/").endswith("/chat/completions")]

    # handling --------------------------------------------------------------------------------------
    def _next_reply(self, req: RecordedRequest) -> Reply:
        with self._lock:
            item = self._queue.popleft() if self._queue else self.default
        return item if isinstance(item, Reply) else item(req)

    def _handle_post(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("content-length") or 0)
        raw = h.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            self._send_json(h, 400, {"error": {"message": "request body is not JSON"}})
            return
        req = RecordedRequest(path=h.path, headers={k.lower(): v for k, v in h.headers.items()}, body=body)
        with self._lock:
            self.requests.append(req)
        if not h.path.rstrip("/").endswith("/chat/completions"):
            self._send_json(h, 404, {"error": {"message": f"no route {h.path}"}})
            return
        reply = self._next_reply(req)
        if reply.hang_s > 0:
            # Bounded: ends when the stub stops, or after max_hang_s; the client has long given up by then.
            self._stopped.wait(min(reply.hang_s, self.max_hang_s))
            try:
                self._send_json(h, 504, {"error": {"message": "stub hang ended"}})
            except OSError:
                pass
            return
        if reply.drip_s > 0:
            self._drip(h, reply.drip_s)
            return
        if reply.status != 200:
            self._send_json(h, reply.status, reply.error_body or {"error": {"message": "error"}}, reply.headers)
            return
        text = reply.text_payload()
        usage = reply.usage or (max(1, len(req.prompt) // 4), max(1, len(text) // 4))
        try:
            if req.stream:
                self._send_sse(h, req, text, usage)
            else:
                self._send_json(h, 200, self._completion(req, text, usage), reply.headers)
        except OSError:  # the client went away
            pass

    def _drip(self, h: BaseHTTPRequestHandler, every_s: float) -> None:
        body = b" " * 1000 + b"{}"  # whitespace before the JSON: every byte is a valid prefix of the answer
        try:
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.flush()
            end = time.monotonic() + self.max_hang_s
            for i in range(len(body)):
                if self._stopped.wait(every_s) or time.monotonic() > end:
                    return
                h.wfile.write(body[i:i + 1])
                h.wfile.flush()
        except OSError:  # the client went away (its deadline)
            pass

    def _message(self, req: RecordedRequest, text: str) -> dict[str, Any]:
        if req.mode == "tools":
            call = {"id": f"call_{len(self.requests)}", "type": "function",
                    "function": {"name": req.schema_name, "arguments": text}}
            return {"role": "assistant", "content": None, "tool_calls": [call]}
        return {"role": "assistant", "content": text}

    def _completion(self, req: RecordedRequest, text: str, usage: tuple[int, int]) -> dict[str, Any]:
        finish = "tool_calls" if req.mode == "tools" else "stop"
        return {
            "id": f"chatcmpl-stub{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": req.body.get("model", self.model),
            "choices": [{"index": 0, "message": self._message(req, text), "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
        }

    def _send_json(self, h: BaseHTTPRequestHandler, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(obj).encode()
        h.send_response(status)
        h.send_header("content-type", "application/json")
        h.send_header("content-length", str(len(data)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(data)
        h.wfile.flush()

    def _send_sse(self, h: BaseHTTPRequestHandler, req: RecordedRequest, text: str, usage: tuple[int, int]) -> None:
        h.send_response(200)
        h.send_header("content-type", "text/event-stream")
        h.send_header("cache-control", "no-cache")
        h.send_header("connection", "close")
        h.end_headers()
        h.close_connection = True
        base = {"id": f"chatcmpl-stub{len(self.requests)}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": req.body.get("model", self.model)}

        def emit(delta: dict[str, Any], finish: str | None = None, usage_obj: Any = None) -> None:
            chunk = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}
            if usage_obj is not None:
                chunk = {**base, "choices": [], "usage": usage_obj}
            h.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            h.wfile.flush()

        pieces = [text[i : i + 40] for i in range(0, len(text), 40)] or [""]
        if req.mode == "tools":
            emit({"role": "assistant", "content": None, "tool_calls": [{
                "index": 0, "id": f"call_{len(self.requests)}", "type": "function",
                "function": {"name": req.schema_name, "arguments": ""}}]})
            for p in pieces:
                emit({"tool_calls": [{"index": 0, "function": {"arguments": p}}]})
            emit({}, "tool_calls")
        else:
            emit({"role": "assistant", "content": ""})
            for p in pieces:
                emit({"content": p})
            emit({}, "stop")
        if (req.body.get("stream_options") or {}).get("include_usage"):
            emit({}, usage_obj={"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)})
        h.wfile.write(b"data: [DONE]\n\n")
        h.wfile.flush()


# --------------------------------------------------------------------------- a plausible agent

_KNOB_LINE = re.compile(r"^- `?([A-Za-z0-9_.]+)`? \((.+?); default (.+?)\): ", re.MULTILINE)
_CANDIDATE_LINE = re.compile(r"^### Candidate `([^`]+)`", re.MULTILINE)
_COUNT = re.compile(r"exactly (\d+) candidate", re.IGNORECASE)


def parse_knobs(prompt: str) -> list[dict[str, Any]]:
    """Knobs as listed by ``SearchSpace.describe``: key, kind, range/choices (what an LLM reads)."""
    knobs = []
    for key, rng, default in _KNOB_LINE.findall(prompt):
        if key.startswith("constraint"):
            continue
        knob: dict[str, Any] = {"key": key, "default": default}
        m = re.match(r"(int|float|log) in \[([^,]+), ([^\]]+)\]", rng)
        if m:
            knob.update(kind=m.group(1), low=float(m.group(2)), high=float(m.group(3)))
        elif rng.startswith("bool"):
            knob.update(kind="bool")
        elif rng.startswith("one of "):
            inner = rng[len("one of "):].split(", nullable")[0]
            try:
                choices = json.loads(inner.replace("'", '"').replace("True", "true").replace("False", "false").replace("None", "null"))
            except json.JSONDecodeError:
                continue
            knob.update(kind="categorical", choices=choices)
        else:
            continue
        knobs.append(knob)
    return knobs


class PlausibleAgent:
    """Answers proposer and critic requests the way a cooperative LLM would, from the prompt alone.

    Proposer requests (schema name containing ``Proposal``): parses the knob list out of the prompt and
    proposes the requested number of candidates, each changing one or two knobs to values inside their
    ranges. Critic requests (``Verdict``): accepts the candidates whose checks the prompt reports as ok and
    picks the first of them. Nothing here knows the test's expected results.
    """

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.calls = 0

    def __call__(self, req: RecordedRequest) -> Reply:
        self.calls += 1
        name = (req.schema_name or "").lower()
        if "verdict" in name or "critic" in name:
            return Reply.json(self.critique(req.prompt))
        return Reply.json(self.propose(req.prompt))

    def _value(self, knob: dict[str, Any]) -> Any:
        kind = knob["kind"]
        if kind == "bool":
            return knob["default"].lower() != "true"
        if kind == "categorical":
            return self.rng.choice(knob["choices"])
        low, high = knob["low"], knob["high"]
        if kind == "int":  # like a person (or an LLM): powers of two, which batch-size rules tend to like
            powers = [2**i for i in range(20) if low <= 2**i <= high]
            return self.rng.choice(powers) if powers else self.rng.randint(int(low), int(high))
        if kind == "log":
            import math

            return float(f"{math.exp(self.rng.uniform(math.log(low), math.log(high))):.3g}")
        return round(self.rng.uniform(low, high), 3)

    def propose(self, prompt: str) -> dict[str, Any]:
        knobs = parse_knobs(prompt)
        m = _COUNT.search(prompt)
        k = int(m.group(1)) if m else 3
        candidates = []
        for i in range(k):
            chosen = self.rng.sample(knobs, min(len(knobs), 1 + i % 2)) if knobs else []
            candidates.append({
                "overrides": [{"key": kn["key"], "value": self._value(kn)} for kn in chosen],
                "rationale": "stub: try " + ", ".join(kn["key"] for kn in chosen),
                "expected_gain": 0.05,
            })
        return {"analysis": "stub analysis of the profile", "candidates": candidates}

    def critique(self, prompt: str) -> dict[str, Any]:
        blocks = re.split(r"(?=^### Candidate `)", prompt, flags=re.MULTILINE)
        verdicts, pick = [], None
        for block in blocks:
            m = _CANDIDATE_LINE.match(block)
            if not m:
                continue
            ok = "validation: ok" in block and "constraints: ok" in block
            verdicts.append({"candidate_id": m.group(1), "accept": ok,
                             "reason": "stub: checks pass" if ok else "stub: checks fail",
                             "risk": "low" if ok else "high"})
            if ok and pick is None:
                pick = m.group(1)
        return {"verdicts": verdicts, "pick": pick, "feedback": "" if pick else "stub: nothing passed"}
