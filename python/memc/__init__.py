"""memc from Python: compile a model into a memory-budgeted training plan and train it.

    import memc
    plan = memc.compile(model, example_inputs, budget="6GB", optimizer="adamw", lr=1e-3)
    print(plan.predicted_peak_bytes, plan.decisions)
    report = plan.fit(loader, epochs=3)          # any iterable of (x, y) batches, or data on disk
    model.load_state_dict(plan.state_dict())     # the trained weights, under the module's names

`model` is an ONNX file, an `onnx.ModelProto` or a `torch.nn.Module`, exported inside the call
(`exporter="auto"`: torch's dynamo exporter, else TorchScript with the reason as a warning) so
that every parameter stays its own trained initializer in train() and eval() mode alike, float
buffers and frozen parameters stay constants, and dropout follows the module's mode.
Every option of `memc compile` is a keyword (`--remat blocks` is `remat="blocks"`, `--no-dropout`
is `no_dropout=True`). Errors are `memc.MemcError` (bad input) and `memc.BudgetError` (a budget
that cannot be met) carrying memc's one-line message. The C++ library does the work: the command
line in-process for compiling and for training on files, and its Session for a Python loop.
"""
from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Sequence


def _bound_blas_threads_under_a_limit() -> None:
    """Under an address-space limit (`ulimit -v`, RLIMIT_AS), one OpenBLAS thread.

    libmemc's constructor does this for memc's own OpenBLAS (runtime/preinit/preinit.cc), but
    NumPy's OpenBLAS starts its threads when NumPy is imported, before libmemc loads: each takes a
    stack and a buffer under the limit (41 MB of address space on a 2-core machine), and memc
    never calls NumPy's BLAS. So, where NumPy is not imported yet and the user set no thread
    count, the same rule applies to it.
    """
    if "numpy" in sys.modules or "OPENBLAS_NUM_THREADS" in os.environ:
        return
    try:
        import resource
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError):
        return
    if soft != resource.RLIM_INFINITY:
        os.environ["OPENBLAS_NUM_THREADS"] = "1"


_bound_blas_threads_under_a_limit()

import numpy as np  # noqa: E402  (after the thread bound above)

from . import _memc

__all__ = ["compile", "load_plan", "Plan", "MemcError", "BudgetError", "cli"]
__version__ = "0.9.0"


class MemcError(ValueError):
    """Bad input that memc refuses: a model, data, option, batch or file (the CLI's exit status 2).

    The message is memc's one line, e.g. ``memc: the batch has 16 samples; the plan's batch is 32``.
    A `ValueError`; the plan and the interpreter stay usable after it.
    """


class BudgetError(MemcError):
    """No plan meets the budget (the CLI's exit status 3).

    The message names the smallest peak memc can plan for the model, batch and optimizer, and
    what dominates it. A subclass of `MemcError`.
    """


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "memc failed without a message"


class _Session:
    """The C++ Session (runtime/session.h), its bad-input errors as MemcError."""

    def __init__(self, session: "_memc.Session"):
        self._s = session

    def step(self, batch: Dict[str, np.ndarray]) -> float:  # every step passes here: no wrapper made per call
        try:
            return self._s.step(batch)
        except ValueError as e:
            raise MemcError(str(e)) from None

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._s, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return attr(*args, **kwargs)
            except ValueError as e:
                raise MemcError(str(e)) from None

        return call


def cli(*args: str, on_step: Optional[Callable[[int, float], Any]] = None) -> str:
    """Runs a `memc` command in this process, as `memc ARGS...` would on the command line.

    Args:
        *args: The command and its arguments, e.g. ``"inspect", "vit.plan", "--json"``; each is
            passed through `str()`.
        on_step: Called as ``on_step(step, loss)`` after each step of `memc run`. Returning
            False stops the run there, as `--steps` would. An exception it raises (Ctrl-C too)
            stops the run and is raised from `cli`.

    Returns:
        What the command printed on stdout.

    Raises:
        BudgetError: The command exited with status 3 (a budget that cannot be met).
        MemcError: The command exited with status 2 (bad input).
        RuntimeError: Any other failure (status 1), with memc's last line of stderr.

    Example:
        ```python
        print(memc.cli("inspect", "vit.plan"))
        ```
    """
    status, out, err = _memc.cli([str(a) for a in args], on_step)
    if status == 0:
        return out
    message = _last_line(err)
    if status == 3:
        raise BudgetError(message)
    if status == 2:
        raise MemcError(message)
    raise RuntimeError(message)


def _flags(options: Mapping[str, Any]) -> list:
    """Keywords as `memc compile` flags: lr=1e-3 -> --lr 1e-3, no_dropout=True -> --no-dropout."""
    out = []
    for key, value in options.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif isinstance(value, (list, tuple)):
            out += [flag, ",".join(str(v) for v in value)]
        else:
            out += [flag, str(value)]
    return out


def _numpy(value: Any) -> np.ndarray:
    """A batch element as a C-contiguous NumPy array (torch tensors are detached and moved to the CPU)."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        value = value.detach().cpu().numpy()
    return np.ascontiguousarray(np.asarray(value))


EXPORTERS = ("auto", "dynamo", "torchscript")


def _export_module(module: Any, example_inputs: Sequence[Any], path: str, exporter: str = "auto") -> Dict[str, Any]:
    """torch.nn.Module -> ONNX with torch's own exporter, every parameter its own initializer under
    its own name, whatever the module's mode: the dynamo exporter without its optimizer (which
    folds weights' transposes and merges equal-valued weights), or TorchScript with the initializers
    kept as inputs (else, outside training mode, it merges equal-valued ones: the zero biases and
    unit LayerNorm weights of a fresh model would train as one tensor). The module's mode decides
    dropout as in PyTorch. "auto" tries dynamo and falls back to TorchScript with the reason as a
    warning. Returns the input names, the exporter used and the modules whose forward ran."""
    import torch

    if exporter not in EXPORTERS:
        raise MemcError(f"memc: exporter is one of {', '.join(EXPORTERS)}, not {exporter!r}")
    _refuse_cumulative_batchnorm(module)
    inputs = tuple(example_inputs)
    names = ["x"] if len(inputs) == 1 else [f"input_{i}" for i in range(len(inputs))]
    ran: set = set()
    hooks = [m.register_forward_pre_hook(lambda m, args: ran.add(id(m))) for m in module.modules()]
    reason = ""
    try:
        if exporter in ("auto", "dynamo"):
            try:
                with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    torch.onnx.export(module, inputs, path, input_names=names, output_names=["logits"], dynamo=True,
                                      optimize=False, external_data=_state_bytes(module) >= 2**31 - 2**26,
                                      dynamic_shapes=tuple({0: torch.export.Dim.AUTO} for _ in inputs))
                return {"input_names": names, "exporter": "dynamo", "ran": ran}
            except Exception as e:
                reason = _root_cause(e)
                if exporter == "dynamo":
                    raise MemcError("memc: torch's dynamo exporter could not export the module: " + reason) from None
                warnings.warn(f"memc: the dynamo exporter could not export the module ({reason}); exporting with TorchScript",
                              stacklevel=3)
        ran.clear()
        # The trace runs the forward: a BatchNorm in train() updates its running statistics and
        # batch count, in the module and in the file. Both get back what they held.
        buffers = {n: b.detach().clone() for n, b in module.named_buffers()}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(module, inputs, path, input_names=names, output_names=["logits"], export_params=True,
                                  do_constant_folding=False, opset_version=17, dynamo=False,
                                  training=torch.onnx.TrainingMode.PRESERVE, keep_initializers_as_inputs=True,
                                  dynamic_axes={n: {0: "batch"} for n in names})
        except Exception as e:  # torch's own message, on one line
            raise MemcError("memc: torch could not export the module: " + " ".join(str(e).split())[:500]) from None
        finally:
            _restore_buffers(module, buffers)
        _restore_initializers(path, buffers)
        return {"input_names": names, "exporter": "torchscript", "ran": ran, "dynamo_failure": reason}
    finally:
        for h in hooks:
            h.remove()


def _refuse_cumulative_batchnorm(module: Any) -> None:
    """A BatchNorm with momentum=None in train() keeps its running statistics as a cumulative
    average: step t weighs its batch by 1/t. An export holds one momentum (TorchScript bakes the
    trace's; dynamo cannot export the data-dependent factor), so memc would update them
    differently from PyTorch, silently. Refused in one line naming the layer."""
    import torch

    for name, m in module.named_modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.training and m.track_running_stats and m.momentum is None:
            raise MemcError(f"memc: BatchNorm {name or type(m).__name__!r} has momentum=None (running statistics as a cumulative "
                            "average, the factor 1/steps), which an exported step cannot hold: give it a momentum "
                            "(PyTorch's default is 0.1), or compile the module in eval()")


def _restore_buffers(module: Any, saved: Dict[str, Any]) -> None:
    import torch

    with torch.no_grad():
        for name, b in module.named_buffers():
            if name in saved and not torch.equal(b, saved[name]):
                b.copy_(saved[name])


def _restore_initializers(path: str, saved: Dict[str, Any]) -> None:
    """Writes the buffers' values from before the trace into the initializers of their names
    where the trace changed them."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(path)
    changed = False
    for init in model.graph.initializer:
        if init.name in saved:
            before = saved[init.name].numpy()
            if not np.array_equal(numpy_helper.to_array(init), before):
                init.CopyFrom(numpy_helper.from_array(before.astype(numpy_helper.to_array(init).dtype), init.name))
                changed = True
    if changed:
        onnx.save(model, path)


def _root_cause(error: BaseException) -> str:
    """The innermost exception behind torch's wrapped export error, on one line."""
    while error.__cause__ is not None:
        error = error.__cause__
    lines = [l.strip() for l in str(error).splitlines() if l.strip()]
    return f"{type(error).__name__}: {lines[0][:300] if lines else ''}"


def _state_bytes(module: Any) -> int:
    return sum(t.numel() * t.element_size() for t in module.state_dict().values())


def _frozen_initializers(module: Any, model_path: str) -> set:
    """The initializers memc would train that PyTorch does not: floating-point buffers (Swinv2's
    relative coordinates table) and parameters with requires_grad off. Asks memc only when the
    module has such tensors."""
    trainable = {n for n, p in module.named_parameters(remove_duplicate=False) if p.requires_grad}
    tensors = list(module.named_buffers(remove_duplicate=False)) + list(module.named_parameters(remove_duplicate=False))
    candidates = {n for n, t in tensors if t.is_floating_point() and n not in trainable}  # non-persistent buffers too
    if not candidates:
        return set()
    return candidates & set(json.loads(cli("inspect", model_path, "--json")).get("trainable_params", []))


def _unused_parameters(module: Any, inputs: Sequence[Any], names: Sequence[str]) -> set:
    """The parameters among `names` the module's output does not depend on, for which PyTorch's
    gradient is None (Dinov2's mask_token without a mask): one forward and backward of a copy on
    the example inputs. Empty where that forward fails."""
    import torch

    probe = copy.deepcopy(module)
    params = dict(probe.named_parameters())
    try:
        out = probe(*inputs)
        out = out.logits if hasattr(out, "logits") else (out[0] if isinstance(out, (tuple, list)) else out)
        grads = torch.autograd.grad(out.float().sum(), [params[n] for n in names], allow_unused=True)
    except Exception:  # the refusal stands
        return set()
    return {n for n, g in zip(names, grads) if g is None}


def _check_parameters(module: Any, trained: Iterable[str], ran: set, exporter: str, inputs: Sequence[Any] = ()) -> Dict[str, str]:
    """Every parameter PyTorch would train is one memc trains, by name: a parameter that did not
    survive the export as its own trained initializer is a MemcError naming it. Weights tied in
    the module (one Parameter under two names) train as one, as in PyTorch; a parameter of a
    submodule whose forward never ran, or one the output does not depend on (the exporters drop
    it), gets no gradient in PyTorch either and is left as it is.
    Returns every name of each trained parameter -> the initializer memc trains it as."""
    trained = set(trained)
    aliases: Dict[int, list] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(name)
    owners = {id(p): sub for _, sub in module.named_modules() for p in sub.parameters(recurse=False)}
    mapping, lost = {}, []
    for name, p in module.named_parameters():
        if not p.requires_grad:
            continue
        found = [n for n in aliases[id(p)] if n in trained]
        if found:
            mapping.update({n: found[0] for n in aliases[id(p)]})
        elif id(owners.get(id(p))) in ran:
            lost.append(name)
    if lost and inputs:
        unused = _unused_parameters(module, inputs, lost)
        lost = [n for n in lost if n not in unused]
    if lost:
        shown = ", ".join(f"'{n}'" for n in lost[:4]) + (f" and {len(lost) - 4} more" if len(lost) > 4 else "")
        raise MemcError(f"memc: {len(lost)} parameter(s) of the module did not survive the {exporter} export as their own "
                        f"trained initializers ({shown}): memc would not train them as PyTorch does")
    return mapping


class Plan:
    """A compiled training plan (what `memc compile` wrote) and the session that trains it.

    Made by `compile` or `load_plan`. The session (memory arena and weights) opens on the first
    `step`, `predict`, `fit` or `state_dict` and stays open; it starts from the model's initial
    weights, or from the checkpoint of the last `fit` on files.

    Attributes:
        path: The plan file.
        summary: The plan's summary (what `memc compile --json` prints); for a torch module also
            ``"exporter"``, ``"parameter_names"`` (each parameter name -> the initializer memc
            trains it as) and, after a fallback, ``"dynamo_failure"``.
        model_path: The ONNX model the plan was compiled from.
    """

    def __init__(self, path: str, summary: Dict[str, Any], *, model_path: str, compile_args: Sequence[str] = (),
                 module: Any = None, input_names: Sequence[str] = ("x",), workdir: Optional[tempfile.TemporaryDirectory] = None):
        self.path = path
        self.summary = summary
        self.model_path = model_path
        self._compile_args = list(compile_args)
        self._module = module
        self._input_names = list(input_names)
        self._workdir = workdir  # holds an exported model and a temporary plan alive
        self._session: Optional[_Session] = None
        self._total_steps = -1

    # --- what the plan says ---
    @property
    def predicted_peak_bytes(self) -> int:
        """The planned peak of device memory in bytes, which the run measures exactly."""
        return int(self.summary["predicted_peak_bytes"])

    @property
    def breakdown(self) -> Dict[str, int]:
        """Bytes by role at the peak: activations, grads, master_weights, optimizer_state, params, workspace."""
        return dict(self.summary.get("breakdown", {}))

    @property
    def decisions(self) -> Dict[str, Any]:
        """What the plan chose: precision, micro_batches, remat, offload, attention, shard, loss_chunks."""
        return dict(self.summary.get("decisions", {}))

    @property
    def batch(self) -> int:
        """Rows per batch: every batch given to `step` and `fit` has exactly this many."""
        return int(self.summary.get("batch", 0))

    def explain(self) -> str:
        """Describes the plan, as `memc inspect PLAN` prints it.

        Returns:
            The text: training setup, parameters, planned peak against the lower bound and the
            budget, memory by role at the peak, decisions and the step-time estimate.
        """
        return cli("inspect", self.path)

    def save(self, path: str) -> "Plan":
        """Writes a copy of the plan file to `path`.

        The plan names its model where it is now (relative to `path`). A torch module compiled
        without `output=` has its exported model in this Plan's temporary folder: that model
        (and its external data) is copied beside `path` as `path`'s name with `.onnx`, so the
        saved plan opens after this Plan is gone.

        Args:
            path: The new plan file; an existing file is replaced.

        Returns:
            The plan at `path`, for the same module, with a session of its own.
        """
        with open(self.path) as f:
            doc = json.load(f)
        model = doc["model"]["path"]
        if not os.path.isabs(model):
            model = os.path.normpath(os.path.join(os.path.dirname(self.path), model))
        target = os.path.abspath(path)
        if self._workdir is not None and os.path.dirname(os.path.realpath(model)) == os.path.realpath(self._workdir.name):
            model = self._keep_model(model, os.path.splitext(target)[0] + ".onnx")
        doc["model"]["path"] = os.path.relpath(model, os.path.dirname(target))
        tmp = f"{target}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, target)
        saved = load_plan(target, self._module)
        saved._input_names = self._input_names
        return saved

    @staticmethod
    def _keep_model(model: str, kept: str) -> str:
        """Copies a model exported into a temporary folder to `kept`, with the external data
        files it names beside it under their own names (the plan's checksums cover the bytes)."""
        folder = os.path.dirname(model)
        for name in os.listdir(folder):  # external data: "model.onnx.data" and the like
            if name.startswith(os.path.basename(model)) and name != os.path.basename(model):
                shutil.copyfile(os.path.join(folder, name), os.path.join(os.path.dirname(kept), name))
        tmp = f"{kept}.tmp.{os.getpid()}"
        shutil.copyfile(model, tmp)
        os.replace(tmp, kept)
        return kept

    def timeline_html(self, path: str) -> str:
        """Writes the plan's memory timeline as one self-contained HTML page.

        Args:
            path: The HTML file; an existing file is replaced.

        Returns:
            `path`.
        """
        cli("inspect", self.path, "--timeline", path, "--force")
        return path

    # --- training ---
    def session(self, total_steps: int = -1, seed: int = 0, device: str = "") -> _Session:
        """The plan's session (`runtime/session.h`): the arena allocated, the weights in.

        Opened on the first call and returned as it is after that, so the arguments count only
        the first time. `step`, `predict`, `fit` and `state_dict` open it themselves.

        Args:
            total_steps: The learning-rate schedule's horizon in steps (-1: the plan's schedule or epochs).
            seed: Seed of dropout.
            device: ``"cpu"``, ``"cuda"`` or ``"cuda:K"`` ("": as `memc run` chooses).

        Returns:
            The session; its errors raise `MemcError`.

        Raises:
            MemcError: The plan or its model cannot be opened.
        """
        if self._session is None:
            try:
                self._session = _Session(_memc.Session.open(self.path, device=device, seed=seed, total_steps=total_steps))
            except ValueError as e:
                raise MemcError(str(e)) from None
        return self._session

    def _batch(self, batch: Any) -> Dict[str, np.ndarray]:
        """(x, y), (x1, x2, ..., y) or {"x": ..., "y": ...} as the session's named arrays."""
        if isinstance(batch, Mapping):
            return {k: _numpy(v) for k, v in batch.items()}
        if isinstance(batch, (list, tuple)) and len(batch) == len(self._input_names) + 1:
            arrays = {n: _numpy(v) for n, v in zip(self._input_names, batch[:-1])}
            arrays["y"] = _numpy(batch[-1]).astype(np.int64, copy=False)
            return arrays
        raise MemcError(f"memc: a batch is (inputs..., labels) with {len(self._input_names)} input(s), or a dict; got {type(batch).__name__}")

    def step(self, x: Any, y: Any) -> float:
        """Takes one optimizer step on one batch.

        Args:
            x: The inputs, an array or torch tensor of `batch` rows; for a model with several
                inputs, a tuple of them.
            y: The integer labels, `batch` of them; for a model whose logits are per position
                ([batch, T, classes], a language model), [batch, T] of them, -100 where a
                position is ignored (PyTorch's ``ignore_index``).

        Returns:
            The batch's loss before the update.

        Raises:
            MemcError: A batch of the wrong size, shape or dtype, or labels out of range.
        """
        return self.session(self._total_steps).step(self._batch((x, y) if len(self._input_names) == 1 else (*x, y)))

    def predict(self, x: Any) -> np.ndarray:
        """Runs the forward pass with the current weights.

        Args:
            x: One batch of inputs (`batch` rows); for a model with several inputs, a tuple of
                them (as `step` takes them), or a dict of them by input name.

        Returns:
            The logits, a NumPy array of shape ``[batch, classes]`` (or the model's
            ``[batch, T, classes]``).

        Raises:
            MemcError: A batch of the wrong size, shape or dtype.
        """
        if isinstance(x, Mapping):
            inputs = x
        elif len(self._input_names) > 1:  # a tuple, as step takes it
            if not isinstance(x, (tuple, list)) or len(x) != len(self._input_names):
                raise MemcError(f"memc: the model has {len(self._input_names)} inputs; give a tuple of them or a dict by name")
            inputs = dict(zip(self._input_names, x))
        else:
            inputs = {self._input_names[0]: x}
        return self.session(self._total_steps).predict({k: _numpy(v) for k, v in inputs.items()})

    def fit(self, train: Any, eval: Any = None, epochs: int = 1, checkpoint: Optional[str] = None, resume: bool = False,
            callbacks: Iterable[Callable[[int, float], Any]] = (), seed: int = 0, progress: bool = True,
            steps: Optional[int] = None) -> Dict[str, Any]:
        """Trains for `epochs` over `train`, or for `steps` optimizer steps.

        On data on disk this is `memc run` in this process, with its checkpoints; afterwards the
        plan holds the trained weights. On an iterable the session steps through its batches; a
        batch with fewer rows than `batch` is skipped (the plan's shapes are fixed). A tqdm bar
        shows progress when tqdm is installed.

        Args:
            train: Data on disk (an .npz, or a folder of .npy files read a batch at a time), or
                any iterable of batches (a DataLoader, a list): ``(x, y)``,
                ``(x1, x2, ..., y)`` or a dict of arrays by input name with ``"y"``.
            eval: Test data, scored after training: a path for data on disk, an iterable of
                batches for an iterable.
            epochs: Passes over `train` (default 1, whatever the plan's `epochs`).
            checkpoint: A folder for `memc run`'s checkpoint (data on disk only).
            resume: Continue from the checkpoint in `checkpoint` (data on disk only).
            callbacks: Each called as ``callback(step, loss)`` after every step; one returning
                False ends training there.
            seed: Seed of the data order (on disk) and of dropout.
            progress: False hides the progress bar.
            steps: Stop after this many optimizer steps instead of `epochs`.

        Returns:
            A report like `memc run --json`: ``steps``, ``loss``, ``step_ms``,
            ``predicted_peak_bytes``, ``measured_peak_bytes``, ``accuracy`` (with `eval`) and,
            on an iterable, ``losses`` and ``skipped_batches``.

        Raises:
            MemcError: Bad data, a batch of the wrong shape or dtype, or `checkpoint`/`resume`
                with an iterable. An exception from the loader or a callback is raised as it is.

        Example:
            ```python
            report = plan.fit(loader, eval=test_loader, epochs=3)
            report = plan.fit("train_shards/", eval="test.npz", epochs=3, checkpoint="ck")
            ```
        """
        if isinstance(train, (str, os.PathLike)):
            return self._fit_files(os.fspath(train), eval, epochs, checkpoint, resume, seed, steps, list(callbacks), progress)
        if checkpoint or resume:
            raise MemcError("memc: checkpoint= and resume= need data on disk (an .npz or a folder of .npy files); "
                            "from an iterable, keep plan.state_dict() yourself")
        callbacks = list(callbacks)
        losses, skipped, started = [], 0, time.perf_counter()
        total = epochs * len(train) if hasattr(train, "__len__") else -1
        session = self.session(total, seed)
        bar = _progress(total, progress)
        stopped = False
        for _ in range(epochs):
            if stopped or (steps is not None and len(losses) >= steps):
                break
            for batch in train:
                if stopped or (steps is not None and len(losses) >= steps):
                    break
                arrays = self._batch(batch)
                if arrays["y"].shape[:1] != (session.batch,):
                    skipped += 1
                    continue
                loss = session.step(arrays)
                losses.append(loss)
                stopped = False in [callback(session.steps, loss) for callback in callbacks]  # every one called
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{loss:.4f}")
        if bar is not None:
            bar.close()
        seconds = time.perf_counter() - started
        report = {"status": "ok", "steps": len(losses), "losses": losses, "loss": losses[-1] if losses else None,
                  "step_ms": 1000 * seconds / max(len(losses), 1), "skipped_batches": skipped,
                  "predicted_peak_bytes": self.predicted_peak_bytes, "measured_peak_bytes": session.measured_peak_bytes,
                  "device": session.device}
        if eval is not None:
            report["accuracy"] = self.accuracy(eval)
        return report

    def _fit_files(self, data: str, eval: Any, epochs: int, checkpoint: Optional[str], resume: bool, seed: int,
                   steps: Optional[int], callbacks: Sequence[Callable[[int, float], Any]], progress: bool) -> Dict[str, Any]:
        """`memc run` in this process; its weights come back through a checkpoint (the caller's
        folder, else one beside the plan), which the session then holds."""
        if checkpoint is None:
            if self._workdir is None:
                self._workdir = tempfile.TemporaryDirectory(prefix="memc_")
            self._fits = getattr(self, "_fits", 0) + 1
            checkpoint = os.path.join(self._workdir.name, f"fit{self._fits}")
        with tempfile.TemporaryDirectory(prefix="memc_fit_") as tmp:
            report_path = os.path.join(tmp, "report.json")
            length = ["--steps", str(steps)] if steps is not None else ["--epochs", str(epochs)]
            args = ["run", self.path, "--data", data, *length, "--seed", str(seed), "--quiet", "--json", report_path,
                    "--checkpoint", checkpoint] + (["--resume"] if resume else [])
            if eval is not None:
                args += ["--eval", os.fspath(eval)]
            # memc's output goes to files meanwhile: the bar and what callbacks print go to the
            # terminal's streams as they were.
            with _own_streams() as (out, err):
                bar = _progress(steps if steps is not None else -1, progress, file=err)
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):

                    def on_step(step: int, loss: float) -> Any:
                        if bar is not None:
                            bar.update(1)
                            bar.set_postfix(loss=f"{loss:.4f}")
                        return False not in [callback(step, loss) for callback in callbacks]  # every one called

                    try:
                        cli(*args, on_step=on_step)
                    finally:
                        if bar is not None:
                            bar.close()
            with open(report_path) as f:
                report = json.load(f)
        self._session = None
        self.session(self._total_steps, seed).restore(checkpoint)
        return report

    def accuracy(self, data: Iterable[Any]) -> float:
        """Scores the current weights on labelled batches.

        Args:
            data: An iterable of batches, as `fit` takes them; batches with fewer rows than
                `batch` are skipped.

        Returns:
            The fraction of rows whose argmax logit is the label (NaN when no batch was full);
            for a token-level model, of the positions whose label is not -100.
        """
        correct = counted = 0
        session = self.session(self._total_steps)
        for batch in data:
            arrays = self._batch(batch)
            labels = arrays.pop("y")
            if labels.shape[:1] != (session.batch,):
                continue
            logits = session.predict(arrays)
            kept = labels >= 0  # a language model's ignored positions (-100) are not scored
            correct += int(((logits.argmax(axis=-1) == labels) & kept).sum())
            counted += int(kept.sum())
        return correct / counted if counted else float("nan")

    def state_dict(self) -> Dict[str, Any]:
        """The current weights under the model's own names.

        Returns:
            For a torch module, its whole ``state_dict()`` as torch tensors: the trained
            parameters (a tied weight under each of its names) and the running statistics of
            BatchNorms trained in ``train()``, the rest as they are in the module. Else a dict
            of NumPy arrays by the ONNX initializers' names.

        Example:
            ```python
            module.load_state_dict(plan.state_dict())
            ```
        """
        session = self.session(self._total_steps)
        state = session.state()
        if self._module is None:
            return {name: state[name] for name in list(session.parameters) + list(session.buffers)}
        import torch

        # A tied weight's every name reads the one tensor memc trained under one of them.
        aliases: Dict[int, list] = {}
        for name, p in self._module.named_parameters(remove_duplicate=False):
            aliases.setdefault(id(p), []).append(name)
        trained_as = {name: next((n for n in names if n in state), name) for names in aliases.values() for name in names}
        # A BatchNorm whose running statistics memc updated counted each step, as PyTorch's does.
        counted = {name.rsplit(".", 1)[0] + ".num_batches_tracked" for name in session.buffers}
        out = {}
        for name, current in self._module.state_dict().items():
            if name in counted:
                out[name] = current + session.steps
                continue
            value = state.get(trained_as.get(name, name))
            out[name] = current.clone() if value is None else torch.from_numpy(np.array(value)).to(current.dtype).reshape(current.shape)
        return out


def _progress(total: int, wanted: bool, file: Any = None):
    if not wanted:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total if total > 0 else None, unit="step", file=file)


@contextlib.contextmanager
def _own_streams():
    """Python's stdout and stderr on copies of their file descriptors (which memc.cli sends to
    files while memc runs); the streams themselves where they have none (a notebook's)."""
    copies = []
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
            copies.append(os.fdopen(os.dup(stream.fileno()), "w", buffering=1))
        except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
            copies.append(stream)
    try:
        yield copies[0], copies[1]
    finally:
        for copy, stream in zip(copies, (sys.stdout, sys.stderr)):
            if copy is not stream:
                copy.close()


def compile(model: Any, example_inputs: Any = None, *, batch: Optional[int] = None, budget: Optional[str] = None,
            optimizer: str = "adamw", output: Optional[str] = None, exporter: str = "auto", **options: Any) -> Plan:
    """Compiles `model` into a training plan under a memory budget.

    A torch module is exported to ONNX first, in its current mode (which decides dropout), every
    parameter its own trained initializer; frozen parameters and floating-point buffers are
    passed as `freeze`.

    Args:
        model: An ONNX file path, an `onnx.ModelProto` or a `torch.nn.Module`.
        example_inputs: One batch of inputs (a tensor, or a tuple for several inputs). Needed for
            a torch module; its first dimension is the default `batch`.
        batch: Rows per batch.
        budget: Device memory the plan may use (``"6GB"``, ``"512MiB"``, bytes); decisions not
            given as options are searched to meet it.
        optimizer: ``"adamw"``, ``"adam"``, ``"sgd"``, ``"momentum"``, ``"adam8bit"`` or
            ``"adafactor"``.
        output: Keep the plan in this file (replacing it), and a torch module's export beside it
            as ``<name>.onnx``; by default both live in a temporary folder with the Plan.
        exporter: For a torch module: ``"auto"`` (torch's dynamo exporter, falling back to
            TorchScript with the reason as a warning), ``"dynamo"`` or ``"torchscript"``.
        **options: Any other `memc compile` option, by its name: ``lr=1e-3``,
            ``precision="bf16-mixed"``, ``remat="blocks"``, ``no_dropout=True``,
            ``freeze=["pos_table"]``.

    Returns:
        The plan, not yet opened.

    Raises:
        BudgetError: No plan meets `budget`.
        MemcError: Bad input: an unsupported model or op, a bad option, a module torch cannot
            export, or a parameter the export did not keep as its own trained initializer.

    Warns:
        UserWarning: `exporter="auto"` fell back to TorchScript; the message says why.

    Example:
        ```python
        plan = memc.compile(model, (x,), budget="600KB", lr=2e-3, epochs=20)
        print(plan.predicted_peak_bytes, plan.decisions)
        ```
    """
    workdir = tempfile.TemporaryDirectory(prefix="memc_")
    module, input_names = None, ["x"]
    examples = None if example_inputs is None else (tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) else (example_inputs,))
    if isinstance(model, (str, os.PathLike)):
        model_path = os.fspath(model)
    elif hasattr(model, "SerializeToString") and hasattr(model, "graph"):  # onnx.ModelProto
        model_path = os.path.join(workdir.name, "model.onnx")
        with open(model_path, "wb") as f:
            f.write(model.SerializeToString())
    elif hasattr(model, "state_dict") and hasattr(model, "forward"):  # torch.nn.Module
        if examples is None:
            raise MemcError("memc: a torch module needs example_inputs to export it")
        module = model
        model_path = os.path.join(output and os.path.dirname(os.path.abspath(output)) or workdir.name,
                                  (os.path.splitext(os.path.basename(output))[0] if output else "model") + ".onnx")
        export = _export_module(model, examples, model_path, exporter)
        input_names = export["input_names"]
        with _naming_the_module(model if not output else None, export, model_path):
            frozen = _frozen_initializers(model, model_path)
        if frozen:
            options = {**options, "freeze": sorted(set(options.get("freeze", [])) | frozen)}
    else:
        raise MemcError(f"memc: model is an ONNX path, an onnx.ModelProto or a torch.nn.Module, not {type(model).__name__}")
    if batch is None:
        if examples is None:
            raise MemcError("memc: give batch= or example_inputs (whose first dim is the batch)")
        batch = int(_numpy(examples[0]).shape[0])
    args = ["--batch", str(batch), "--optimizer", optimizer] + (["--budget", str(budget)] if budget is not None else []) + _flags(options)
    plan_path = os.path.abspath(output) if output else os.path.join(workdir.name, "model.plan")
    with _naming_the_module(module if not output else None, export if module is not None else None, model_path):
        summary = json.loads(cli("compile", model_path, *args, "-o", plan_path, "--json", "--force"))
    summary.setdefault("batch", batch)
    if module is not None:
        summary["exporter"] = export["exporter"]
        if export.get("dynamo_failure"):
            summary["dynamo_failure"] = export["dynamo_failure"]
        summary["parameter_names"] = _check_parameters(module, summary.get("trainable_params", []), export["ran"], export["exporter"],
                                                       examples)
    return Plan(plan_path, summary, model_path=model_path, compile_args=args, module=module, input_names=input_names, workdir=workdir)


@contextlib.contextmanager
def _naming_the_module(module: Any, export: Optional[dict], model_path: str):
    """Re-raises memc's refusal of a module's export naming the module, not the export's
    temporary file, which is gone once the exception leaves `compile`."""
    try:
        yield
    except MemcError as e:
        if module is None or export is None:
            raise
        what = f"{type(module).__name__} (its {export['exporter']} ONNX export)"
        raise type(e)(str(e).replace(model_path, what, 1)) from None


def load_plan(path: str, module: Any = None) -> Plan:
    """Opens a plan file that `memc compile`, `compile(output=...)` or `Plan.save` wrote.

    Args:
        path: The plan file; its model must be where the plan names it.
        module: The torch module the plan was compiled from, so that `Plan.state_dict` returns
            its state under its names. A batch of a module with several inputs is
            ``(x1, x2, ..., y)`` in the model's input order, or a dict by input name.

    Returns:
        The plan; its session starts from the model's initial weights (`Plan.fit` with
        ``resume=True`` continues from a checkpoint).

    Raises:
        MemcError: The file is missing or not a plan.
    """
    summary = json.loads(cli("inspect", path, "--json"))
    model = summary.get("model", "")
    if model and not os.path.isabs(model):  # recorded relative to the plan's folder
        model = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(path)), model))
    return Plan(os.path.abspath(path), summary, model_path=model, module=module, input_names=summary.get("inputs") or ("x",))
