"""The model and its conversion: SmolLM2-135M fetched and converted (`fetch_model`:
kvpolicy-fetch-model), a GGUF model to kvpolicy-lm's directory (`gguf_to_lm`: kvpolicy-gguf-to-lm)
or to F32 (`gguf_dequantize`), and the authors' checkpoints to the gates' safetensors
(`convert_checkpoint`: kvpolicy-convert-checkpoint)."""
