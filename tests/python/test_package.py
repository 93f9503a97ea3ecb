"""The Python package (issue 31): memc.compile on an ONNX file and on a torch module, training
from Python equal to the CLI's bit for bit and to PyTorch's within 1e-5, the state_dict round
trip, data larger than memory, and bad input as one-line exceptions. Run by tests/python/run.sh
(ctest `python.package`) in a fresh venv after `pip install .`."""
import copy
import json
import os
import resource
import struct
import subprocess
import sys

import numpy as np
import pytest

import memc

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DIGITS = os.path.join(SRC, "data", "digits_train.npz")


def read_safetensors(path):
    """A safetensors file as {name: float32 array} (memc's checkpoints hold f32 and i64)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        dtype = {"F32": np.float32, "I64": np.int64}[info["dtype"]]
        out[name] = np.frombuffer(data[a:b], dtype=dtype).reshape(info["shape"])
    return out


def digits():
    d = np.load(DIGITS)
    return d["x"], d["y"]


def test_onnx_model_trained_from_python_equals_the_cli(tmp_path):
    plan = memc.compile(os.path.join(SRC, "models", "vit_tiny.onnx"), batch=32, optimizer="adamw", lr=2e-3, epochs=1,
                        output=str(tmp_path / "p.plan"))
    assert plan.predicted_peak_bytes > 0 and plan.decisions["precision"] == "fp32"
    x, y = digits()
    # The CLI's 5 steps, and its weights after them.
    memc.cli("run", plan.path, "--data", DIGITS, "--steps", "5", "--seed", "7", "--quiet", "--checkpoint", str(tmp_path / "ck"))
    cli_state = read_safetensors(str(tmp_path / "ck" / "checkpoint.safetensors"))
    # The same batches from Python: the CLI's seeded order (its horizon: one epoch of 44 batches).
    order = memc._memc.epoch_order(len(y), 7, 0)
    session = plan.session(total_steps=len(y) // 32, seed=7)
    for b in range(5):
        rows = order[32 * b:32 * b + 32]
        session.step({"x": x[rows], "y": y[rows]})
    state = plan.state_dict()
    assert len(state) == 32
    for name, value in state.items():
        assert np.array_equal(value, cli_state[name]), name


def test_plans_save_load_and_describe_themselves(tmp_path):
    plan = memc.compile(os.path.join(SRC, "models", "vit_tiny.onnx"), batch=8, optimizer="sgd", lr=0.05, remat="none")
    (tmp_path / "elsewhere").mkdir()
    saved = plan.save(str(tmp_path / "elsewhere" / "v.plan"))
    loaded = memc.load_plan(str(tmp_path / "elsewhere" / "v.plan"))
    assert loaded.predicted_peak_bytes == saved.predicted_peak_bytes == plan.predicted_peak_bytes
    assert loaded.decisions == plan.decisions and loaded.breakdown == plan.breakdown
    assert "sgd lr 0.05" in loaded.explain()
    x, y = digits()
    assert loaded.step(x[:8], y[:8]) == plan.step(x[:8], y[:8])  # the same plan, the same first step
    page = loaded.timeline_html(str(tmp_path / "t.html"))
    assert open(page).read().startswith("<!DOCTYPE html>")


def test_a_saved_plan_of_a_module_outlives_the_plan_it_came_from(tmp_path):
    """A torch module compiled without output= exports into the Plan's temporary folder; save()
    keeps that model beside the saved plan, so load_plan works once the first Plan is gone."""
    import gc
    import torch
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.GELU(), torch.nn.Linear(32, 10))
    x, y = digits()
    plan = memc.compile(module, (torch.from_numpy(x[:8]),), optimizer="sgd", lr=0.05)
    temporary = plan.model_path
    plan.save(str(tmp_path / "kept.plan"))
    first = plan.step(x[:8], y[:8])
    del plan
    gc.collect()
    assert not os.path.exists(temporary)
    assert os.path.exists(tmp_path / "kept.onnx")
    loaded = memc.load_plan(str(tmp_path / "kept.plan"), module)
    assert loaded.step(x[:8], y[:8]) == first
    assert set(loaded.state_dict()) == {n for n, _ in module.named_parameters()}


def test_a_loaded_plan_of_a_module_with_two_inputs_takes_tuple_batches(tmp_path):
    """load_plan reads the plan's input names (memc inspect PLAN --json: "inputs"), so batches of
    a module with several inputs are (x1, x2, y) there as on the Plan compile returned."""
    import torch

    class TwoInputs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(64, 10), torch.nn.Linear(64, 10)

        def forward(self, x1, x2):
            return self.a(x1.flatten(1)) + self.b(x2.flatten(1))

    torch.manual_seed(0)
    module = TwoInputs()
    x, y = digits()
    example = (torch.from_numpy(x[:8]), torch.from_numpy(x[8:16]))
    plan = memc.compile(module, example, optimizer="sgd", lr=0.05, output=str(tmp_path / "two.plan"))
    loaded = memc.load_plan(str(tmp_path / "two.plan"), module)
    assert loaded._input_names == plan._input_names and len(loaded._input_names) == 2
    assert loaded.step((x[:8], x[8:16]), y[:8]) == plan.step((x[:8], x[8:16]), y[:8])


def test_steps_read_the_callers_arrays_in_place_however_they_are_held(tmp_path):
    """The session reads a batch where it lies (no copy before the arena's): a writable array, a
    read-only memory map and a strided view step to the same loss and weights."""
    plan = memc.compile(os.path.join(SRC, "models", "vit_tiny.onnx"), batch=8, optimizer="adamw", lr=1e-3, epochs=1,
                        output=str(tmp_path / "p.plan"))
    x, y = digits()
    np.save(tmp_path / "x.npy", x[:8])
    mapped = np.load(tmp_path / "x.npy", mmap_mode="r")
    assert not mapped.flags.writeable
    reversed_twice = np.ascontiguousarray(x[:8, :, :, ::-1])[:, :, :, ::-1]
    assert not reversed_twice.flags.c_contiguous
    results = []
    for batch_x in (x[:8].copy(), mapped, reversed_twice):
        session = memc.load_plan(plan.path).session(total_steps=10)
        losses = [session.step({"x": batch_x, "y": y[:8]}) for _ in range(2)]
        results.append((losses, session.state()))
    for losses, state in results[1:]:
        assert losses == results[0][0]
        assert all(np.array_equal(state[k], results[0][1][k]) for k in state)


def test_fit_on_files_and_on_an_iterable(tmp_path):
    plan = memc.compile(os.path.join(SRC, "models", "vit_tiny.onnx"), batch=32, optimizer="adamw", lr=2e-3)
    report = plan.fit(DIGITS, eval=os.path.join(SRC, "data", "digits_test.npz"), epochs=2)
    assert report["steps"] == 88 and report["measured_peak_bytes"] == report["predicted_peak_bytes"]
    assert 0 < report["accuracy"] <= 1
    x, y = digits()
    seen = []
    fresh = memc.compile(os.path.join(SRC, "models", "vit_tiny.onnx"), batch=32, optimizer="adamw", lr=2e-3)
    report = fresh.fit([(x[i:i + 32], y[i:i + 32]) for i in range(0, len(y), 32)], epochs=2,
                       callbacks=[lambda step, loss: seen.append((step, loss))], progress=False)
    assert report["steps"] == 88 and report["skipped_batches"] == 2  # 1437 rows: a short last batch per epoch
    assert [s for s, _ in seen] == list(range(1, 89)) and report["losses"][-1] < report["losses"][0]
    assert report["measured_peak_bytes"] == fresh.predicted_peak_bytes
    stopping = memc.compile(os.path.join(SRC, "models", "vit_tiny.onnx"), batch=32, optimizer="adamw", lr=2e-3)
    report = stopping.fit([(x[i:i + 32], y[i:i + 32]) for i in range(0, len(y), 32)], callbacks=[lambda step, loss: step < 3])
    assert report["steps"] == 3


def test_fit_on_files_calls_back_every_step_and_stops_when_told(tmp_path, capsys):
    plan = memc.compile(os.path.join(SRC, "models", "vit_tiny.onnx"), batch=32, optimizer="adamw", lr=2e-3, epochs=2,
                        output=str(tmp_path / "p.plan"))
    seen = []
    report = plan.fit(DIGITS, epochs=2, callbacks=[lambda step, loss: seen.append((step, loss))], progress=False)
    assert seen == list(enumerate(report["losses"], start=1)) and len(seen) == 88
    # A callback's False ends training after that step; the checkpoint resumes from there to the
    # same weights as one run without a stop.
    ck = str(tmp_path / "ck")
    printed = []
    report = plan.fit(DIGITS, epochs=2, checkpoint=ck, progress=False,
                      callbacks=[lambda step, loss: print(f"step {step}"), lambda step, loss: printed.append(step) or step < 50])
    assert report["steps"] == 50 and printed == list(range(1, 51))
    assert capsys.readouterr().out.splitlines() == [f"step {s}" for s in range(1, 51)]  # a callback's prints reach Python's stdout
    report = plan.fit(DIGITS, epochs=2, checkpoint=ck, resume=True, progress=False)
    assert report["steps_this_run"] == 38 and report["steps"] == 88
    resumed = plan.state_dict()
    plan.fit(DIGITS, epochs=2, progress=False)
    assert all(np.array_equal(resumed[k], v) for k, v in plan.state_dict().items())
    # An exception in a callback stops memc and reaches the caller.
    def fails(step, loss):
        if step == 4:
            raise KeyError("from the callback")
    with pytest.raises(KeyError, match="from the callback"):
        plan.fit(DIGITS, epochs=2, callbacks=[fails], progress=False)
    assert plan.fit(DIGITS, steps=2, progress=False)["steps"] == 2  # memc goes on after it


torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.dirname(__file__))
from tiny_models import TinyViT  # noqa: E402


def key_bias_rows(name, value):
    """The key third of attention's in_proj_bias: its gradient is exactly 0 (softmax ignores a
    constant added to a row of scores), so both sides hold rounding noise there, which Adam's
    m / sqrt(v) turns into steps of ±lr in directions neither side controls."""
    if name.endswith("self_attn.in_proj_bias"):
        third = value.shape[0] // 3
        return slice(third, 2 * third)
    return None


def test_torch_module_trains_as_pytorch_does_and_loads_back():
    torch.manual_seed(0)
    module = TinyViT()
    x, y = digits()
    xs = [torch.from_numpy(x[16 * s:16 * s + 16]) for s in range(5)]
    ys = [torch.from_numpy(y[16 * s:16 * s + 16]) for s in range(5)]
    plan = memc.compile(module, (xs[0],), optimizer="adamw", lr=1e-3, weight_decay=0.01, epochs=5)
    reference = copy.deepcopy(module)
    optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-3, weight_decay=0.01)
    for xb, yb in zip(xs, ys):
        loss = plan.step(xb, yb)
        optimizer.zero_grad()
        torch_loss = torch.nn.functional.cross_entropy(reference(xb), yb)
        torch_loss.backward()
        optimizer.step()
        assert abs(loss - torch_loss.item()) <= 1e-5 * abs(torch_loss.item())
    state = plan.state_dict()
    assert set(state) == set(reference.state_dict())
    for name, ours in state.items():
        theirs = reference.state_dict()[name]
        assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, name
        mask = torch.ones_like(theirs, dtype=torch.bool)
        if (rows := key_bias_rows(name, theirs)) is not None:
            mask[rows] = False
        error = ((ours - theirs)[mask].abs().max() / theirs[mask].abs().max().clamp_min(1e-12)).item()
        assert error <= 1e-5, f"{name}: {error:.2e}"
    # The trained weights in the user's own module: its forward equals memc's.
    restored = copy.deepcopy(module)
    restored.load_state_dict(plan.state_dict())
    with torch.no_grad():
        assert np.abs(restored(xs[0]).numpy() - plan.predict(xs[0])).max() <= 1e-6


@pytest.mark.parametrize("loss_chunks", ["none", "3"])
def test_a_language_model_trains_per_position_with_its_tied_embedding(loss_chunks):
    """GPT-2's logits [N, T, V] against next-token labels, -100 ignored: three AdamW steps equal
    PyTorch's, and the tied embedding comes back under both of its names; also with the head and
    loss in 3 chunks of positions (loss_chunks="3", the CLI's --loss-chunks 3)."""
    transformers = pytest.importorskip("transformers")
    data = np.load(os.path.join(os.path.dirname(__file__), "..", "..", "data", "lm_test.npz"))

    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            config = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
                                             embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
            self.gpt2 = transformers.GPT2LMHeadModel(config)

        def forward(self, input_ids, attention_mask):
            return self.gpt2(input_ids=input_ids, attention_mask=attention_mask).logits

    torch.manual_seed(0)
    module = LM()
    batches = [tuple(torch.from_numpy(data[k][8 * s:8 * s + 8]) for k in ("input_ids", "attention_mask", "y")) for s in range(3)]
    plan = memc.compile(module, batches[0][:2], optimizer="adamw", lr=1e-3, loss_chunks=loss_chunks)
    assert plan.decisions["loss_chunks"] == (1 if loss_chunks == "none" else 3)
    reference = copy.deepcopy(module)
    optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-3)
    for ids, mask, y in batches:
        loss = plan.step((ids, mask), y)
        optimizer.zero_grad()
        torch_loss = torch.nn.functional.cross_entropy(reference(ids, mask).reshape(-1, 64), y.reshape(-1), ignore_index=-100)
        torch_loss.backward()
        optimizer.step()
        assert abs(loss - torch_loss.item()) <= 1e-5 * abs(torch_loss.item())
    state = plan.state_dict()
    assert torch.equal(state["gpt2.lm_head.weight"], state["gpt2.transformer.wte.weight"])
    for name in ("gpt2.transformer.wte.weight", "gpt2.transformer.h.1.mlp.c_fc.weight"):
        theirs = reference.state_dict()[name]
        assert ((state[name] - theirs).abs().max() / theirs.abs().max()).item() <= 1e-5, name
    # Accuracy counts the labelled positions only.
    ids, mask, y = batches[0]
    predicted = plan.predict((ids, mask)).argmax(-1)
    kept = y.numpy() >= 0
    assert plan.accuracy([batches[0]]) == pytest.approx((predicted == y.numpy())[kept].mean())


def test_a_parameter_the_output_does_not_use_is_left_as_pytorch_leaves_it():
    """A mask token read only when a mask is given (Dinov2's): the exporters drop it, PyTorch
    gives it no gradient, and memc leaves it as it is instead of refusing the module."""
    class WithMaskToken(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(3, 4)
            self.mask_token = torch.nn.Parameter(torch.randn(3))

        def forward(self, x, mask=None):
            if mask is not None:
                x = torch.where(mask[..., None], self.mask_token, x)
            return self.linear(x)

    module = WithMaskToken()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    for exporter in ("dynamo", "torchscript"):
        plan = memc.compile(module, (torch.randn(4, 3),), optimizer="adamw", lr=0.1, exporter=exporter)
        plan.step(torch.randn(4, 3), torch.tensor([0, 1, 2, 3]))
        state = plan.state_dict()
        assert torch.equal(state["mask_token"], before["mask_token"]), exporter
        assert not torch.equal(state["linear.weight"], before["linear.weight"]), exporter


def test_a_scalar_parameter_trains_and_a_scalar_buffer_does_not():
    """A 0-d nn.Parameter (CLIP's logit_scale, a ReZero gate) trains as PyTorch trains it, through
    both exporters; a 0-d float buffer stays as it is."""
    class Gated(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(3, 4)
            self.gate = torch.nn.Parameter(torch.tensor(0.7))
            self.register_buffer("scale", torch.tensor(2.0))

        def forward(self, x):
            return self.linear(x * self.gate * self.scale)

    torch.manual_seed(0)
    module = Gated()
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 2, 3])
    reference = copy.deepcopy(module)
    torch.nn.functional.cross_entropy(reference(x), y).backward()
    with torch.no_grad():
        for p in reference.parameters():
            p -= 0.1 * p.grad
    for exporter in ("dynamo", "torchscript"):
        plan = memc.compile(module, (x,), optimizer="sgd", lr=0.1, exporter=exporter)
        plan.step(x, y)
        state = plan.state_dict()
        for name, theirs in reference.state_dict().items():
            assert torch.allclose(state[name], theirs, rtol=1e-5, atol=1e-6), f"{exporter} {name}: {state[name]} against {theirs}"
        assert state["gate"].item() != 0.7 and state["scale"].item() == 2.0, exporter


def test_bad_inputs_are_one_line_exceptions():
    torch.manual_seed(0)
    module = TinyViT()
    x, y = digits()
    plan = memc.compile(module, (torch.from_numpy(x[:8]),), optimizer="sgd", lr=0.1)
    cases = [
        (lambda: plan.step(x[:7], y[:7]), "the plan's batch is 8"),
        (lambda: plan.step(x[:8, :, :, :7].copy(), y[:8]), "expected [8x1x8x8]"),
        (lambda: plan.step(x[:8].astype(np.int64), y[:8]), "needs f32"),
        (lambda: plan.step(x[:8], np.full(8, 12)), "outside [0, 10)"),
        (lambda: plan.fit("/no/such/data.npz"), "/no/such/data.npz"),
        (lambda: memc.compile(os.path.join(SRC, "models", "vit_tiny.onnx"), batch=32, budget="1KB"), "budget"),
        (lambda: memc.compile(os.path.join(SRC, "models", "vit_tiny.onnx")), "batch="),
        (lambda: memc.compile(42), "not int"),
    ]
    for call, says in cases:
        with pytest.raises(memc.MemcError) as e:
            call()
        assert says in str(e.value) and "\n" not in str(e.value), str(e.value)
    with pytest.raises(memc.BudgetError):
        memc.compile(os.path.join(SRC, "models", "vit_tiny.onnx"), batch=32, budget="1KB")

    class Unexportable(torch.nn.Module):  # an op torch's ONNX exporter has no rule for
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(3, 3)

        def forward(self, x):
            return torch.linalg.svd(self.linear(x))[0]

    with pytest.raises(memc.MemcError) as e:
        memc.compile(Unexportable(), (torch.zeros(2, 3, 3),))
    assert "torch could not export the module" in str(e.value) and "\n" not in str(e.value), str(e.value)

    class WithBatchNorm(torch.nn.Module):  # exports fine; memc refuses micro-batches of BatchNorm's batch statistics
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(3, 3)
            self.norm = torch.nn.BatchNorm1d(3)

        def forward(self, x):
            return self.norm(self.linear(x))

    with pytest.raises(memc.MemcError) as e:  # the export's folder is gone: the module is named
        memc.compile(WithBatchNorm().train(), (torch.zeros(2, 3),), micro_batches=2)
    message = str(e.value)
    assert "WithBatchNorm (its" in message and "normalizes with its batch's statistics" in message, message
    assert "memc_" not in message and "\n" not in message, message

    class NoParameters(torch.nn.Module):
        def forward(self, x):
            return x * 2

    with pytest.raises(memc.MemcError, match="no trainable parameters"):
        memc.compile(NoParameters(), (torch.zeros(2, 3),))

    def failing_loader():
        yield torch.from_numpy(x[:8]), torch.from_numpy(y[:8])
        raise RuntimeError("the loader broke")

    with pytest.raises(RuntimeError, match="the loader broke"):
        plan.fit(failing_loader(), progress=False)
    assert plan.step(x[:8], y[:8]) > 0  # the interpreter and the plan go on


def write_shards(folder, total_bytes):
    """vit_small32-shaped data (3x32x32 f32), 4 shards and labels, as .npy files."""
    os.makedirs(folder)
    per = 3 * 32 * 32 * 4
    n = total_bytes // per + 1
    block = ((np.arange(3 * 32 * 32, dtype=np.float32) * 37) % 101 / 50.0 - 1.0).reshape(1, 3, 32, 32)
    for k, rows in enumerate(np.array_split(np.arange(n), 4)):
        array = np.lib.format.open_memmap(os.path.join(folder, f"x.{k}.npy"), mode="w+", dtype=np.float32, shape=(len(rows), 3, 32, 32))
        for start in range(0, len(rows), 4096):
            array[start:start + 4096] = block
        array.flush()
        del array
    np.save(os.path.join(folder, "y.npy"), np.arange(n, dtype=np.int64) % 10)
    return n


# Under an address-space limit, importing memc first bounds NumPy's OpenBLAS to one thread, as
# libmemc bounds its own: no worker thread's stack and buffer under the limit (41 MB of address
# space on a 2-core machine). Without a limit, or where the user chose a thread count, nothing
# changes.
def test_under_an_address_limit_numpys_blas_starts_no_threads():
    probe = """
import os, resource, sys
if sys.argv[1] == "limit":
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
import memc, numpy
threads = [l.split()[1] for l in open("/proc/self/status") if l.startswith("Threads:")][0]
print(os.environ.get("OPENBLAS_NUM_THREADS", "unset"), threads)
"""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    def run(mode, extra=None):
        out = subprocess.run([sys.executable, "-c", probe, mode], capture_output=True, text=True, timeout=120, env={**env, **(extra or {})})
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout.split()
    assert run("limit") == ["1", "1"]
    free = run("none")
    assert free[0] == "unset" and (int(free[1]) >= 2 or (os.cpu_count() or 1) == 1)
    assert run("limit", {"OPENBLAS_NUM_THREADS": "2"})[0] == "2"


# Under an address-space limit, memc keeps malloc to one arena (runtime/preinit/preinit.cc): a
# thread that mallocs while another holds the arena gets no 64 MiB reservation of its own, so how
# threads happen to interleave does not decide whether a plan's arena still fits (the test below
# once failed so under load). Without the limit glibc's own choice stands.
def test_threads_under_an_address_space_limit_reserve_no_arenas():
    probe = """
import resource, sys, threading, time
if sys.argv[1] == "limit":
    resource.setrlimit(resource.RLIMIT_AS, (640 << 20, 640 << 20))
import memc
def vm():
    return [int(l.split()[1]) << 10 for l in open("/proc/self/status") if l.startswith("VmSize")][0]
before = vm()
start = threading.Barrier(4)
def work():
    start.wait()
    kept = [bytearray(200_000) for _ in range(50)]
    time.sleep(0.3)
threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
print(vm() - before)
"""
    def grown(mode):
        out = subprocess.run([sys.executable, "-c", probe, mode], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        return int(out.stdout)
    # Four threads' stacks (8 MiB each) and their 10 MB, not 64 MiB arenas (before: 288 MiB).
    assert grown("limit") < 64 << 20


# Natively, and with oneDNN and OpenBLAS held to an AVX2-only CPU's kernels (issue 38: on Zen 3
# the address space once ran out here).
@pytest.mark.parametrize("isa_env", [{}, {"ONEDNN_MAX_CPU_ISA": "AVX2", "OPENBLAS_CORETYPE": "Zen"}],
                         ids=["native", "avx2_zen"])
def test_data_four_times_the_memory_limit_trains(tmp_path, isa_env):
    limit = 640 << 20
    if os.statvfs(str(tmp_path)).f_bavail * os.statvfs(str(tmp_path)).f_frsize < 4 * limit + (2 << 30):
        pytest.skip("needs 4.6 GB free for the data")
    write_shards(str(tmp_path / "big"), 4 * limit)
    # A child process: the address-space limit first, then memc (OpenBLAS's buffers are bounded by it).
    script = f"""
import resource
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
import memc
plan = memc.compile({os.path.join(SRC, "models", "vit_small32.onnx")!r}, batch=16, optimizer="adamw", threads=1)
report = plan.fit({str(tmp_path / "big")!r}, steps=30)
print(report["steps"], report["process_peak_rss_bytes"])
"""
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                           env={**os.environ, **isa_env})
    assert child.returncode == 0, child.stderr[-2000:]
    steps, rss = map(int, child.stdout.split())
    data = sum(os.path.getsize(tmp_path / "big" / f) for f in os.listdir(tmp_path / "big"))
    assert data >= 4 * limit and steps == 30 and rss < limit
    print(f"{data / 2**30:.2f} GiB trained {steps} steps under RLIMIT_AS {limit >> 20} MiB; peak RSS {rss >> 20} MiB")
