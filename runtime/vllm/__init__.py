"""vLLM as a worker's engine behind pdserve's hand-off (docs/design.md, The engine: vLLM behind the contract).

`VllmEngine` (engine.py) keeps the hand-off's engine contract
(runtime/worker/engine_contract.py) with vLLM's own engine core in the worker process;
`PdserveConnector` (connector.py) is the vLLM KV connector (API v1) through which vLLM's
scheduler allocates the blocks a Reserve grants and its attention layers report each
layer's K/V as written. Nothing here is imported unless a worker runs with
PD_ENGINE=vllm, in the environment `make vllm-env` builds (vLLM pins its own torch,
transformers and numpy; the default environment never holds vLLM).
"""
