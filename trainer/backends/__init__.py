"""Generation backends: token ids in, token ids and logprobs out (``base``, the interface);
``hf`` runs transformers' ``generate`` on the CPU or one GPU, ``vllm`` drives vLLM engines
(colocated or separate; ``vllm_inline`` moves weights to a CPU engine), ``scripted`` plays a
scripted policy for tests."""
