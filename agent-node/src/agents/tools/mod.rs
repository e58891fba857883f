//! Repository tools for agents: grep, glob, ranged reads, a Python code graph, BM25 retrieval.
