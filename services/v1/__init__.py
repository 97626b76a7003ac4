"""Generated greenserve.v1 protobuf and gRPC stubs. Regenerate with: python scripts/gen_protos.py"""
