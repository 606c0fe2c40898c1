"""Evaluation: the seed's ablation (the same model with and without the mask) and its held-out tasks.

In: a model and tokenizer, the default registry. Out: the ablation's table and JSON (`batchmask ablate`).

    ablation.py   run_ablation: greedy, with and without the mask, on the same prompts
    taskgen.py    generated tool-use tasks (the held-out set, and the generator the recipe trains on)
    calc.py       the calc tool's exact arithmetic (checks the calls' answers)

Public names: batchmask.evaluation.ablation.run_ablation, batchmask.evaluation.taskgen.EVAL,
batchmask.evaluation.calc.eval_expr.
"""
