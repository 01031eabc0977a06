"""The global batch of a training step, a function of (seed, step) and the token data only.

docs/design.md section 3: the batch never depends on the plan, so every plan trains on exactly the
same sequences, and each rank can draw the batch itself and keep the rows of its own
micro-batches. As in nanoGPT's ``get_batch``, row r is a window of seq_len + 1 consecutive
tokens starting at a uniformly drawn offset (with replacement); inputs are its first seq_len
tokens, labels its last seq_len (shifted by one).

Offsets are the raw 64-bit outputs of NumPy's PCG64 seeded by SeedSequence([seed, step]),
reduced modulo the number of possible starts: a stream of its own, untouched by any global
RNG, and the same across processes, machines and NumPy versions (NEP 19 keeps the raw
streams of bit generators stable, unlike Generator methods such as ``integers``). The modulo
bias is below (possible starts) / 2^64, under 1e-9 for any file of fewer than 2^34 tokens.
"""

from __future__ import annotations

import numpy as np
import torch

from piebald.errors import SpecError
from piebald.runtime.data.token_file import TokenFile

__all__ = ["batch_for_step", "batch_offsets"]

# Training reads an array only for the corpus shipped with piebald (no --data given).
_BUILTIN_CORPUS = "the built-in corpus (no --data)"


def batch_offsets(
    num_tokens: int, *, seed: int, step: int, global_batch_size: int, seq_len: int
) -> np.ndarray:
    """Start offsets of the rows of step ``step``, int64 [global_batch_size]."""
    if seed < 0 or step < 0:
        raise ValueError(f"seed ({seed}) and step ({step}) must be >= 0")
    if global_batch_size < 1 or seq_len < 1:
        raise ValueError(
            f"global_batch_size ({global_batch_size}) and seq_len ({seq_len}) must be >= 1"
        )
    bits = np.random.PCG64(np.random.SeedSequence([seed, step])).random_raw(global_batch_size)
    # A window needs seq_len + 1 tokens: the last start is num_tokens - seq_len - 1.
    num_starts = np.uint64(num_tokens - seq_len)
    return (np.asarray(bits, dtype=np.uint64) % num_starts).astype(np.int64)


def batch_for_step(
    tokens: TokenFile | np.ndarray,
    *,
    seed: int,
    step: int,
    global_batch_size: int,
    seq_len: int,
    source: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels), int64 [global_batch_size, seq_len] each, labels = inputs shifted by one.

    ``tokens`` is a token file or any 1-D integer array (training passes ``corpus_tokens()``,
    the built-in corpus, which errors name unless ``source`` says where the array came from).
    """
    array = tokens.tokens if isinstance(tokens, TokenFile) else tokens
    num_tokens = int(array.shape[0])
    if num_tokens < seq_len + 1:
        if source is None:
            source = str(tokens.path) if isinstance(tokens, TokenFile) else _BUILTIN_CORPUS
        raise SpecError(
            source=source,
            field="seq_len",
            value=seq_len,
            expected=f"at most {num_tokens - 1}: the data holds {num_tokens} tokens and a "
            "row needs seq_len + 1",
        )
    offsets = batch_offsets(
        num_tokens, seed=seed, step=step, global_batch_size=global_batch_size, seq_len=seq_len
    )
    # [B, 1] + [1, seq_len + 1]: fancy indexing reads only these windows of a memory map.
    windows = array[offsets[:, None] + np.arange(seq_len + 1)].astype(np.int64)
    batch = torch.from_numpy(windows)  # [B, seq_len + 1]
    return batch[:, :-1].contiguous(), batch[:, 1:].contiguous()
