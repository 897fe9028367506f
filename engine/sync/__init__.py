"""Weight sync trainer → rollout replicas: one pipeline for every transport.

`flat` (model-dtype flat buckets and their fingerprint), `pipeline` (one bucket ahead on each side), `verify`
(the delivery check), `apply` (the receiving copy into a torch model); the transports `collective`
(torch.distributed broadcast group) and `object_store` (Ray, imported explicitly, so this package stays
Ray-free); `runtime` wires them for the engine (`publish`, `resolve_buckets`). Import each name from its module."""
