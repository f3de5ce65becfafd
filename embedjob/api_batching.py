"""The spec's batching section, and the batching a job gets from it: the defaults for unset fields, in one place.

`batchSize` and `maxTokens` have no schema default: the API server fills schema defaults in
before the driver sees the spec, so a default there could not be told from a value the user
set. Unset is decided here instead (`choose_batching`), from the spec as stored:

- neither set: batches filled to a token budget chosen for the actors' device (a GPU with
  workers.gpusPerActor > 0, else the CPU), at most `DEFAULT_BUDGET_RECORDS` records each;
- `batchSize` alone: fixed batches of that many records, as before budgets were a default;
- `maxTokens` alone: that budget, at most `DEFAULT_BUDGET_RECORDS` records a batch;
- both: that budget, at most `batchSize` records a batch;
- `sortWindow: 0` and neither: fixed batches of `DEFAULT_FIXED_BATCH_SIZE` (a budget is cut from
  length-sorted windows, so none can apply).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ConfigDict, Field, model_validator

from .api_base import ApiModel
from .api_rules import cel

# The defaults, and why (docs/token-budget.md has the measurements):
# - on a CPU, the budget that embedded the PEP paragraphs fastest with all-MiniLM-L6-v2 among
#   2048-16384 on an idle machine (bench/token_budget.py, interleaved rounds; 2048 as fast, less
#   steadily): a smaller one pays a model call and a write per few records, a larger one pads more
#   (attention cost grows with the padded length);
DEFAULT_CPU_MAX_TOKENS = 4096
# - on a GPU, text-embeddings-inference's default --max-batch-tokens: a padded batch of this
#   size keeps a GPU busy with small and base-size encoders, and its activations fit the
#   memory of any current data-centre GPU (not measured here: no GPU on the build machine);
DEFAULT_GPU_MAX_TOKENS = 16_384
# - the most records of a batch under a budget the user did not bound by batchSize: the bound
#   bench/token_budget.py measured the budgets with; on a CPU only texts of at most
#   DEFAULT_CPU_MAX_TOKENS / 512 = 8 tokens reach it, and it keeps what a lost batch costs and
#   one batch's bookkeeping (ids, results) small;
DEFAULT_BUDGET_RECORDS = 512
# - fixed batches where no budget can apply (sortWindow 0): the batchSize default from before
#   budgets were the default, so such specs keep their batches.
DEFAULT_FIXED_BATCH_SIZE = 64

# batchSize's maximum × maxSeqLength's: a larger budget never cuts a batch.
MAX_TOKENS_LIMIT = 4096 * 8192
# (CEL rule, message); Batching's validator checks the same in Python.
MAX_TOKENS_NEEDS_SORTING = (
    "!has(self.maxTokens) || !has(self.sortWindow) || self.sortWindow > 0",
    "maxTokens is only meaningful with length sorting: set sortWindow above 0 or unset maxTokens",
)
MAX_TOKENS_NEEDS_ROOM = (
    "!has(self.maxTokens) || !has(self.batchSize) || self.batchSize > 1",
    "maxTokens is only meaningful with batchSize above 1 (batchSize is the most records per batch)",
)


class Batching(ApiModel):
    """How records are grouped into batches for the workers. With neither batchSize nor maxTokens set, batches are
    filled to a token budget for the workers' device (docs/token-budget.md)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                # has(): the API server checks the object's `default: {}` against the
                # rule before nested defaults are filled in.
                cel(
                    "!has(self.sortWindow) || !has(self.batchSize) || self.sortWindow == 0 "
                    "|| self.sortWindow >= self.batchSize",
                    "sortWindow must be 0 (no length bucketing) or at least batchSize",
                    ".sortWindow",
                ),
                cel(*MAX_TOKENS_NEEDS_SORTING, ".maxTokens"),
                cel(*MAX_TOKENS_NEEDS_ROOM, ".maxTokens"),
            ]
        }
    )

    batch_size: int | None = Field(
        None, ge=1, le=4096,
        description="Texts per batch (1-4096); one batch is one model call. Alone: fixed batches of this many. With "
        f"maxTokens: the most records per batch. Unset: at most {DEFAULT_BUDGET_RECORDS} within the token budget "
        f"({DEFAULT_FIXED_BATCH_SIZE} per batch with sortWindow 0).",
    )
    max_in_flight: int = Field(
        4, ge=1, le=1024,
        description="Batches outstanding at once, at the workers or not yet written (1-1024); bounds memory and "
        "the work a crash loses.",
    )
    sort_window: int = Field(
        4096,
        ge=0,
        le=1_000_000,
        description="Records read ahead and sorted by length before batches are formed, so that a batch holds "
        "texts of similar length (0 disables this; otherwise at least batchSize).",
    )
    max_tokens: int | None = Field(
        None, ge=1, le=MAX_TOKENS_LIMIT,
        description="Token budget per batch (1-33554432): batches are cut from the length-sorted window so that "
        "records × the longest record's tokens (the model's tokenizer, capped at its token limit) stays within "
        "it, at most batchSize records each; a record over the budget alone is a batch of one. Unset: "
        f"{DEFAULT_CPU_MAX_TOKENS} on CPU workers, {DEFAULT_GPU_MAX_TOKENS} with workers.gpusPerActor above 0, "
        "unless batchSize is set (then fixed batches of batchSize) or sortWindow is 0. Needs sortWindow > 0 and "
        "batchSize > 1.",
    )

    @model_validator(mode="after")
    def _max_tokens_needs_sorting_and_room(self) -> "Batching":
        if self.max_tokens is not None and self.sort_window == 0:
            raise ValueError(MAX_TOKENS_NEEDS_SORTING[1])
        if self.max_tokens is not None and self.batch_size == 1:
            raise ValueError(MAX_TOKENS_NEEDS_ROOM[1])
        return self


@dataclass(frozen=True)
class ChosenBatching:
    """The batching a job runs with: batchSize (with a budget, the most records a batch), the token budget (None:
    fixed batches) and, for each, whether the spec set it or which default it is."""

    batch_size: int
    max_tokens: int | None
    batch_size_origin: str | None  # None: set in the spec; else the default's reason, e.g. "default with a budget"
    max_tokens_origin: str | None  # None: set in the spec (or no budget); else e.g. "default for CPU"

    def __str__(self) -> str:
        """What `embedjob render` and the run's summary show, e.g. "maxTokens 4096 (default for CPU), at most 512
        records a batch (default with a budget)"."""
        def told(text: str, origin: str | None) -> str:
            return f"{text} ({origin})" if origin else text

        if self.max_tokens is None:
            return told(f"fixed batches of {self.batch_size} records", self.batch_size_origin)
        return (told(f"maxTokens {self.max_tokens}", self.max_tokens_origin) + ", "
                + told(f"at most {self.batch_size} records a batch", self.batch_size_origin))


def choose_batching(batching: Batching, gpus_per_actor: float) -> ChosenBatching:
    """The batch size and token budget a job with `batching` runs with on actors of `gpus_per_actor` GPUs (the
    rules in the module's docstring)."""
    size, budget = batching.batch_size, batching.max_tokens
    if size is not None and budget is None:
        return ChosenBatching(size, None, None, None)
    if budget is None and batching.sort_window == 0:
        return ChosenBatching(DEFAULT_FIXED_BATCH_SIZE, None, "default with sortWindow 0", None)
    budget_origin = None
    if budget is None:
        on_gpu = gpus_per_actor > 0
        budget = DEFAULT_GPU_MAX_TOKENS if on_gpu else DEFAULT_CPU_MAX_TOKENS
        budget_origin = f"default for {'GPU' if on_gpu else 'CPU'}"
    if size is not None:
        return ChosenBatching(size, budget, None, budget_origin)
    # Batches are cut within a window: a bound above sortWindow would never be reached.
    return ChosenBatching(min(DEFAULT_BUDGET_RECORDS, batching.sort_window), budget, "default with a budget",
                          budget_origin)
