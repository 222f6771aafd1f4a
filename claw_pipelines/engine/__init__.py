"""The embedded engine: a vLLM-shaped simulator (no GPU, no weights) that the stack and tests use.

It answers exactly in vLLM's OpenAI-compatible shapes (token IDs, logprobs, tool calls) so the real
LiteLLM ``hosted_vllm/`` code paths run end to end, while a seeded policy keeps answers verifiable.
"""
