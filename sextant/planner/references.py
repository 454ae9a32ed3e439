"""The planner against published figures (`sextant plan references`; docs/validation.md).

Each reference is a number a paper or model card published, the planner's figure for the same
setting, and the relative error. The settings the papers do not state (micro-batch size,
interleaving, cluster size for GPU-hour totals) are written next to each row: they are the
planner's defaults or the simplest choice, never tuned to reduce the error. Default
assumptions (kernel efficiency 0.75, overlap 0.5) are used throughout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from sextant.errors import UserError
from sextant.planner import comms
from sextant.planner.catalogue import Link, fit_ramp, load_catalogue
from sextant.planner.estimate import Layout, PlanOptions, evaluate_one, resolve_hardware
from sextant.planner.memory import model_state_bytes, transient_param_bytes
from sextant.planner.models import TransformerShape, megatron_gpt, preset
from sextant.planner.search import MAX_MICRO_BATCH, divisors, search

ZERO = "Rajbhandari et al. 2020 (ZeRO)"
MEG = "Narayanan et al. 2021 (Megatron-LM, SC21)"
KOR = "Korthikanti et al. 2022 (activation recomputation)"


@dataclass(kw_only=True, slots=True, frozen=True)
class Reference:
    id: str
    source: str
    quantity: str
    unit: str
    published: float
    planner: Callable[..., float]  # lambdas bind their loop variable as a default argument
    setting: str
    command: str = ""
    kind: str = "end-to-end"
    """'formula' (follows from a formula: held to 0.5%), 'end-to-end' (throughput, MFU,
    time to train, memory as allocated: held to 10%), 'collective' (a published collective
    benchmark's bus bandwidth, held to 10% and counted apart) or 'not comparable' (a
    published figure that measures something other than what the planner predicts, the
    reason in its setting: shown, counted in no ratio); docs/validation.md."""
    printed: float | None = None
    """The precision the source prints (0.1 for "1.9 GB"): formula points are compared after
    rounding the planner's figure to it."""
    planner_other: Callable[..., float] | None = None
    """Where the source bounds an input instead of stating it (a GPU's peak "between SXM and
    NVL"), the planner's figure at the bound's other end: the row's prediction is then the
    interval between the two, and its error the distance from the published figure to the
    interval's nearer end (0 inside it; interval_error)."""


def interval_error(low: float, high: float, published: float) -> float:
    """Relative error of a published figure against a predicted interval: 0 inside it, else
    (nearer end - published) / published."""
    lo, hi = min(low, high), max(low, high)
    if lo <= published <= hi:
        return 0.0
    return ((lo if published < lo else hi) - published) / published


def _cat():
    return load_catalogue(calibration=None)


def _interleaves(n_layers: int, layout: Layout, batch: int) -> list[int]:
    """Model chunks per stage (v > 1: interleaved) Megatron-LM accepts for this layout: v
    divides the layers of a stage (--num-layers-per-virtual-pipeline-stage) and the
    micro-batches per step are a multiple of p (Narayanan et al. 2021 §2.2.2); [1] when no
    v > 1 does (no pipeline, one layer per stage)."""
    p = layout.pp
    m = batch // (layout.dp * layout.mbs)
    if p == 1 or n_layers % p or m % p:
        return [1]
    per_stage = n_layers // p
    return [v for v in range(2, per_stage + 1) if per_stage % v == 0] or [1]


def _megatron_step(shape: TransformerShape, layout: Layout, batch: int, **options: Any) -> float:
    """The planner's step time for a Megatron-LM run (megatron_choice)."""
    return megatron_choice(shape, layout, batch, **options)[0]


def megatron_choice(
    shape: TransformerShape,
    layout: Layout,
    batch: int,
    *,
    recompute: str = "full",
    sp: bool = False,
    interleave: int | str = 1,
    overlap: float = 0.5,
    zero3_gather: str = "layer",
    micro_batch: str = "layout",
) -> tuple[float, int, int]:
    """(step time, micro-batch size, v): the planner's step time for a Megatron-LM run on
    Selene (a100-80gb, ib-hdr, 2021-22 stack: no FlashAttention, layers split evenly), with
    the micro-batch size and v it ran. `interleave` "searched": the schedule was
    interleaved but the papers do not state v, so the fastest valid v > 1 is taken.
    `micro_batch` "searched": the paper does not state the micro-batch size either, so the
    fastest that fits of those the planner's own search tries (the divisors of the rank's
    share of the batch, up to MAX_MICRO_BATCH) is taken, with v searched for each; "layout"
    keeps the layout's."""
    opts = PlanOptions(
        global_batch=batch, flash_attention=False, balanced_stages=False, overlap=overlap,
        zero3_gather=zero3_gather,
    )
    hw = resolve_hardware(_cat(), "a100-80gb", "ib-hdr", options=opts)
    per_rank = batch // layout.dp
    sizes = (
        [b for b in divisors(per_rank) if b <= MAX_MICRO_BATCH]
        if micro_batch == "searched"
        else [layout.mbs]
    )
    cost = shape.cost(flash_attention=False)
    steps = []
    for mbs in sizes:
        sized = replace(layout, mbs=mbs)
        chunks = (
            _interleaves(shape.n_layers, sized, batch) if interleave == "searched"
            else [interleave]
        )
        for v in chunks:
            f = evaluate_one(
                cost, hw, opts,
                Layout(
                    dp=layout.dp, tp=layout.tp, pp=layout.pp, zero=layout.zero, mbs=mbs,
                    recompute=recompute, sp=sp, interleave=int(v),
                ),
            ).figures
            if f["fits"] or micro_batch == "layout":
                steps.append((float(f["step"]), mbs, int(v)))
    if not steps:
        raise UserError(f"reference setting does not fit at any micro-batch size: {shape.name}")
    return min(steps)


def _megatron_tflops(
    shape: TransformerShape,
    layout: Layout,
    batch: int,
    *,
    recompute: str = "full",
    sp: bool = False,
    interleave: int | str = 1,
    **step_options: Any,
) -> float:
    """TFLOP/s per GPU as Narayanan et al. count it (eq. 3, which includes the recomputation
    forward pass: F = 96 B s l h^2 (1 + s/6h + V/16lh)) over the planner's step time."""
    step = _megatron_step(
        shape, layout, batch, recompute=recompute, sp=sp, interleave=interleave, **step_options
    )
    s, layers, h, v = shape.seq_len, shape.n_layers, shape.d_model, shape.vocab_size
    flops = 96 * batch * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))
    return flops / (step * layout.devices) / 1e12


def _best(
    shape: TransformerShape,
    devices: int,
    acc: str,
    net: str,
    *,
    batch: int | None = None,
    fixed: dict[str, int] | None = None,
    flash: bool = True,
    devices_per_node: int | None = None,
    balanced_stages: bool = True,
    cp_method: str = "ring",
) -> dict[str, Any]:
    opts = PlanOptions(
        global_batch=batch or shape.global_batch,
        flash_attention=flash,
        devices_per_node=devices_per_node,
        balanced_stages=balanced_stages,
        cp_method=cp_method,
    )
    hw = resolve_hardware(_cat(), acc, net, options=opts)
    res = search(shape.cost(flash_attention=flash), hw, opts, devices, fixed=fixed)
    best = res.best()
    if best is None:
        raise UserError(f"reference setting does not fit: {shape.name} on {devices} {acc}")
    row = res.row(best)
    return {k: float(v[0]) for k, v in row.items() if v.dtype != bool} | {
        "layout": res.layout(best).label()
    }


GOODPUT = 0.9
"""Llama Team 2024 (Llama 3) §3.3.4: "higher than 90% effective training time" during
pre-training on 16K GPUs; published GPU-hour totals are wall time."""


def _gpu_hours(shape: TransformerShape, devices: int, acc: str, net: str, tokens: float) -> float:
    f = _best(shape, devices, acc, net)
    return tokens / f["tokens_per_s"] * devices / 3600 / GOODPUT


def _states_gb(params: float, dp: int, zero: int) -> float:
    return float(model_state_bytes(params, dp, zero)["total"]) / 1e9


# Narayanan et al. 2021, Table 1: (params B, heads, hidden, layers, t, p, GPUs, batch, TF/s).
MEGATRON_TABLE1 = [
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
    (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
    (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
    (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
    (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
]


# Narayanan et al. 2021, Table 2, every row: PTD-P (params B, t, p, GPUs, batch, TF/s) and
# ZeRO-3 without model parallelism (params B, GPUs, micro-batch, batch, TF/s). The 529.6B
# ZeRO-3 row on 640 GPUs runs a batch of 2560 (the table's asterisk), the others 2240. Each
# row's TFLOP/s agrees within 1 % with the table's own training time for 300B tokens.
MEGATRON_TABLE2_PTDP = [
    (174.6, 8, 12, 384, 1536, 153),
    (174.6, 8, 12, 768, 1536, 149),
    (174.6, 8, 12, 1536, 1536, 141),
    (529.6, 8, 35, 560, 2240, 171),
    (529.6, 8, 35, 1120, 2240, 167),
    (529.6, 8, 35, 2240, 2240, 159),
]
MEGATRON_TABLE2_ZERO3 = [
    (174.6, 384, 4, 1536, 144),
    (174.6, 768, 2, 1536, 88),
    (174.6, 1536, 1, 1536, 44),
    (529.6, 640, 4, 2560, 138),
    (529.6, 1120, 2, 2240, 98),
    (529.6, 2240, 1, 2240, 48),
]


def _gpt175() -> TransformerShape:
    return megatron_gpt(
        n_layers=96, d_model=12288, n_heads=96, global_batch=1536, name="gpt-174.6b"
    )


def _gpt530(batch: int) -> TransformerShape:
    return megatron_gpt(
        n_layers=105, d_model=20480, n_heads=128, global_batch=batch, name="gpt-529.6b"
    )


def _table2(params: float, batch: int, scheme: str, devices: int) -> tuple[TransformerShape, str]:
    """A Table 2 row's model and id (the 174.6B rows keep their ids of the first revisions)."""
    if params == 174.6:
        return _gpt175(), f"megatron-t2-{scheme}-{devices}"
    return _gpt530(batch), f"megatron-t2-530b-{scheme}-{devices}"


def _korthikanti_mfu(recompute: str, sp: bool) -> float:
    """Korthikanti et al. 2022, Table 3 and §6: 530B with t = 8, p = 35, micro-batch 1, 280
    sequences per model instance (x 8 data-parallel replicas = 2240), "the interleaving
    schedule with three interleaving stages" for 530B (§6), and "we do not use any
    overlapping of gradient all-reduces with back-propagation" (§6.3): overlap 0."""
    shape = _gpt530(2240)
    opts = PlanOptions(
        global_batch=2240, flash_attention=False, balanced_stages=False, overlap=0.0
    )
    hw = resolve_hardware(_cat(), "a100-80gb", "ib-hdr", options=opts)
    lay = Layout(dp=8, tp=8, pp=35, mbs=1, recompute=recompute, sp=sp, interleave=3)
    return evaluate_one(shape.cost(flash_attention=False), hw, opts, lay).figures["mfu"]


def _references() -> list[Reference]:
    refs: list[Reference] = []
    for stage, published, what in (
        (0, 120.0, "plain data parallel"),
        (1, 31.4, "optimizer-state sharding (ZeRO-1)"),
        (2, 16.6, "+ gradient sharding (ZeRO-2)"),
        (3, 1.9, "+ parameter sharding (ZeRO-3)"),
    ):
        refs.append(
            Reference(
                id=f"zero-fig1-stage{stage}",
                source=f"{ZERO}, Figure 1",
                quantity=f"model states per device, 7.5B params, 64 GPUs, {what}",
                unit="GB",
                published=published,
                planner=lambda s=stage: _states_gb(7.5e9, 64, s),
                setting="mixed-precision Adam (K = 12); the figure prints one decimal",
                kind="formula",
                printed=0.1,
            )
        )
    refs.append(
        Reference(
            id="zero-gpt2-states",
            source=f"{ZERO}, §3.1",
            quantity="model states of GPT-2 1.5B (mixed-precision Adam, 16 bytes/param)",
            unit="GB",
            published=24.0,
            planner=lambda: _states_gb(1.5e9, 1, 0),
            setting="1 device",
            kind="formula",
        )
    )
    refs.append(
        Reference(
            id="zero-gpt2-fp16",
            source=f"{ZERO}, §3.1",
            quantity="fp16 weights of GPT-2 1.5B",
            unit="GB",
            published=3.0,
            planner=lambda: float(model_state_bytes(1.5e9)["params"]) / 1e9,
            setting="1 device",
            kind="formula",
        )
    )

    for params, heads, hidden, layers, *_ in (
        MEGATRON_TABLE1[0],
        MEGATRON_TABLE1[3],
        MEGATRON_TABLE1[6],
        MEGATRON_TABLE1[9],
    ):
        refs.append(
            Reference(
                id=f"megatron-params-{params:g}b",
                source=f"{MEG}, Table 1",
                quantity=f"parameters of the {layers}-layer, h={hidden} GPT",
                unit="B",
                published=params,
                planner=lambda n=layers, h=hidden, a=heads: (
                    megatron_gpt(n_layers=n, d_model=h, n_heads=a).total_params() / 1e9
                ),
                setting="V = 51,200, s = 2048, ffn = 4h; the paper rounds to 0.1B",
                kind="formula",
                printed=0.1,
            )
        )

    for params, heads, hidden, layers, t, p, n, batch, tflops in MEGATRON_TABLE1:

        def fn(heads=heads, hidden=hidden, layers=layers, t=t, p=p, n=n, batch=batch):
            shape = megatron_gpt(n_layers=layers, d_model=hidden, n_heads=heads, global_batch=batch)
            return _megatron_tflops(
                shape, Layout(dp=n // (t * p), tp=t, pp=p), batch, interleave="searched",
                micro_batch="searched",
            )

        refs.append(
            Reference(
                id=f"megatron-t1-{params:g}b",
                source=f"{MEG}, Table 1",
                quantity=f"TFLOP/s per GPU, {params:g}B on {n} A100 (t={t}, p={p}, batch {batch})",
                unit="TFLOP/s",
                published=float(tflops),
                planner=fn,
                setting="a100-80gb + ib-hdr (8 ports/node), full recomputation, the "
                "interleaved schedule with scatter/gather (§5.1: \"we use the interleaved "
                "pipeline schedule with the scatter/gather optimization enabled\"); neither v "
                "nor the micro-batch size is stated per row, so the fastest valid pair: v > 1 "
                "dividing the stage's layers (with p > 1) and a micro-batch size dividing the "
                "rank's share of the batch (up to 64, as the search tries), the layout fitting",
            )
        )

    for params, t, p, n, batch, published in MEGATRON_TABLE2_PTDP:
        shape, ref_id = _table2(params, batch, "ptdp", n)
        refs.append(
            Reference(
                id=ref_id,
                source=f"{MEG}, Table 2",
                quantity=f"TFLOP/s per GPU, {params:g}B PTD-P (t={t}, p={p}) on {n} A100, "
                f"batch {batch}",
                unit="TFLOP/s",
                published=float(published),
                planner=lambda shape=shape, t=t, p=p, n=n, batch=batch: _megatron_tflops(
                    shape, Layout(dp=n // (t * p), tp=t, pp=p), batch
                ),
                setting="full recomputation, micro-batch 1 (the table's)",
            )
        )
    for params, n, mbs, batch, published in MEGATRON_TABLE2_ZERO3:
        shape, ref_id = _table2(params, batch, "zero3", n)
        refs.append(
            Reference(
                id=ref_id,
                source=f"{MEG}, Table 2",
                quantity=f"TFLOP/s per GPU, {params:g}B ZeRO-3 (no model parallelism) on {n} "
                f"A100, micro-batch {mbs}, batch {batch}",
                unit="TFLOP/s",
                published=float(published),
                planner=lambda shape=shape, n=n, mbs=mbs, batch=batch: _megatron_tflops(
                    shape, Layout(dp=n, zero=3, mbs=mbs), batch, overlap=0.0,
                    zero3_gather="tensor",
                ),
                setting="full recomputation; DeepSpeed's ZeRO-3 as released before the "
                "paper (v0.3.13, March 2021, partition_parameters.py and stage3.py): one "
                "all-gather per parameter tensor (`_allgather_param`) and one reduce-scatter "
                "per gradient (`_reduce_scatter_gradient`), --zero3-gather tensor (12 tensors "
                "a layer, the 8 biases and norms under the 1e5-element persistence threshold "
                "gathered once a step; the recomputed forward gathers again each weight it "
                "will not reuse within stage3_max_reuse_distance, 1e9 elements: all but the "
                "MLP-out weight); a `torch.cuda.synchronize()` before every gather and a "
                "blocking fetch before every module's forward, so no gather runs beside "
                "compute: --overlap 0",
            )
        )

    refs.append(
        Reference(
            id="megatron-gpt3-days",
            source=f"{MEG}, §5.1 (estimate)",
            quantity="days to train 174.6B on 300B tokens, 1024 A100, batch 1536",
            unit="days",
            published=34.0,
            planner=lambda: (
                300e9
                / _best(
                    _gpt175(), 1024, "a100-80gb", "ib-hdr", batch=1536, flash=False,
                    fixed={"rc": 2, "sp": 0, "zero": 0, "off": 0, "tp": 8},
                    balanced_stages=False,
                )["tokens_per_s"]
                / 86400
            ),
            setting="tensor-parallel size 8 (§4.1: \"for large enough models, we use a "
            "tensor-model-parallel size of 8\"; every 175B run of the paper does), the rest the "
            "best of the search with what the 2021 stack (Megatron-LM) had: no FlashAttention, "
            "full recomputation, no sequence parallelism, no ZeRO / distributed optimizer, no "
            "CPU offload",
        )
    )
    refs.append(
        Reference(
            id="megatron-1t-days",
            source=f"{MEG}, §5.1 (estimate)",
            quantity="days to train the 1T model on 450B tokens, 3072 A100",
            unit="days",
            published=84.0,
            planner=lambda: 450e9 / (3072 * 2048 / _step_of_1t()) / 86400,
            setting="Table 1 layout (t=8, p=64, batch 3072), full recomputation, interleaved "
            "as in §5.1 (v = 2: 2 layers per stage)",
        )
    )

    refs.append(
        Reference(
            id="gpt3-compute",
            source="Brown et al. 2020 (GPT-3), Table D.1",
            quantity="training compute of GPT-3 175B on 300B tokens (6 N D)",
            unit="1e21 FLOP",
            published=314.0,
            planner=lambda: 6.0 * preset("gpt3-175b").total_params() * 300e9 / 1e21,
            setting="the paper's 6 N D with the planner's parameter count; the planner's own "
            "FLOPs per token add the attention term 12 L h s (PaLM appendix B): +2.8%",
            command="sextant plan --model gpt3-175b --gpus 1024 --accelerator a100-80gb --json",
            kind="formula",
            printed=1.0,
        )
    )

    for name, published in (
        ("llama2-7b", 184_320),
        ("llama2-13b", 368_640),
        ("llama2-70b", 1_720_320),
    ):
        refs.append(
            Reference(
                id=f"{name}-gpu-hours",
                source="Touvron et al. 2023 (Llama 2), model card",
                quantity=f"A100-80GB GPU-hours to pre-train {name} on 2T tokens",
                unit="GPU-h",
                published=float(published),
                planner=lambda name=name: _gpu_hours(
                    preset(name), 2048, "a100-80gb", "ib-hdr", 2e12
                ),
                setting="2048 GPUs (cluster size not published), 200 Gb/s InfiniBand, best layout, "
                "goodput 0.9 (Llama 3's effective training time)",
                command=f"sextant plan --model {name} --gpus 2048 --accelerator a100-80gb "
                "--network ib-hdr --tokens 2e12 --goodput 0.9",
            )
        )
    for name, devices, published in (
        ("llama3-8b", 4096, 1.46e6),
        ("llama3-70b", 4096, 7.0e6),
        ("llama3-405b", 16384, 30.84e6),
    ):
        refs.append(
            Reference(
                id=f"{name}-gpu-hours",
                source="Llama 3.1 model card (meta-llama/llama-models)",
                quantity=f"H100-80GB GPU-hours to pre-train Llama 3.1 {name[7:].upper()} on ~15T "
                "tokens",
                unit="GPU-h",
                published=published,
                planner=lambda name=name, d=devices: _gpu_hours(
                    preset(name), d, "h100-sxm", "ethernet-400g", 15e12
                ),
                setting=f"{devices} GPUs (16K for 405B per the paper; not published for the "
                "others), 400 Gb/s RoCE, best layout; goodput 0.9 (Llama 3 §3.3.4). **Not "
                "comparable, not counted**: the card gives \"the total GPU time required for "
                "training each model\" and says fine-tuning, annotation and evaluation ran on "
                "the same production infrastructure, with no split into pre-training, "
                "long-context and post-training; the planner predicts pre-training on 15T "
                "tokens (Llama 2's card, by contrast, states pre-training hours and "
                "fine-tuning on other compute)",
                command=f"sextant plan --model {name} --gpus {devices} --accelerator h100-sxm "
                "--network ethernet-400g --tokens 15e12 --goodput 0.9",
                kind="not comparable",
            )
        )
    for devices, published in ((8192, 0.43), (16384, 0.41)):
        refs.append(
            Reference(
                id=f"llama3-405b-mfu-{devices}",
                source="Llama Team 2024 (Llama 3), Table 4",
                quantity=f"BF16 MFU of 405B on {devices} H100 (TP 8, PP 16, DP {devices // 128})",
                unit="MFU",
                published=published,
                planner=lambda d=devices: _best(
                    preset("llama3-405b"), d, "h100-sxm", "ethernet-400g", fixed={"tp": 8, "pp": 16}
                )["mfu"],
                setting="16M-token batch, seq 8192; the rest of the layout searched",
                command=f"sextant plan --model llama3-405b --gpus {devices} --accelerator h100-sxm "
                "--network ethernet-400g --tp 8 --pp 16",
            )
        )
    long_405b = TransformerShape(
        **{
            **{k: getattr(preset("llama3-405b"), k) for k in TransformerShape.__slots__},
            "seq_len": 131072,
            "global_batch": 128,
        }
    )
    refs.append(
        Reference(
            id="llama3-405b-mfu-16384-cp16",
            source="Llama Team 2024 (Llama 3), Table 4 (and Balaji, SC'24)",
            quantity="BF16 MFU of 405B on 16384 H100 at 131,072 tokens (TP 8, CP 16, PP 16, DP 8)",
            unit="MFU",
            published=0.38,
            planner=lambda: _best(
                long_405b, 16384, "h100-sxm", "ethernet-400g",
                fixed={"tp": 8, "pp": 16, "cp": 16}, cp_method="allgather",
            )["mfu"],
            setting="the llama3-405b preset at sequence 131,072, 16M tokens per batch (128 "
            "sequences), ethernet-400g; TP, CP and PP as published, the rest searched; "
            "all-gather context parallelism (--cp-method allgather; §3.3.2: K and V "
            "all-gathered, then the local queries' attention)",
        )
    )
    for key, published in (("mfu", 0.462), ("hfu", 0.578)):
        refs.append(
            Reference(
                id=f"palm-540b-{key}",
                source="Chowdhery et al. 2022 (PaLM), Table 3 and §4",
                quantity=f"{key.upper()} of PaLM 540B on 6144 TPU v4 (two pods of 3072)",
                unit="MFU",
                published=published,
                planner=lambda key=key: _best(
                    preset("palm-540b"), 6144, "tpu-v4", "ethernet-100g",
                    devices_per_node=3072, fixed={"tp": 12, "pp": 1, "zero": 3, "rc": 2, "hs": 1},
                )[key],
                setting="the published layout: 12-way model parallelism, parameters sharded "
                "256-way within each pod and replicated across the 2 pods (hybrid sharding), "
                "no pipeline, rematerialisation (HFU > MFU; full recomputation assumed); pods "
                "joined by 100 Gb/s Ethernet per node port (assumed)",
                command="sextant plan --model palm-540b --gpus 6144 --accelerator tpu-v4 "
                "--network ethernet-100g --gpus-per-node 3072 --tp 12 --pp 1 --zero 3 "
                "--recompute full --hsdp on",
            )
        )
    refs.append(
        Reference(
            id="korthikanti-530b-mfu-selective",
            source=f"{KOR}, abstract",
            quantity="MFU of 530B on 2240 A100, sequence parallelism + selective recomputation",
            unit="MFU",
            published=0.542,
            planner=lambda: _korthikanti_mfu("selective", True),
            setting="t=8, p=35, dp=8, micro-batch 1, 280 sequences per replica (batch 2240), "
            "interleaved with v = 3, data-parallel all-reduce not overlapped (overlap 0): "
            "Table 3 and §6 of the paper",
        )
    )
    refs.append(
        Reference(
            id="korthikanti-530b-mfu-full",
            source=f"{KOR}, abstract",
            quantity="MFU of 530B on 2240 A100, full recomputation",
            unit="MFU",
            published=0.421,
            planner=lambda: _korthikanti_mfu("full", False),
            setting="as above (Table 3, §6: v = 3, overlap 0)",
        )
    )
    refs.append(
        Reference(
            id="korthikanti-530b-speedup",
            source=f"{KOR}, abstract",
            quantity="speed-up of selective recomputation + SP over full recomputation",
            unit="x",
            published=0.542 / 0.421,
            planner=lambda: _korthikanti_mfu("selective", True) / _korthikanti_mfu("full", False),
            setting="as above",
        )
    )
    return refs + _new_references() + _collective_references()


def _pinned(
    shape: TransformerShape,
    layout: Layout,
    acc: str,
    net: str,
    *,
    batch: int,
    flash: bool = True,
    memory_model: str = "zero",
    nics_per_node: int | None = None,
    balanced_stages: bool = True,
    fp8: bool = False,
    overlap: float = 0.5,
) -> dict[str, Any]:
    """The planner's figures for a published layout (nothing searched)."""
    opts = PlanOptions(
        global_batch=batch, flash_attention=flash, memory_model=memory_model,
        nics_per_node=nics_per_node, balanced_stages=balanced_stages, fp8=fp8, overlap=overlap,
    )
    hw = resolve_hardware(_cat(), acc, net, options=opts)
    return evaluate_one(shape.cost(flash_attention=flash), hw, opts, layout).figures


TT = "torchtitan docs/performance.md (commit 0413364), FSDP2 on 64 A100 80GB"
# (preset, local batch, torchtitan activation checkpointing, planner recompute, WPS per GPU)
# torchtitan's "selective op" AC saves every compute op's output "except every second mm"
# (planner recompute "op"); "selective layer" checkpoints every 2nd layer (its default option
# "2"; planner recompute "alternate"): torchtitan/parallelisms/parallelize_llama.py at the same
# commit. Earlier revisions of this table read both as the planner's "selective" (attention
# core only), which recomputes far less.
TORCHTITAN_A100 = [
    ("llama3-8b", 1, "selective op", "op", 2973),
    ("llama3-8b", 1, "selective layer", "alternate", 2904),
    ("llama3-70b", 1, "full", "full", 331),
    ("llama2-13b", 2, "no", "none", 2162),
    ("llama2-13b", 2, "selective layer", "alternate", 1914),
    ("llama2-13b", 2, "selective op", "op", 1904),
    ("llama2-70b", 1, "selective op", "op", 355),
    ("llama2-70b", 2, "full", "full", 353),
]
TT_H100 = (
    "torchtitan docs/performance.md (commit d4c86e3; torchtitan 9dec370), Tables 1, 3 and 4"
)
TT_H100_SETTING = (
    "Grand Teton hosts as the doc states them: 8 H100 per host on NVLink, 96 GB HBM2e at "
    "2.4 TB/s, 400 Gb/s RDMA per GPU (ethernet-400g), the default 500 W power limit; the "
    "doc does not know the GPU's peak (\"between SXM and NVL\", footnote 2), so the "
    "throughput rows are predicted at both ends, the h100-sxm peak (989 TFLOP/s BF16) and the "
    "H100 NVL's (835.5), their error the distance to the nearer end; seq 8192 and the AC "
    "policy from train_configs/ at 9dec370; --memory-model torch"
)
H100_NVL_PEAK = {"bf16": 835.5e12, "fp16": 835.5e12, "fp32": 60e12, "fp8": 1670.5e12}
"""NVIDIA H100 Tensor Core GPU datasheet (2023), H100 NVL column, dense: the sparse 1,671 BF16
and 3,341 FP8 TFLOP/s halved as for h100-sxm, FP32 60. The lower end of the peak torchtitan's
performance.md gives its H100s (footnote 2: "between SXM and NVL")."""
# (preset, GPUs, published layout, global batch, tokens/s per GPU, peak reserved memory GiB,
# row tag, setting)
# Table 1 and Table 3: the plain FSDP rows (no torch.compile, which the planner does not
# model; the compiled rows are not transcribed). Table 4: the only row without AsyncTP.
TORCHTITAN_H100 = [
    ("llama3-8b", 8, Layout(dp=8, zero=3, mbs=2, recompute="op"), 16, 5762, 82.4, "fsdp",
     "Table 1: FSDP, local batch 2, selective op AC (--recompute op), eager"),
    ("llama3-8b", 128, Layout(dp=128, zero=3, mbs=2, recompute="op"), 256, 5605, 67.0, "fsdp",
     "Table 3: FSDP, local batch 2, selective op AC (--recompute op), eager"),
    ("llama3-70b", 256, Layout(dp=32, tp=8, zero=3, mbs=16, recompute="full", sp=True), 512,
     829, 71.9, "2d-fp8",
     "Table 4: FSDP 32 x TP 8 (norms sequence-parallel), local batch 16, full AC, Float8 "
     "linears (--fp8); its torch.compile is not modelled"),
]


def _torchtitan_h100(
    name: str, layout: Layout, batch: int, *, fp8: bool, nvl_peak: bool = False
) -> dict[str, float]:
    """Tokens/s per GPU and memory per GPU (GiB) of a torchtitan run on the doc's H100 hosts
    (96 GB, 2.4 TB/s), at the h100-sxm peak or (nvl_peak) at the H100 NVL's."""
    opts = PlanOptions(global_batch=batch, memory_model="torch", fp8=fp8)
    hw = resolve_hardware(_cat(), "h100-sxm", "ethernet-400g", options=opts)
    acc = replace(hw.accelerator, memory_bytes=96 * 2**30, memory_bw=2.4e12)
    if nvl_peak:
        acc = replace(acc, peak_flops=dict(H100_NVL_PEAK))
    f = evaluate_one(preset(name).cost(), replace(hw, accelerator=acc), opts, layout).figures
    return {"tokens_per_s": f["tokens_per_s"] / layout.devices, "memory_gib": f["memory"] / 2**30}


MBRIDGE = (
    "Megatron-Bridge docs/performance-summary.md (github.com/NVIDIA-NeMo/Megatron-Bridge, "
    "commit 00b7660), 25.11 NeMo container, pre-training tables"
)
MBRIDGE_SETTING = (
    "FP8 GEMMs with current scaling (--fp8), the data-parallel gradient reduction and "
    "parameter gather overlapped with compute (--overlap 1: the recipes' overlap_grad_reduce "
    "and overlap_param_gather, _llama3_common in src/megatron/bridge/recipes/llama/llama3.py), "
    "Megatron-Core's allocation (--memory-model "
    "megatron: fp32 gradient buffers and master weights), the distributed optimizer (ZeRO-1) "
    "where the table says FSDP 0, sequence parallelism with TP, DGX nodes of 8 GPUs on NVLink "
    "with 8 x 400 Gb/s InfiniBand (ib-ndr); CUDA graphs and Transformer Engine's fusions are "
    "not modelled. The rows are every dense-model row of the page's DGX-H100 and DGX-B200 "
    "tables; its GB200/GB300 rows (NVL72 NVLink domains, not in the catalogue) and MoE rows "
    "(DeepSeek-V3, GPT-OSS, Qwen3: no presets) are not rows"
)
# (preset, accelerator, layout as the table states it, global batch, tokens/s per GPU, note)
MEGATRON_BRIDGE = [
    ("llama3-8b", "h100-sxm", Layout(dp=8, zero=3, mbs=1), 128, 14451,
     "FSDP over the 8 GPUs; the recipe (llama3_workload_base_configs.py) recomputes 5 of the "
     "32 layers, which --recompute cannot express (none is taken)"),
    ("llama3-70b", "h100-sxm",
     Layout(dp=2, tp=4, pp=8, interleave=5, sp=True, zero=1, mbs=1), 128, 1602, ""),
    ("llama3-405b", "h100-sxm",
     Layout(dp=8, tp=8, pp=8, cp=2, interleave=8, sp=True, zero=1, mbs=1), 512, 292, ""),
    ("llama3-8b", "b200", Layout(dp=8, zero=1, mbs=2), 128, 30624, ""),
    ("llama3-405b", "b200",
     Layout(dp=2, tp=4, pp=8, cp=2, interleave=8, sp=True, zero=1, mbs=1), 64, 661, ""),
]


def _megatron_bridge(name: str, acc: str, layout: Layout, batch: int) -> float:
    """Tokens/s per GPU of a Megatron-Bridge FP8 pre-training run on DGX nodes."""
    f = _pinned(preset(name), layout, acc, "ib-ndr", batch=batch, memory_model="megatron",
                fp8=True, overlap=1.0)
    return f["tokens_per_s"] / layout.devices


def _llama1_65b() -> TransformerShape:
    return TransformerShape(
        name="llama1-65b", n_layers=80, d_model=8192, n_heads=64, n_kv_heads=64, d_ff=22016,
        vocab_size=32000, seq_len=2048, gated_mlp=True, layernorm=False, global_batch=2048,
        source="Touvron et al. 2023 (LLaMA), Table 2",
    )


MTNLG = "Smith et al. 2022 (Megatron-Turing NLG 530B), §2.4"
MEGDIST = "Megatron-Core developer guide, Distributed Optimizer (bytes per parameter)"
DSEST = (
    "DeepSpeed runtime/zero/stage_1_and_2.py estimate_zero2_model_states_mem_needs, "
    "stage3.py estimate_zero3_model_states_mem_needs"
)


def _mtnlg(batch: int = 1920) -> TransformerShape:
    return megatron_gpt(
        n_layers=105, d_model=20480, n_heads=128, global_batch=batch, name="mt-nlg-530b"
    )


def _deepspeed_gpu_gb(zero: int, offload: int, devices: int) -> float:
    shape = preset("llama2-7b")
    cost = shape.cost()
    states = model_state_bytes(
        cost.total_params, devices, zero, offload=offload, memory_model="deepspeed"
    )
    extra = transient_param_bytes(
        cost.layer_params, cost.n_layers, zero, memory_model="deepspeed",
        largest_module_params=cost.largest_module_params,
    )
    return float(states["total"] + extra) / 1e9


def _deepspeed_formula_gb(zero: int, offload: int, devices: int) -> float:
    """The estimator's own arithmetic for the same model (what DeepSpeed prints)."""
    cost = preset("llama2-7b").cost()
    p, largest = cost.total_params, cost.largest_module_params
    if zero == 2:
        return (2 * p if offload else 4 * p + 16 * p / devices) / 1e9
    return (4 * largest + (2 * p / devices if offload else 18 * p / devices)) / 1e9


def _new_references() -> list[Reference]:
    refs: list[Reference] = []
    for precision, plain, fixed, sharded, label in (
        ("fp16", 20, 4, 16, "fp16 parameters, fp16 gradients"),
        ("bf16", 18, 6, 12, "bf16 parameters, fp32 gradients"),
        ("fp32", 16, 8, 8, "fp32 parameters, fp32 gradients"),
    ):
        refs.append(
            Reference(
                id=f"megatron-distopt-{precision}-plain",
                source=MEGDIST,
                quantity=f"bytes per parameter without the distributed optimizer, {label}",
                unit="B/param",
                published=float(plain),
                planner=lambda p=precision: float(
                    model_state_bytes(1, 8, 0, precision=p, memory_model="megatron")["total"]
                ),
                setting="--memory-model megatron, ZeRO stage 0",
                kind="formula",
            )
        )
        refs.append(
            Reference(
                id=f"megatron-distopt-{precision}-d8",
                source=MEGDIST,
                quantity=f"bytes per parameter with the distributed optimizer, {label}, d = 8 "
                f"({fixed} + {sharded}/d)",
                unit="B/param",
                published=fixed + sharded / 8,
                planner=lambda p=precision: float(
                    model_state_bytes(1, 8, 1, precision=p, memory_model="megatron")["total"]
                ),
                setting="--memory-model megatron, ZeRO stage 1 (the distributed optimizer)",
                kind="formula",
            )
        )
    for zero, offload, what in (
        (2, 0, "ZeRO-2"),
        (2, 1, "ZeRO-2 + offload_optimizer=cpu"),
        (3, 0, "ZeRO-3"),
        (3, 1, "ZeRO-3 + offload_optimizer=cpu"),
    ):
        refs.append(
            Reference(
                id=f"deepspeed-estimator-z{zero}{'-offload' if offload else ''}",
                source=DSEST,
                quantity=f"GPU memory for model states of Llama 2 7B on 8 GPUs, {what} "
                "(estimator without its 1.5 buffer factor, which applies to CPU memory only)",
                unit="GB",
                published=_deepspeed_formula_gb(zero, offload, 8),
                planner=lambda z=zero, o=offload: _deepspeed_gpu_gb(z, o, 8),
                setting="--memory-model deepspeed; largest layer = the embedding table "
                "(32000 x 4096)",
                kind="formula",
            )
        )
    for name, local, ac, rc, wps in TORCHTITAN_A100:
        refs.append(
            Reference(
                id=f"torchtitan-a100-{name}-bs{local}-{ac.replace(' ', '-')}",
                source=TT,
                quantity=f"tokens/s per GPU, {name} FSDP2 on 64 A100, local batch {local}, "
                f"activation checkpointing: {ac}",
                unit="tokens/s",
                published=float(wps),
                planner=lambda name=name, local=local, rc=rc: _pinned(
                    preset(name),
                    Layout(dp=64, zero=3, mbs=local, recompute=rc),
                    "a100-80gb",
                    "ib-hdr",
                    batch=64 * local,
                    memory_model="torch",
                )["tokens_per_s"]
                / 64,
                setting="zero 3 (FSDP2), --memory-model torch, FlashAttention; network not "
                "published (ib-hdr, 8 ports per node assumed); selective op AC = --recompute op, "
                "selective layer AC = --recompute alternate (torchtitan's policies at that commit)",
                command=f"sextant plan --model {name} --gpus 64 --accelerator a100-80gb "
                f"--network ib-hdr --dp 64 --zero 3 --mbs {local} --recompute {rc} "
                "--memory-model torch --global-batch " + str(64 * local),
            )
        )
    mixtral = preset("mixtral-8x7b")
    for key, published, count in (
        ("total", 46.7, lambda: mixtral.total_params()),
        (
            "active",
            12.9,
            lambda: mixtral.n_layers * mixtral.active_layer_params()
            + mixtral.embedding_params()
            + mixtral.head_params()
            + mixtral.final_norm_params(),
        ),
    ):
        refs.append(
            Reference(
                id=f"mixtral-8x7b-{key}-params",
                source="Jiang et al. 2024 (Mixtral of Experts), §2 and Table 1",
                quantity=f"{key} parameters of Mixtral 8x7B (8 experts, top-2)",
                unit="B",
                published=published,
                planner=lambda count=count: count() / 1e9,
                setting="the mixtral-8x7b preset (MoE: n_experts 8, top_k 2); the paper prints "
                "0.1B",
                kind="formula",
                printed=0.1,
            )
        )
    for nodes, seconds in ((280, 60.1), (350, 50.2), (420, 44.4)):
        n = nodes * 8
        refs.append(
            Reference(
                id=f"mtnlg-530b-{n}-iteration",
                source=MTNLG,
                quantity=f"seconds per iteration, 530B on {n} A100 (t=8, p=35, dp={n // 280}), "
                "batch 1920",
                unit="s",
                published=seconds,
                planner=lambda n=n: _pinned(
                    _mtnlg(),
                    Layout(dp=n // 280, tp=8, pp=35, mbs=1, recompute="full"),
                    "a100-80gb",
                    "ib-hdr",
                    batch=1920,
                    flash=False,
                    balanced_stages=False,
                )["step"],
                setting="full recomputation, micro-batch 1, non-interleaved (not stated); "
                "V = 51,200 (Megatron's GPT vocabulary)",
            )
        )
    for name, devices, layout, batch, published, gib, what, setting in TORCHTITAN_H100:
        refs.append(
            Reference(
                id=f"torchtitan-h100-{name}-{what}-{devices}",
                source=TT_H100,
                quantity=f"tokens/s per GPU, {name} on {devices} H100 ({layout.label()}, "
                f"global batch {batch})",
                unit="tokens/s",
                published=float(published),
                planner=lambda name=name, layout=layout, batch=batch, what=what: _torchtitan_h100(
                    name, layout, batch, fp8=what.endswith("fp8")
                )["tokens_per_s"],
                planner_other=lambda name=name, layout=layout, batch=batch, what=what: (
                    _torchtitan_h100(name, layout, batch, fp8=what.endswith("fp8"),
                                     nvl_peak=True)["tokens_per_s"]
                ),
                setting=f"{setting}; {TT_H100_SETTING}",
            )
        )
        refs.append(
            Reference(
                id=f"torchtitan-h100-{name}-{what}-{devices}-memory",
                source=TT_H100,
                quantity=f"peak reserved memory per GPU, {name} on {devices} H100 "
                f"({layout.label()}, global batch {batch})",
                unit="GiB",
                published=gib,
                planner=lambda name=name, layout=layout, batch=batch, what=what: _torchtitan_h100(
                    name, layout, batch, fp8=what.endswith("fp8")
                )["memory_gib"],
                setting=f"memory as allocated: torchtitan logs the caching allocator's peak "
                f"reserved bytes (metrics.py at 9dec370, max_reserved_gib), the maximum over "
                f"the GPUs (footnote 1); the planner's total with its default allowance "
                f"(fragmentation 10 %, 1 GB fixed); {setting}; {TT_H100_SETTING}",
            )
        )
    for name, acc, layout, batch, published, note in MEGATRON_BRIDGE:
        system = {"h100-sxm": "DGX-H100", "b200": "DGX-B200"}[acc]
        refs.append(
            Reference(
                id=f"mbridge-{acc.split('-')[0]}-{name}-fp8-{layout.devices}",
                source=MBRIDGE,
                quantity=f"tokens/s per GPU, {name} FP8 on {layout.devices} {system} GPUs "
                f"({layout.label()}, global batch {batch})",
                unit="tokens/s",
                published=float(published),
                planner=lambda name=name, acc=acc, layout=layout, batch=batch: (
                    _megatron_bridge(name, acc, layout, batch)
                ),
                setting=(f"{note}; " if note else "") + MBRIDGE_SETTING,
            )
        )
    refs.append(
        Reference(
            id="llama1-65b-tokens",
            source="Touvron et al. 2023 (LLaMA), §2.4",
            quantity="tokens/s per GPU, LLaMA 65B on 2048 A100 80GB",
            unit="tokens/s",
            published=380.0,
            planner=lambda: _best(
                _llama1_65b(), 2048, "a100-80gb", "ib-hdr", fixed={"tp": 8, "sp": 1}
            )["tokens_per_s"] / 2048,
            setting="\"around 380 tokens/sec/GPU on 2048 A100 GPU with 80GB of RAM\"; the "
            "shape of Table 2 (80 layers, h = 8192, 64 heads, SwiGLU d_ff = 22,016, V = 32,000, "
            "sequence 2048, 4M-token batch = 2048 sequences); \"model and sequence "
            "parallelism\" (§2.4): tensor parallelism 8, the model-parallel size the 65B "
            "checkpoint was released in (facebookresearch/llama README, v1: \"Different "
            "models require different MP values\", 65B: 8), with sequence parallelism; the "
            "rest of the layout searched; 200 Gb/s InfiniBand assumed (ib-hdr)",
        )
    )
    refs.append(
        Reference(
            id="bloom-176b-tflops",
            source="BigScience BLOOM 176B training page (bigscience.notion.site) and Le Scao et "
            "al. 2022 §3.4",
            quantity="TFLOP/s per GPU, BLOOM 176B on 384 A100 80GB (TP 4 x PP 12 x DP 8), "
            "batch 2048",
            unit="TFLOP/s",
            published=150.0,
            planner=lambda: _bloom_tflops(),
            setting="4 x 100 Gb/s Omni-Path per node (ethernet-100g, 4 ports), ZeRO-1, "
            "micro-batch 2, full recomputation, Megatron's TFLOP/s counting (eq. 3)",
        )
    )
    return refs


MLENG = (
    "Bekman, Machine Learning Engineering Open Book, network/README.md "
    "(github.com/stas00/ml-engineering, commit 29c6b70)"
)
# (accelerator, network, ranks per node, nodes, payload bytes, published busbw GB/s, section)
COLLECTIVES = [
    ("b200", "ib-ndr", 8, 4, 16 * 2**20, 64.43, "Inter-node speed depends on intra-node speed"),
    ("b200", "ib-ndr", 8, 4, 256 * 2**20, 229.09, "Inter-node speed depends on intra-node speed"),
    ("b200", "ib-ndr", 8, 4, 2**30, 361.99, "Inter-node speed depends on intra-node speed"),
    ("b200", "ib-ndr", 8, 4, 16 * 2**30, 381.80, "Inter-node speed depends on intra-node speed"),
    ("a100-80gb", "ib-hdr", 8, 1, 2**20, 18.00, "Real network throughput"),
    ("a100-80gb", "ib-hdr", 8, 1, 16 * 2**20, 106.16, "Real network throughput"),
    ("a100-80gb", "ib-hdr", 8, 1, 64 * 2**20, 171.54, "Real network throughput"),
    ("a100-80gb", "ib-hdr", 8, 1, 256 * 2**20, 194.07, "Real network throughput"),
    ("a100-80gb", "ib-hdr", 8, 1, 2**30, 229.04, "Real network throughput"),
]


def _held_out(link: Link, payload: float, intra: Link) -> Link:
    """The link with its ramp refitted without the sweep point at `payload` (leave one out):
    the row then tests the interpolation between the neighbouring published points, not the
    point the ramp was fitted to."""
    kept = tuple(pt for pt in link.sweep if pt[0] != payload)
    if not link.sweep or len(kept) == len(link.sweep):
        return link
    trimmed = replace(link, sweep=kept)
    return replace(trimmed, ramp=fit_ramp(trimmed, intra))


def _busbw(acc: str, net: str, n_intra: int, n_inter: int, payload: float) -> float:
    """All-reduce bus bandwidth as nccl-tests reports it (2 (n-1)/n x size / time), GB/s,
    from the planner's collective cost on the catalogue's links, with the measured point
    itself left out of the fitted ramp (_held_out)."""
    hw = resolve_hardware(_cat(), acc, net)
    a, b = hw.intra, hw.inter
    if n_inter > 1:
        b = _held_out(b, payload, _cat().link(b.sweep_intra_link or a.key))
    else:
        a = _held_out(a, payload, a)
    intra = (a.collective_bandwidth, a.latency, a.call_latency, a.ramp)
    inter = (hw.inter_coll_bw_per_device, b.latency, b.call_latency, b.ramp)
    t = float(comms.hier_all_reduce(payload, n_intra, n_inter, intra, inter))
    n = n_intra * n_inter
    return 2.0 * (n - 1) / n * payload / t / 1e9


def _size(payload: float) -> str:
    return f"{payload / 2**30:g} GiB" if payload >= 2**30 else f"{payload / 2**20:g} MiB"


def _collective_references() -> list[Reference]:
    refs = []
    for acc, net, g, nodes, payload, published, section in COLLECTIVES:
        what = (
            f"{nodes} nodes x {g} B200 (NVLink 5; 8 x 400 Gb/s EFA v4 per node)"
            if acc == "b200"
            else f"one node of {g} A100 (NVLink 3)"
        )
        setting = (
            "NVLink 5 at the catalogue's ring figure (682.2 GB/s, one node, NVLS off, same "
            "source), the network at ib-ndr's 50 GB/s per GPU (the same 400 Gb/s per GPU), "
            "NCCL's ring and tree latencies, ib-ndr's ramp (this 4-node sweep) refitted "
            "without this point (held out)"
            if acc == "b200"
            else "NVLink 3 at the catalogue's 235 GB/s (this sweep's 16 GiB plateau, so that "
            "point is not a row), NCCL's ring and tree latencies, NVLink 3's ramp (this "
            "sweep) refitted without this point (held out)"
        )
        refs.append(
            Reference(
                id=f"collective-{acc.split('-')[0]}-{nodes}node-{_size(payload).replace(' ', '')}"
                .lower(),
                source=f"{MLENG}, '{section}'",
                quantity=f"all-reduce bus bandwidth, {what}, {_size(payload)}",
                unit="GB/s",
                published=published,
                planner=lambda a=acc, n=net, g=g, k=nodes, m=payload: _busbw(a, n, g, k, m),
                setting=setting,
                kind="collective",
            )
        )
    return refs


def _bloom_tflops() -> float:
    shape = TransformerShape(
        name="bloom-176b", n_layers=70, d_model=14336, n_heads=112, n_kv_heads=112,
        d_ff=4 * 14336, vocab_size=250880, seq_len=2048, biases=True, dropout=False,
        tied_embeddings=True, global_batch=2048, source="Le Scao et al. 2022, Table 3",
    )
    batch = 2048
    f = _pinned(
        shape, Layout(dp=8, tp=4, pp=12, zero=1, mbs=2, recompute="full"), "a100-80gb",
        "ethernet-100g", batch=batch, flash=False, nics_per_node=4, balanced_stages=False,
    )
    s, layers, h, v = shape.seq_len, shape.n_layers, shape.d_model, shape.vocab_size
    flops = 96 * batch * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))
    return flops / (f["step"] * 384) / 1e12


def _step_of_1t() -> float:
    _, heads, hidden, layers, t, p, n, batch, _ = MEGATRON_TABLE1[-1]
    shape = megatron_gpt(n_layers=layers, d_model=hidden, n_heads=heads, global_batch=batch)
    return _megatron_step(
        shape, Layout(dp=n // (t * p), tp=t, pp=p), batch, interleave="searched"
    )


def run_references(only: str | None = None) -> list[dict[str, Any]]:
    refs = _references()
    if only is not None:
        refs = [r for r in refs if r.id == only]
        if not refs:
            raise UserError(
                f"unknown reference {only!r}; allowed: {', '.join(r.id for r in _references())}"
            )
    rows = []
    for r in refs:
        value = float(r.planner())
        compared = value if r.printed is None else round(value / r.printed) * r.printed
        other = None if r.planner_other is None else float(r.planner_other())
        rows.append(
            {
                "id": r.id,
                "source": r.source,
                "quantity": r.quantity,
                "unit": r.unit,
                "published": r.published,
                "planner": value,
                "planner_other": other,
                "error": (compared - r.published) / r.published
                if other is None
                else interval_error(other, compared, r.published),
                "kind": r.kind,
                "setting": r.setting,
                "command": r.command or f"sextant plan references --only {r.id}",
            }
        )
    return rows


def _share(hits: int, total: int) -> str:
    """hits / total as a percentage, rounded down to 0.1 % so that a share under a threshold
    never prints as reaching it (47/59 is 79.6 %, not "80 %")."""
    tenths = (1000 * hits) // max(total, 1)
    return f"{tenths // 10}.{tenths % 10}%"


def summary(rows: list[dict[str, Any]]) -> str:
    """The validation summary line (docs/validation.md, `plan references`)."""
    formula = [r for r in rows if r["kind"] == "formula"]
    e2e = [r for r in rows if r["kind"] == "end-to-end"]
    coll = [r for r in rows if r["kind"] == "collective"]
    f_ok = sum(abs(r["error"]) <= 0.005 for r in formula)
    e_ok = sum(abs(r["error"]) <= 0.10 for r in e2e)
    c_ok = sum(abs(r["error"]) <= 0.10 for r in coll)
    apart = [r for r in rows if r["kind"] == "not comparable"]
    counted = [r for r in rows if r["kind"] != "not comparable"]
    errs = sorted(abs(r["error"]) for r in counted) or [0.0]
    collectives = f", {c_ok}/{len(coll)} collective benchmarks within 10%" if coll else ""
    not_counted = f", {len(apart)} not comparable (shown, not counted)" if apart else ""
    return (
        f"{len(rows)} references: {f_ok}/{len(formula)} formula-defined within 0.5%, "
        f"{e_ok}/{len(e2e)} end-to-end within 10% ({_share(e_ok, len(e2e))})"
        f"{collectives}{not_counted}; median |error| {errs[len(errs) // 2]:.1%}, "
        f"max {errs[-1]:.1%} (counted rows)."
    )


def _fmt(value: float, unit: str) -> str:
    if unit == "MFU":
        return f"{value:.1%}"
    if unit == "GPU-h":
        return f"{value:,.0f}"
    if unit == "x":
        return f"{value:.2f}"
    return f"{value:,.3g}" if value < 1000 else f"{value:,.0f}"


def _predicted(row: dict[str, Any]) -> str:
    """The planner's figure, or its interval (low-high) where the source bounds an input."""
    if row.get("planner_other") is None:
        return _fmt(row["planner"], row["unit"])
    lo, hi = sorted((row["planner_other"], row["planner"]))
    return f"{_fmt(lo, row['unit'])}-{_fmt(hi, row['unit'])}"


def render_references(rows: list[dict[str, Any]], console) -> None:
    from rich.table import Table

    t = Table(title="Planner vs published figures (default assumptions)", title_justify="left")
    for col in ("id", "quantity", "unit", "published", "planner", "error"):
        t.add_column(col, justify="left" if col in ("id", "quantity") else "right")
    for r in rows:
        t.add_row(
            r["id"],
            r["quantity"],
            r["unit"],
            _fmt(r["published"], r["unit"]),
            _predicted(r),
            f"{r['error']:+.1%}",
        )
    console.print(t)
    if rows:
        console.print(summary(rows) + " Sources and settings: --json or docs/validation.md")


def references_markdown(rows: list[dict[str, Any]]) -> str:
    """The table of docs/validation.md (`sextant plan references --markdown`)."""
    lines = [
        "| id | kind | published (source) | planner | error | setting / command |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        unit = "" if r["unit"] in ("MFU", "x") else f" {r['unit']}"
        lines.append(
            f"| `{r['id']}` | {r['kind']} | {r['quantity']}: "
            f"**{_fmt(r['published'], r['unit'])}{unit}** "
            f"({r['source']}) | {_predicted(r)}{unit} | {r['error']:+.1%} | "
            f"{r['setting']}; `{r['command']}` |"
        )
    lines.append("")
    lines.append(summary(rows))
    return "\n".join(lines)
