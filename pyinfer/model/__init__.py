"""Loading: GGUF files, model config, tokenizer, chat template, default-model pull."""
