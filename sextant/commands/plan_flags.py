"""The flags of `sextant plan` and `sextant calibrate`, declared once (sextant.core.fields).

Each field is one flag: its type, default, choices and help, in its argument group. The
parsers are made from these declarations (sextant.commands.plan, sextant.commands.calibrate),
so a new knob of the planner is one field here. The flags' ranges and combinations are
checked where the plan is made (sextant.commands.plan._check_args), with the knowledge of the
catalogue. Importing this module imports no planner code: `--help` stays instant.
"""

from __future__ import annotations

from dataclasses import dataclass

from sextant.core.defaults import MEASUREMENT_TIMEOUT_S
from sextant.core.fields import option
from sextant.core.paths import DEFAULT_CALIBRATION

GROUPS = (
    ("model", "model"),
    ("hardware", "hardware"),
    ("training", "training"),
    ("finetune", "fine-tuning (docs/planner.md, 'Fine-tuning')"),
    ("layout", "layout (each one given is pinned; the others are searched)"),
    ("assumptions", "assumptions"),
    ("output", "output"),
)
"""(group, its title in `sextant plan --help`), in the order the help shows them."""


@dataclass(frozen=True, kw_only=True)
class PlanFlags:
    """Every flag of `sextant plan` (the command reads them from its parsed arguments)."""

    model: str | None = option(None, group="model", help="architecture preset (see 'sextant "
                               "plan list'), e.g. llama-70b, gpt3-175b")
    workload: str | None = option(None, group="model", metavar="FILE",
                                  help="a sextant workload TOML instead of --model")

    gpus: int | None = option(None, group="hardware", metavar="N", aliases=("--devices",),
                              help="number of accelerators")
    accelerator: str = option("h100-sxm", group="hardware",
                              help="catalogue accelerator (default h100-sxm)")
    network: str | None = option(None, group="hardware",
                                 help="inter-node link (default: the accelerator's usual one)")
    intra_link: str | None = option(None, group="hardware",
                                    help="intra-node link (default: the accelerator's)")
    gpus_per_node: int | None = option(None, group="hardware",
                                       help="devices per node (default: catalogue)")
    nics_per_node: int | None = option(None, group="hardware",
                                       help="network ports per node (default: one per device)")
    oversubscription: float = option(1.0, group="hardware",
                                     help="fabric taper above one leaf switch (default 1: "
                                          "non-blocking); needs --nodes-per-leaf")
    nodes_per_leaf: int | None = option(None, group="hardware",
                                        help="nodes under one leaf switch (rail group)")
    host_memory_gb: float | None = option(None, group="hardware",
                                          help="host RAM per node: offloaded bytes must fit "
                                               "in it")

    tokens: float | None = option(None, group="training",
                                  help="tokens to train, e.g. 2e12 (time and cost)")
    global_batch: int | None = option(None, group="training",
                                      help="sequences per step (default: the model's)")
    precision: str | None = option(None, group="training",
                                   choices=("bf16", "fp16", "tf32", "fp32"),
                                   help="default bf16 where the accelerator has it, else fp16, "
                                        "else fp32; tf32: fp32 values, matmuls at the TF32 peak")
    optimizer: str = option("adam", group="training", choices=("adam", "sgd"),
                            help="adam (default) or sgd")
    fp8: bool = option(False, group="training",
                       help="FP8 GEMMs at the accelerator's fp8 peak (MFU stays relative to "
                            "the 16-bit peak)")
    price_per_hour: float | None = option(None, group="training",
                                          help="USD per device-hour (default: catalogue "
                                               "estimate)")
    goodput: float = option(1.0, group="training",
                            help="share of wall time that trains, for time and cost (default "
                                 "1; Llama 3 reports > 0.9 on 16K GPUs)")

    finetune: str | None = option(None, group="finetune", choices=("full", "lora"),
                                  help="full: every parameter trains; lora: adapters beside a "
                                       "frozen base (default: full, or the workload's "
                                       "[finetune] method)")
    lora_rank: int | None = option(None, group="finetune", help="LoRA's rank r (default 8)")
    lora_targets: str | None = option(None, group="finetune", metavar="LIST",
                                      help="projections with an adapter, among "
                                           "q,k,v,o,gate,up,down (default q,v)")
    base_dtype: str | None = option(None, group="finetune", choices=("fp32", "bf16", "fp16"),
                                    help="the frozen base's dtype (default: the precision's)")

    dp: int | None = option(None, group="layout", help="data-parallel degree")
    tp: int | None = option(None, group="layout", help="tensor-parallel degree")
    pp: int | None = option(None, group="layout", help="pipeline stages")
    zero: int | None = option(None, group="layout", choices=(0, 1, 2, 3),
                              help="ZeRO stage (3 = FSDP)")
    mbs: int | None = option(None, group="layout", help="micro-batch size")
    recompute: str | None = option(
        None, group="layout", choices=("none", "selective", "full", "op", "alternate"),
        help="none, selective (attention core), full; op / alternate: torchtitan's selective "
             "op AC (every other matmul recomputed) and selective layer AC (every 2nd layer); "
             "the last two only when given")  # estimate.RECOMPUTE
    sp: str | None = option(None, group="layout", choices=("on", "off"),
                            help="sequence parallelism")
    offload: str | None = option(None, group="layout", choices=("none", "optimizer", "params"),
                                 help="CPU offload: none, optimizer (ZeRO-Offload), params "
                                      "(ZeRO-Infinity, needs --zero 3)")
    interleave: int | None = option(None, group="layout",
                                    help="model chunks per pipeline stage")
    cp: int | None = option(None, group="layout",
                            help="context-parallel degree (splits the sequence)")
    cp_method: str | None = option(
        None, group="layout", choices=("ring", "allgather"),  # profiles.CP_METHODS
        help="override the stack's context-parallel exchange: ring (ring attention, hidden "
             "behind the attention) or allgather (K and V gathered before the attention)")
    zero3_gather: str | None = option(
        None, group="layout", choices=("layer", "tensor"),  # profiles.ZERO3_GATHERS
        help="override what one ZeRO-3 / FSDP collective carries: layer (FSDP's per-block "
             "units, DeepSpeed's coalesced gathers) or tensor (one collective per parameter "
             "tensor, DeepSpeed's ZeRO-3 as released in 2021)")
    ep: int | None = option(None, group="layout", help="expert-parallel degree (MoE models)")
    hsdp: str | None = option(None, group="layout", choices=("on", "off"),
                              help="hybrid sharding: ZeRO within the node, replicas across "
                                   "nodes (needs --zero >= 1)")

    mfu: float | None = option(
        None, group="assumptions",
        help="end-to-end model FLOP utilisation to plan for (model FLOPs / peak / step time, "
             "as papers report it): the kernel efficiency is solved so the chosen layout "
             "reaches it")
    kernel_efficiency: float | None = option(
        None, group="assumptions",
        help="fraction of dense peak the GEMM/attention kernels reach (default: the "
             "calibrated value of docs/planner.md; the old meaning of --mfu)")
    stack: str | None = option(
        None, group="assumptions",
        help="the training stack whose defaults the plan assumes (profiles.toml): generic "
             "(the ZeRO paper's accounting, default; maxtext on a TPU), megatron-core, "
             "deepspeed, torchtitan, maxtext; dated: megatron-lm-2021, deepspeed-0.3, "
             "llama3-2024")
    memory_model: str | None = option(
        None, group="assumptions",
        help="override the stack's allocation: zero (the ZeRO paper's 16 bytes/param), "
             "megatron (distributed optimizer, fp32 main grads), deepspeed (its estimators), "
             "torch (fp32 params and grads, FSDP2/DDP)")
    overlap: float = option(0.5, group="assumptions",
                            help="fraction of data-parallel comm that may hide behind compute "
                                 "(default 0.5; the plan also shows 0)")
    tp_overlap: float = option(0.0, group="assumptions",
                               help="fraction of tensor-parallel comm hidden behind compute "
                                    "(default 0: Megatron-LM 2021 hides none)")
    link_efficiency: float = option(1.0, group="assumptions",
                                    help="fraction of the catalogue link bandwidth "
                                         "collectives achieve (default 1)")
    fragmentation: float = option(0.10, group="assumptions",
                                  help="allocator fragmentation and framework buffers, as "
                                       "a fraction of the tensors (default 0.1)")
    overhead_gb: float | None = option(None, group="assumptions",
                                       help="runtime memory per device before tensors "
                                            "(default 1 GB; 0.3 on cpu-local)")
    stages: str | None = option(
        None, group="assumptions", choices=("balanced", "even"),
        help="override the stack's pipeline layer split: balanced (the last stage gives up "
             "layers for the output projection, current stacks) or even (ceil(L/p) layers "
             "per stage, 2021-era)")
    elementwise: str | None = option(
        None, group="assumptions", choices=("fused", "eager"),
        help="override the stack's elementwise kernels: fused (torch.compile, Transformer "
             "Engine, XLA) or eager (one kernel per operator, PyTorch without compile)")
    no_flash_attention: bool = option(False, group="assumptions",
                                      help="store attention scores (2021-era stacks, "
                                           "Korthikanti's 5as term)")

    search: bool = option(False, group="output", help="also print the best layouts ranked")
    top: int = option(10, group="output", help="rows of --search (default 10)")
    threshold: float = option(0.8, group="output",
                              help="scaling efficiency threshold for the knee (default 0.8)")
    no_curve: bool = option(False, group="output", help="skip the scaling curve")
    json: bool = option(False, group="output", help="print JSON instead of tables")


CALIBRATE_GROUPS = (
    ("calibrate", ""),
    ("device", "device (--device gpu): the kernel efficiency over a workload's GEMM shapes and "
               "the all-reduce bus bandwidth between this host's GPUs, for 'sextant plan'"),
)
"""(group, its title; '' for the command's own options) of `sextant calibrate`."""


@dataclass(frozen=True, kw_only=True)
class CalibrateFlags:
    """Every flag of `sextant calibrate`."""

    out: str | None = option(None, group="calibrate", metavar="PATH",
                             help=f"default ./{DEFAULT_CALIBRATION.as_posix()}")
    max_bytes: int = option(64 * 2**20, group="calibrate",
                            help="largest all-reduce message (default 64 MiB)")
    timeout: float = option(MEASUREMENT_TIMEOUT_S, group="calibrate",
                            help=f"seconds allowed for the worker processes (default "
                                 f"{MEASUREMENT_TIMEOUT_S:g})")
    json: bool = option(False, group="calibrate", help="print the calibration as JSON")
    device: str = option("cpu", group="device", choices=("cpu", "gpu"),
                         help="cpu (default: the host only) or gpu (also its GPUs)")
    model: str | None = option(None, group="device",
                               help="planner preset whose GEMMs to time (see 'sextant plan "
                                    "list')")
    workload: str | None = option(None, group="device", metavar="FILE",
                                  help="a workload TOML instead of --model")
    accelerator: str | None = option(None, group="device",
                                     help="catalogue key of the GPU (default: from its name)")
    mbs: int = option(1, group="device", help="micro-batch in sequences (default 1)")
    tp: int = option(1, group="device", help="tensor-parallel split (default 1)")
    device_max_bytes: int = option(1 << 30, group="device",
                                   help="largest GPU all-reduce message (default 1 GiB)")
