"""The long-range documents a ranking trains on: the settings that make them and their targets
(kvpolicy-gate-targets' options, and kvpolicy-rank-gates' when it makes its documents itself). No
model library is imported here, so the ranking trainer that reads stored targets starts without one.
"""
import argparse
import os


def add_document_arguments(ap):
    """The settings that make a document's targets (this command's, and kvpolicy-rank-gates' when it
    makes its documents itself)."""
    ap.add_argument("--seq-len", type=int, default=1024, help="tokens per document")
    ap.add_argument("--steps-per-document", type=int, default=16, help="K: the steps a shard holds targets at")
    ap.add_argument("--first-step", type=int, default=64, help="the earliest step sampled")
    ap.add_argument("--prose-fraction", type=float, default=0.25, help="the share of documents that are plain prose")
    ap.add_argument("--numerals", type=float, default=0.25,
                    help="the share of documents with facts that also hold lines of numbers nothing asks about")
    ap.add_argument("--restated-variables", action="store_true",
                    help="half the variables reassigned in their first statement's own words, not an update's "
                         "(longrange.make_fact); documents without a variable are the same")
    ap.add_argument("--text", help="a haystack file instead of the train haystack (kvpolicy_tools.data.longrange)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                    help="the frozen model's weights and activations while it makes targets (the attention's "
                         "softmax stays float32): bfloat16 is faster where the CPU or GPU has bfloat16 arithmetic")
    ap.add_argument("--probe", action="store_true",
                    help="read each document with its probe after it (every fact asked, distractors included: "
                         "longrange.probe), so a fact's target is what a question about it reads, whether or not the "
                         "document asks it; the shard holds the document alone")


def check_document_arguments(ap, a):
    for name, low in (("seq_len", 8), ("steps_per_document", 1), ("first_step", 1)):
        if getattr(a, name) < low:
            ap.error(f"--{name.replace('_', '-')} {getattr(a, name)} must be >= {low}")
    if a.first_step >= a.seq_len:
        ap.error(f"--first-step {a.first_step} must be below --seq-len {a.seq_len}")
    if not 0 <= a.prose_fraction <= 1 or not 0 <= a.numerals <= 1:
        ap.error(f"--prose-fraction {a.prose_fraction} and --numerals {a.numerals} must be in [0, 1]")


def document_settings(a):
    """What makes a folder's (or an online run's) documents and targets what they are."""
    settings = {k: getattr(a, k) for k in ("seq_len", "steps_per_document", "first_step", "prose_fraction",
                                           "numerals", "text", "seed")}
    if a.probe:  # a folder made before the probe existed holds settings without it
        settings["probe"] = True
    if getattr(a, "restated_variables", False):  # and one made before restated variables, without them
        settings["restated_variables"] = True
    if getattr(a, "dtype", "float32") != "float32":  # and one made before the option, in float32
        settings["dtype"] = a.dtype
    settings["model"] = os.path.basename(a.gguf or a.hf or "tiny")
    return settings


def document_data(a, tok):
    """The long-range documents of a's settings (train_gates.LongRangeData)."""
    from kvpolicy_tools.train.train_gates import LongRangeData

    return LongRangeData(argparse.Namespace(seed=a.seed, prose_fraction=a.prose_fraction, seq_len=a.seq_len,
                                            numerals=a.numerals, text=a.text,
                                            restated_variables=getattr(a, "restated_variables", False)), tok)
