"""The text the gates train on and the text they are evaluated on, kept apart: `corpus` (the
training haystack, and the held-out tutorial), `longrange` (training documents with facts and late
questions, and the retrieval suite's held-out instances, from disjoint phrasings and entities)."""
