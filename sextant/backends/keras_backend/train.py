"""One Keras 3 worker: the canonical model in Keras layers, trained by `model.fit`.

The Keras way, on whichever backend KERAS_BACKEND names (set by `run` before keras is
imported):

- model: `model.build` (canonical weights assigned to Keras layers), `compile(optimizer=
  keras.optimizers.AdamW(...), jit_compile=...)`: 'compiled' is `jit_compile=True` (jax.jit,
  torch.compile, XLA), 'eager' is `jit_compile=False` (op by op on JAX and torch; on
  TensorFlow a tf.function without XLA, Keras' own non-jit path);
- data: a `keras.utils.PyDataset` whose item j is the canonical batch start_step + j, in
  order (`shuffle=False`), one epoch of `steps - start_step` batches;
- step: the model's `train_step` override (model.Trainable), which puts this step's loss
  and global gradient norm into fit's logs;
- measurement: a `keras.callbacks.Callback` whose `on_train_batch_end` hands each step's
  end, loss and norm to the harness' StepRecorder. A callback with `on_train_batch_end`
  makes Keras convert the logs to Python floats after every step (its CallbackList does so
  for any such callback, the progress bar included): one host read-back per step, which is
  also what marks the step's end; sextant's own loops read back every `log_every` steps.
- optimizer: Keras' AdamW with sextant's hyper-parameters, the learning rate as a
  `LearningRateSchedule` indexing `sextant.workloads.schedule.lr_table` by `optimizer.iterations`, and
  weight decay excluded (`exclude_from_weight_decay`) from the parameters `sextant.workloads.init.decays`
  exempts. Its update differs from torch's in where eps goes (docs/keras.md): Keras adds eps
  to sqrt(v) before the bias correction, torch after.
- dp (JAX backend only): `keras.distribution.DataParallel` over every device, set before the
  model is built: inside one process over `devices_per_worker` host devices, across
  processes after `keras.distribution.initialize` (jax.distributed). Keras shards each batch
  over the devices and XLA all-reduces the gradients.
- checkpoints: `model.save_weights` plus the optimizer's variables (moments and the update
  counter) in an .npz, through the harness' sealed directories.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sextant import data
from sextant.backends import harness
from sextant.backends.harness import Description, Trainer
from sextant.workloads.init import adapter_shapes, decays, param_shapes
from sextant.pretrained.weights import initial_params, trainable
from sextant.measure.env import fingerprint
from sextant.workloads.schedule import lr_table

if TYPE_CHECKING:
    from sextant.contracts import RankResult, WorkerContext
    from sextant.measure.loop import StepRecorder

WEIGHTS = "model.weights.h5"
OPTIMIZER = "optimizer.npz"


def prepare(ctx: WorkerContext) -> Any:
    """The process set up for the Keras backend, then `import keras` (returned)."""
    backend = ctx.strategy.keras_backend
    os.environ["KERAS_BACKEND"] = backend
    if backend == "tensorflow":
        from sextant.backends.tf_backend import import_tensorflow
        from sextant.backends.tf_backend.train import configure

        configure(import_tensorflow(ctx), ctx)
    elif backend == "torch":
        import torch

        torch.set_num_threads(ctx.threads)
    # Keras imports JAX whatever its backend; the host devices are fixed before first use.
    from sextant.backends.jax_backend import use_host_devices

    use_host_devices(ctx.strategy.devices_per_worker)
    import keras

    if ctx.world > 1:  # JAX only (KerasBackend.check): jax.distributed underneath
        keras.distribution.initialize(job_addresses=f"{ctx.master_addr}:{ctx.master_port}",
                                      num_processes=ctx.world, process_id=ctx.rank)
    return keras


def run(ctx: WorkerContext) -> RankResult:
    keras = prepare(ctx)
    try:
        return _train(ctx, keras)
    finally:
        if ctx.world > 1:
            import jax

            jax.distributed.shutdown()


def make_optimizer(keras: Any, workload: Any, variables: dict[str, Any],
                   torch_eps: bool = True) -> Any:
    """Keras' AdamW with sextant's hyper-parameters, schedule and decay mask; `torch_eps`:
    with torch's eps placement (TorchEpsAdamW), else Keras' stock update."""
    opt_spec = workload.optimizer
    table = lr_table(opt_spec, workload.steps)
    ops = keras.ops

    class TableSchedule(keras.optimizers.schedules.LearningRateSchedule):
        """Update k uses lr_table[k] (clamped to the last entry)."""

        def __call__(self, step: Any) -> Any:
            index = ops.minimum(ops.cast(step, "int32"), table.size - 1)
            return ops.take(ops.convert_to_tensor(table), index)

    class TorchEpsAdamW(keras.optimizers.AdamW):
        """keras.optimizers.AdamW with torch.optim.AdamW's update (docs/keras.md): eps added
        to the bias-corrected root, `p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)`.
        Keras' own adds it before the correction, i.e. uses eps/sqrt(1-b2^t). The moments,
        the decoupled decay (Keras' AdamW, before the step) and everything else are Keras'."""

        def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
            dtype = variable.dtype
            lr = ops.cast(learning_rate, dtype)
            g = ops.cast(gradient, dtype)
            t = ops.cast(self.iterations + 1, dtype)
            bc1 = 1 - ops.power(ops.cast(self.beta_1, dtype), t)
            bc2_sqrt = ops.sqrt(1 - ops.power(ops.cast(self.beta_2, dtype), t))
            index = self._get_variable_index(variable)
            m, v = self._momentums[index], self._velocities[index]
            self.assign_add(m, ops.multiply(ops.subtract(g, m), 1 - self.beta_1))
            self.assign_add(v, ops.multiply(ops.subtract(ops.square(g), v), 1 - self.beta_2))
            denom = ops.add(ops.divide(ops.sqrt(v), bc2_sqrt), self.epsilon)
            self.assign_sub(variable, ops.divide(ops.multiply(m, lr / bc1), denom))

    cls = TorchEpsAdamW if torch_eps else keras.optimizers.AdamW
    optimizer = cls(learning_rate=TableSchedule(), weight_decay=opt_spec.weight_decay,
                    beta_1=opt_spec.beta1, beta_2=opt_spec.beta2, epsilon=opt_spec.eps)
    shapes = {**param_shapes(workload.model),
              **adapter_shapes(workload.model, workload.finetune)}
    optimizer.exclude_from_weight_decay(
        var_list=[v for n, v in variables.items() if not decays(n, shapes[n])])
    return optimizer


def _distribution(keras: Any, ctx: WorkerContext) -> tuple[Any, str]:
    if ctx.strategy.parallel != "dp":
        return None, "none"
    devices = keras.distribution.list_devices()
    # Each process feeds its own shard of the canonical batch (sextant.data.local_batch), so
    # Keras must not shard the dataset again (its auto-sharding wants a tf.data.Dataset).
    dist = keras.distribution.DataParallel(devices=devices, auto_shard_dataset=False)
    keras.distribution.set_distribution(dist)
    where = (f"{len(devices)} host devices in one process" if ctx.world == 1
             else f"{len(devices)} devices over {ctx.world} processes (jax.distributed)")
    return dist, f"keras.distribution.DataParallel over {where}"


def _train(ctx: WorkerContext, keras: Any) -> RankResult:
    from sextant.backends.keras_backend import model as km

    workload, strategy = ctx.workload, ctx.strategy
    backend = keras.backend.backend()
    dist, wrapping = _distribution(keras, ctx)
    params0 = initial_params(workload)
    ft = workload.finetune
    model, variables = km.build(workload.model, params0,
                                (ft.targets, ft.rank, ft.scale) if ft.lora else None)
    for name, variable in variables.items():  # LoRA: the base is frozen
        variable.trainable = trainable(workload, name)
    # The test hook SEXTANT_TEST_FAULT=keras-stock-adamw trains with Keras' own AdamW update,
    # so the tests can show the parity tolerance sees its eps placement.
    stock = "keras-stock-adamw" in (ctx.fault or "").split(",")
    optimizer = make_optimizer(keras, workload, variables, torch_eps=not stock)
    optimizer.build(model.trainable_variables)  # its variables exist before a restore
    jit = strategy.mode == "compiled"
    model.compile(optimizer=optimizer, jit_compile=jit)

    def final_params() -> dict[str, np.ndarray] | None:
        _sync(model)
        if ctx.rank != 0:
            return None
        return {n: np.asarray(keras.ops.convert_to_numpy(v.value)) for n, v in
                variables.items()}

    def save(directory: Path) -> None:
        _sync(model)
        if ctx.rank != 0:  # every rank holds the same replicated state
            return
        directory.mkdir(parents=True, exist_ok=True)
        model.save_weights(str(directory / WEIGHTS))
        np.savez(directory / OPTIMIZER, **{f"{i:04d}": keras.ops.convert_to_numpy(v.value)
                                           for i, v in enumerate(optimizer.variables)})

    def restore(directory: Path, step: int) -> None:
        model.load_weights(str(directory / WEIGHTS))
        with np.load(directory / OPTIMIZER) as saved:
            if len(saved.files) != len(optimizer.variables):
                raise RuntimeError(f"{directory}: {len(saved.files)} optimizer variables "
                                   f"saved, {len(optimizer.variables)} expected")
            for i, v in enumerate(optimizer.variables):
                v.assign(saved[f"{i:04d}"])
        if int(keras.ops.convert_to_numpy(optimizer.iterations.value)) != step:
            raise RuntimeError(f"{directory}: optimizer iterations do not match step {step}")

    def owned_loop(recorder: StepRecorder) -> None:
        _fit(keras, ctx, model, recorder)

    def describe() -> Description:
        nbytes = sum(a.nbytes for a in params0.values())
        trained = sum(params0[n].nbytes for n, v in variables.items() if v.trainable)
        return Description(
            memory={"params": nbytes, "frozen_params": nbytes - trained,
                    "grads": None,  # live only inside the step
                    "optimizer_state": 2 * trained},
            details={
                "optimizer": ("keras.optimizers.AdamW (stock update: test hook)" if stock else
                              "keras.optimizers.AdamW subclass with torch's eps placement "
                              "(update_step overridden, docs/keras.md)"),
                "keras_backend": backend,
                "wrapping": " + ".join(w for w in (wrapping if dist is not None else "",
                                                   f"compile(jit_compile={jit})") if w),
                "step": "model.fit: Trainable.train_step "
                        f"({backend}), logs = this step's loss and gradient norm",
                "collectives": ("XLA all-reduce (keras DataParallel)"
                                if dist is not None else None),
                "devices": len(keras.distribution.list_devices()) if dist is not None else 1,
                "precision": strategy.precision,
            },
            fingerprint=fingerprint(
                framework="keras", framework_version=keras.__version__,
                keras_backend=backend, backend_version=_backend_version(backend),
                threads=ctx.threads, device=_device(backend),
                jit_compile=jit, omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
            ),
        )

    return harness.train(ctx, Trainer(
        n_params=sum(v.size for v in params0.values()),
        n_trainable=sum(int(np.prod(v.shape)) for v in model.trainable_variables),
        fetch=harness.unused, step=harness.unused, block=harness.unused,
        to_floats=harness.unused, final_params=final_params, describe=describe,
        save=save, restore=restore, owned_loop=owned_loop,
        barrier=_barrier(ctx),
    ))


def _fit(keras: Any, ctx: WorkerContext, model: Any, recorder: StepRecorder) -> None:
    """`model.fit` over the canonical batches [start_step, steps), measured by a callback."""
    workload = ctx.workload
    start = recorder.start_step
    rows: dict[int, int] = {}

    class Batches(keras.utils.PyDataset):
        """Item j: this rank's shard of canonical global batch start + j."""

        def __len__(self) -> int:
            return workload.steps - start

        def __getitem__(self, j: int) -> tuple[np.ndarray, np.ndarray]:
            t0 = time.perf_counter()
            x, y = data.local_batch(workload, start + j, ctx.rank, ctx.world, ctx.fault)
            rows[start + j] = len(x)
            recorder.data_time(start + j, time.perf_counter() - t0)
            return x, y

    class Measure(keras.callbacks.Callback):
        def on_train_begin(self, logs: Any = None) -> None:
            recorder.begin()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            step = start + batch
            recorder.step_end(step, logs["loss"], logs["grad_norm"], rows.get(step))

    if start >= workload.steps:
        recorder.begin()
        return
    model.fit(Batches(workers=1, use_multiprocessing=False), epochs=1, shuffle=False,
              verbose=0, callbacks=[Measure()])


def _sync(model: Any) -> None:
    """On JAX, fit keeps the training state outside the variables until it ends; a callback
    (a checkpoint save) brings them up to date."""
    if hasattr(model, "jax_state_sync"):
        model.jax_state_sync()


def _barrier(ctx: WorkerContext) -> Any:
    if ctx.world == 1:
        return harness._no_barrier  # noqa: SLF001 - the harness' own default

    def barrier() -> None:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("sextant-keras")

    return barrier


def _backend_version(backend: str) -> str:
    import importlib

    return str(importlib.import_module(backend).__version__)


def _device(backend: str) -> str:
    if backend == "jax":
        import jax

        return ", ".join(str(d) for d in jax.local_devices())
    return "cpu"
