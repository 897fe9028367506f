"""`asyncrl rehearse`: every role of a run built as `launch` builds it and stepped once, at the model's real
configuration and the real world sizes, in one CPU process on fake tensors and a fake process group
(`run.rehearse`; `fake` the stand-ins, `batch` the micro-batches, `torch_rank` / `megatron_rank` the trainer
backends, `report` what is measured)."""
