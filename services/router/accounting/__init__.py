"""What a request cost and how the service did: carbon receipts, SLO attainment reports, the folded request
metrics and the load and access feeds to the optimizer."""
