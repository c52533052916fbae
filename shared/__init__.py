"""The repo's common library: wire messages, the Redis stream bus, weight chunking, config.

Nothing in here imports torch or vllm when imported (tests/unit/test_layering.py): every service, including the
coordinator and the reward service (which run without torch), can import all of it.
"""
