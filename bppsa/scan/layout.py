"""How a sequence is laid out for a scan: a block-diagonal map's blocks as batch rows, and the
equal chunks a chunked scan runs over (one chunk program compiled, whatever T)."""

from __future__ import annotations

from jax import Array

__all__ = ["to_blocks", "block_rows", "equal_chunks"]


def to_blocks(a: Array, k: int) -> Array:
    """(..., B, S) -> (..., B·S/k, k): a block-diagonal map's blocks become batch rows.

    Args:
      a: (..., B, S) vectors, S a multiple of k.
      k: the block size.

    Returns:
      (..., B·S/k, k), each row one block's k entries.
    """
    return a.reshape(a.shape[:-2] + (a.shape[-2] * (a.shape[-1] // k), k))


def block_rows(blocks: Array) -> Array:
    """(..., B, S/k, k, k) Jacobian blocks -> (..., B·S/k, k, k), the scans' batch of matrices.

    Args:
      blocks: (..., B, S/k, k, k) the diagonal blocks of each batch row's matrix.

    Returns:
      (..., B·S/k, k, k), the rows in the order :func:`to_blocks` gives the vectors.
    """
    return blocks.reshape(blocks.shape[:-4] + (-1,) + blocks.shape[-2:])



def equal_chunks(T: int, chunk_size: int) -> tuple[int, int]:
    """(n, C): the fewest chunks of at most ``chunk_size`` steps covering T, n of one length C =
    ⌈T / n⌉ (n·C − T < n steps of padding), so a chunked loop compiles one chunk program.

    Args:
      T: the number of steps.
      chunk_size: the most steps a chunk may have (>= 1).

    Returns:
      (n, C), the number of chunks and their common length.
    """
    n = -(-T // chunk_size)
    return n, -(-T // n)


