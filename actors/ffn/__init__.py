"""The FFN role of attention-FFN disaggregation (AFD): a replica's experts on ranks of their own, with no
scheduler, KV cache or requests; the engine's runner sends them each MoE layer's hidden states."""
