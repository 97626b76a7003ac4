"""Which engine serves a request: the routing policy (filters, scorers), the prefix index, the engine registry
and its health, the plan in force (enforcer.py), engines that step down, and what replicas share."""
