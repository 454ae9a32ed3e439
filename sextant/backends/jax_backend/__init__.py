"""JAX backend: one jitted, donated train step; data parallel and FSDP over a Mesh, and a
hand-written shard_map variant; workers joined with jax.distributed.

JAX is imported only inside `run`, in the worker process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sextant.backends.base import DEPLOY_INSTALL, BackendBase, Capabilities, ExportFormat

if TYPE_CHECKING:
    from sextant.contracts import RankResult, WorkerContext
    from sextant.strategy import Strategy


def use_host_devices(count: int) -> None:
    """Split the CPU into `count` JAX devices (count > 1), before JAX's first use in this
    process; one device is JAX's default and needs nothing.

    XLA's CPU client runs every device's program on one thread pool, sized by `NPROC`, else
    by the cores this process may use. A device that reaches an all-reduce holds its thread
    while it waits for the others, and with fewer than two threads per device the last
    device's program can find none free: the rendezvous never completes and XLA aborts the
    process after 40 s. With 2 devices on 2 cores a jitted matmul and gradient mean hung
    within 300 steps, and on one core every time; with 3 threads it still hung, with 4 it
    ran 2,000 steps (4 devices: 6 hung, 8 ran 1,000). So the pool gets at least two threads
    per device; a user's own NPROC is left alone.
    """
    if count <= 1:
        return
    import os

    import jax

    if "NPROC" not in os.environ:
        os.environ["NPROC"] = str(max(len(os.sched_getaffinity(0)), 2 * count))
    jax.config.update("jax_num_cpu_devices", count)


EXPORTS = (
    ExportFormat(name="jax-export", runtime="jax", needs=("jax",),
                 install="pip install 'sextant[jax]'", targets=("server",)),
    ExportFormat(name="savedmodel", runtime="tensorflow", needs=("jax", "tensorflow"),
                 install="pip install 'sextant[tensorflow]'", targets=("server",)),
    ExportFormat(name="litert", runtime="litert", needs=("jax", "tensorflow", "ai_edge_litert"),
                 install=DEPLOY_INSTALL, targets=("mobile", "edge")),
    ExportFormat(name="onnx", runtime="onnxruntime", needs=("jax", "jax2onnx", "onnxruntime"),
                 install=DEPLOY_INSTALL, targets=("server", "browser", "mobile")),
)


class JaxBackend(BackendBase):
    name = "jax"
    package = "jax"
    extra = "jax"

    STRATEGY_CODE = {
        "dp-manual": ("sextant.backends.jax_backend.train:_step_functions.per_device_step",
                      "sextant.backends.jax_backend.train:_step_functions.mean_over_devices"),
        "fsdp": ("sextant.backends.jax_backend.train:_fsdp_spec",),
        "tp": ("sextant.backends.jax_backend.train:_tp_spec",),
        "pp": tuple(f"sextant.backends.jax_backend.pipeline:{name}" for name in (
            "stack", "unstack", "spec_of", "decay_mask", "make_loss")),
        "tp-manual": ("sextant.backends.jax_backend.train:_tp_spec",
                      "sextant.backends.jax_backend.train:_megatron_step",
                      "sextant.backends.jax_backend.model:megatron_ops",
                      "sextant.backends.jax_backend.model:vocab_parallel_embed",
                      "sextant.backends.jax_backend.model:gather_vocab"),
    }

    def capabilities(self) -> Capabilities:
        # Only jit: op-by-op JAX dispatch is not how anyone trains, and measuring it would
        # compare PyTorch against a strawman.
        return Capabilities(
            modes=("compiled",),
            parallel=("single", "dp", "dp-manual", "zero1", "zero2", "fsdp", "tp", "tp-manual",
                      "pp"),
            # fp16 needs loss scaling, which optax does not provide: not built.
            precisions=("fp32", "tf32", "bf16"),
            model_features=("qkv_bias", "tied_gpt_head", "lora", "lora_gpt", "masked_loss",
                            "bf16_base"),
            devices=("cpu", "gpu"),
            compress=("none", "bf16", "fp16"),
            grad_accum=True,
            activation_checkpointing=True,
            checkpoint=("single", "dp", "dp-manual", "zero1", "zero2", "fsdp"),
            why_not=(("zero3", "JAX's ZeRO-3 is parameters and moments sharded on the mesh: "
                               "--parallel fsdp"),),
            exports=EXPORTS,
        )

    def check(self, strategy: Strategy) -> None:
        from sextant.core.errors import UserError

        if strategy.parallel == "pp" and strategy.schedule != "gpipe":
            raise UserError("jax pp runs GPipe: its backward is JAX's transpose of the whole "
                            "forward program (every forward before the first backward); "
                            "1F1B's interleaving needs a hand-scheduled backward, not built")
        if strategy.parallel in ("tp", "tp-manual", "pp"):
            unsupported = [flag for flag, on in (
                ("--grad-accum", strategy.grad_accum > 1),
                (f"--precision {strategy.precision}",
                 strategy.precision not in ("fp32", "tf32")),
                ("--activation-checkpointing", strategy.activation_checkpointing),
                ("--sequence-parallel", strategy.sequence_parallel),
            ) if on]
            if unsupported:
                raise UserError(f"jax {strategy.parallel} runs fp32 or tf32 without "
                                f"{', '.join(unsupported)} in sextant yet")
        if strategy.compress != "none" and strategy.parallel != "dp-manual":
            raise UserError(
                "jax compresses gradients by casting before the hand-written pmean: --compress "
                f"needs parallel dp-manual. Received: parallel={strategy.parallel!r}"
            )

    def compare_matrix(self, workers: int) -> list[dict[str, Any]]:
        """jit on one device, and jit with a batch-sharded NamedSharding (JAX's own way to
        write data parallelism). The hand-written pmean (dp-manual) and fsdp are rows of
        `compare levers --frameworks jax` (each costs ~30 s a trial on 2 cores, which
        the default comparison's 5-minute budget does not hold)."""
        return [
            {"mode": "compiled", "parallel": "single", "workers": 1},
            {"mode": "compiled", "parallel": "dp", "workers": workers},
        ]

    def run(self, ctx: WorkerContext) -> RankResult:
        from sextant.backends.jax_backend.train import run

        return run(ctx)
