"""The onnx backend's model at run time: the model tokenizer's Rust half and one ONNX Runtime session.

An export (`embedjob_worker.encode.onnx_export`) is one ONNX graph from token ids to the sentence
embedding: the transformer, the pooling and the normalisation that the model's sentence-transformers
config names. Running it needs onnxruntime and the `tokenizers` library, not torch, transformers,
sentence-transformers or optimum: the export keeps the tokenizer transformers built (its Rust half)
with the padding and truncation settings transformers would apply, so an actor of this backend starts
without importing torch (several seconds of CPU). The class offers what the actor and `embedjob search`
use of a SentenceTransformer (`encode`, `tokenizer`, `max_seq_length`, `get_embedding_dimension`), so
both take either.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

# Inside an export's directory: the graph, what running it needs, the tokenizer as transformers built it.
GRAPH = Path("onnx") / "model.onnx"
SETTINGS = "embedjob-onnx.json"
TOKENIZER = "embedjob-tokenizer.json"


@dataclass(frozen=True)
class Padding:
    """How transformers pads a batch for this model (its tokenizer's pad token and sides)."""

    pad_id: int
    pad_token: str
    pad_type_id: int
    padding_side: str
    truncation_side: str

    @classmethod
    def of(cls, tokenizer) -> "Padding":
        """A transformers tokenizer's padding."""
        return cls(tokenizer.pad_token_id, tokenizer.pad_token, tokenizer.pad_token_type_id, tokenizer.padding_side,
                   tokenizer.truncation_side)


@dataclass(frozen=True)
class OnnxSettings:
    """What the graph expects: its inputs (tokenizer outputs, in order), the token limit, the vector size, and
    the padding its tokenizer applies."""

    inputs: tuple[str, ...]
    max_seq_length: int
    dimension: int
    padding: Padding

    def write(self, directory: Path) -> None:
        (directory / SETTINGS).write_text(json.dumps(asdict(self)))

    @classmethod
    def read(cls, directory: Path) -> "OnnxSettings":
        settings = json.loads((directory / SETTINGS).read_text())
        return cls(tuple(settings["inputs"]), settings["max_seq_length"], settings["dimension"],
                   Padding(**settings["padding"]))


class RustTokenizer:
    """The export's `tokenizers.Tokenizer`, called as the actor calls a transformers tokenizer (ids of texts),
    and making the graph's inputs as transformers does for a text model: padded to the longest, cut at
    `max_length` tokens ("longest_first")."""

    def __init__(self, path: Path, settings: OnnxSettings):
        from tokenizers import Tokenizer

        self.settings = settings
        saved = path.read_text()  # read once, built twice: one for ids as they are, one for the graph's inputs
        self.unpadded = Tokenizer.from_str(saved)
        self.unpadded.no_padding()
        self.unpadded.no_truncation()
        self.padded = Tokenizer.from_str(saved)
        padding = settings.padding
        self.padded.enable_padding(direction=padding.padding_side, pad_id=padding.pad_id,
                                   pad_type_id=padding.pad_type_id, pad_token=padding.pad_token)
        self._truncated_at: int | None = None

    def __call__(self, texts: list[str], add_special_tokens: bool = True, truncation: bool = False,
                 verbose: bool = False) -> dict[str, list]:
        """{"input_ids": ids of each text}, neither padded nor truncated (`verbose` as transformers takes it)."""
        if truncation:
            raise ValueError("RustTokenizer() gives untruncated ids; features() cuts them")
        encoded = self.unpadded.encode_batch(texts, add_special_tokens=add_special_tokens)
        return {"input_ids": [encoding.ids for encoding in encoded]}

    def features(self, texts: list[str], max_length: int) -> dict[str, np.ndarray]:
        """The graph's inputs for `texts`: padded to the longest, cut at `max_length` tokens."""
        if self._truncated_at != max_length:
            self.padded.enable_truncation(max_length, stride=0, strategy="longest_first",
                                          direction=self.settings.padding.truncation_side)
            self._truncated_at = max_length
        encoded = self.padded.encode_batch(texts, add_special_tokens=True)
        columns = {"input_ids": "ids", "attention_mask": "attention_mask", "token_type_ids": "type_ids"}
        return {name: np.array([getattr(e, columns[name]) for e in encoded], dtype=np.int64)
                for name in self.settings.inputs}


class OnnxSentenceModel:
    """An exported model, loaded for CPU inference with `threads` threads (all of the machine's when None)."""

    def __init__(self, directory: str | Path, threads: int | None = None):
        import onnxruntime

        directory = Path(directory)
        self.settings = OnnxSettings.read(directory)
        self.tokenizer = RustTokenizer(directory / TOKENIZER, self.settings)
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
            inputs = self.tokenizer.features([texts[i] for i in chosen], self.max_seq_length)
            vectors[chosen] = self.session.run(None, inputs)[0]
        if truncate_dim is not None:
            vectors = np.ascontiguousarray(vectors[:, :truncate_dim])
        if normalize_embeddings:
            vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        return vectors
