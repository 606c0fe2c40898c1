"""The run: the `batchmask` command line and everything a generation run reads, writes and shows.

In: task files, flags, a model and tokenizer (batchmask.models), grammars (batchmask.api). Out: result JSON
Lines, the run's fingerprint, progress on stderr. Uses every stage below; nothing below imports it.

    cli.py            the commands (generate, ablate, compile, check-kernels); cli_grammar.py its cache files
                      cli_format.py its argparse (one error line, defaults in --help, --version)
    loading.py        device, dtype, model, tokenizer and registry a command loads
    generation.py     the generation loop (continuous batching)
    grammar_store.py  each distinct tool set compiled once, cached in memory and on disk; waves.py cuts a run
                      into waves of tool sets; schema_task.py tasks answered by one JSON value of a schema
    runfiles.py       task and result files; fingerprint.py the run's fingerprint; locks.py exclusive locks;
                      out_paths.py output paths checked before any work
    openai_batch.py   OpenAI Batch API request files in, Batch API output lines out
    distributed.py    where results go, on one process or under torchrun (--resume, one output in order)
    limits.py         bounds on every number a user gives; interrupts.py Ctrl-C; display.py what a person sees

Public names: batchmask.run.cli.main (the console script is batchmask.console:main),
batchmask.run.generation.{BatchGenerator, GenerationConfig}.
"""
