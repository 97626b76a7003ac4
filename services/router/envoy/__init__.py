"""greenserve as the endpoint picker of Envoy-based gateways (the Gateway API Inference Extension's protocol).

``picker.py``: the ext_proc ExternalProcessor that chooses the engine; ``ledger.py``: the requests routed this
way, closed by Envoy's gRPC access log into carbon receipts; ``bootstrap.py``: Envoy's configuration;
``surface.py``: what ``--envoy-picker`` adds to the router process; ``gateway.py``: an Envoy process started and
stopped with the fleet.
"""
