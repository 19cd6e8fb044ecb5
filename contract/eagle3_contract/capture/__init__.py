"""serving.capture: a sample of live chat completions recorded by the vLLM server itself (issue 44).

This package runs inside the vLLM pod, as the top-level package `eagle3_capture`: the operator mounts
its source from a ConfigMap and starts `vllm serve --middleware eagle3_capture.middleware.CaptureMiddleware`.
So its modules import only one another (relatively), the standard library, and prometheus_client where it is
installed (every vLLM installs it). It is the contract between the operator, which mounts and configures it,
and the pipeline, which reads its records.

Why a vLLM middleware, not a proxy or a log pipeline: the records need the request, the answer and vLLM's
per-request acceptance (`--per-request-spec-decode-metrics summary` puts it in the response), which only the
HTTP exchange holds together; vLLM loads ASGI middleware by name (`--middleware`), so no second process sits
in the request path, and nothing is parsed on it either.

Rules:
- Sampled: a request is chosen with probability EAGLE3_CAPTURE_SAMPLE_RATE before anything is buffered; an
  unchosen one passes through untouched.
- Harmless: the request path only copies bytes it already has and puts them on a bounded queue (dropped and
  counted when full, or when a body exceeds MAX_BODY_BYTES); parsing and writing happen on a thread.
- Crash-safe: records reach disk in segments, each written to a `.partial` file, fsynced and renamed:
  a kill loses the records not yet written, never leaves a partial one visible.
- Bounded: after each segment, segments older than EAGLE3_CAPTURE_RETENTION_SECONDS are deleted, then the
  oldest while all pods' segments together exceed EAGLE3_CAPTURE_MAX_BYTES.

Layout: `<EAGLE3_CAPTURE_DIR>/<source>/<first record's time>-<pid>-<sequence>.jsonl`, a JSON record a line:
servedAt (ISO 8601, UTC), model, messages (the request's), response ({role, content, reasoning_content}),
finishReason, and where vLLM reported them acceptanceLength, draftTokens, acceptedTokens.
"""
