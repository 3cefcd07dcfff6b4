"""Access and accounting around the app: API key, request body limit, request counts."""

import hmac
import json

from .errors import APIError

DRAIN_LIMIT = 64 << 20  # past this a too-large body is not even read to its end


class AuthMiddleware:
    """Require ``Authorization: Bearer <key>`` on every path but ``/health`` (401)."""

    def __init__(self, app, api_key):
        self.app = app
        self.key = api_key.encode("utf-8") if api_key else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.key is None or scope["path"] == "/health":
            return await self.app(scope, receive, send)
        auth = dict(scope["headers"]).get(b"authorization", b"")
        token = auth[7:].strip() if auth[:7].lower() == b"bearer " else b""
        # compare_digest: the time taken does not tell how much of the key matched.
        if not token or not hmac.compare_digest(token, self.key):
            error = APIError(401, "Invalid or missing API key: send 'Authorization: Bearer <key>'.",
                             None, "invalid_api_key")
            return await error.response()(scope, receive, send)
        return await self.app(scope, receive, send)


class StatusCounter:
    """Count answered requests by path and status in the server's metrics (paths
    outside ``paths`` count as "other", so clients cannot grow the label set)."""

    def __init__(self, app, metrics, paths):
        self.app = app
        self.metrics = metrics
        self.paths = set(paths)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def counting_send(message):
            if message["type"] == "http.response.start":
                path = scope["path"] if scope["path"] in self.paths else "other"
                self.metrics.count_request(path, message["status"])
            await send(message)

        return await self.app(scope, receive, counting_send)


async def read_json(request, limit):
    """The request body parsed as JSON: 413 past ``limit`` bytes, 400 for invalid UTF-8
    or malformed JSON."""
    body, size = bytearray(), 0
    async for chunk in request.stream():
        size += len(chunk)
        if size <= limit:
            body += chunk
        elif size > DRAIN_LIMIT:
            break  # read on only so that the client sees the 413 rather than a reset
    if size > limit:
        raise APIError(413, f"The request body is {size} bytes or more, over this server's "
                       f"limit of {limit} bytes (--max-body-bytes).", None, "request_too_large")
    try:
        text = bytes(body).decode("utf-8")
    except UnicodeDecodeError as e:
        raise APIError(400, f"The request body is not valid UTF-8 (byte {e.start}).", None,
                       "invalid_utf8") from None
    try:
        return json.loads(text)
    except ValueError as e:
        raise APIError(400, f"The request body is not valid JSON: {e}.", None, "invalid_json") from None
