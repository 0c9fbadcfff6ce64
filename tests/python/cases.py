"""Random decode inputs for the tests, poisoned so that reading what must not be read shows.

KV rows past each request's seq_len and every unused page hold NaN; block table slots past the
last needed page hold an invalid page id; outputs are filled with NaN before each call.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from reference import reference


@dataclasses.dataclass
class Case:
    query: np.ndarray  # [B, q_len, H, D] or [T, H, D]
    kv_cache: np.ndarray  # [P, page_size, D] or [P, 1, page_size, D]
    block_tables: Optional[np.ndarray]  # [B, max_pages] int32
    seq_lens: np.ndarray  # [B] int32
    kv_lora_rank: int
    qk_rope_head_dim: int
    q_lens: List[int]  # n_b per request
    cum_seq_lens_q: Optional[np.ndarray] = None  # [B + 1] int32
    extra: Dict[str, Any] = dataclasses.field(default_factory=dict)  # further batch_decode args

    @property
    def num_heads(self) -> int:
        return self.query.shape[-2]

    def kwargs(self, **overrides: Any) -> Dict[str, Any]:
        """Keyword arguments of mla_decode.batch_decode (besides the four positional ones)."""
        kw = dict(
            kv_lora_rank=self.kv_lora_rank,
            qk_rope_head_dim=self.qk_rope_head_dim,
            cum_seq_lens_q=self.cum_seq_lens_q,
            **self.extra,
        )
        kw.update(overrides)
        return kw

    def args(self) -> tuple:
        return (self.query, self.kv_cache, self.block_tables, self.seq_lens)

    def poisoned_outputs(self, out_dtype: Any = np.float16) -> Dict[str, np.ndarray]:
        lead = self.query.shape[:-1]
        return dict(
            out=np.full(lead + (self.kv_lora_rank,), np.nan, dtype=out_dtype),
            lse=np.full(lead, np.nan, dtype=np.float32),
        )

    def reference(self, **overrides: Any) -> tuple:
        kw = dict(self.extra)
        kw.update(overrides)
        names = ("sinks", "mask", "sparse_indices", "sparse_topk_lens", "bmm1_scale", "bmm2_scale")
        return reference(
            self.query,
            self.kv_cache,
            self.block_tables,
            self.seq_lens,
            kv_lora_rank=self.kv_lora_rank,
            cum_seq_lens_q=self.cum_seq_lens_q,
            **{k: v for k, v in kw.items() if k in names},
        )


def make_case(
    rng: np.random.Generator,
    *,
    batch: int = 3,
    q_len: int = 1,
    heads: int = 4,
    kv_lora_rank: int = 32,
    rope_dim: int = 16,
    page_size: int = 4,
    seq_lens: Optional[Sequence[int]] = None,
    ragged_q_lens: Optional[Sequence[int]] = None,
    kv_4d: bool = False,
    dtype: Any = np.float32,
    spare_pages: int = 2,
) -> Case:
    """A dense (or, with ragged_q_lens, ragged) paged decode problem in `dtype`."""
    D = kv_lora_rank + rope_dim
    q_lens = list(ragged_q_lens) if ragged_q_lens is not None else [q_len] * batch
    batch = len(q_lens)
    if seq_lens is None:
        seq_lens = [int(rng.integers(n, n + 23)) for n in q_lens]
    seq_lens = np.asarray(seq_lens, dtype=np.int32)
    pages_needed = [-(-int(s) // page_size) for s in seq_lens]
    max_pages = max(pages_needed, default=0) + 1  # one slot past the last needed page
    num_pages = sum(pages_needed) + spare_pages
    physical = rng.permutation(num_pages).astype(np.int32)

    invalid_page = num_pages + 1000
    block_tables = np.full((batch, max_pages), invalid_page, dtype=np.int32)
    kv = np.full((num_pages, page_size, D), np.nan, dtype=np.float32)
    next_page = 0
    for b, s in enumerate(seq_lens):
        for logical in range(pages_needed[b]):
            page = physical[next_page]
            next_page += 1
            block_tables[b, logical] = page
            rows = min(page_size, int(s) - logical * page_size)
            kv[page, :rows] = rng.standard_normal((rows, D))
    kv = kv.astype(dtype)
    if kv_4d:
        kv = kv.reshape(num_pages, 1, page_size, D)

    H = heads
    if ragged_q_lens is not None:
        query = rng.standard_normal((sum(q_lens), H, D)).astype(dtype)
        cum = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    else:
        query = rng.standard_normal((batch, q_len, H, D)).astype(dtype)
        cum = None
    return Case(
        query=query,
        kv_cache=kv,
        block_tables=block_tables,
        seq_lens=seq_lens,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=rope_dim,
        q_lens=q_lens,
        cum_seq_lens_q=cum,
        extra=dict(bmm1_scale=1.0 / np.sqrt(D)),
    )


def fp8_ds_mla_cache(kv: np.ndarray) -> np.ndarray:
    """[..., 576] float values -> [..., 656] uint8 fp8_ds_mla rows (docs/contract.md, section 1): each group
    of 128 latent values quantized to float8_e4m3fn with scale = amax / 448 (as DeepSeek does),
    the 4 float32 scales, then the 64 rope values in bfloat16. Rows holding NaN (never to be read)
    become 0xff bytes: NaN values, NaN scales, NaN rope."""
    import ml_dtypes

    x = np.asarray(kv, dtype=np.float64)
    lead = x.shape[:-1]
    x = x.reshape(-1, 576)
    bad = np.isnan(x).any(axis=1)
    x = np.where(bad[:, None], 0.0, x)
    groups = x[:, :512].reshape(-1, 4, 128)
    scales = (np.maximum(np.abs(groups).max(axis=2), 1e-4) / 448.0).astype(np.float32)
    latent = np.clip(groups / scales[:, :, None].astype(np.float64), -448.0, 448.0)
    latent = latent.reshape(-1, 512).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    rope = x[:, 512:].astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
    rows = np.concatenate(
        [latent, scales.astype("<f4").view(np.uint8), rope.astype("<u2").view(np.uint8)], axis=1)
    rows[bad] = 0xFF
    return rows.reshape(lead + (656,))


def random_mask(rng: np.random.Generator, num_tokens: int, max_q_len: int) -> np.ndarray:
    """[tokens, W] uint32 mask rows (W = ceil(max_q_len / 32)) with random bits."""
    words = max(1, -(-max_q_len // 32))
    bits = rng.random((num_tokens, words * 32)) < 0.5
    return np.packbits(bits, axis=1, bitorder="little").view(np.uint32).copy()


def sparse_case(
    rng: np.random.Generator,
    case: Case,
    top_k: int,
    *,
    with_missing: bool = True,
) -> np.ndarray:
    """[tokens..., top_k] int32 flat KV slots inside the written rows of `case` (-1 for some)."""
    page_size = case.kv_cache.shape[-2]
    valid = []
    for b, s in enumerate(case.seq_lens):
        for j in range(int(s)):
            valid.append(int(case.block_tables[b, j // page_size]) * page_size + j % page_size)
    lead = case.query.shape[:-2]
    indices = rng.choice(np.asarray(valid, dtype=np.int32), size=lead + (top_k,))
    if with_missing:
        indices[rng.random(indices.shape) < 0.2] = -1
    return indices.astype(np.int32)
