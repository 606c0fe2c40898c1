"""Masking kernels: `mask_torch` (the reference, any device) and `mask_triton` (imported lazily, so that
importing batchmask never requires triton)."""
