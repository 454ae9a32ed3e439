"""The analytical planner: memory, FLOPs, communication and scaling of data / ZeRO / FSDP /
tensor / pipeline parallel training on a catalogue of accelerators and networks, searched with
numpy and calibrated by measurement. Formulas and sources: docs/planner.md.

Importing this package imports numpy only (never an ML framework).
"""

from sextant.planner.catalogue import Accelerator, Catalogue, Link, load_catalogue
from sextant.planner.comms import bus_factor
from sextant.planner.estimate import (
    Hardware,
    Layout,
    PlanOptions,
    check_layout,
    evaluate,
    evaluate_one,
    resolve_hardware,
)
from sextant.planner.evaluation import Evaluation, MemoryPart, StepPart
from sextant.planner.memory import activation_bytes_per_layer, model_state_bytes
from sextant.planner.models import (
    MLPShape,
    ModelCost,
    TransformerShape,
    preset,
)
from sextant.planner.plan import PlanRequest, make_plan
from sextant.planner.plan_doc import Plan
from sextant.planner.search import enumerate_layouts, scaling_curve, search
from sextant.planner.workload_shapes import load_workload_shape, shape_from_workload

__all__ = [
    "Accelerator",
    "Catalogue",
    "Evaluation",
    "Hardware",
    "Layout",
    "Link",
    "MLPShape",
    "MemoryPart",
    "ModelCost",
    "Plan",
    "PlanOptions",
    "PlanRequest",
    "StepPart",
    "TransformerShape",
    "activation_bytes_per_layer",
    "bus_factor",
    "check_layout",
    "enumerate_layouts",
    "evaluate",
    "evaluate_one",
    "load_catalogue",
    "load_workload_shape",
    "make_plan",
    "model_state_bytes",
    "preset",
    "resolve_hardware",
    "scaling_curve",
    "search",
    "shape_from_workload",
]
