"""The router's OpenAI-compatible HTTP front (docs/design.md, "The HTTP front").

A second listener of the router process beside its gRPC server, on the same asyncio loop,
over the same Orchestrator: routing, admission, retries, tracing and metrics are the
gRPC front's. What is its own is the HTTP side of a request:

    bytes -> body limit (413) -> API key -> tenant (401, 403)      app.py, keys.py
          -> JSON -> the request's schema (400, naming the field)  schema.py
          -> model name (404) -> prompt: text, chat template, ids   prompt.py
          -> GenerateParams -> Orchestrator.submit                  (its own refusals)
          -> tokens -> text, stop strings, usage -> JSON or SSE     reply.py, stops.py

Errors leave in OpenAI's JSON shape with the status their cause deserves (errors.py).
"""
