"""Online hidden states on the trainer's side: speculators' own online dataset, pointed at the producers.

In online mode (`extraction.mode: online`) the train stage trains from speculators' `ArrowDataset` with
`on_missing: generate`: for every sample it asks the producers (`eagle3 produce`: vLLM with the
`extract_hidden_states` method behind `$EAGLE3_HIDDEN_STATES_ENDPOINT`) with speculators' client, reads the
sample through the hs-connectors transfer (`file`/`fp8` on the artifacts volume, or `mooncake`), checks it and
deletes it. What this module adds, and why speculators' dataset alone is not enough for a day-long run:

- `wait_for_producers`: training starts only once the producers answer (`/v1/models`), with a bounded wait
  and a progress line, instead of failing at the first sample.
- `WaitingRecoveryGuard` replaces the dataset's `GenerationRecoveryGuard`: speculators retries a failed
  sample a few times and then SKIPS it (and trips after 20 in a row), so a producer that restarts would
  silently drop samples or fail the run. The guard here waits for the producers to answer again when a
  sample failed because they were unreachable (up to `$EAGLE3_PRODUCER_WAIT_SECONDS`), then retries it;
  any other failure keeps speculators' own handling.
- `KeepingTransfer` (`extraction.keep: true`): each sample that passed speculators' checks is also written to
  `hs_<i>.safetensors` in the train stage's own `hidden_states/`, where later epochs read it instead of asking
  again (speculators 0.9 always deletes generated samples: its `on_generate` option is deprecated).

Both are attributes of the dataset object, so DataLoader workers (which receive a pickled copy) use them too.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import httpx
import torch

from eagle3_pipeline.runtime.errors import StageError

logger = logging.getLogger(__name__)

ENV_CACHE = "EAGLE3_HIDDEN_STATES_CACHE"  # set by the train stage when extraction.keep is true
ENV_WAIT = "EAGLE3_PRODUCER_WAIT_SECONDS"
DEFAULT_WAIT_S = 1800.0
POLL_S = 2.0
LOG_EVERY_S = 30.0


def producers_answer(endpoint: str, timeout: float = 5.0) -> bool:
    """Whether the producers' OpenAI API answers `GET /models` with a model."""
    try:
        response = httpx.get(f"{endpoint.rstrip('/')}/models", timeout=timeout)
        return response.status_code == 200 and bool(response.json().get("data"))
    except (httpx.HTTPError, ValueError):
        return False


def wait_seconds() -> float:
    raw = os.environ.get(ENV_WAIT)
    return float(raw) if raw else DEFAULT_WAIT_S


def wait_for_producers(endpoint: str, deadline_s: float | None = None, why: str = "starting") -> None:
    """Block until the producers answer; a StageError after `deadline_s` (default: ENV_WAIT, else 30 min)."""
    limit = wait_seconds() if deadline_s is None else deadline_s
    started = last_log = time.monotonic()
    while not producers_answer(endpoint):
        now = time.monotonic()
        if now - started > limit:
            raise StageError(
                f"the hidden-state producers at {endpoint} did not answer for {limit:.0f} s ({why}): check "
                "the producer Deployment's pods (status.producers in the cluster; locally their logs)",
                keep_work=True,
            )
        if now - last_log >= LOG_EVERY_S:
            logger.info(
                "train: waiting for the hidden-state producers at %s (%s, %.0f s)",
                endpoint,
                why,
                now - started,
            )
            last_log = now
        time.sleep(POLL_S)
    if time.monotonic() - started > POLL_S:
        logger.info("train: the producers at %s answer (after %.0f s)", endpoint, time.monotonic() - started)


def unreachable(error: BaseException) -> bool:
    """Whether `error` (or its cause) says the producers could not be reached, not that a sample was bad."""
    import openai

    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, openai.APIConnectionError | httpx.TransportError | ConnectionError):
            return True
        if isinstance(seen, openai.APIStatusError) and seen.status_code in (502, 503, 504):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class WaitingRecoveryGuard:
    """speculators' GenerationRecoveryGuard, except that unreachable producers are waited for, not skipped.

    A sample that failed because the producers were unreachable is retried (not counted as an attempt) once
    they answer again; `keeper` (a KeepingTransfer or None) is told of every sample that passed.
    """

    def __init__(self, inner: Any, endpoint: str, keeper: KeepingTransfer | None = None) -> None:
        self.inner = inner
        self.endpoint = endpoint
        self.keeper = keeper

    def run(self, operation: Any, *, description: str) -> Any:
        def waiting() -> Any:
            while True:
                try:
                    return operation()
                except Exception as error:
                    if not unreachable(error):
                        raise
                    logger.warning(
                        "%s: the producers are unreachable (%s); waiting for them", description, error
                    )
                    wait_for_producers(self.endpoint, why="a producer stopped answering during training")

        result = self.inner.run(waiting, description=description)
        if self.keeper is not None and isinstance(result, dict):
            self.keeper.keep(result)
        return result

    @property
    def consecutive_failures(self) -> int:
        count: int = self.inner.consecutive_failures
        return count


class KeepingTransfer:
    """A transfer that reads `hs_<i>.safetensors` from `cache` first and keeps every new sample there."""

    def __init__(self, inner: Any, cache: Path) -> None:
        self.inner = inner
        self.cache = cache
        self.pending: int | None = None  # the file index the dataset asked for and did not find

    def setup(self) -> None:
        self.inner.setup()

    def get_cached(self, file_idx: int) -> dict[str, torch.Tensor] | None:
        from safetensors.torch import load_file

        path = self.cache / f"hs_{file_idx}.safetensors"
        if path.is_file():
            self.pending = None
            return load_file(str(path))
        self.pending = file_idx
        cached: dict[str, torch.Tensor] | None = self.inner.get_cached(file_idx)
        return cached

    def get_generated(self, hs_transfer_params: dict[str, Any]) -> dict[str, torch.Tensor] | None:
        sample: dict[str, torch.Tensor] | None = self.inner.get_generated(hs_transfer_params)
        return sample

    def delete(self, handle: str) -> None:
        self.inner.delete(handle)

    def keep(self, sample: dict[str, torch.Tensor]) -> None:
        """Write a generated sample that passed speculators' checks under the index the dataset asked for."""
        index, self.pending = self.pending, None
        if index is None:
            return
        from safetensors.torch import save_file

        self.cache.mkdir(parents=True, exist_ok=True)
        target = self.cache / f"hs_{index}.safetensors"
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        save_file({k: v.contiguous() for k, v in sample.items()}, str(tmp))
        tmp.replace(target)


def adapt_dataset(dataset: Any, endpoint: str, cache: Path | None) -> None:
    """Give speculators' ArrowDataset the waiting guard (and, with a cache, the keeping transfer)."""
    keeper = None
    if cache is not None:
        keeper = KeepingTransfer(dataset.transfer, cache)
        dataset.transfer = keeper
    dataset.generation_recovery = WaitingRecoveryGuard(dataset.generation_recovery, endpoint, keeper)


def adapt_loaders(loaders: tuple[Any, ...], endpoint: str) -> None:
    """Adapt the datasets of speculators' train and validation loaders for online training."""
    cache = os.environ.get(ENV_CACHE)
    for loader in loaders:
        adapt_dataset(loader.dataset, endpoint, Path(cache) if cache else None)
