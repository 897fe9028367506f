"""Weight sync trainer → rollout replicas: the `WeightSync` protocol, bucketing, and the receiving copy.

Ray-backed transport lives in `engine.sync.object_store` (imported explicitly, so this package stays
Ray-free)."""

from engine.sync.apply import load_buckets_into
from engine.sync.base import SyncRecord, WeightSync
from engine.sync.buckets import Bucket, bucket_nbytes, bucketize

__all__ = ["Bucket", "SyncRecord", "WeightSync", "bucket_nbytes", "bucketize", "load_buckets_into"]
