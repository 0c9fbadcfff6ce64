"""mla_decode: Multi-head Latent Attention (MLA) decode for DeepSeek-style models.

Native API: :func:`batch_decode` (one call), :func:`plan` / :meth:`Plan.run` (plan once per decode
step, run every layer), :func:`workspace_size` / :func:`make_workspace`. FlashInfer-compatible:
:func:`trtllm_batch_decode_with_kv_cache_mla`. Context parallelism: :func:`merge_states` and
:mod:`mla_decode.distributed`. Tensors from PyTorch, NumPy, CuPy or JAX (DLPack);
the contract is docs/contract.md.
"""

from ._api import (
    BACKENDS,
    Plan,
    available_backends,
    batch_decode,
    make_workspace,
    plan,
    run,
    workspace_size,
)
from ._lib import library_path
from ._merge import merge_states
from .flashinfer import trtllm_batch_decode_with_kv_cache_mla

__version__ = "0.1.0"

__all__ = [
    "BACKENDS",
    "Plan",
    "available_backends",
    "batch_decode",
    "library_path",
    "make_workspace",
    "merge_states",
    "plan",
    "run",
    "trtllm_batch_decode_with_kv_cache_mla",
    "workspace_size",
]
