"""The onnx backend's model at run time: the job model's tokenizer and one ONNX Runtime session.

An export (`embedjob_worker.encode.onnx_export`) is one ONNX graph from token ids to the sentence
embedding: the transformer, the pooling and the normalisation that the model's sentence-transformers
config names. Running it needs onnxruntime and the tokenizer, not torch, sentence-transformers or
optimum. The class offers what the actor and `embedjob search` use of a SentenceTransformer
(`encode`, `tokenizer`, `max_seq_length`, `get_embedding_dimension`), so both take either.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

# Inside an export's directory: the graph, and what running it needs besides the tokenizer's own files.
GRAPH = Path("onnx") / "model.onnx"
SETTINGS = "embedjob-onnx.json"


@dataclass(frozen=True)
class OnnxSettings:
    """What the graph expects: its inputs (tokenizer outputs, in order), the token limit, the vector size."""

    inputs: tuple[str, ...]
    max_seq_length: int
    dimension: int

    def write(self, directory: Path) -> None:
        (directory / SETTINGS).write_text(json.dumps(asdict(self)))

    @classmethod
    def read(cls, directory: Path) -> "OnnxSettings":
        settings = json.loads((directory / SETTINGS).read_text())
        return cls(tuple(settings["inputs"]), settings["max_seq_length"], settings["dimension"])


def features(tokenizer, texts: list[str], inputs: tuple[str, ...], max_length: int) -> dict[str, np.ndarray]:
    """The graph's inputs for `texts`, tokenized as sentence-transformers does for a text model: padded to
    the longest, cut at `max_length` tokens. The export checks that this gives the model's own vectors."""
    encoded = tokenizer(texts, padding=True, truncation="longest_first", max_length=max_length, return_tensors="np")
    return {name: encoded[name].astype(np.int64) for name in inputs}


class OnnxSentenceModel:
    """An exported model, loaded for CPU inference with `threads` threads (all of the machine's when None)."""

    def __init__(self, directory: str | Path, threads: int | None = None):
        import onnxruntime
        from transformers import AutoTokenizer

        directory = Path(directory)
        self.settings = OnnxSettings.read(directory)
        self.tokenizer = AutoTokenizer.from_pretrained(str(directory))
        self.max_seq_length = self.settings.max_seq_length  # the model's own; spec.model.maxSeqLength may lower it
        options = onnxruntime.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        # Its threads sleep between runs instead of spinning (ONNX Runtime's default): an actor shares its node's
        # cores with the driver, the writers and PostgreSQL, which a spinning thread would take from them.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        # Quiet: the session's optimizer warnings are not the job's concern.
        options.log_severity_level = 3
        self.session = onnxruntime.InferenceSession(str(directory / GRAPH), options,
                                                    providers=["CPUExecutionProvider"])

    def get_embedding_dimension(self) -> int:
        return self.settings.dimension

    def encode(self, texts: list[str], batch_size: int = 32, normalize_embeddings: bool = False,
               prompt: str | None = None, truncate_dim: int | None = None,
               **_sentence_transformers_options) -> np.ndarray:
        """Vectors of `texts` in their order, `batch_size` texts a forward pass, longest first (as
        sentence-transformers does: each pass pads to texts of similar length); `prompt` put before each text,
        the first `truncate_dim` dimensions kept (before the normalisation), as sentence-transformers does."""
        texts = [prompt + text for text in texts] if prompt else texts
        vectors = np.empty((len(texts), self.settings.dimension), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        for start in range(0, len(texts), max(1, batch_size)):
            chosen = order[start:start + batch_size]
            inputs = features(self.tokenizer, [texts[i] for i in chosen], self.settings.inputs, self.max_seq_length)
            vectors[chosen] = self.session.run(None, inputs)[0]
        if truncate_dim is not None:
            vectors = np.ascontiguousarray(vectors[:, :truncate_dim])
        if normalize_embeddings:
            vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        return vectors
