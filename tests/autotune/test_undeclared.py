"""A plain `@triton.autotune` kernel with only the decorator swapped, no declaration: tuned here
as Triton would by default, shared through the service after the correctness check against the
first config, and served to a fresh process with no benchmark; a grown config list measures only
what is new; Triton's autotuner behaviours hold (hooks, pruning, one cache entry per key)."""
from __future__ import annotations

from trusted_records import trusted

import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl
from at_env import HERE, child_env, run_user
from svc_helpers import LiveServer, settings_for

import kernelsearch
from kernelsearch.kernels import registry
from kernelsearch.kernels.undeclared import Definition, UndeclaredKernel, written_mismatches
from kernelsearch import backends, identity, options
from kernelsearch.service.api import create_app
from kernelsearch.options import Source

pytestmark = [pytest.mark.timeout(600), pytest.mark.tune_default,
              pytest.mark.usefixtures("isolated_client")]
NAME = "ks_undeclared_user.scale_kernel"


def _user(n: int, dtype: str, env: dict) -> dict:
    return run_user("ks_undeclared_user.py", n, dtype, env=env)


def test_tuned_once_then_served_to_fresh_processes(sqlite_store) -> None:
    app = create_app(settings_for(sqlite_store.url), store=sqlite_store)
    with LiveServer(app) as srv:
        env = child_env(KS_SERVICE_URL=srv.url, KS_AUTOTUNE_FALLBACK="tune")
        first = _user(200, "float32", env)
        assert first["sources"] == ["tuned_here"] and first["benched"] == 3
        # The kernel is known to the service by its definition alone, keyed by Triton's key.
        kernels = {k["name"]: k for k in sqlite_store.kernel_definitions().values()}
        assert NAME in {d["name"] for d in kernels.values()}
        (rec,) = sqlite_store.list_records(kernel=NAME)
        assert rec.axes == {"n": 200, "x_ptr.dtype": "float32", "y_ptr.dtype": "float32"}
        assert len(rec.config_timings) == 3 and rec.config["BLOCK"] == first["best"]
        import httpx

        names = [k["name"] for k in httpx.get(f"{srv.url}/v1/kernels").json()]
        assert NAME in names
        # A fresh process (fresh Triton cache) is served without benchmarking anything.
        second = _user(200, "float32", env)
        assert second == {"sources": ["service"], "benched": 0, "best": first["best"]}
        # Another dtype is another key: tuned, not served the float32 record.
        other = _user(200, "float64", env)
        assert other["sources"] == ["tuned_here"] and other["benched"] == 3
        # A grown config list measures only its new config, and the merged record serves the
        # next process with no benchmark at all.
        grown = _user(200, "float32", {**env, "KS_TEST_EXTRA": "1"})
        assert grown["benched"] == 1
        again = _user(200, "float32", {**env, "KS_TEST_EXTRA": "1"})
        assert again["benched"] == 0
        # It shows where a declared kernel shows: /v1/best, the dashboard, exports.
        from kernelsearch.kernels.device import INTERPRETER_DEVICE

        best = httpx.get(f"{srv.url}/v1/best", params={
            "kernel": NAME, "device": INTERPRETER_DEVICE, "n": 200, "x_ptr.dtype": "float32",
            "y_ptr.dtype": "float32"})
        assert best.status_code == 200, best.text
        assert best.json()["match"] == "exact" and best.json()["config"]["BLOCK"] == again["best"]
        assert best.json()["same_versions"] is True  # the decorator's identity is the service's
        for page in ("/", f"/kernels/{NAME}"):
            got = httpx.get(srv.url + page)
            assert got.status_code == 200 and NAME in got.text, (page, got.text[:300])
        doc = sqlite_store.export_records(kernel=NAME)
        assert len(doc["records"]) == 2 and all(r["config_timings"] for r in doc["records"])


def test_service_down_tunes_here_without_error(monkeypatch) -> None:
    monkeypatch.setenv("KS_SERVICE_URL", "http://127.0.0.1:9")  # nothing listens there
    import ks_undeclared_user as u

    u.scale_kernel.forget()
    u.BENCHED.clear()
    x = torch.randn(300)
    torch.testing.assert_close(u.scale(x), 2 * x)
    assert list(u.scale_kernel.sources.values()) == [Source.TUNED_HERE]
    assert len(u.BENCHED) == 3
    kdef = registry.get_kernel(NAME)
    assert isinstance(kdef, UndeclaredKernel)
    assert [a.name for a in kdef.axes] == ["n", "x_ptr.dtype", "y_ptr.dtype"]
    assert kdef.axes[1].categorical and "bfloat16" in kdef.axes[1].choices


def test_a_record_of_other_code_or_another_config_list_is_not_served(sqlite_store,
                                                                      monkeypatch) -> None:
    import ks_undeclared_user as u

    monkeypatch.setenv("KS_DATABASE_URL", sqlite_store.url)
    u.scale_kernel.forget()
    x = torch.randn(64)
    u.scale(x)  # tunes and shares into the local store
    backends.BACKENDS.drain(20)
    (rec,) = sqlite_store.list_records(kernel=NAME)
    assert len(rec.config_timings) == 3
    # The same record, but tuned on other code: not served, tuned again.
    from dataclasses import asdict

    from kernelsearch.db.views import RecordIn

    fields = {k: v for k, v in asdict(rec).items() if k in RecordIn.__dataclass_fields__}
    sqlite_store.upsert_best(trusted(RecordIn(**{**fields, "source_hash": "0" * 16,
                                         "latency_median_us": rec.latency_median_us / 2,
                                         "latency_min_us": rec.latency_min_us / 2})))
    u.scale_kernel.forget()
    backends.BACKENDS.reset()
    u.BENCHED.clear()
    u.scale(x)
    assert list(u.scale_kernel.sources.values()) == [Source.TUNED_HERE] and len(u.BENCHED) == 3


def test_a_winner_that_writes_other_values_is_not_shared(sqlite_store, monkeypatch, caplog) -> None:
    monkeypatch.setenv("KS_DATABASE_URL", sqlite_store.url)

    def bench_prefers_last(fn, quantiles=None, **_kw):
        fn()
        bench_prefers_last.n += 1
        return [10.0 - bench_prefers_last.n] * 3
    bench_prefers_last.n = 0

    @kernelsearch.autotune(configs=[triton.Config({"SHIFT": 0}), triton.Config({"SHIFT": 1})],
                           key=["n"], do_bench=bench_prefers_last)
    @triton.jit
    def wrong_kernel(x_ptr, y_ptr, n, SHIFT: tl.constexpr):
        offs = tl.arange(0, 64)
        m = offs < n
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) + SHIFT, mask=m)

    x, y = torch.randn(64), torch.empty(64)
    wrong_kernel[(1,)](x, y, 64)
    assert wrong_kernel.best_config.kwargs["SHIFT"] == 1  # Triton's pick, used here
    backends.BACKENDS.drain(20)
    assert "does not write what the first config writes" in caplog.text
    assert sqlite_store.list_records(kernel=wrong_kernel.undeclared.name) == []


def test_written_tensors_compare_at_their_dtype() -> None:
    before = [torch.zeros(4), torch.zeros(4, dtype=torch.int32), 3]
    first = [torch.ones(4), torch.ones(4, dtype=torch.int32), 3]
    close = [torch.ones(4) * (1 + 1e-6), torch.ones(4, dtype=torch.int32), 3]
    far = [torch.ones(4) * 1.01, torch.ones(4, dtype=torch.int32), 3]
    ints = [torch.ones(4), torch.full((4,), 2, dtype=torch.int32), 3]
    assert written_mismatches(before, first, close)[1] == []
    assert "argument 0" in written_mismatches(before, first, far)[1][0]
    assert "exact" in written_mismatches(before, first, ints)[1][0]


def test_a_half_precision_split_k_rounding_is_shared_and_a_wrong_result_is_not() -> None:
    """Partial sums added atomically in a float16 output round at every add (gemlite's 4-bit GEMV
    on the H200 differed from its first config by 2.9e-3): such a winner is shared; an output off
    by a few percent, as a config that drops a block would be, is not."""
    gen = torch.Generator().manual_seed(0)
    ref = torch.randn(4096, generator=gen).half()
    rounded = (ref.float() * (1 + 3e-3 * torch.randn(4096, generator=gen))).half()
    wrong = ref.clone()
    wrong[:100] = 0
    before = [torch.zeros(4096, dtype=torch.float16)]
    assert written_mismatches(before, [ref], [rounded])[1] == []
    assert "argument 0" in written_mismatches(before, [ref], [wrong])[1][0]
    assert "argument 0" in written_mismatches(before, [ref.bfloat16()], [(ref * 1.1).bfloat16()])[1][0]


def test_a_reset_to_zero_partials_buffer_is_compared_by_its_total() -> None:
    """Liger DyT's partials: the config decides which slots its programs fill, so a scratch
    buffer (reset_to_zero) of other filled slots but the same total is the same result; a wrong
    total, wrong values in the same slots, or a wrong real output are not."""
    x = torch.arange(1.0, 9.0)
    before = [torch.zeros(8), torch.zeros(8)]
    first = [torch.tensor([3.0, 7, 11, 15, 0, 0, 0, 0]), x.clone()]  # BLOCK 2: four programs
    other = [torch.tensor([10.0, 26, 0, 0, 0, 0, 0, 0]), x.clone()]  # BLOCK 4: two programs
    assert written_mismatches(before, first, other, scratch={0}) == (0.0, [])
    assert "argument 0" in written_mismatches(before, first, other)[1][0]  # not scratch: compared
    wrong_total = [torch.tensor([10.0, 27, 0, 0, 0, 0, 0, 0]), x.clone()]
    assert "total of a reset_to_zero" in written_mismatches(before, first, wrong_total, {0})[1][0]
    same_slots = [torch.tensor([7.0, 3, 11, 15, 0, 0, 0, 0]), x.clone()]  # an atomics output
    assert "argument 0" in written_mismatches(before, first, same_slots, {0})[1][0]
    wrong_output = [other[0], x.flip(0)]
    assert "argument 1" in written_mismatches(before, first, wrong_output, {0})[1][0]


def test_every_key_value_triton_accepts_keys_a_category() -> None:
    """Floats (exactly), strings, Triton and torch dtypes and None key as typed tokens, integers
    and flags as integers; "nearest" never crosses a token, and a fresh process's query text
    parses back to the same case."""
    import triton.language as tl

    defn = Definition(name="m.k", module="m", qualname="k", arg_names=("x", "n", "s", "a", "d", "o", "f"),
                      key=("n", "s", "a", "d", "o", "f"), dtype_args=("x",),
                      configs=({"B": 1, "num_warps": 4},), source_hash="ab")
    x = torch.zeros(2)
    axes = defn.case_axes({"x": x, "n": 96, "s": 0.1, "a": "relu", "d": tl.float16, "o": None,
                           "f": True})
    assert axes == {"n": 96, "s": "float:0.1", "a": "str:relu", "d": "tl:fp16", "o": "none", "f": 1,
                    "x.dtype": "float32"}
    assert defn.case_axes({"x": x, "n": 96, "s": (1, 2), "a": "", "d": 1, "o": 1, "f": 1}) is None
    kdef = identity.kernel_def(defn)
    assert kdef.validate_axes({k: str(v) for k, v in axes.items()}) == axes
    near = {**axes, "n": 128}
    assert kdef.distance(axes, near) < float("inf")
    assert kdef.distance(axes, {**near, "s": "float:0.10000000000000002"}) == float("inf")
    assert kdef.distance(axes, {**near, "s": 0}) == float("inf")


def test_definition_refuses_bad_documents() -> None:
    good = {"name": "m.k", "module": "m", "qualname": "k", "arg_names": ["x", "n"], "key": ["n"],
            "dtype_args": ["x"], "configs": [{"B": 1, "num_warps": 4}], "source_hash": "ab"}
    assert Definition.from_json(good).axis_names() == ("n", "x.dtype")
    for bad, field in [({**good, "configs": []}, "configs"), ({**good, "key": ["m"]}, "key"),
                       ({**good, "name": ""}, "name"),
                       ({**good, "configs": [{"B": [1]}]}, "configs[0].B")]:
        with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
            Definition.from_json(bad)


def test_triton_autotuner_behaviours_on_an_undeclared_kernel() -> None:
    """Triton's own autotuner tests' behaviours: one cache entry per key whatever the keyword
    order, reset_to_zero (a None argument too) and restore_value around every benchmark,
    prune_configs_by with perf_model and top_k, and a prune to nothing raising Triton's error."""

    def early(configs, nargs, **kw):
        return [c for c in configs if c.kwargs["BLOCK"] <= nargs["n"]]

    def perf_model(**kw):
        return kw["BLOCK"]  # prefers the smallest block: top_k=2 keeps 16 and 32

    @kernelsearch.autotune(configs=[triton.Config({"BLOCK": b}) for b in (16, 32, 64, 1024)],
                           key=["n"], reset_to_zero=["acc_ptr", "opt_ptr"], restore_value=["x_ptr"],
                           prune_configs_by={"early_config_prune": early, "perf_model": perf_model,
                                             "top_k": 2},
                           do_bench=lambda fn, quantiles=None: (fn(), [1.0, 1.0, 1.0])[1])
    @triton.jit
    def acc_kernel(x_ptr, acc_ptr, opt_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        x = tl.load(x_ptr + offs, mask=m)
        tl.atomic_add(acc_ptr + offs, x, mask=m)
        tl.store(x_ptr + offs, x * 0.0, mask=m)  # restore_value puts it back between runs

    x = torch.randn(100)
    x0 = x.clone()
    acc = torch.zeros(100)
    grid = lambda meta: (triton.cdiv(100, meta["BLOCK"]),)  # noqa: E731
    acc_kernel[grid](x, acc, None, 100)
    # Every benchmark started from zero and the restored input: one run's sum is left.
    torch.testing.assert_close(acc, x0)
    assert acc_kernel.best_config.kwargs["BLOCK"] in (16, 32)
    assert list(acc_kernel.sources.values()) == [Source.TUNED_HERE]
    acc_kernel[grid](x_ptr=x0.clone(), n=100, acc_ptr=torch.zeros(100), opt_ptr=None)
    assert len(acc_kernel.cache) == 1  # the same key, keywords in another order
    with pytest.raises(triton.runtime.autotuner.AutotunerError, match="pruning"):
        acc_kernel[grid](x, acc, None, 8)  # no config has BLOCK <= 8


def test_pre_and_post_hooks_come_in_pairs() -> None:
    events: list[str] = []

    def pre(nargs, reset_only=False):
        events.append("reset" if reset_only else "pre")

    def post(nargs, exception):
        events.append("post")

    @kernelsearch.autotune(configs=[triton.Config({"BLOCK": b}) for b in (16, 32, 64)], key=["n"],
                           pre_hook=pre, post_hook=post,
                           do_bench=lambda fn, quantiles=None: (fn(), [1.0, 1.0, 1.0])[1])
    @triton.jit
    def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)

    x, y = torch.randn(50), torch.empty(50)
    copy_kernel[lambda meta: (triton.cdiv(50, meta["BLOCK"]),)](x, y, 50)
    torch.testing.assert_close(y, x)
    # One pre and one post per benchmarked config, then Triton's reset before the real launch.
    assert events.count("pre") == events.count("post") == 3 and events[-1] == "reset"


def test_an_optional_tensor_passed_as_none_keys_its_own_record(sqlite_store, monkeypatch) -> None:
    """A library calls one kernel with an optional tensor and, elsewhere, with None (Triton's key
    then lacks that dtype): both calls are keyed, shared and served."""
    monkeypatch.setenv("KS_DATABASE_URL", sqlite_store.url)

    @kernelsearch.autotune(configs=[triton.Config({"BLOCK": b}) for b in (16, 32)], key=["n"],
                           do_bench=lambda fn, quantiles=None: (fn(), [1.0, 1.0, 1.0])[1])
    @triton.jit
    def maybe_gated(x_ptr, g_ptr, y_ptr, n, HAS_G: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        x = tl.load(x_ptr + offs, mask=m)
        if HAS_G:
            x = x * tl.load(g_ptr + offs, mask=m)
        tl.store(y_ptr + offs, x, mask=m)

    x, g, y = torch.randn(40), torch.randn(40), torch.empty(40)
    grid = lambda meta: (triton.cdiv(40, meta["BLOCK"]),)  # noqa: E731
    maybe_gated[grid](x, g, y, 40, HAS_G=True)
    torch.testing.assert_close(y, x * g)
    maybe_gated[grid](x, None, y, 40, HAS_G=False)
    torch.testing.assert_close(y, x)
    backends.BACKENDS.drain(20)
    recs = sqlite_store.list_records(kernel=maybe_gated.undeclared.name)
    assert sorted(r.axes["g_ptr.dtype"] for r in recs) == ["float32", "none"]
    # A fresh resolution of both keys is served from the store, no benchmark.
    maybe_gated.forget()
    backends.BACKENDS.reset()
    maybe_gated[grid](x, g, y, 40, HAS_G=True)
    maybe_gated[grid](x, None, y, 40, HAS_G=False)
    assert set(maybe_gated.sources.values()) == {Source.STORE}


_CPU_PROGRAM = """
{first}
import torch, triton, triton.language as tl
@triton.jit
def twice(v):  # a helper decorated before kernelsearch is used, calling tl's own jit functions
    return tl.maximum(v * 2.0, tl.cdiv(3, 2) * 0.0 - 1e30)
@kernelsearch.autotune(configs=[triton.Config({{'B': 16}}), triton.Config({{'B': 32}})], key=['n'])
@triton.jit
def k(x, y, n, B: tl.constexpr):
    o = tl.program_id(0) * B + tl.arange(0, B)
    tl.store(y + o, twice(tl.load(x + o, mask=o < n)) + 0.0 * tl.max(o, axis=0), mask=o < n)
x, y = torch.randn(40), torch.empty(40)
k[lambda m: (triton.cdiv(40, m['B']),)](x, y, 40)
print('same', torch.equal(2 * x, y))
"""


@pytest.mark.parametrize("first", ["import kernelsearch\nimport triton.language",
                                   "import triton.language\nimport kernelsearch"])
def test_on_a_cpu_the_import_order_does_not_matter(first: str, tmp_path) -> None:
    """No GPU (none visible), no TRITON_INTERPRET: whatever was decorated first, the interpreter
    runs it (`kernelsearch.kernels.interpreter`)."""
    env = {k: v for k, v in child_env(CUDA_VISIBLE_DEVICES="").items() if k != "TRITON_INTERPRET"}
    program = tmp_path / "cpu_user.py"  # compiled-mode @triton.jit needs a source file
    program.write_text(_CPU_PROGRAM.format(first=first))
    out = subprocess.run([sys.executable, str(program)], env=env,
                         capture_output=True, text=True, timeout=300, cwd=HERE)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("same True")


def test_one_declaration_keys_each_dtype(sqlite_store, monkeypatch, caplog) -> None:
    """declare(dtypes={arg: [...]}) is a categorical axis: fp32 and fp64 calls each get their own
    record; a dtype outside the list says so once and is tuned here, not shared."""
    import logging

    caplog.set_level(logging.INFO, logger="kernelsearch")
    monkeypatch.setenv("KS_DATABASE_URL", sqlite_store.url)

    @kernelsearch.autotune(configs=[triton.Config({"BLOCK": b}) for b in (16, 32)], key=["n"],
                           do_bench=lambda fn, quantiles=None: (fn(), [1.0, 1.0, 1.0])[1])
    @triton.jit
    def twice_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)

    def twice(x):
        y = torch.empty_like(x)
        twice_kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, y, x.numel())
        return y

    def make(axes, *, seed, distribution="benchmark", device="cpu"):
        dt = getattr(torch, axes["x_ptr.dtype"])
        return (torch.randn(int(axes["n"]), generator=torch.Generator().manual_seed(seed)).to(dt),)

    kdef = twice_kernel.declare(
        name="ks_test_twice_dtypes", launch=twice, make_inputs=make, axes=("n",),
        dtypes={"x_ptr": [torch.float32, torch.float64]}, input_names=("x",),
        output_names=("y",), bytes_moved=lambda a: 8 * int(a["n"]), rtol=1e-6, register=False)
    assert [a.name for a in kdef.axes] == ["n", "x_ptr.dtype"] and kdef.axes[1].categorical
    named32 = {"x_ptr": torch.zeros(8), "y_ptr": torch.zeros(8), "n": 8}
    named64 = {**named32, "x_ptr": torch.zeros(8, dtype=torch.float64)}
    assert twice_kernel.case_key(named32).axes_dict == {"n": 8, "x_ptr.dtype": "float32"}
    assert twice_kernel.case_key(named64).axes_dict == {"n": 8, "x_ptr.dtype": "float64"}
    assert twice_kernel.case_key({**named32, "x_ptr": torch.zeros(8, dtype=torch.float16)}) is None
    assert twice_kernel.case_key({**named32, "x_ptr": torch.zeros(8, dtype=torch.int32)}) is None
    assert caplog.text.count("called outside its declaration") == 1


def test_a_server_setting_typo_is_no_concern_of_the_decorator(monkeypatch, caplog) -> None:
    """The decorator reads its own settings (ClientSettings): a bad KS_LEASE_SECONDS, a server
    setting, neither warns nor changes its policy."""
    monkeypatch.setenv("KS_LEASE_SECONDS", "soon")
    monkeypatch.setenv("KS_HEARTBEAT_SECONDS", "100")
    monkeypatch.setenv("KS_AUTOTUNE_FALLBACK", "first")
    opts = options.Options.from_env()
    assert opts.fallback is options.Fallback.FIRST
    backends.BACKENDS.prepare()
    assert "KS_LEASE_SECONDS" not in caplog.text and "not prepared" not in caplog.text


def test_a_registered_definition_asks_no_process_to_import_the_users_module() -> None:
    """A trial child imports the modules the registry names (plugin_modules): an undeclared
    kernel's module is the user's program, which a worker or its child may not be able to import
    (a service that loaded a definition would fail every job's trial runner at start)."""
    from kernelsearch.service.definitions import register_definition

    doc = {"name": "no_such_pkg.k", "module": "no_such_pkg", "qualname": "k", "arg_names": ["x", "n"],
           "key": ["n"], "dtype_args": ["x"], "configs": [{"B": 1, "num_warps": 4}],
           "source_hash": "ab"}
    register_definition(doc)
    try:
        assert "no_such_pkg" not in registry.plugin_modules()
    finally:
        registry.unregister("no_such_pkg.k")


def test_torch_compile_resolves_at_trace_time(sqlite_store, monkeypatch) -> None:
    """Dynamo never calls run(): it traces early_config_prune, which hands it the served config
    alone. On the CPU Dynamo does not take Triton kernels into its graph, so the test traces the
    prune itself, as Dynamo does with a compiled call's arguments (the GPU run compiles a kernel)."""
    import ks_undeclared_user as u

    monkeypatch.setenv("KS_DATABASE_URL", sqlite_store.url)
    u.scale_kernel.forget()
    u.scale(torch.randn(64))  # tunes and shares into the local store
    backends.BACKENDS.drain(20)
    (rec,) = sqlite_store.list_records(kernel=NAME)
    u.scale_kernel.forget()
    backends.BACKENDS.reset()
    prune, configs = u.scale_kernel.early_config_prune, u.scale_kernel.configs

    def traced(x: torch.Tensor, n: int) -> torch.Tensor:
        picked = prune(configs, {"x_ptr": x, "y_ptr": x, "n": n})
        return x * len(picked) + picked[0].kwargs["BLOCK"]

    x = torch.zeros(8)
    got = torch.compile(traced, fullgraph=True, backend="eager")(x, 64)
    assert torch.equal(got, torch.full((8,), float(rec.config["BLOCK"])))
    assert list(u.scale_kernel.sources.values()) == [Source.STORE]
    # A key with no record: every config, as torch.compile would tune without kernelsearch.
    got = torch.compile(traced, fullgraph=True, backend="eager")(x, 96)
    assert torch.equal(got, torch.full((8,), float(configs[0].kwargs["BLOCK"])))
    # Outside compile, the prune is the user's (here none): the whole list.
    assert prune(configs, {"x_ptr": x, "y_ptr": x, "n": 64}) == configs
