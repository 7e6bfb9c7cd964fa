"""The learned gates (`gates`), the model they run inside (`gated_attention`), the training
objectives (`objectives`), the training command (`train_gates`: kvpolicy-train-gates) and two gate
edits (`blend_gates`, `scale_gate`)."""
