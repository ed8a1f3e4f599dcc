"""The element-wise kernels of a step (`emulation.measured`), per GPU of a `tp`-way attention rank: what
every token runs through besides the GEMMs, attention and experts, which no kernel table holds, priced
by the package's own formula for them (bytes over the GPU's memory bandwidth, plus a fixed latency a
kernel) and so counted as not measured::

    kernel                                    reads, writes (BF16 elements a token)   x layers
    residual add + RMSNorm, before the mixer  2h, 2h                                  every layer
    residual add + RMSNorm, before the MLP    2h, 2h                                  every layer
    gated activation of a dense MLP           2i/tp, i/tp                             dense MLP layers
    gated activation of shared experts        2s/tp, s/tp                             MoE layers

The routed experts' activation runs inside the fused-MoE kernel, which the tables measured whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from emulation.kernel_tables import KernelTables
from emulation.profiles import ModelProfile
from emulation.step_kernels import layers_of, total


@dataclass(frozen=True)
class ElementwiseKernels:
    """A model's element-wise kernels on one GPU of a `tp`-way rank (see the module's docstring)."""

    tables: KernelTables
    model: ModelProfile
    tp: int

    @cached_property
    def kernels(self) -> list[tuple[int, int, int]]:
        """Each kernel a token runs through, as (layers, elements read, elements written)."""
        m, tp, h = self.model, self.tp, self.model.hidden_size
        kernels = [(2 * m.num_layers, 2 * h, 2 * h)]
        if (i := m.intermediate_size) and m.num_dense_mlp_layers:
            kernels.append((m.num_dense_mlp_layers, 2 * i // tp, i // tp))
        if m.moe is not None and (shared := m.moe.shared_expert_intermediate_size):
            kernels.append((m.num_moe_layers, 2 * shared // tp, shared // tp))
        return kernels

    def times(self, num_tokens: int) -> tuple[Any, Any] | None:
        """All of them over `num_tokens` tokens, every layer that runs them: (time, its measured part)."""
        return total([layers_of(n, [self.tables.elementwise(num_tokens, a, b)]) for n, a, b in self.kernels])

    def bytes(self, num_tokens: float) -> float:
        """What they read and write over `num_tokens` tokens (BF16)."""
        return 2.0 * num_tokens * sum(n * (a + b) for n, a, b in self.kernels)
