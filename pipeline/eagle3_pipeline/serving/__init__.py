"""A vLLM server a stage starts, the requests it answers, and its speculative-decoding counters."""
