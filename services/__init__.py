"""greenserve: a carbon-aware control plane for LLM serving (six gRPC microservices)."""

__version__ = "0.1.0"
