"""The HTTP API's errors as Kubernetes answers them: a Status object with the code."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from ..errors import ReconcilerError, first_line
from ..store import StoreError
from ..wire import NO_ROUTE, error_status, status


def answer_errors(app: FastAPI) -> None:
    """Every error a route raises answered as a Status object (wire.py) with its code: the
    verbs' errors by their kind, the store's as 503, a body that does not validate as 422
    naming each field (one that is not JSON 400, or 415 when it says it is another type, as
    Kubernetes answers), FastAPI's own (404, 405) in the same shape."""

    @app.exception_handler(ReconcilerError)
    async def verb_error(_: Request, exc: ReconcilerError) -> Response:
        document = error_status(exc)
        return JSONResponse(document, status_code=document["code"])

    @app.exception_handler(StoreError)
    async def store_error(_: Request, exc: StoreError) -> Response:
        return JSONResponse(status(503, f"the store cannot be used: {first_line(exc)}"), status_code=503)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> Response:
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return JSONResponse(status(400, "the request body is not valid JSON"), status_code=400)
        if any(tuple(e.get("loc", ())) == ("body",) for e in errors):  # the body whole, not a field of it
            media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
            if media and media != "application/json":
                message = f"the request body must be a JSON object (Content-Type: application/json), not {media}"
                return JSONResponse(status(415, message), status_code=415)
            return JSONResponse(status(422, "the request body must be a JSON object"), status_code=422)
        causes = [
            {
                "reason": "FieldValueInvalid",
                "field": ".".join(str(p) for p in e.get("loc", ()) if p != "body"),
                "message": str(e.get("msg", "")),
            }
            for e in errors
        ]
        message = "; ".join(f"{c['field']}: {c['message']}" for c in causes)
        return JSONResponse(status(422, message, causes=causes), status_code=422)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> Response:
        message = NO_ROUTE if exc.status_code == 404 else str(exc.detail)
        return JSONResponse(status(exc.status_code, message), status_code=exc.status_code, headers=exc.headers)
