"""Batched generation on one model, shared by the inference engine and the trainer's task evals:
``batch`` (the running batch and ``generate``), ``kv_batch`` (its KV cache), ``sampling`` (each
row's next token), ``text_stream`` (tokens to text)."""
