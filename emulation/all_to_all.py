"""Expert parallelism's all-to-alls: every MoE layer sends each token's hidden state to the ranks of
the experts it picked (dispatch) and their outputs back (combine), over the EP fabric.

With data-parallel attention each rank holds its own tokens. A token's top_k experts fall on D of the
ep ranks and on D_node of the nodes; under uniform routing, with n = E/ep experts a rank (E/nodes a
node)::

    P(a rank holds none of its experts) = C(E - n, k) / C(E, k) = Π_{i<k} (E - n - i) / (E - i)
    D = ep · (1 - that)                        D_node likewise over nodes

Hierarchically, as DeepEP's kernels do: a token crosses to each other node once (its RDMA traffic),
and every delivery to another rank, D·(ep - 1)/ep of them, crosses the scale-up link (sent there, or
forwarded inside the receiving node). Each of a rank's `tp` GPUs sends its share; both links at once::

    nvlink bytes(GPU) = tokens(rank) · D·(ep-1)/ep · hidden · bytes per value / tp
    rdma bytes(GPU)   = tokens(rank) · D_node·(nodes-1)/nodes · hidden · bytes per value / tp
    t                 = latency + max(nvlink bytes / (up·η), rdma bytes / (out·η))

Latency and bandwidth give a small message its fixed cost and a large one its wire time; the busiest
receiver's excess is not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from math import prod


def distinct_holders_per_token(num_experts: int, top_k: int, num_holders: int) -> float:
    """The holders (EP ranks, or nodes) a token's top_k experts fall on, in expectation under uniform
    routing, the experts spread evenly over `num_holders`."""
    e, n = num_experts, num_experts / num_holders  # n need not be whole (redundant experts fill slots)
    return num_holders * (1.0 - prod(max(0.0, e - n - i) / (e - i) for i in range(top_k)))


@dataclass(frozen=True)
class AllToAll:
    """One replica's EP fabric, as one GPU's all-to-alls see it."""

    ep: int
    tp: int
    hidden_size: int
    num_experts: int
    top_k: int
    gpus_per_node: int
    scale_up_bytes_per_s: float
    scale_out_bytes_per_s: float
    scale_up_latency_s: float
    scale_out_latency_s: float
    eta: float
    dispatch_bytes: float
    combine_bytes: float

    @property
    def ranks_per_node(self) -> int:
        return max(1, self.gpus_per_node // self.tp)

    @property
    def crosses_nodes(self) -> bool:
        return self.ep > self.ranks_per_node

    @property
    def num_nodes(self) -> int:
        """Nodes one replica spans."""
        return -(-self.ep * self.tp // self.gpus_per_node)

    @cached_property
    def values_per_token(self) -> tuple[float, float]:
        """Hidden values one GPU sends per token of its rank in one direction: over the scale-up link,
        and over the scale-out NIC."""
        ranks = distinct_holders_per_token(self.num_experts, self.top_k, self.ep) * (self.ep - 1) / self.ep
        nodes = self.num_nodes
        remote_nodes = distinct_holders_per_token(self.num_experts, self.top_k, nodes) * (nodes - 1) / nodes
        return ranks * self.hidden_size / self.tp, remote_nodes * self.hidden_size / self.tp

    def time_s(self, rank_tokens: float, bytes_per_value: float) -> float:
        """One all-to-all of `rank_tokens` tokens a rank, `bytes_per_value` each value."""
        if self.ep == 1 or not rank_tokens:
            return 0.0
        up, out = self.bytes_sent(rank_tokens, bytes_per_value)
        wire_s = max(
            up / (self.scale_up_bytes_per_s * self.eta), out / (self.scale_out_bytes_per_s * self.eta)
        )
        return (self.scale_out_latency_s if self.crosses_nodes else self.scale_up_latency_s) + wire_s

    def bytes_sent(self, rank_tokens: float, bytes_per_value: float) -> tuple[float, float]:
        """One GPU's bytes in one all-to-all of `rank_tokens` tokens a rank: (scale-up, scale-out)."""
        up, out = self.values_per_token
        return rank_tokens * up * bytes_per_value, rank_tokens * out * bytes_per_value

    def layer_s(self, rank_tokens: float) -> float:
        """One MoE layer's dispatch and combine."""
        return self.time_s(rank_tokens, self.dispatch_bytes) + self.time_s(rank_tokens, self.combine_bytes)
