"""Weight sync trainer → rollout replicas: one pipeline for every transport.

`flat` (model-dtype flat buckets and their fingerprint), `pipeline` (one bucket ahead on each side), `verify`
(the delivery check), `apply` (the receiving copy into a torch model); the transports `collective`
(torch.distributed broadcast group) and `object_store` (Ray, imported explicitly, so this package stays
Ray-free); `runtime` wires them for the engine (`publish`, `resolve_buckets`)."""

from engine.sync.apply import load_buckets_into
from engine.sync.base import SyncRecord, WeightSync
from engine.sync.buckets import Bucket, bucket_nbytes, bucketize
from engine.sync.flat import FlatBucket, fingerprint, flatten
from engine.sync.verify import DeliveryCheck, SyncDeliveryError

__all__ = ["Bucket", "DeliveryCheck", "FlatBucket", "SyncDeliveryError", "SyncRecord", "WeightSync",
           "bucket_nbytes", "bucketize", "fingerprint", "flatten", "load_buckets_into"]
