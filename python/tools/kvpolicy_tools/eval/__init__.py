"""Evaluation: the perplexity table (`quality`: kvpolicy-quality) and its plot (`quality_plot`:
kvpolicy-quality-plot), the retrieval suite (`retrieval`: kvpolicy-retrieval), survivors against
kvpress (`kvpress_survivors`), llama.cpp's golden run (`llama_golden`), and where a gate ranks a
fact (`fact_ranks`)."""
