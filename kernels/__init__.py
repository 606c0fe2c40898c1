"""Masking kernels. `tables` (the grammar and row state as the kernels read them), `mask_torch` (the dense
reference, any device), `mask_cpu` / `choose_cpu` (its CPU fast paths), `gumbel` (the random draw of every
backend), `rng` (the counter hash) and `mask_triton` (CUDA; imported lazily, so importing batchmask never
requires triton)."""
