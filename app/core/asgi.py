"""ASGI types and the middleware that rewrites a response's headers as it starts."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]


class ResponseHeaders:
    """ASGI middleware that rewrites the headers of each HTTP response
    (:meth:`rewrite`, given the request's scope) as it starts; the body passes as it is."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    def rewrite(self, scope: Scope, headers: Headers) -> Headers:
        raise NotImplementedError

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def rewritten(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = self.rewrite(scope, list(message.get("headers", [])))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, rewritten)
