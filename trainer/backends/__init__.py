"""Generation backends: token ids in, token ids and logprobs out (``base``); ``hf`` runs
transformers' ``generate`` on CPU or one GPU; a vLLM engine is the next backend."""
