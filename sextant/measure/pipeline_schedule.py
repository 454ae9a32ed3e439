"""DeepSpeed's pipeline TrainSchedule, simulated: how long a step takes with blocking sends.

`benchmarks/pipeline_schedule.py` prints a step's length from the command line.

DeepSpeed's pipeline engine (deepspeed/runtime/pipe/schedule.py, TrainSchedule, as of v0.5)
runs 2 (m + p - 1) steps per batch. In each step a stage runs one forward or one backward (or
nothing, at the ends): even stages forward on even steps and backward on odd ones, odd stages
the other way round. Before a forward step's compute the stage receives the micro-batch's
activation from the previous stage and sends the previous step's gradient back; before a
backward step's compute it sends the previous step's activation on and receives the
gradient. Every send and receive is a blocking NCCL broadcast on a two-rank group
(deepspeed/runtime/pipe/p2p.py), so a pair completes when both sides have reached it, plus
the transfer time.

This replays every stage's command list in program order with that rendezvous rule and prints
the step's length in micro-batch times (forward + backward) beyond the m micro-batches: the
fill and drain. With sends of no duration it is exactly p - 1 (1F1B's bubble); sends add to
every micro-batch. Durations are in any one unit (the defaults: forward 1, backward 3, as with
full recomputation).
"""

from __future__ import annotations


def stage_program(stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """The commands one stage runs, in order: ("recv_act" | "send_act" | "recv_grad" |
    "send_grad" | "F" | "B", micro-batch)."""

    def micro_batch(step: int) -> tuple[int, bool]:
        half, odd_step, odd_stage = step // 2, step % 2, stage % 2
        forward = odd_step == odd_stage
        if forward:
            return (step - odd_step) // 2 - stage // 2, True
        if odd_step:
            return (step - 1) // 2 - stages + 1 + stage // 2, False
        return half - stages + (stage + 1) // 2, False

    def valid(j: int) -> bool:
        return 0 <= j < micro_batches

    commands: list[tuple[str, int]] = []
    previous = -1
    for step in range(2 * (micro_batches + stages - 1)):
        j, forward = micro_batch(step)
        if forward and stage > 0:
            if valid(j):
                commands.append(("recv_act", j))
            if valid(previous):
                commands.append(("send_grad", previous))
        if not forward and stage < stages - 1:
            if valid(previous):
                commands.append(("send_act", previous))
            if valid(j):
                commands.append(("recv_grad", j))
        if valid(j):
            commands.append(("F" if forward else "B", j))
        previous = j
    return commands


PARTNER = {
    "recv_act": ("send_act", -1),
    "send_act": ("recv_act", 1),
    "send_grad": ("recv_grad", -1),
    "recv_grad": ("send_grad", 1),
}


def simulate(stages: int, micro_batches: int, forward: float, backward: float,
             send_activation: float = 0.0, send_gradient: float = 0.0) -> float:
    """Length of one step (the last stage to finish), every stage starting at 0."""
    programs = [stage_program(s, stages, micro_batches) for s in range(stages)]
    pc, clock = [0] * stages, [0.0] * stages
    moved = True
    while moved:
        moved = False
        for s in range(stages):
            while pc[s] < len(programs[s]):
                op, j = programs[s][pc[s]]
                if op in ("F", "B"):
                    clock[s] += forward if op == "F" else backward
                    pc[s] += 1
                    moved = True
                    continue
                other_op, offset = PARTNER[op]
                q = s + offset
                if pc[q] < len(programs[q]) and programs[q][pc[q]] == (other_op, j):
                    took = send_activation if op.endswith("act") else send_gradient
                    clock[s] = clock[q] = max(clock[s], clock[q]) + took
                    pc[s] += 1
                    pc[q] += 1
                    moved = True
                    continue
                break
    if any(pc[s] < len(programs[s]) for s in range(stages)):
        raise RuntimeError("the schedule deadlocked")
    return max(clock)
