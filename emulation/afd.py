"""Attention-FFN disaggregation (AFD): what crosses the cut at every MoE layer, and the ping-pong
pipeline of micro-batches that hides it.

Attention and the experts run on different GPUs. At each MoE layer a micro-batch's hidden states go
attention -> FFN (A2F) and the experts' outputs come back (F2A)::

    bytes a token a pass = MoE layers x hidden x (A2F bytes + F2A bytes) + routing metadata
    DeepSeek-V3 in BF16 both ways: 58 x 7,168 x 4 B = 1,662,976 B = 1.59 MiB, 24 x its 70,272 B of KV

(Step-3 sends A2F in FP8 with the expert choices, F2A in BF16; MegaScale-Infer dispatches per expert,
top_k copies.) A step of m micro-batches through L MoE layers, each micro-batch taking T_a of attention,
T_e of experts and T_c on the link each way a layer, pipelines as MegaScale-Infer's ping-pong
(arXiv 2504.02263)::

    round trip    R = T_a + T_c + T_e + T_c (+ 2 x the link's latency)
                                                       one micro-batch through one layer (A2F, F2A)
    stage         T_f = max(T_a, T_e, T_c)             the busiest resource (A2F and F2A are separate
                                                       directions of the link; T_c its wire time)
    layer cycle   C = max(m · T_f, R)                  a micro-batch's next layer waits for its trip
    step          T = (L - 1) · C + (m - 1) · T_f + R

    m >= 2(1 + T_c/T_f) (and T_c <= T_f): C = m · T_f and T = (m·L - 1) · T_f + R, MegaScale-Infer's
    m = 1: T = L · R, nothing overlaps

Each side is busy m·L·T_a (attention) or m·L·T_e (FFN) of T; the rest is its bubbles. What the link adds
is T less the same pipeline with T_c = 0. `afd_layout.AfdLayout`, the time model of a pool with `afd`,
takes T_a, T_e and T_c from the per-operator model's groups on each side's GPUs and from the link.
"""

from __future__ import annotations

from dataclasses import dataclass

from emulation.model_profile import ModelProfile
from emulation.roofline import maximum

ROUTING_BYTES_PER_CHOICE = 8
"""Routing metadata a token sends per chosen expert: its index and weight, 4 bytes each."""


def cut_bytes_per_layer(model: ModelProfile, nbytes: float = 2.0, routing: bool = False) -> float:
    """Bytes one token moves across the cut one way at one MoE layer: `nbytes` a hidden value (2: BF16,
    1: FP8), plus its expert choices if the FFN side does not route itself (`routing`, A2F only)."""
    assert model.moe is not None, f"{model.name} has no experts: nothing to disaggregate"
    per_layer = model.hidden_size * nbytes
    if routing:
        per_layer += model.moe.num_experts_per_tok * ROUTING_BYTES_PER_CHOICE
    return per_layer


def cut_bytes_per_token(
    model: ModelProfile, a2f_bytes: float = 2.0, f2a_bytes: float = 2.0, routing: bool = False
) -> float:
    """Bytes one token moves across the attention-FFN cut in one forward pass, both ways, over all
    MoE layers (`cut_bytes_per_layer` out, with the choices if `routing`, and back)."""
    out, back = cut_bytes_per_layer(model, a2f_bytes, routing), cut_bytes_per_layer(model, f2a_bytes)
    return model.num_moe_layers * (out + back)


@dataclass(frozen=True)
class PipelineTime:
    """One step of `num_micro_batches` micro-batches through `num_layers` MoE layers, itemised (seconds)."""

    total_s: float
    attention_s: float
    """Attention's busy time: m · L · T_a."""
    ffn_s: float
    """The experts' busy time: m · L · T_e."""
    attention_bubble_s: float
    """Attention idle within the step, waiting on the experts or the link."""
    ffn_bubble_s: float
    """The experts idle within the step."""
    communication_s: float
    """What the link adds: the step less the same pipeline with no transfer time."""


def pipeline(
    attention_s: float,
    ffn_s: float,
    comm_s: float,
    num_micro_batches: int,
    num_layers: int,
    f2a_s: float | None = None,
    latency_s: float = 0.0,
) -> PipelineTime:
    """The ping-pong pipeline's step time (module docstring): `attention_s`, `ffn_s`, `comm_s` are one
    micro-batch's attention, experts and A2F wire time at one layer; `f2a_s` its wire time back, if it
    differs (FP8 out, BF16 back): the round trip takes both, the stage the slower direction.
    `latency_s`, the link's one-way latency, lengthens each round trip twice but occupies no stage
    (the NIC is free while a message is in flight)."""
    m, layers = num_micro_batches, num_layers
    assert m >= 1 and layers >= 1, (m, layers)
    back_s = comm_s if f2a_s is None else f2a_s
    total = _step_s(attention_s, ffn_s, comm_s, back_s, m, layers, latency_s)
    busy_a, busy_e = m * layers * attention_s, m * layers * ffn_s
    return PipelineTime(
        total_s=total,
        attention_s=busy_a,
        ffn_s=busy_e,
        attention_bubble_s=total - busy_a,
        ffn_bubble_s=total - busy_e,
        communication_s=total - _step_s(attention_s, ffn_s, 0.0, 0.0, m, layers, 0.0),
    )


def _step_s(t_a: float, t_e: float, a2f: float, f2a: float, m: int, layers: int, latency: float) -> float:
    round_trip = t_a + a2f + t_e + f2a + 2 * latency
    stage = maximum(maximum(t_a, t_e), maximum(a2f, f2a))  # elementwise over a window's steps
    cycle = maximum(m * stage, round_trip)
    return (layers - 1) * cycle + (m - 1) * stage + round_trip


def min_micro_batches(attention_s: float, ffn_s: float, comm_s: float) -> float:
    """MegaScale-Infer's m >= 2(1 + T_c / T_f): the fewest micro-batches that keep the busiest side
    busy (T_f = max(T_a, T_e))."""
    return 2 * (1 + comm_s / max(attention_s, ffn_s))
