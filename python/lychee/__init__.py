"""lychee: long-context LLM inference with LycheeDecode hybrid-head sparse decoding.

    import lychee
    engine = lychee.Engine()                      # the default model (scripts/fetch_assets.sh)
    print(engine.generate("The capital of France is", max_tokens=16).text)
    outs = engine.generate(["Once upon a time", "The sea"], lychee.SamplingParams(max_tokens=16))
    for piece in engine.stream("Once upon a time", max_tokens=32):
        print(piece, end="", flush=True)
    out = engine.generate("...", policy=lychee.policy.Lychee(budget=256, block_size=16))
    reply = engine.chat([{"role": "user", "content": "Hi"}], format="openai")

Engine generates; SamplingParams holds a request's settings; lychee.policy holds the attention
policies; docs/python.md is the reference. lychee.ops (a CUDA build) runs the decode-attention and
selection kernels on torch tensors.
"""
import os as _os

# libgomp reads its wait policy once, when it loads (with the extension below): short spins, then
# sleep, as the CLI does (src/runtime/threads.h), unless the caller chose a policy.
if "OMP_WAIT_POLICY" not in _os.environ and "GOMP_SPINCOUNT" not in _os.environ:
    _os.environ["GOMP_SPINCOUNT"] = "1000"

from . import _lychee  # noqa: E402
from ._lychee import (  # noqa: E402
    CapacityError,
    Completion,
    CudaError,
    EngineBusyError,
    Error,
    HeadRoles,
    InternalError,
    InvalidArgumentError,
    InvalidFileError,
    NotFoundError,
    Stream,
    UnsupportedError,
    cuda_device_status,
    default_model_path,
    load_head_roles,
    models_dir,
)
# The engine's exceptions are defined in lychee._lychee; they are shown (and pickled) as lychee.<name>.
for _error in (CapacityError, CudaError, EngineBusyError, Error, InternalError, InvalidArgumentError,
               InvalidFileError, NotFoundError, UnsupportedError):
    _error.__module__ = __name__
del _error

from . import policy  # noqa: E402
from .sampling import SamplingParams  # noqa: E402
from ._engine import Engine, read_weights, select_units_reference, train_heads  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "CapacityError", "Completion", "CudaError", "Engine", "EngineBusyError", "Error", "HeadRoles", "InternalError",
    "InvalidArgumentError", "InvalidFileError", "NotFoundError", "SamplingParams", "Stream", "UnsupportedError",
    "cuda_device_status", "default_model_path", "load_head_roles", "models_dir", "policy",
    "read_weights", "select_units_reference", "train_heads",
]
