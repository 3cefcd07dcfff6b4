"""OpenAI's error JSON: ``{"error": {"message", "type", "param", "code"}}``."""

from starlette.responses import JSONResponse

_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
          405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
          503: "server_error"}


class APIError(Exception):
    """An error answered to one request (and only to it) with ``status``."""

    def __init__(self, status, message, param=None, code=None, retry_after=None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.retry_after = retry_after

    def body(self):
        """The error as OpenAI's JSON object."""
        return {"error": {"message": self.message, "type": _TYPES.get(self.status, "server_error"),
                          "param": self.param, "code": self.code}}

    def response(self):
        """A JSON response with the status (and ``Retry-After`` for 429)."""
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after is not None else None
        if self.status == 401:
            headers = {"WWW-Authenticate": "Bearer"}
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "tuple"}


def _is_type_tag(part):
    return "[" in part or "-" in part or part in _TAGS


def validation_error(exc):
    """An :class:`APIError` (400) for the first error of a pydantic ``ValidationError``,
    naming the field as a dotted path (``messages[0].content``)."""
    err = exc.errors()[0]
    param = ""
    for part in err["loc"]:
        if isinstance(part, int):
            param += f"[{part}]"
        elif _is_type_tag(part):  # pydantic names the union member it tried
            continue
        else:
            param += f".{part}" if param else str(part)
    msg = err["msg"]
    if err["type"] == "missing":
        return APIError(400, f"Missing required parameter: '{param}'.", param, "missing_required_parameter")
    return APIError(400, f"Invalid value for '{param}': {msg}.", param, "invalid_value")
