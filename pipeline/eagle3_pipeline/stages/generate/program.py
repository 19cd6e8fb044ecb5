"""generate: regenerate the assistant turns of the prepared conversations with the verifier, in vLLM.

The draft then learns the verifier's own answers (and reasoning), not the dataset author's. Each assistant
turn is regenerated in order from the turns before it, earlier turns already regenerated; a prompt-only row
gets its last user turn answered. A conversation with tool calls or tool turns is kept as recorded, since
the verifier's own calls would need the tools' answers to them (`keptAsRecorded` counts them). Finished
conversations are appended to `<work>/conversations.jsonl` as they complete, so a killed or out-of-memory
attempt resumes where it stopped. At the end the file is rewritten in input order and tokenized like
prepare's output (`data/`, `token_freq.pt`). Rows whose regeneration fails are recorded in `failed.jsonl`
and dropped, up to `regeneration.maxFailedFraction` of the rows.

Progress: conversations done of all (an earlier attempt's count as done), the tokens generated, the failed
rows by reason, and the token budget (halved after an out-of-memory).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from eagle3_contract.params import GenerateParams, GenerateTuning
from eagle3_contract.stages import Stage
from eagle3_pipeline.data.conversations import uses_tools
from eagle3_pipeline.data.prepared import (
    CONVERSATIONS_FILE,
    Tokenizing,
    read_conversations,
    write_conversations,
    write_prepared,
)
from eagle3_pipeline.runtime.context import StageContext
from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.runtime.reporter import StageReporter
from eagle3_pipeline.serving.vllm_server import VllmServer

logger = logging.getLogger(__name__)

Conversation = dict[str, Any]
Message = dict[str, str]
FAILED_FILE = "failed.jsonl"
FSYNC_INTERVAL_S = 1.0
FAILED_EXAMPLES = 5
REQUEST_RETRIES = 2  # the OpenAI client's own retries: connection errors, 408, 409, 429 and 5xx
REQUEST_TIMEOUT_S = 3600.0
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


Context = StageContext[GenerateParams, GenerateTuning]


def run(ctx: Context) -> dict[str, Any]:
    started = time.monotonic()
    conversations = read_conversations(ctx.input(Stage.PREPARE) / CONVERSATIONS_FILE)
    ids = {c["id"] for c in conversations}
    done_file = ctx.work / CONVERSATIONS_FILE
    done = read_done(done_file, ids)
    todo = [(i, c) for i, c in enumerate(conversations) if c["id"] not in done]
    logger.info("%d conversations: %d done by an earlier attempt", len(conversations), len(done))
    progress = Progress(rows=len(conversations), resumed=len(done))
    budget = ctx.token_budget or ctx.tuning.token_budget
    ctx.progress.set_token_budget(budget)
    ctx.progress.begin("rows", len(conversations), done=len(done))
    if todo:
        engine = ctx.params.verifier.engine(ctx.tuning.tensor_parallel_size)
        with VllmServer(ctx, engine, seed=ctx.params.seed, max_num_batched_tokens=budget) as server:
            progress.server_start_s = server.started_s
            generation_started = time.monotonic()
            asyncio.run(regenerate_all(ctx, server, todo, progress))
            progress.generation_s = time.monotonic() - generation_started
    finished = read_done(done_file, ids)
    ordered = [finished[c["id"]] for c in conversations if c["id"] in finished]
    write_conversations(done_file, ordered)

    p = ctx.params
    stats = write_prepared(
        ctx.work, ordered, ctx, Tokenizing(p.verifier, p.max_sequence_length, p.loss_on_reasoning)
    )
    return stats | progress.result(time.monotonic() - started)  # tokensPerSecond: generated tokens


# --- one conversation ---------------------------------------------------------------------------------------


class RowFailed(Exception):
    """One row could not be regenerated: recorded in failed.jsonl and dropped; `reason` is a short word."""

    def __init__(self, message: str, reason: str = "error") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Sampling:
    model: str
    max_tokens: int
    temperature: float
    keep_reasoning: bool


@dataclass(frozen=True)
class Answer:
    conversation: Conversation
    output_tokens: int
    recorded: bool = False  # kept as the dataset recorded it, not regenerated


async def regenerate_conversation(client: Any, conv: Conversation, sampling: Sampling, seed: int) -> Answer:
    """Every assistant turn regenerated in order; without one, the last user turn is answered. A conversation
    that uses tools is kept as recorded: a regenerated call would need the tool's answer to it."""
    if uses_tools(conv["messages"]):
        return Answer(conv, 0, recorded=True)
    messages: list[Message] = []
    tokens = 0
    for message in conv["messages"]:
        if message["role"] == "assistant":
            reply, used = await ask(client, messages, sampling, seed)
            messages.append(reply)
            tokens += used
        else:
            messages.append(dict(message))
    if not any(m["role"] == "assistant" for m in conv["messages"]):
        if not messages or messages[-1]["role"] != "user":
            raise RowFailed("a prompt-only row must end with a user turn to answer", "no_user_turn")
        reply, used = await ask(client, messages, sampling, seed)
        messages.append(reply)
        tokens += used
    return Answer({**conv, "messages": messages}, tokens)


async def ask(client: Any, history: list[Message], sampling: Sampling, seed: int) -> tuple[Message, int]:
    """The verifier's answer to `history` (role and content only) and the number of tokens it generated."""
    import openai

    try:
        response = await client.chat.completions.create(
            model=sampling.model,
            messages=[{"role": m["role"], "content": m["content"]} for m in history],
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            seed=seed,
        )
    except openai.APIError as exc:
        raise RowFailed(f"turn {len(history)}: {type(exc).__name__}: {exc}", "request") from None
    choice = response.choices[0]
    extra = choice.message.model_extra or {}
    content, reasoning = split_reasoning(
        choice.message.content or "", extra.get("reasoning_content") or extra.get("reasoning")
    )
    if not content.strip():
        raise RowFailed(
            f"turn {len(history)}: empty answer (finish_reason {choice.finish_reason}; "
            f"{len(reasoning or '')} characters of reasoning): raise regeneration.maxTokens?",
            "empty_answer",
        )
    reply: Message = {"role": "assistant", "content": content}
    if sampling.keep_reasoning and reasoning:
        reply["reasoning_content"] = reasoning
    return reply, response.usage.completion_tokens if response.usage else 0


def split_reasoning(content: str, reasoning: str | None) -> tuple[str, str | None]:
    """(answer, reasoning): the server's reasoning parser's field, else a `<think>...</think>` block.

    A template that opens the block in the prompt (Qwen3-style) leaves only `...</think>` in the output.
    An unclosed block (cut off by maxTokens) is all reasoning and no answer.
    """
    if reasoning is not None:
        return content, reasoning
    head = content.lstrip()
    if head.startswith(THINK_OPEN):
        head = head[len(THINK_OPEN) :]
    elif THINK_CLOSE not in head:
        return content, None
    thought, closed, answer = head.partition(THINK_CLOSE)
    if not closed:
        return "", thought.strip()
    return answer.lstrip(), thought.strip()


# --- the rows: resume, concurrency, failures ----------------------------------------------------------------


@dataclass
class Progress:
    rows: int
    resumed: int
    regenerated: int = 0
    recorded: int = 0  # conversations with tools, kept as recorded
    failed: list[tuple[str, str]] = field(default_factory=list)
    output_tokens: int = 0
    server_start_s: float = 0.0
    generation_s: float = 0.0

    def result(self, seconds: float) -> dict[str, Any]:
        rate = self.output_tokens / self.generation_s if self.generation_s > 0 else None
        return {
            "rows": self.rows,
            "regenerated": self.regenerated,
            "keptAsRecorded": self.recorded,
            "failed": len(self.failed),
            "resumed": self.resumed,
            "outputTokens": self.output_tokens,
            "tokensPerSecond": round(rate, 1) if rate is not None else None,
            "generationSeconds": round(self.generation_s, 3),
            "serverStartSeconds": round(self.server_start_s, 1),
            "seconds": round(seconds, 3),
        }


def read_done(path: Path, known: set[str]) -> dict[str, Conversation]:
    """Conversations finished by earlier attempts; a torn last line (a killed writer) is cut off the file."""
    done: dict[str, Conversation] = {}
    if not path.is_file():
        return done
    good_bytes = 0
    with path.open("rb") as f:
        for line in f:
            try:
                row = json.loads(line) if line.endswith(b"\n") else None
            except json.JSONDecodeError:
                row = None
            if not isinstance(row, dict) or row.get("id") not in known:
                logger.warning("%s: dropping a torn or unknown line at byte %d and after", path, good_bytes)
                break
            done[row["id"]] = row
            good_bytes += len(line)
    if good_bytes != path.stat().st_size:
        os.truncate(path, good_bytes)
    return done


class Appender:
    """Appends one JSON line per finished row; flushed at once, fsynced at most once a second and at close."""

    def __init__(self, path: Path, mode: str = "a") -> None:
        self.file: IO[str] = path.open(mode, encoding="utf-8")
        self.synced = time.monotonic()

    def write(self, row: dict[str, Any]) -> None:
        self.file.write(json.dumps(row, ensure_ascii=False) + "\n")
        self.file.flush()
        if time.monotonic() - self.synced > FSYNC_INTERVAL_S:
            os.fsync(self.file.fileno())
            self.synced = time.monotonic()

    def close(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()


@dataclass
class Rows:
    """Where finished and failed rows go, and how many failures the stage tolerates."""

    progress: Progress
    done: Appender
    failed: Appender
    allowed_failures: int
    reporter: StageReporter

    def finished(self, answer: Answer) -> None:
        self.done.write(answer.conversation)
        if answer.recorded:
            self.progress.recorded += 1
        else:
            self.progress.regenerated += 1
        self.progress.output_tokens += answer.output_tokens
        self.reporter.advance(1, answer.output_tokens)

    def failure(self, row_id: str, error: str, reason: str = "error") -> None:
        failed = self.progress.failed
        failed.append((row_id, error))
        self.failed.write({"id": row_id, "error": error})
        self.reporter.advance(1)
        self.reporter.fail(reason)
        logger.warning("row %s failed: %s", row_id, error)
        if len(failed) > self.allowed_failures:
            examples = "; ".join(f"{i}: {e}" for i, e in failed[:FAILED_EXAMPLES])
            raise StageError(
                f"{len(failed)} of {self.progress.rows} rows failed to regenerate, more than "
                f"regeneration.maxFailedFraction allows ({self.allowed_failures}); first errors: {examples}. "
                f"Every failure is in {FAILED_FILE} of the work directory, next to the vLLM log: fix the "
                "cause or raise regeneration.maxFailedFraction (regenerated rows are kept for the retry)",
                keep_work=True,
            )


async def regenerate_all(
    ctx: Context, server: VllmServer, todo: list[tuple[int, Conversation]], progress: Progress
) -> None:
    """Regenerate `todo` against `server`, at most `regeneration.concurrency` conversations in flight."""
    from openai import AsyncOpenAI

    reg = ctx.params.regeneration
    sampling = Sampling(server.model_name, reg.max_tokens, reg.temperature, reg.reasoning.value == "keep")
    client = AsyncOpenAI(
        base_url=server.base_url, api_key="unused", max_retries=REQUEST_RETRIES, timeout=REQUEST_TIMEOUT_S
    )
    rows = Rows(
        progress,
        done=Appender(ctx.work / CONVERSATIONS_FILE),
        # this attempt's failures only: rows that failed before are retried
        failed=Appender(ctx.work / FAILED_FILE, mode="w"),
        allowed_failures=int(reg.max_failed_fraction * progress.rows),
        reporter=ctx.progress,
    )
    try:
        await run_rows(client, sampling, todo, rows, server, ctx.tuning.concurrency, ctx.params.seed)
    finally:
        rows.done.close()
        rows.failed.close()
        await client.close()


async def run_rows(
    client: Any,
    sampling: Sampling,
    todo: list[tuple[int, Conversation]],
    rows: Rows,
    server: VllmServer | None,
    concurrency: int,
    seed: int,
) -> None:
    """The concurrent loop; the first StageError or OutOfMemory cancels the rest and is raised as is."""
    semaphore = asyncio.Semaphore(concurrency)

    async def one(index: int, conv: Conversation) -> None:
        try:
            answer = await regenerate_conversation(client, conv, sampling, seed + index)
        except RowFailed as exc:
            if server is not None:
                server.check()  # a dead server is an OutOfMemory or a StageError, not a failed row
            rows.failure(conv["id"], str(exc), exc.reason)
        else:
            rows.finished(answer)
        finally:
            semaphore.release()

    try:
        async with asyncio.TaskGroup() as group:
            for index, conv in todo:
                await semaphore.acquire()  # at most `concurrency` tasks exist at any time
                group.create_task(one(index, conv))
    except BaseExceptionGroup as group_error:
        raise _first(group_error) from None


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first
