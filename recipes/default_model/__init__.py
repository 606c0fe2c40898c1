"""The recipe that trained the embedded default model (batchmask/models/default/, see its CARD.md).

    python -m recipes.default_model.train --out models/default --minutes 26.5 --threads 2

Run from the repository root. It uses the installed library (prompt protocol, registry, the eval split of
batchmask.evaluation.taskgen, the llama2.c runtime); nothing in the library imports it.
"""
