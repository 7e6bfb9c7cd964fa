"""kvpolicy's evaluation and training code, installed beside the bindings (`pip install .[eval]`,
`.[train]`, `.[convert]`; docs/python.md):

- `kvpolicy_tools.data`: the training documents and the held-out texts and retrieval instances,
  kept apart (`corpus`, `longrange`);
- `kvpolicy_tools.train`: the learned gates and their training (`kvpolicy-train-gates`);
- `kvpolicy_tools.eval`: the perplexity table (`kvpolicy-quality`) and its plot
  (`kvpolicy-quality-plot`), the retrieval suite (`kvpolicy-retrieval`), the checks against kvpress
  and llama.cpp, the gates' fact ranks;
- `kvpolicy_tools.convert`: the model (`kvpolicy-fetch-model`), model and checkpoint conversion
  (`kvpolicy-gguf-to-lm`, `kvpolicy-convert-checkpoint`);
- `kvpolicy_tools.pypi`: whether the package index answers (the set-up scripts' probe).

None of it imports the compiled module `kvpolicy` but the kvpress check's Python engine.
"""
