"""Exporting a sentence-transformers model to one ONNX graph, checking it, and quantizing it to int8.

The graph runs the model's whole sentence-transformers pipeline (transformer, pooling, and the
normalisation its config names) from the tokenizer's outputs to the sentence embedding, exported by
torch.onnx (the torch.export-based exporter: the TorchScript one cannot trace transformers 5's
attention masks), then rewritten with ONNX Runtime's fused operators. Before anything is quantized, the float32 graph, run through the same code the actors
run (`embedjob_worker.encode.onnx_model`), must give the model's own vectors on `CHECK_TEXTS` within
`CHECK_ATOL`: a model whose preprocessing the export does not reproduce (a prompt, a lower-casing
tokenizer setting, a module the graph lacks) is refused rather than embedded differently.

int8 is ONNX Runtime's dynamic quantization (no calibration data) of the exported graph before its fusion, so
that the query, key and value projections are quantized too (a fused attention hides their weights from the
quantizer): the weights of the matrix products in int8, per output channel, in 7 bits (`reduce_range`: the
integer products then cannot saturate on CPUs without VNNI, so a vector does not depend on which CPU computed
it), activations quantized per batch at run time. The products that project the feed-forward layer back down
(the weight's input side wider than its output side) stay in float32: their inputs, after the activation
function, have the widest range, and quantizing them cost the most quality (bench/backends.py;
docs/backends.md). INT8_SCHEME names this way in each int8 vector's revision, so that vectors of an earlier
way are never taken for these.
"""

from __future__ import annotations

import logging
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from embedjob_worker.encode.onnx_model import GRAPH, TOKENIZER, OnnxSentenceModel, OnnxSettings, Padding

CHECK_ATOL = 1e-5
# Short, long (past any token limit), padded, non-Latin and whitespace-edged texts, in batches of mixed
# lengths: what the check needs to see the tokenizer's and the graph's every path.
CHECK_TEXTS = (
    "a", "Embeddings for search.", "  leading and trailing spaces  ", "Ünïcödé, 中文, русский, العربية 🙂",
    "tabs\tand\nnew lines", "Python Enhancement Proposal " * 200, "x" * 3000, "",
)
OPSET = 18
# The onnx int8 quantization as above (v2: before the fusion; an export without a scheme quantized after it).
INT8_SCHEME = "v2"


def export_onnx(location: str, hub_revision: str | None, directory: Path, int8: bool) -> None:
    """Export the model at `location` into `directory` (the graph, its settings, the tokenizer as transformers
    built it), checked against the model itself; `int8`: then quantized."""
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(location, revision=hub_revision, device="cpu").eval()
    tokenizer = model.tokenizer
    example = tokenizer(["an example", "a longer example text"], padding=True, return_tensors="pt")
    settings = OnnxSettings(tuple(example.keys()), model.max_seq_length, model.get_embedding_dimension(),
                            Padding.of(tokenizer))
    graph = directory / GRAPH
    graph.parent.mkdir(parents=True)
    exported = graph.with_name("exported.onnx")
    axes = {0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC}
    with torch.no_grad(), warnings.catch_warnings(), _quiet("torch.onnx", "onnxscript"):
        warnings.simplefilter("ignore")
        torch.onnx.export(_sentence_embedding(model, settings.inputs), tuple(example[n] for n in settings.inputs),
                          str(exported), input_names=list(settings.inputs), output_names=["sentence_embedding"],
                          dynamic_shapes=(tuple(axes for _ in settings.inputs),), opset_version=OPSET,
                          dynamo=True, verbose=False)
    _fuse_for_onnxruntime(exported, graph)
    # The tokenizer as transformers built it (tokenizer_config.json's settings applied), for running without it.
    tokenizer.backend_tokenizer.save(str(directory / TOKENIZER))
    settings.write(directory)
    _check_equal(model, directory)
    if int8:
        quantize_int8(exported, graph)
    for stale in graph.parent.glob(f"{exported.stem}*"):
        stale.unlink()


def _sentence_embedding(model, names: tuple[str, ...]):
    """The model as one module from tokenizer outputs (positional, in `names`' order) to the sentence embedding."""
    import torch

    class SentenceEmbedding(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *tensors):
            return self.model(dict(zip(names, tensors)))["sentence_embedding"]

    return SentenceEmbedding().eval()


def _fuse_for_onnxruntime(exported: Path, graph: Path) -> None:
    """`exported` rewritten into `graph` (and its external data, replaced) with ONNX Runtime's fused operators
    (attention, skip layer norm, bias GELU: onnxscript's ort_fusions), which run the float parts of each layer 1.2x
    faster here."""
    import onnx_ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    fused, _counts = optimize_for_ort(onnx_ir.load(str(exported)))
    graph.with_name(f"{graph.name}.data").unlink(missing_ok=True)  # an earlier graph's, never appended to
    onnx_ir.save(fused, str(graph), external_data=f"{graph.name}.data")


def _check_equal(model, directory: Path) -> None:
    """The export's tokens and vectors of CHECK_TEXTS must be the model's own (the vectors within CHECK_ATOL)."""
    texts = list(CHECK_TEXTS)
    exported = OnnxSentenceModel(directory, threads=1)
    expected_ids = model.tokenizer(texts, padding=True, truncation="longest_first", max_length=model.max_seq_length,
                                   return_tensors="np")
    found_ids = exported.tokenizer.features(texts, model.max_seq_length)
    differing = [name for name in exported.settings.inputs if not np.array_equal(found_ids[name], expected_ids[name])]
    if differing:
        raise ValueError(f"the exported tokenizer's {', '.join(differing)} differ from the model tokenizer's: "
                         "the export does not reproduce this model's tokenizer")
    expected = model.encode(texts, batch_size=4, convert_to_numpy=True, show_progress_bar=False)
    found = exported.encode(texts, batch_size=4)
    difference = float(np.abs(found - expected).max())
    if not difference <= CHECK_ATOL:
        raise ValueError(f"the exported ONNX graph's vectors differ from the model's by up to {difference:.2e} "
                         f"(allowed {CHECK_ATOL:.0e}): the export does not reproduce this model")


def down_projections(graph) -> list[str]:
    """The matrix products whose constant weight maps a wider input to a narrower output (a feed-forward
    layer's way back down)."""
    weights = {w.name: tuple(w.dims) for w in graph.initializer}
    return [node.name for node in graph.node if node.op_type == "MatMul" and len(weights.get(node.input[1], ())) == 2
            and weights[node.input[1]][0] > weights[node.input[1]][1]]


def quantize_int8(exported: Path, graph: Path) -> None:
    """Replace the fused float32 `graph` with the dynamic int8 quantization of `exported`, the graph as exported
    (unfused), fused in turn (see the module's doc)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    keep_float = down_projections(onnx.load(str(exported), load_external_data=False).graph)
    quantized = exported.with_name(f"{exported.stem}-int8.onnx")
    with _quiet("root"):
        quantize_dynamic(str(exported), str(quantized), weight_type=QuantType.QInt8, per_channel=True,
                         reduce_range=True, op_types_to_quantize=["MatMul"], nodes_to_exclude=keep_float)
    _fuse_for_onnxruntime(quantized, graph)


@contextmanager
def _quiet(*names: str):
    """The named loggers ("root": the root one) at ERROR for a block: the exporters' progress and advice
    lines are noise in a job's log."""
    loggers = [logging.getLogger(None if name == "root" else name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
