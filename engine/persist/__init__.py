"""What a run leaves on disk and reads back: checkpoints of both sides, resume, run directories, the ledger.

    atomic.py               the one atomic writer: `atomic_write_bytes/text/json` (temp file in the same
                            directory, fsync, `os.replace`) and `publish_dir` (a staged directory swapped in)
    checkpoint.py           the run checkpoint `global_step_<s>/`: trainer state, counters, the rollout-side
                            cut (queued groups, in-flight prompts), manifest with digests; atomic publish
    trainer_checkpoints.py  the trainer actor's side of writing one (a mixin of its core) and the weights hash
    stop_grace.py           which state a stop with a deadline writes (full or light; pure)
    resume.py               reading a checkpoint back: what a resumed run starts from, rewinding the run dir
    run_dirs.py             where a run writes (never over another run) and the resume command
    ledger.py               `ledger.jsonl`: every admitted prompt ends in exactly one line
"""
