"""What a model's own files say about how to use it: its prompts (sentence-transformers config) and its card.

The document prompt is chosen among the prompts the model's config declares as sentence-transformers'
`encode_document` chose it before version 6 (`document`, else `passage`, else `corpus`), the query prompt as
`encode_query` does; the actors then pass it to `encode_document` explicitly. (sentence-transformers 6 adds an
empty `document` and `query` prompt to every model's prompts, so its `encode_document` without a prompt embeds
an e5-style model, which declares `passage`, with none.) Whether a model was trained for truncation (Matryoshka) is read from
its card (README.md), where sentence-transformers writes the training loss; a card that does not say is no
evidence either way.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from embedjob.api import ModelPrompt
from embedjob_worker.core.errors import JobFailed

ST_CONFIG = "config_sentence_transformers.json"
CARD = "README.md"
# encode_document's choice among a config's prompts, in its order.
DOCUMENT_PROMPT_NAMES = ("document", "passage", "corpus")
QUERY_PROMPT_NAME = "query"
# How a card names the loss that trains a model for truncation (sentence-transformers' MatryoshkaLoss,
# Matryoshka2dLoss, or a card that simply says so).
MATRYOSHKA_WORD = "matryoshka"


@dataclass(frozen=True)
class ModelPrompts:
    """The prompts a model's sentence-transformers config declares, and its default prompt's name."""

    prompts: dict[str, str]
    default_name: str | None = None

    def default(self) -> str:
        return self.prompts.get(self.default_name, "") if self.default_name else ""


@dataclass(frozen=True)
class ChosenPrompt:
    text: str  # "" for none
    chosen_by: str  # for the summary and the log: which prompt, and why

    @property
    def tag(self) -> str:
        """What the vectors' revision records of it: a short hash of the text ("" for none)."""
        return hashlib.sha256(self.text.encode()).hexdigest()[:8] if self.text else ""


def model_file(location: str, hub_revision: str | None, name: str) -> str | None:
    """The text of the model's file `name` (from its directory, or its hub repository at the pinned revision);
    None when it has none."""
    if hub_revision is None:
        path = Path(location) / name
        return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else None
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    try:
        return Path(hf_hub_download(location, name, revision=hub_revision)).read_text(encoding="utf-8",
                                                                                     errors="replace")
    except EntryNotFoundError:
        return None


def parse_prompts(config_text: str | None) -> ModelPrompts:
    """The prompts of a sentence-transformers config's text; ValueError naming the file when they are not a
    mapping of names to texts."""
    try:
        config = json.loads(config_text) if config_text else {}
    except ValueError as exc:
        raise ValueError(f"{ST_CONFIG} is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{ST_CONFIG} is not a JSON object")
    prompts, default_name = config.get("prompts") or {}, config.get("default_prompt_name")
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise ValueError(f"{ST_CONFIG}: prompts is not a mapping of prompt names to texts")
    if default_name is not None and not isinstance(default_name, str):
        raise ValueError(f"{ST_CONFIG}: default_prompt_name is not a name")
    return ModelPrompts(prompts, default_name)


def model_prompts(location: str, hub_revision: str | None) -> ModelPrompts:
    return parse_prompts(model_file(location, hub_revision, ST_CONFIG))


def document_prompt(asked: ModelPrompt | None, declared: ModelPrompts) -> ChosenPrompt:
    """The prompt put before each document: spec.model.prompt's, else as encode_document picks it (the first
    of DOCUMENT_PROMPT_NAMES the config has), else the config's default prompt, else none."""
    if asked is not None and asked.text is not None:
        return ChosenPrompt(asked.text, "spec.model.prompt.text" if asked.text else "none (spec.model.prompt.text)")
    if asked is not None:
        if asked.name not in declared.prompts:
            have = ", ".join(sorted(declared.prompts)) or "none"
            raise JobFailed("ModelPromptUnknown", f"spec.model.prompt.name {asked.name!r}: the model's {ST_CONFIG} "
                                                  f"declares no such prompt (its prompts: {have})")
        return ChosenPrompt(declared.prompts[asked.name], f"the model's {asked.name!r} prompt (spec.model.prompt.name)")
    for name in DOCUMENT_PROMPT_NAMES:
        if name in declared.prompts:
            return ChosenPrompt(declared.prompts[name], f"the model's {name!r} prompt (its document prompt)")
    if declared.default():
        return ChosenPrompt(declared.default(), f"the model's default prompt {declared.default_name!r}")
    return ChosenPrompt("", "none (the model declares no document prompt)")


def query_prompt(declared: ModelPrompts) -> str:
    """The prompt put before a search's query, as encode_query picks it: the config's query prompt, else its
    default prompt, else none."""
    return declared.prompts.get(QUERY_PROMPT_NAME, declared.default())


def pooling_includes_prompt(location: str, hub_revision: str | None) -> bool:
    """Whether the model's Pooling module pools over the prompt's tokens too (its config's include_prompt, by
    default true): an exported graph that is given the prompt with the text can only do that."""
    modules = json.loads(model_file(location, hub_revision, "modules.json") or "[]")
    for module in modules if isinstance(modules, list) else []:
        if isinstance(module, dict) and str(module.get("type", "")).endswith(".Pooling"):
            config = json.loads(model_file(location, hub_revision, f"{module.get('path', '')}/config.json") or "{}")
            return bool(config.get("include_prompt", True)) if isinstance(config, dict) else True
    return True


def trained_for_truncation(location: str, hub_revision: str | None) -> bool:
    """Whether the model's card says it was trained for truncation (Matryoshka)."""
    try:
        card = model_file(location, hub_revision, CARD)
    except (OSError, ValueError):  # a card that cannot be fetched says nothing either
        return False
    return card is not None and MATRYOSHKA_WORD in card.lower()
