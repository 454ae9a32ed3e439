"""One JAX worker: a pure train step under jax.jit with donated buffers, optax AdamW.

Strategies over a 1-D device Mesh with axis 'data' (the devices of every worker process,
joined by jax.distributed):
- single:    one device, plain jit.
- dp:        batch sharded on 'data', parameters replicated; XLA inserts the gradient
             all-reduce (declarative).
- dp-manual: the same step written per device with jax.shard_map and an explicit
             lax.pmean of loss and gradients (the hand-controlled style).
- zero1:     parameters replicated, optimizer moments sharded on 'data'; XLA all-gathers the
             updated parameters.
- zero2:     zero1 with the gradients constrained to the moments' sharding (ZeRO-2): a
             reduce-scatter where XLA has one (GPU); on CPU it lowers to an all-reduce and
             a slice, the same program as zero1 (see the run's hlo_collectives).
- fsdp:      parameters and optimizer state sharded on 'data' along their first divisible
             axis (ZeRO-3 style); XLA inserts all-gathers and reduce-scatters.

Tensor parallelism (Llama family) over a 2-D Mesh ('data', 'model'), batch on 'data':
- tp:        declared: q/k/v and gate/up weights sharded by columns on 'model', the attention
             output and down projection by rows, the embedding and the head over the
             vocabulary, norms replicated; XLA inserts the collectives (read back from the
             compiled HLO).
- tp-manual: the same split written by hand: jax.shard_map over the mesh, Megatron's f/g
             operators (model.megatron_ops: psum of the partial sums forward, of the input
             gradients backward), a vocabulary-parallel embedding and head (masked lookup +
             psum; logits all-gathered), gradients averaged over 'data' with a pmean.

Checkpoints: orbax (StandardCheckpointer) of parameters and optimizer state, every process
writing its own shards, sealed by sextant.checkpoint's manifest.

The no-sync variant used for the exposed-communication figure is the shard_map step without
the pmean: every device updates its replica from its local gradients.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from sextant import data
from sextant.backends import harness, precision
from sextant.backends.harness import Description, Trainer
from sextant.core.devices import detect
from sextant.core.errors import UserError
from sextant.workloads.init import decays, param_shapes
from sextant.pretrained.weights import bf16_base_names, initial_params, trainable
from sextant.measure.comm import megatron_tp_payload
from sextant.measure.env import fingerprint, package_version
from sextant.measure.guard import guard_recompiles
from sextant.workloads.schedule import lr_table
from sextant.workloads.spec import MLPSpec

if TYPE_CHECKING:
    from sextant.contracts import RankResult, WorkerContext


def run(ctx: WorkerContext) -> RankResult:
    import jax

    from sextant.backends.jax_backend import use_host_devices

    use_host_devices(ctx.strategy.devices_per_worker)
    if ctx.world > 1:
        jax.distributed.initialize(
            coordinator_address=f"{ctx.master_addr}:{ctx.master_port}",
            # The coordination service listens on the coordinator host's address only (JAX's
            # default is every interface).
            coordinator_bind_address=f"{ctx.master_addr}:{ctx.master_port}",
            num_processes=ctx.world,
            process_id=ctx.rank,
            initialization_timeout=int(ctx.collective_timeout_s),
            heartbeat_timeout_seconds=int(ctx.collective_timeout_s),
        )
    try:
        return _train(ctx)
    finally:
        if ctx.world > 1:
            jax.distributed.shutdown()


def _fsdp_spec(shape: tuple[int, ...], n: int) -> Any:
    from jax.sharding import PartitionSpec as P

    for axis, size in enumerate(shape):
        if size % n == 0:
            return P(*([None] * axis + ["data"]))
    return P()  # too small to split evenly: replicated


COLUMN_PARALLEL = ("attn.q.weight", "attn.k.weight", "attn.v.weight", "mlp.gate.weight",
                   "mlp.up.weight")
COLUMN_BIASES = ("attn.q.bias", "attn.k.bias", "attn.v.bias")
"""Split as their projections' columns: each shard adds the bias of its own heads."""
ROW_PARALLEL = ("attn.o.weight", "mlp.down.weight")


def _tp_spec(name: str) -> Any:
    """Megatron's split of a Llama parameter over mesh axis 'model'."""
    from jax.sharding import PartitionSpec as P

    if name.endswith(COLUMN_PARALLEL) or name == "head.weight":  # head: over the vocabulary
        return P(None, "model")
    if name.endswith(ROW_PARALLEL) or name == "wte":  # embedding rows: over the vocabulary
        return P("model", None)
    if name.endswith(COLUMN_BIASES):
        return P("model")
    return P()


def _megatron_step(mesh: Any, tp_specs: dict[str, Any], loss_of: Any, apply: Any,
                   summed: bool = False) -> Any:
    """Tensor parallelism by hand: each device's shard computes its loss and gradients with
    Megatron's f/g operators (model.megatron_ops), then averages them over 'data' with an
    explicit pmean (`summed`: the test hook that leaves out the division)."""
    import jax
    from jax.sharding import PartitionSpec as P

    mean = jax.lax.psum if summed else jax.lax.pmean
    replicas = mesh.shape["data"]

    def local(p: Any, x: Any, y: Any) -> tuple:
        # One shard: its heads and MLP columns, its rows of the batch.
        loss, grads = jax.value_and_grad(loss_of)(p, x, y, "model")
        if replicas == 1:  # no data-parallel peers: XLA would keep a no-op all-reduce
            return loss, grads
        return jax.lax.pmean(loss, "data"), jax.tree.map(lambda g: mean(g, "data"), grads)

    def step(params: Any, opt_state: Any, x: Any, y: Any) -> tuple:
        loss, grads = jax.shard_map(
            local, mesh=mesh, in_specs=(tp_specs, P("data"), P("data")),
            out_specs=(P(), tp_specs), check_vma=False)(params, x, y)
        return apply(params, opt_state, loss, grads)

    return step


def _check_remat(remat: bool, spec: Any) -> None:
    if remat and isinstance(spec, MLPSpec):
        raise UserError("--activation-checkpointing recomputes transformer blocks; "
                        "this model (mlp) has none")


def _without_tp_collectives(make_jit: Any, step: Any, params: Any, opt_state: Any,
                            batch: Any) -> Any:
    """The hand-written tensor-parallel step compiled again with its collectives replaced by
    local stand-ins of the right shape (model.NO_COLLECTIVES, read while it is traced): the
    same compute without tensor-parallel communication, for the exposed-communication pairs
    after training (the data-parallel pmean, if any, stays)."""
    from sextant.backends.jax_backend import model as jax_model

    jax_model.TEST_FAULTS.add(jax_model.NO_COLLECTIVES)
    def untimed_copy(*args: Any) -> Any:  # a new function: jit's trace cache is per function
        return step(*args)

    try:  # traced here, with the flag set
        return make_jit(untimed_copy).lower(params, opt_state, *batch).compile()
    finally:
        jax_model.TEST_FAULTS.discard(jax_model.NO_COLLECTIVES)


def _initial_params(workload: Any, strategy: Any) -> dict[str, np.ndarray]:
    """Canonical parameters, or the pipeline's stacked layout of them (parallel pp)."""
    import jax.numpy as jnp

    from sextant.backends.jax_backend import pipeline

    params = initial_params(workload)
    for name in bf16_base_names(workload):  # a bf16 frozen base, rounded once
        params[name] = params[name].astype(jnp.bfloat16)
    return pipeline.stack(params, workload.model, strategy.pp) if strategy.pp > 1 else params


def _decay_mask(params: dict[str, np.ndarray], spec: Any, parallel: str) -> dict[str, bool]:
    from sextant.backends.jax_backend import pipeline

    if parallel == "pp":
        return pipeline.decay_mask(params, spec)
    return {k: decays(k, v.shape) for k, v in params.items()}


def _model_loss(spec: Any, strategy: Any, mesh: Any, fault: str | None, numerics: Any
                ) -> Any:
    """loss(p, x, y, remat, tp_axis): the model's, or the pipeline's over the mesh."""
    from sextant.backends.jax_backend import pipeline
    from sextant.backends.jax_backend.model import loss_fn

    if strategy.parallel == "pp":  # fp32 only (JaxBackend.check)
        pp_loss = pipeline.make_loss(spec, mesh, strategy.pp, strategy.microbatches, fault)
        return lambda p, x, y, remat, tp_axis: pp_loss(p, x, y)
    return lambda p, x, y, remat, tp_axis: loss_fn(spec, p, x, y, remat, tp_axis, numerics)


def _numerics(ctx: WorkerContext, device: Any) -> tuple[Any, str]:
    """(model.Numerics, how attention runs): the compute dtype of the precision, and cuDNN's
    fused attention where the device and dtype allow it (a GPU, bf16 or fp16), probed once
    on the workload's attention shape; otherwise XLA's, with the reason."""
    import jax
    import jax.numpy as jnp

    from sextant.backends.jax_backend.model import Numerics
    from sextant.workloads.spec import MLPSpec

    compute = precision.half_dtype(jnp, ctx.strategy.precision, jnp.float32)
    spec = ctx.workload.model
    if isinstance(spec, MLPSpec):
        return Numerics(compute=compute), "none (no attention)"
    if device.platform != "gpu":
        return Numerics(compute=compute), f"xla (cuDNN attention needs a GPU; this is {device.platform})"
    if compute == jnp.float32:
        return Numerics(compute=compute), "xla (cuDNN attention needs bf16 or fp16)"
    head_dim = spec.d_model // spec.n_heads
    kv_heads = getattr(spec, "n_kv_heads", spec.n_heads)  # Llama's grouped-query attention
    try:
        q = jnp.zeros((1, spec.seq_len, spec.n_heads, head_dim), compute)
        kv = jnp.zeros((1, spec.seq_len, kv_heads, head_dim), compute)
        def probe(a: jax.Array, b: jax.Array) -> jax.Array:  # forward and backward
            return jax.nn.dot_product_attention(a, b, b, is_causal=True,
                                                implementation="cudnn").astype(jnp.float32).sum()

        jax.block_until_ready(jax.jit(jax.grad(probe, argnums=(0, 1)))(q, kv))
    except Exception as exc:  # noqa: BLE001 - any refusal of cuDNN's kernel: XLA's, named
        first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        return Numerics(compute=compute), f"xla (cuDNN attention refused: {first})"
    return Numerics(compute=compute, attention="cudnn"), "cudnn (jax.nn.dot_product_attention)"


def _canonical(params: dict[str, np.ndarray], spec: Any, parallel: str
               ) -> dict[str, np.ndarray]:
    from sextant.backends.jax_backend import pipeline

    return pipeline.unstack(params, spec) if parallel == "pp" else params


def _register_faults(fault: str | None) -> None:
    from sextant.backends.jax_backend import model as jax_model

    jax_model.TEST_FAULTS.update(fault.split(",") if fault else ())


def _shardings(parallel: str, devices: list[Any], tp: int, pp: int,
               params_np: dict[str, np.ndarray]
               ) -> tuple[Any, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(mesh, tensor-parallel PartitionSpecs, parameter and optimizer-moment shardings)."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from sextant.backends.jax_backend import pipeline

    n = len(devices) // (tp * pp)
    if parallel in ("tp", "tp-manual"):
        mesh = Mesh(np.array(devices).reshape(n, tp), ("data", "model"))
    elif parallel == "pp":
        mesh = Mesh(np.array(devices).reshape(n, pp), ("data", "stage"))
    else:
        mesh = Mesh(np.array(devices), ("data",))
    replicated = NamedSharding(mesh, P())
    tp_specs = {k: _tp_spec(k) for k in params_np}
    sharded = {k: NamedSharding(mesh, _fsdp_spec(v.shape, n)) for k, v in params_np.items()}
    if parallel in ("tp", "tp-manual"):
        param_sh = {k: NamedSharding(mesh, tp_specs[k]) for k in params_np}
    elif parallel == "pp":
        param_sh = {k: NamedSharding(mesh, pipeline.spec_of(k)) for k in params_np}
    else:
        param_sh = sharded if parallel == "fsdp" else {k: replicated for k in params_np}
    # ZeRO-1: the optimizer moments are sharded, the parameters replicated (XLA all-gathers
    # the updated parameters); fsdp shards both.
    moment_sh = sharded if parallel in ("zero1", "zero2", "fsdp") else param_sh
    return mesh, tp_specs, param_sh, moment_sh


def _optimizer(workload: Any, params_np: dict[str, np.ndarray], parallel: str) -> Any:
    """optax.adamw with the workload's schedule: the same math as torch.optim.AdamW
    (bias-corrected moments, eps added to sqrt(v_hat) = sqrt(v)/sqrt(1-b2^t) + eps, decoupled
    decay lr*wd*p on the masked parameters)."""
    import jax.numpy as jnp
    import optax

    opt_spec = workload.optimizer
    lrs = jnp.asarray(lr_table(opt_spec, workload.steps))
    last = workload.steps - 1
    adamw = optax.adamw(
        learning_rate=lambda count: lrs[jnp.minimum(count, last)],
        b1=opt_spec.beta1, b2=opt_spec.beta2, eps=opt_spec.eps,
        weight_decay=opt_spec.weight_decay,
        mask=_decay_mask(params_np, workload.model, parallel),
    )
    if not workload.finetune.lora:
        return adamw
    # LoRA: moments for the adapters only; the frozen base's (zero) gradients pass through
    # as its (zero) updates.
    return optax.masked(adamw, {k: trainable(workload, k) for k in params_np})


def _loss_and_grads(ctx: WorkerContext, mesh: Any, numerics: Any) -> tuple[Any, Any]:
    """(precision_loss, grad_fn): the model's loss under the precision and activation-
    checkpointing levers, and its (loss, gradients) over `grad_accum` micro-batches."""
    import jax
    import jax.numpy as jnp

    strategy, spec = ctx.strategy, ctx.workload.model
    model_loss = _model_loss(spec, strategy, mesh, ctx.fault, numerics)
    accum = strategy.grad_accum
    remat = strategy.activation_checkpointing  # every transformer block under jax.checkpoint
    _check_remat(remat, spec)

    frozen = {k for k in param_shapes(spec) if not trainable(ctx.workload, k)}

    def precision_loss(p: Any, x: jax.Array, y: jax.Array, tp_axis: str | None = None
                       ) -> jax.Array:
        # Mixed precision casts inside the model (model.Numerics): fp32 master weights,
        # bf16 matmul operands, the loss in fp32. LoRA's frozen base takes no gradient.
        if frozen:  # (a bf16 frozen base upcast to fp32 for the model's matmuls)
            p = {k: jax.lax.stop_gradient(v).astype(jnp.float32) if k in frozen else v
                 for k, v in p.items()}
        return model_loss(p, x, y, remat, tp_axis)

    single_grad = jax.value_and_grad(precision_loss)

    def grad_fn(p: Any, x: jax.Array, y: jax.Array) -> tuple[jax.Array, Any]:
        if accum == 1:
            return single_grad(p, x, y)
        # K micro-batches, gradients summed in a scan; micro-batch k takes the rows with
        # index = k (mod K), so every device keeps its own rows.
        def micro(a: jax.Array) -> jax.Array:
            return a.reshape(a.shape[0] // accum, accum, *a.shape[1:]).swapaxes(0, 1)

        def body(carry: tuple, batch: tuple) -> tuple:
            loss, grads = single_grad(p, *batch)
            return (carry[0] + loss, jax.tree.map(jnp.add, carry[1], grads)), None

        zero = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, p))
        (loss, grads), _ = jax.lax.scan(body, zero, (micro(x), micro(y)))
        return loss / accum, jax.tree.map(lambda g: g / accum, grads)

    return precision_loss, grad_fn


def _step_functions(ctx: WorkerContext, mesh: Any, n: int, moment_sh: Any, optimizer: Any,
                    grad_fn: Any) -> tuple[Any, Any, Any]:
    """(apply, declarative_step, per_device_step): the optimizer update, the step whose
    collectives XLA inserts from the shardings, and the shard_map step whose gradient mean is
    written by hand (`per_device_step(sync=False)` leaves it out)."""
    import jax
    import jax.flatten_util
    import jax.numpy as jnp
    import optax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    strategy = ctx.strategy
    accum, parallel = strategy.grad_accum, strategy.parallel
    wire = precision.half_dtype(jnp, strategy.compress)

    def mean_over_devices(tree: Any) -> Any:
        # One collective for all gradients (a flat buffer, as DDP's buckets), not one per
        # tensor: on CPU every gloo collective pays a round-trip latency. Compression casts
        # the buffer to 16 bits before the collective and back to fp32 after.
        flat, unflatten = jax.flatten_util.ravel_pytree(tree)
        if wire is None:
            return unflatten(jax.lax.pmean(flat, "data"))
        return unflatten(jax.lax.pmean(flat.astype(wire), "data").astype(flat.dtype))

    def apply(params: Any, opt_state: Any, loss: jax.Array, grads: Any) -> tuple:
        norm = optax.global_norm(grads)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, jnp.stack([loss, norm])

    def accumulated_over_devices(p: Any, x: jax.Array, y: jax.Array) -> tuple[jax.Array, Any]:
        # Declarative accumulation that communicates once per optimizer step. Scanning over
        # micro-batches of the sharded batch makes XLA all-reduce every micro-batch's
        # gradients (the scan carry is replicated): measured 4x the communication at K=4.
        # Instead each device's rows get their own axis (sharded on 'data', so no data
        # moves), every device accumulates its K micro-batches locally (vmap of the scan),
        # and the mean over that axis is the step's one gradient reduction, as DDP's no_sync.
        def per_device(a: jax.Array) -> jax.Array:
            a = a.reshape(n, a.shape[0] // n, *a.shape[1:])
            return jax.lax.with_sharding_constraint(a, NamedSharding(mesh, P("data")))

        losses, grads = jax.vmap(grad_fn, in_axes=(None, 0, 0))(p, per_device(x), per_device(y))
        return losses.mean(), jax.tree.map(lambda g: g.mean(axis=0), grads)

    def declarative_step(params: Any, opt_state: Any, x: jax.Array, y: jax.Array) -> tuple:
        if accum > 1 and n > 1:
            loss, grads = accumulated_over_devices(params, x, y)
        else:
            loss, grads = grad_fn(params, x, y)
        if parallel == "zero2":
            # Gradients sharded like the moments (a reduce-scatter where XLA emits one).
            grads = jax.lax.with_sharding_constraint(grads, moment_sh)
        return apply(params, opt_state, loss, grads)

    def per_device_step(sync: bool) -> Any:
        def local(params: Any, opt_state: Any, x: jax.Array, y: jax.Array) -> tuple:
            loss, grads = grad_fn(params, x, y)  # this device's shard only
            if sync:
                loss = jax.lax.pmean(loss, "data")
                grads = mean_over_devices(grads)
            return apply(params, opt_state, loss, grads)

        # check_vma=False: classic shard_map semantics, where gradients of replicated
        # parameters are per-device and the pmean above is the only reduction.
        return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P("data"), P("data")),
                             out_specs=(P(), P(), P()), check_vma=False)

    return apply, declarative_step, per_device_step


def _checkpointing(ctx: WorkerContext, state: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(save, restore, barrier) through orbax's StandardCheckpointer: every process writes
    and reads its own shards, restored straight into each array's sharding."""
    import jax

    barriers = {"n": 0}

    def barrier() -> None:
        if ctx.world > 1:
            from jax.experimental import multihost_utils

            barriers["n"] += 1
            multihost_utils.sync_global_devices(f"sextant-checkpoint-{barriers['n']}")

    def checkpointer() -> Any:
        import orbax.checkpoint as ocp

        return ocp.StandardCheckpointer()

    def save(directory: Any) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        writer = checkpointer()
        writer.save(directory.resolve() / "state", dict(state))
        writer.wait_until_finished()
        writer.close()

    def restore(directory: Any, step: int) -> None:
        abstract = jax.tree.map(
            lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), dict(state))
        reader = checkpointer()
        state.update(reader.restore(directory.resolve() / "state", abstract))
        reader.close()

    return save, restore, barrier


STEP_DESCRIPTIONS = {
    "single": "jit",
    "dp": "jit over Mesh(data), batch sharded, params replicated",
    "dp-manual": "jit(shard_map) with lax.pmean of gradients",
    "zero1": "jit over Mesh(data), params replicated, optimizer state sharded",
    "zero2": "jit over Mesh(data), params replicated, gradients and optimizer state sharded",
    "fsdp": "jit over Mesh(data), params and optimizer state sharded",
    "tp": "jit over Mesh(data={n}, model={tp}), q/k/v/gate/up sharded by columns, o/down by "
          "rows (XLA inserts the collectives)",
    "tp-manual": "jit(shard_map) over Mesh(data={n}, model={tp}) with Megatron's f/g psum "
                 "operators",
    "pp": "jit(shard_map) over Mesh(data={n}, stage={pp}): blocks stacked by stage, "
          "lax.ppermute hand-offs, GPipe over {m} micro-batches",
}


def _describe(ctx: WorkerContext, train_step: Any, state: dict[str, Any], batch: Any,
              n: int, attention: str, applied: precision.Precision) -> Description:
    import jax
    import optax

    strategy = ctx.strategy
    devices = jax.devices()
    collectives = collective_bytes = None
    if len(devices) > 1:
        # The collectives XLA put in the compiled step (the cached executable: no recompile).
        hlo = train_step.lower(state["params"], state["opt"], *batch).compile().as_text()
        collectives = hlo_collectives(hlo)
        collective_bytes = hlo_collective_bytes(hlo)
        if ctx.rank == 0:  # kept with the run: what XLA made of the strategy
            (ctx.run_dir / "train_step.hlo.txt").write_text(hlo)

    def local_bytes(tree: Any) -> int:
        # Bytes this process holds for its first device (its own shard, or a full replica).
        first = jax.local_devices()[0]
        return sum(s.data.nbytes for leaf in jax.tree.leaves(tree)
                   for s in leaf.addressable_shards if s.device == first)

    params_bytes = local_bytes(state["params"])
    details = {
        "optimizer": f"optax.adamw (optax {optax.__version__})",
        "step": STEP_DESCRIPTIONS[strategy.parallel].format(
            n=n, tp=strategy.tp, pp=strategy.pp, m=strategy.microbatches),
        "devices": n,
        "local_param_bytes": params_bytes,
        "collectives": jax.config.jax_cpu_collectives_implementation if ctx.world > 1 else None,
        "hlo_collectives": collectives,
        "hlo_collective_bytes": collective_bytes,
        "tp_planned_bytes_per_step": megatron_tp_payload(ctx.workload, strategy),
        "attention": attention,
    }
    if strategy.activation_checkpointing:
        details["activation_checkpointing"] = "jax.checkpoint per transformer block"
    stats = devices[0].memory_stats() if devices[0].platform == "gpu" else None
    return Description(
        device_peak_bytes=int(stats["peak_bytes_in_use"]) if stats else None,
        memory={"params": params_bytes,
                "frozen_params": local_bytes({k: v for k, v in state["params"].items()
                                              if not trainable(ctx.workload, k)}),
                "grads": None,  # live only inside the compiled step; XLA does not expose them
                "optimizer_state": local_bytes(state["opt"])},
        details=details,
        fingerprint=fingerprint(
            framework="jax",
            framework_version=jax.__version__,
            jaxlib=package_version("jaxlib"),
            optax=optax.__version__,
            threads=ctx.threads,
            device=f"{devices[0].platform} x{len(jax.local_devices())} per process",
            cuda=detect().cuda if devices[0].platform == "gpu" else None,
            gpu=devices[0].device_kind if devices[0].platform == "gpu" else None,
        ),
        precision=applied,
    )


def _batch_feeder(ctx: WorkerContext, first_device: Any, batch_sharding: Any,
                  replicas: int) -> Callable[[int], tuple[Any, Any]]:
    """fetch(i): global batch i as this process's part of the step's input arrays, one batch
    ahead on the device (flax's prefetch_to_device): device_put is asynchronous, so on an
    accelerator the next batch's copy overlaps this step."""
    import jax

    workload, parallel = ctx.workload, ctx.strategy.parallel
    two_d = parallel in ("tp", "tp-manual", "pp")
    ahead: dict[int, tuple[jax.Array, jax.Array]] = {}

    def put(i: int) -> tuple[jax.Array, jax.Array]:
        x, y = data.global_batch(workload, i)
        if ctx.fault == "shape-change" and i == workload.measure.warmup_steps + 1:
            x, y = x[:-replicas], y[:-replicas]  # test hook: another shape after warm-up
        if parallel == "single":
            return jax.device_put((x, y), first_device)
        if two_d:  # each process feeds the rows of its devices' 'data' positions
            return (jax.make_array_from_callback(x.shape, batch_sharding, lambda i: x[i]),
                    jax.make_array_from_callback(y.shape, batch_sharding, lambda i: y[i]))
        x, y = data.shard(x, ctx.rank, ctx.world), data.shard(y, ctx.rank, ctx.world)
        return (jax.make_array_from_process_local_data(batch_sharding, x),
                jax.make_array_from_process_local_data(batch_sharding, y))

    def fetch(i: int) -> tuple[jax.Array, jax.Array]:
        batch = ahead.pop(i, None) or put(i)
        ahead.clear()
        ahead[i + 1] = put(i + 1)
        return batch

    return fetch


def _nosync_step(parallel: str, per_device_step: Any, sharded_jit: Any, step_fn: Any,
                 params: Any, opt_state: Any, fetch: Callable[[int], Any]) -> Any:
    """The step without its gradient collectives, whose time against the synced step's is
    the exposed communication (None where the strategy has no such twin)."""
    import jax

    if parallel in ("dp", "dp-manual"):
        return jax.jit(per_device_step(False), donate_argnums=(0, 1))
    if parallel == "tp-manual":
        return _without_tp_collectives(sharded_jit, step_fn, params, opt_state, fetch(0))
    return None


def _with_moments(opt_state: Any) -> int:
    """Parameters the optimizer updates: the size of Adam's first moments (LoRA's masked
    optimizer keeps them for the adapters only)."""
    import jax

    return int(sum(leaf.size for path, leaf in jax.tree_util.tree_leaves_with_path(opt_state)
                   if any(getattr(k, "name", None) == "mu" for k in path)))


def _train(ctx: WorkerContext) -> RankResult:
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    workload, strategy = ctx.workload, ctx.strategy
    parallel = strategy.parallel
    applied = precision.apply_jax(strategy.precision)  # before anything is traced
    devices = jax.devices()
    n = len(devices) // (strategy.tp * strategy.pp)  # data-parallel replicas
    if workload.global_batch % n:
        raise UserError(
            f"global_batch {workload.global_batch} is not divisible by {n} devices"
        )
    params_np = _initial_params(workload, strategy)
    mesh, tp_specs, param_sh, moment_sh = _shardings(parallel, devices, strategy.tp,
                                                     strategy.pp, params_np)
    replicated = NamedSharding(mesh, P())
    batch_sharding = NamedSharding(mesh, P("data"))
    params = {
        k: jax.make_array_from_callback(v.shape, param_sh[k], lambda idx, v=v: v[idx])
        for k, v in params_np.items()
    }
    optimizer = _optimizer(workload, params_np, parallel)

    def state_sharding(path: tuple, leaf: Any) -> NamedSharding:
        # Moments mirror their parameter's sharding; counters are replicated.
        keys = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        return moment_sh[keys[-1]] if keys and keys[-1] in moment_sh else replicated

    state_sh = jax.tree_util.tree_map_with_path(state_sharding,
                                                jax.eval_shape(optimizer.init, params))
    opt_state = jax.jit(optimizer.init, out_shardings=state_sh)(params)

    numerics, attention = _numerics(ctx, devices[0])
    numerics = dataclasses.replace(numerics, lora_scale=workload.finetune.scale)
    precision_loss, grad_fn = _loss_and_grads(ctx, mesh, numerics)
    apply, declarative_step, per_device_step = _step_functions(ctx, mesh, n, moment_sh,
                                                               optimizer, grad_fn)
    _register_faults(ctx.fault)
    donate = (0, 1)
    sharded_jit = functools.partial(
        jax.jit,
        in_shardings=(param_sh, state_sh, batch_sharding, batch_sharding),
        out_shardings=(param_sh, state_sh, replicated),
        donate_argnums=donate,
    )
    step_fn = declarative_step
    if parallel == "single":
        train_step = jax.jit(declarative_step, donate_argnums=donate)
    elif parallel == "dp-manual":
        train_step = jax.jit(per_device_step(True), donate_argnums=donate)
    else:
        if parallel == "tp-manual":
            step_fn = _megatron_step(mesh, tp_specs, precision_loss, apply,
                                     summed="sum-gradients" in (ctx.fault or "").split(","))
        train_step = sharded_jit(step_fn)

    fetch = _batch_feeder(ctx, devices[0], batch_sharding, n)
    state = {"params": params, "opt": opt_state}

    def run_step(fn: Any, batch: tuple[jax.Array, jax.Array]) -> jax.Array:
        state["params"], state["opt"], metrics = fn(state["params"], state["opt"], *batch)
        return metrics

    step = guard_recompiles(lambda batch: run_step(train_step, batch),
                            workload.measure.warmup_steps, count=train_step._cache_size)
    nosync_step = _nosync_step(parallel, per_device_step, sharded_jit, step_fn, params,
                               opt_state, fetch)

    def to_floats(handles: list[jax.Array]) -> list[tuple[float, float]]:
        return [tuple(np.asarray(h.addressable_data(0)).tolist()) for h in handles]

    def local_rows(batch: tuple[jax.Array, jax.Array]) -> int:
        # Rows this process feeds (its devices' shards), not the global batch.
        return sum(s.data.shape[0] for s in batch[0].addressable_shards)

    def final_params() -> dict[str, np.ndarray] | None:
        # Every process joins the gather; rank 0 writes.
        from jax.experimental import multihost_utils

        gathered = multihost_utils.process_allgather(state["params"], tiled=True)
        return _canonical({k: np.asarray(v, np.float32) for k, v in gathered.items()},
                          workload.model, parallel)

    save, restore, barrier = _checkpointing(ctx, state)
    return harness.train(ctx, Trainer(
        n_params=int(sum(v.size for v in params_np.values())),
        n_trainable=_with_moments(state["opt"]),
        fetch=fetch, step=step, block=jax.block_until_ready, to_floats=to_floats,
        rows_of=local_rows,
        step_nosync=(lambda batch: run_step(nosync_step, batch)) if nosync_step is not None
                     else None,
        final_params=final_params,
        describe=lambda: _describe(ctx, train_step, state, fetch(0), n, attention, applied),
        save=save, restore=restore, barrier=barrier,
    ))


_DTYPE_BYTES = {"f64": 8, "s64": 8, "u64": 8, "f32": 4, "s32": 4, "u32": 4, "bf16": 2,
                "f16": 2, "s16": 2, "u16": 2, "s8": 1, "u8": 1, "pred": 1}


HLO_COLLECTIVES = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all",
                   "collective-permute")


def _hlo_collective_lines(hlo_text: str) -> Any:
    """(op, result types, line, whether in the ENTRY computation) of each collective
    instruction in HLO text."""
    import re

    in_entry = False
    for line in hlo_text.splitlines():
        if line.startswith("ENTRY "):
            in_entry = True
        elif line and not line[0].isspace() and line.rstrip().endswith("{"):
            in_entry = False  # another computation starts (HLO text lists ENTRY last)
        head = re.match(r"\s*(?:ROOT )?%\S+ = (.*?) ([a-z-]+?)(?:-start)?\(", line)
        if head and head.group(2) in HLO_COLLECTIVES:
            yield head.group(2), head.group(1), line, in_entry


def hlo_collective_bytes(hlo_text: str) -> dict[str, int]:
    """Input payload bytes of each collective in a compiled XLA module, per execution of its
    computation (op -> bytes): the operand an all-reduce or reduce-scatter reduces, the shard
    an all-gather contributes, as torch's functional collectives count them. Group sizes
    come from replica_groups ({{0,1},...} or the iota form [groups,size]<=[n])."""
    import re

    out: dict[str, int] = {}
    for op, types, line, _ in _hlo_collective_lines(hlo_text):
        size = sum(
            _DTYPE_BYTES.get(dtype, 4) * (math.prod(int(d) for d in dims.split(",")) if dims
                                          else 1)
            for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", types))
        explicit = re.search(r"replica_groups=\{\{([\d,]+)\}", line)
        iota = re.search(r"replica_groups=\[\d+,(\d+)\]<=", line)
        group = len(explicit.group(1).split(",")) if explicit else int(iota.group(1)) if iota else 1
        if group == 1 and (explicit or iota):
            continue  # groups of one device: nothing crosses a link
        if op == "all-gather":
            size //= group
        elif op == "reduce-scatter":
            size *= group
        out[op] = out.get(op, 0) + size
    return out


def hlo_collectives(hlo_text: str) -> dict[str, list[int]]:
    """Collectives a compiled XLA module issues: op -> [instructions, tensors moved,
    instructions inside nested computations]. A combined (tuple) all-reduce of 26 gradients
    is one instruction of 26 tensors; one inside a loop body (e.g. per micro-batch of a
    scan) runs once per iteration, which the third figure exposes."""
    import re

    found: dict[str, list[int]] = {}
    for op, types, _, in_entry in _hlo_collective_lines(hlo_text):
        counts = found.setdefault(op, [0, 0, 0])
        counts[0] += 1
        counts[1] += max(1, len(re.findall(r"\w+\[[\d,]*\]", types)))
        counts[2] += 0 if in_entry else 1
    return found
