"""The ASGI middleware vLLM loads (`--middleware eagle3_capture.middleware.CaptureMiddleware`)."""

from __future__ import annotations

import random
import time

from . import config
from .config import App, CaptureConfig, Exchange, Message, Receive, Scope, Send
from .recorder import Recorder


class CaptureMiddleware:
    """`vllm serve --middleware eagle3_capture.CaptureMiddleware`: samples POST /v1/chat/completions."""

    def __init__(self, app: App, recorder: Recorder | None = None, rng: random.Random | None = None) -> None:
        self.app = app
        self.recorder = recorder or Recorder(CaptureConfig.from_env())
        self.rng = rng or random.Random()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, self._on_shutdown(receive), send)
            return
        chosen = (
            scope["type"] == "http"
            and scope.get("method") == "POST"
            and scope.get("path") == config.CAPTURED_PATH
            and self.rng.random() < self.recorder.config.sample_rate
        )
        if not chosen:
            await self.app(scope, receive, send)
            return
        await self._captured(scope, receive, send)

    def _on_shutdown(self, receive: Receive) -> Receive:
        async def wrapped() -> Message:
            message = await receive()
            if message.get("type") == "lifespan.shutdown":
                self.recorder.close()
            return message

        return wrapped

    async def _captured(self, scope: Scope, receive: Receive, send: Send) -> None:
        served_at = time.time()
        request: list[bytes] = []
        response: list[bytes] = []
        sizes = [0, 0]
        state = {"status": 0, "streamed": False}

        async def receive_copy() -> Message:
            message = await receive()
            if message.get("type") == "http.request":
                body = message.get("body", b"")
                sizes[0] += len(body)
                if sizes[0] <= config.MAX_BODY_BYTES:
                    request.append(body)
            return message

        async def send_copy(message: Message) -> None:
            if message.get("type") == "http.response.start":
                state["status"] = message.get("status", 0)
                headers = dict(message.get("headers") or [])
                state["streamed"] = headers.get(b"content-type", b"").startswith(b"text/event-stream")
            elif message.get("type") == "http.response.body":
                body = message.get("body", b"")
                sizes[1] += len(body)
                if sizes[1] <= config.MAX_BODY_BYTES:
                    response.append(body)
            await send(message)

        await self.app(scope, receive_copy, send_copy)
        if max(sizes) > config.MAX_BODY_BYTES:
            self.recorder.counters.count("dropped")
            return
        exchange = Exchange(
            served_at, b"".join(request), b"".join(response), int(state["status"]), bool(state["streamed"])
        )
        self.recorder.offer(exchange)
