"""A corpus of the shapes real libraries give their `@triton.autotune` kernels, each tiny enough
for the interpreter: a user package that `corpus_run.py` imports as is (with `triton.autotune`)
or with the decorator swapped (`triton.autotune = kernelsearch.autotune` before the import).

Each entry module defines `run() -> dict[str, torch.Tensor]`: its op called as the library calls
it, on seeded inputs. Importing this package imports no kernel (the test process reads ENTRIES
only)."""

ENTRIES = (
    # FlagGems' vendor/backend folders: module plus qualified name well over 100 characters
    "vendored_inference_runtime.backends.triton_backend.fused_elementwise_operators."
    "rowwise_gain_and_bias_kernels",
    # a non-ASCII module and kernel name (PEP 3131 identifiers)
    "ядра.масштабирование",
    # torchao / vLLM: a kernel launched through torch.library.triton_op and wrap_triton
    "torch_library_ops",
    # gemlite's and Liger's keys: floats, bools, strings, Triton dtypes and None
    "mixed_keys",
    # mamba_ssm / fla: @triton.heuristics stacked under @triton.autotune
    "heuristics_stack",
    # gemlite / vLLM fused_moe: prune_configs_by (early prune, perf model, top_k)
    "pruned",
    # gemlite's pruner: it yields new configs with constexprs the list never sets
    "rewriting_prune",
    # Liger's DyT (reset_to_zero) and gemlite (restore_value) around an in-place update
    "accumulate",
    # Liger's DyT backward: per-program partials in a scratch buffer whose filled slots depend
    # on the config
    "scratch_partials",
    # a serving engine: one kernel called from several threads at once
    "threaded",
    # fla's optional gate and Liger's optional bias: a tensor or None
    "optional_tensor",
    # a library's own benchmark function (do_bench=)
    "custom_bench",
)
