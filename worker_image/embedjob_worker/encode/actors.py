"""The EmbeddingWorker Ray actor: loads the model once, embeds batches of texts."""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from typing import Any

import numpy as np

from embedjob.api import ModelBackend

from embedjob_worker.core.vector_range import largest_components
from embedjob_worker.core.worker_reports import EmbedResult, PrecisionCheck, WorkerInfo
from embedjob_worker.encode.exported import ExportedModel, materialize
from embedjob_worker.encode.model import ResolvedModel, float32_reference, load_model, loaded_revision, on_this_node


class EmbeddingWorker:
    """Keeps one model resident; `embed` returns vectors tagged with the model and batch id.

    `fault_injection` is a test hook (the driver passes it from EMBEDJOB_FAULT_INJECTION):
    {"oom_above": N} raises torch.OutOfMemoryError (MemoryError in an onnx actor) for batches of more than N texts;
    {"revision": "x"} reports revision x instead of the loaded one;
    {"hang_once_file": PATH} makes the first `embed` of any actor that creates PATH hang;
    {"component_when": {TEXT: VALUE}} sets the first component of the vector of each text containing TEXT to
    float(VALUE) ("nan", "inf", "1e6"), as a model in half precision or int8 may give.
    """

    def __init__(self, resolved: ResolvedModel, exported: ExportedModel | None, num_cpus: float, num_gpus: float,
                 fault_injection: dict[str, Any] | None = None):
        import ray

        threads = max(1, int(round(num_cpus)))
        self.threads = threads
        started = time.monotonic()
        # The model's out-of-memory errors; onnx runs without torch (its import is seconds of CPU).
        if resolved.backend == ModelBackend.onnx.value:
            self.torch, self.out_of_memory = None, (MemoryError,)
        else:
            self.torch = _torch_with_threads(threads)
            self.out_of_memory = (self.torch.OutOfMemoryError, MemoryError)
        resolved = on_this_node(resolved)  # a model from storage: fetched once per node (model_store)
        # `exported`: the driver's one export of an onnx/openvino model (embedjob_worker.encode.exported).
        exported_dir = materialize(exported) if exported is not None else None
        self.device = "cuda" if num_gpus > 0 else "cpu"
        self.resolved = resolved
        self.model = load_model(resolved, self.device, exported_dir, threads)
        self.load_seconds = time.monotonic() - started
        # Wall clock: a job that reuses a pool actor sees when another job loaded the model.
        self.loaded_at = time.time()
        self.name = resolved.name
        # Recomputed from the files on this actor's node, not copied from the driver.
        self.revision = loaded_revision(resolved)
        self.normalize = resolved.normalize
        self.max_tokens = self.model.max_seq_length
        self.faults = fault_injection or {}
        self.actor_id = ray.get_runtime_context().get_actor_id() or ""
        self.worker_id = f"{socket.gethostname()}/{os.getpid()}/{self.actor_id[:8]}"[:128]

    def info(self) -> WorkerInfo:
        model_dimension = (self.model.get_embedding_dimension() if hasattr(self.model, "get_embedding_dimension")
                           else self.model.get_sentence_embedding_dimension())
        return WorkerInfo(
            model=self.name,
            revision=self.faults.get("revision", self.revision),
            dimension=min(model_dimension, self.resolved.dimensions or model_dimension),
            model_dimension=model_dimension,
            max_tokens=self.max_tokens,
            load_seconds=self.load_seconds,
            loaded_at=self.loaded_at,
            actor_id=self.actor_id,
            worker=self.worker_id,
        )

    def embed(self, batch_id: str, texts: list[str], pass_size: int | None = None) -> EmbedResult:
        """Vectors of `texts`, `pass_size` texts a forward pass (default: all of them in one)."""
        started = time.monotonic()
        if "hang_once_file" in self.faults:
            try:
                os.close(os.open(self.faults["hang_once_file"], os.O_CREAT | os.O_EXCL))
                time.sleep(24 * 3600)
            except FileExistsError:
                pass
        vectors, splits = self._encode(texts, pass_size or len(texts))
        for marker, value in self.faults.get("component_when", {}).items():
            vectors[[marker in text for text in texts], 0] = float(value)
        return EmbedResult(
            batch_id=batch_id,
            truncated=self._truncated(texts),
            model=self.name,
            revision=self.faults.get("revision", self.revision),
            worker=self.worker_id,
            seconds=time.monotonic() - started,
            oom_splits=splits,
            vectors=vectors,
            largest=largest_components(vectors),
        )

    def embed_apart(self, batch_id: str, texts: list[str], pass_size: int | None = None
                    ) -> tuple[EmbedResult, np.ndarray]:
        """`embed`, with the vectors as a second return value (called with num_returns=2): the driver
        gets the first (its vectors None) and hands the ObjectRef of the second to a writer actor
        (spec.sink.writers)."""
        result = self.embed(batch_id, texts, pass_size)
        return dataclasses.replace(result, vectors=None), result.vectors

    def check_precision(self, texts: list[str]) -> PrecisionCheck:
        """The cosines between this model's vectors of `texts` and the same model's in float32 torch, loaded on
        this actor's device for the check and dropped after it."""
        _torch_with_threads(self.threads)
        reference = load_model(float32_reference(self.resolved), self.device)
        expected, found = (self._vectors(model, texts, 32, normalize=True) for model in (reference, self.model))
        del reference
        cosines = (found * expected).sum(axis=1)
        return PrecisionCheck(len(texts), round(float(cosines.mean()), 6), round(float(cosines.min()), 6))

    def _encode(self, texts: list[str], pass_size: int) -> tuple[np.ndarray, int]:
        """Encode in forward passes of `pass_size` texts; on out-of-memory, encode the halves (recursively)."""
        try:
            if len(texts) > self.faults.get("oom_above", len(texts)):
                raise self.out_of_memory[0](f"injected: batch of {len(texts)} > {self.faults['oom_above']}")
            vectors = self._vectors(self.model, texts, min(len(texts), pass_size), self.normalize)
            return vectors.astype(np.float32, copy=False), 0
        except self.out_of_memory:
            if len(texts) == 1:
                raise
            if self.torch and self.torch.cuda.is_available():
                self.torch.cuda.empty_cache()
            half = len(texts) // 2
            first, first_splits = self._encode(texts[:half], pass_size)
            second, second_splits = self._encode(texts[half:], pass_size)
            return np.vstack([first, second]), 1 + first_splits + second_splits

    def _vectors(self, model, texts: list[str], batch_size: int, normalize: bool) -> np.ndarray:
        """`texts` embedded as documents: after the job's prompt, cut to its dimensions (then normalised), as
        sentence-transformers' encode_document does (the onnx backend's model takes the same arguments)."""
        encode = getattr(model, "encode_document", model.encode)
        # prompt "" (not None): none, where None would let sentence-transformers take the default prompt
        return encode(texts, prompt=self.resolved.prompt.text, truncate_dim=self.resolved.dimensions,
                      batch_size=batch_size, normalize_embeddings=normalize, convert_to_numpy=True,
                      show_progress_bar=False)

    def _truncated(self, texts: list[str]) -> tuple[int, ...]:
        """Indices of texts longer than the model's token limit after the prompt (they were embedded truncated)."""
        texts = [self.resolved.prompt.text + t for t in texts]
        # A token covers at least one character, so only texts longer than the limit
        # (less the two special tokens) can exceed it; only those are tokenized.
        candidates = [i for i, t in enumerate(texts) if len(t) > self.max_tokens - 2]
        if not candidates:
            return ()
        encoded = self.model.tokenizer(
            [texts[i] for i in candidates], add_special_tokens=True, truncation=False, verbose=False
        )["input_ids"]
        return tuple(i for i, ids in zip(candidates, encoded) if len(ids) > self.max_tokens)


def _torch_with_threads(threads: int):
    """torch, imported, with the actor's CPUs as its threads (Ray leaves torch at one thread unless told)."""
    import torch

    torch.set_num_threads(threads)
    return torch
