"""The encoder role: vision encoding on GPUs of its own (E/P/D), embeddings handed on to prefill."""
